package httplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// errClosedEarly is what a pick's Done is told when the caller closed a
// response body before its end, typically because the client went away.
var errClosedEarly = fmt.Errorf("httplb: response body closed before its end: %w", context.Canceled)

// body is a response body that passes reads straight through, first
// returning the bytes held back while waiting for the first event, and calls
// finish exactly once: at EOF, on a read error, or on Close. Read and Close
// may be called at once; a Read after Close fails.
type body struct {
	rc     io.ReadCloser
	buf    []byte // held-back bytes not yet returned
	finish func(err error)
	done   atomic.Bool
	closed atomic.Bool // Close was called: Read fails
	// out, if metered, counts the output in every byte returned by Read,
	// in order, and its end before finish is called.
	out     outputMeter
	metered bool
}

// Read implements io.Reader.
func (b *body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		if b.metered {
			b.out.observe(p[:n])
		}
		return n, nil
	}
	n, err := b.rc.Read(p)
	if n > 0 && b.metered {
		b.out.observe(p[:n])
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			b.end(nil)
		} else {
			b.end(err)
		}
	}
	return n, err
}

// Close implements io.Closer. Closing before the end finishes the request as
// cancelled.
func (b *body) Close() error {
	b.closed.Store(true)
	err := b.rc.Close()
	b.end(errClosedEarly)
	return err
}

func (b *body) end(err error) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	if b.metered {
		b.out.end()
	}
	if b.finish != nil {
		b.finish(err)
	}
}

// peek reads the start of resp's body until its first event has begun: for a
// text/event-stream, the first "data:" field at the start of a line; for
// anything else (or a compressed stream), the first byte. It gives up waiting
// after limit bytes. An EOF ends the wait without error; another read error
// is returned, and the attempt is then retryable.
func (b *body) peek(resp *http.Response, limit int) error {
	sse := isEventStream(resp.Header)
	var sc eventScanner
	buf := make([]byte, 0, 512)
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := b.rc.Read(buf[len(buf):min(cap(buf), limit)])
		chunk := buf[len(buf) : len(buf)+n]
		buf = buf[:len(buf)+n]
		if n > 0 && (!sse || sc.scan(chunk)) {
			break
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// A complete short body: nothing more will come. Keep it
				// readable, with its EOF.
				b.rc = eofReader{b.rc}
				break
			}
			return err
		}
	}
	b.buf = buf
	return nil
}

// eofReader reports EOF at once but still closes the underlying body.
type eofReader struct{ io.Closer }

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// eventScanner finds the first "data:" field at the start of a line of an
// event stream, across reads.
type eventScanner struct {
	m    int       // bytes of "data:" matched at the start of the current line; -1 if the line is something else
	mark markState // the stream's leading byte-order mark
}

const dataField = "data:"

// scan consumes p and reports whether a "data:" line has started.
func (s *eventScanner) scan(p []byte) bool {
	if s.mark.skipping() {
		var broken bool
		if p, broken = s.mark.skip(p); broken {
			s.m = -1
		}
	}
	for _, c := range p {
		switch {
		case c == '\n' || c == '\r':
			s.m = 0
		case s.m < 0:
		case c == dataField[s.m]:
			s.m++
			if s.m == len(dataField) {
				return true
			}
		default:
			s.m = -1
		}
	}
	return false
}

// byteOrderMark is U+FEFF in UTF-8. An event stream may start with one,
// which is not part of its first line.
const byteOrderMark = "\xef\xbb\xbf"

// markState follows the byte-order mark an event stream may start with,
// across reads: the bytes of it matched so far, or markPast once the stream
// is past its start. The zero value is a stream's start.
type markState int8

const markPast markState = -1

// skipping reports whether the stream is still at its start.
func (m markState) skipping() bool { return m >= 0 }

// skip consumes the bytes of a byte-order mark at the start of p and
// returns the rest. broken reports a stream that starts with part of a mark
// and then something else: its first line is not a field.
func (m *markState) skip(p []byte) (rest []byte, broken bool) {
	i := 0
	for ; i < len(p) && int(*m) < len(byteOrderMark); i++ {
		if p[i] != byteOrderMark[*m] {
			broken = *m > 0
			*m = markPast
			return p[i:], broken
		}
		*m++
	}
	if int(*m) == len(byteOrderMark) {
		*m = markPast
	}
	return p[i:], false
}
