package extproc

import "time"

// SetAfterFunc replaces the timer that arms the body deadlines of s's
// streams, so that a test fires them when it chooses.
func SetAfterFunc(s *Server, f func(d time.Duration, fire func()) (stop func() bool)) {
	s.afterFunc = f
}

// Buffered returns the bytes of request bodies s's streams hold.
func Buffered(s *Server) int64 { return s.buffered.Load() }
