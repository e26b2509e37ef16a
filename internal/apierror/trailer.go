package apierror

import (
	"io"
	"net/http"
)

// StripTrailerAtEnd wraps the body of resp, an upstream's answer, so that
// its trailers lose, as the body ends, what [StripUpstream] strips: net/http
// adds the trailers that follow a body to its answer's Trailer before the
// Read that reaches the body's end returns, on the goroutine that reads
// it, and a reverse proxy sends them on after that Read. The wrapper's
// Unwrap method returns the body it reads, so that a handler looking for
// a body of its own under wrappers finds it (httplb's
// NewUpstreamErrorHandler, the body of an httplb.Transport, which holds
// back a stream's first event and rewrites its error events). resp's body
// must not be nil.
func StripTrailerAtEnd(resp *http.Response) {
	resp.Body = &trailerBody{ReadCloser: resp.Body, resp: resp}
}

// trailerBody is the body of resp that strips its trailers as it ends (see
// StripTrailerAtEnd).
type trailerBody struct {
	io.ReadCloser
	resp *http.Response
}

// Read implements io.Reader.
func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		StripUpstream(b.resp.Trailer)
	}
	return n, err
}

// Unwrap returns the body b reads.
func (b *trailerBody) Unwrap() io.ReadCloser { return b.ReadCloser }
