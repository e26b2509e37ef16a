package spill

import (
	"io"
	"maps"
	"net/http"
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

	// src is the answer whose body is read, and announced its Trailer
	// before the read ahead began: the names announced. dst, if set, is
	// the copy of src that the caller got instead (see detach), whose
	// Trailer gets src's at the body's end.
	src       *http.Response
	announced http.Header
	dst       *http.Response
}

// readAhead makes resp's body a peekedBody, having started to read it
// ahead. The goroutine that reads ends once it has read maxPeekBytes, at
// the body's end, or on a read error, such as that of a read of a closed
// body. Reaching the body's end, net/http adds the trailers that follow it
// to resp.Trailer on that goroutine: resp.Trailer is made a map first if
// it is nil, so that the field itself is not set then, only the map's
// entries (see detach).
func readAhead(resp *http.Response) *peekedBody {
	if resp.Trailer == nil {
		resp.Trailer = make(http.Header)
	}
	p := &peekedBody{rc: resp.Body, done: make(chan struct{}), src: resp, announced: resp.Trailer.Clone()}
	resp.Body = p
	go p.fill()
	return p
}

// detach returns resp, or, if its body is read ahead (see readAhead) and
// the read ahead may still be reading, a copy of resp whose Trailer the
// read ahead never touches: the trailers of an answer must not be used
// while its body is read (see http.Response), and a caller uses them
// before it reads the body (httputil.ReverseProxy announces their names to
// its client; httplb's NewUpstreamErrorHandler strips them), while the
// read ahead's goroutine, reaching the body's end, adds them to
// resp.Trailer. The copy's Trailer holds the names resp announced, and
// gets the trailers that follow the body when a Read of the body returns
// its end, on the goroutine that reads it, as net/http's Trailer does.
func detach(resp *http.Response) *http.Response {
	p, ok := resp.Body.(*peekedBody)
	if !ok || p.ended() || p.src != resp {
		return resp
	}
	c := *resp // the read ahead sets no field of resp (see readAhead)
	c.Trailer = p.announced
	p.dst = &c
	return &c
}

// ended reports whether the read ahead has ended.
func (p *peekedBody) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
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
		p.end(p.err)
		return 0, p.err
	}
	n, err := p.rc.Read(b)
	if err != nil {
		p.end(err)
	}
	return n, err
}

// end gives the caller's copy of the answer, if any (see detach), the
// trailers that the body's end, err io.EOF, added to the answer read.
// They are fixed by then: the read ahead has ended, or the end was read
// on the goroutine that calls.
func (p *peekedBody) end(err error) {
	if p.dst == nil || err != io.EOF {
		return
	}
	if p.dst.Trailer == nil {
		p.dst.Trailer = make(http.Header, len(p.src.Trailer))
	}
	maps.Copy(p.dst.Trailer, p.src.Trailer)
	p.dst = nil
}

// Close implements io.Closer.
func (p *peekedBody) Close() error { return p.rc.Close() }
