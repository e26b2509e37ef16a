package httplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/llmlb/llmlb/internal/sse"
)

// errClosedEarly is what a pick's Done is told when the caller closed a
// response body before its end, typically because the client went away.
var errClosedEarly = fmt.Errorf("httplb: response body closed before its end: %w", context.Canceled)

// errErrorEvent is what a pick's Done (and the Reporter) is told of a
// stream that ended after an error event: the engine failed the request
// after its 200 (vLLM and SGLang then send {"error": {...}} and end the
// stream), which is no success whatever the status said.
var errErrorEvent = errors.New("httplb: the response stream carried an error event")

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
		if _, eof := b.rc.(eofReader); eof && len(b.buf) == 0 {
			// The body ended with these bytes: say so now, as net/http
			// does, for a caller that stops reading at the end of what
			// it decodes and then closes the body.
			b.end(nil)
			return n, io.EOF
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
	if b.metered && b.out.end() && err == nil {
		err = errErrorEvent
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
	stream := isEventStream(resp.Header)
	var first sse.FirstEvent
	buf := make([]byte, 0, 512)
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := b.rc.Read(buf[len(buf):min(cap(buf), limit)])
		chunk := buf[len(buf) : len(buf)+n]
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			// A complete short body: nothing more will come. Keep it
			// readable, with its EOF.
			b.rc = eofReader{b.rc}
			break
		}
		if n > 0 && (!stream || first.Feed(chunk)) {
			break
		}
		if err != nil {
			return err
		}
	}
	b.buf = buf
	return nil
}

// eofReader reports EOF at once but still closes the underlying body.
type eofReader struct{ io.Closer }

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
