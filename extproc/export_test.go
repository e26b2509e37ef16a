package extproc

import (
	"context"
	"net/http"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// SetAfterFunc replaces the timer that arms the body deadlines of s's
// streams, so that a test fires them when it chooses.
func SetAfterFunc(s *Server, f func(d time.Duration, fire func()) (stop func() bool)) {
	s.afterFunc = f
}

// Buffered returns the bytes of request bodies and response id scans s's
// streams hold.
func Buffered(s *Server) int64 { return s.buffered.Load() }

// RestoreModel renames, in the response body given as chunks, the model
// target back to incoming (both JSON strings), as a stream does after a
// model rewrite, and returns the body sent back; ok is false if there is
// no rename to make.
func RestoreModel(incoming, target []byte, chunks [][]byte) (out []byte, ok bool) {
	r := newModelRestore(incoming, target)
	if r == nil {
		return nil, false
	}
	for i, c := range chunks {
		out = append(out, r.feed(c, i == len(chunks)-1)...)
	}
	return out, true
}

// ScanResponseID reads the id of a Responses API response from its body,
// given as chunks, as a stream does; sse tells an event stream.
func ScanResponseID(sse bool, chunks [][]byte) (string, bool) {
	s := &idScan{sse: sse}
	for i, c := range chunks {
		if id, ok := s.feed(c, i == len(chunks)-1); ok {
			return id, true
		}
	}
	return "", false
}

// PreviousResponseID returns the previous_response_id a request body
// continues, as a stream reads it.
func PreviousResponseID(body []byte) (string, bool) { return previousResponseID(body) }

// StoredResponseID returns the id of the stored response that a request
// with the given method and :path addresses, as a stream reads it.
func StoredResponseID(method, path string) (string, bool) {
	st := headersOnly(method, path)
	decoded, ok := st.decodedPath()
	if !ok {
		return "", false
	}
	return storedResponseID(st.method, decoded)
}

// ParserRequest returns the request a stream gives its parser for request
// headers with the given :method and :path.
func ParserRequest(method, path string) *http.Request {
	return headersOnly(method, path).httpRequest()
}

// headersOnly returns a stream that has read request headers with the
// given :method and :path.
func headersOnly(method, path string) *stream {
	st := &stream{s: &Server{maxBuffered: DefaultMaxBufferedBytes}, ctx: context.Background()}
	st.readHeaders(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(method)}, {Key: ":path", RawValue: []byte(path)}}})
	return st
}
