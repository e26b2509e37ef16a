package spill

import (
	"io"
	"sync"
	"time"
)

// maxPeekTime bounds how long a 400 or 422 answer's body is waited for to
// tell a context-length error (see isContextLength). An error body
// normally arrives with its headers; the bound is longer than
// maxDiscardTime's since a misread refusal is a request lost to a tier
// that could have served it, and it allows for a lost packet's
// retransmission. It is wall-clock time, as maxDiscardTime is.
const maxPeekTime = time.Second

// maxEmptyReads is how many reads in a row may return nothing before a
// body is taken as broken (io.ErrNoProgress), as bufio.Reader takes it.
const maxEmptyReads = 100

// peekedBody is a response body whose first bytes, up to maxPeekBytes,
// are read ahead on a goroutine of their own (see readAhead), so that they
// can be waited for with a limit and still be returned. Read returns them,
// and the read's error if it failed, then passes on to the body; it waits
// for the read ahead to end first. Close closes the body, which ends the
// read ahead of a net/http body at once. Read and Close may be called at
// once, as on a net/http body.
type peekedBody struct {
	rc   io.ReadCloser
	done chan struct{} // closed when the read ahead has ended

	mu  sync.Mutex // protects buf and err until done is closed
	buf []byte     // the bytes read ahead
	err error      // the read ahead's error, io.EOF at the body's end

	off int // the bytes of buf that Read returned
}

// readAhead returns rc as a peekedBody, having started to read it ahead.
// The goroutine that reads ends once it has read maxPeekBytes, at the
// body's end, or on a read error, such as that of a read of a closed body.
func readAhead(rc io.ReadCloser) *peekedBody {
	p := &peekedBody{rc: rc, done: make(chan struct{})}
	go p.fill()
	return p
}

func (p *peekedBody) fill() {
	defer close(p.done)
	chunk := make([]byte, 4<<10)
	for n, empty := 0, 0; n < maxPeekBytes; {
		m, err := p.rc.Read(chunk[:min(len(chunk), maxPeekBytes-n)])
		if m == 0 && err == nil {
			if empty++; empty == maxEmptyReads {
				err = io.ErrNoProgress
			}
		} else {
			empty = 0
		}
		n += m
		p.mu.Lock()
		p.buf = append(p.buf, chunk[:m]...)
		p.err = err
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// head returns a copy of the bytes read ahead so far and the error that
// ended the read ahead, if it has.
func (p *peekedBody) head() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.buf...), p.err
}

// Read implements io.Reader.
func (p *peekedBody) Read(b []byte) (int, error) {
	<-p.done // buf and err are fixed from now on
	if p.off < len(p.buf) {
		n := copy(b, p.buf[p.off:])
		p.off += n
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.rc.Read(b)
}

// Close implements io.Closer.
func (p *peekedBody) Close() error { return p.rc.Close() }
