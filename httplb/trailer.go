package httplb

import (
	"io"
	"net/http"

	"github.com/llmlb/llmlb/internal/apierror"
)

// stripTrailer gives the trailers of resp, an answer that
// handleUpstreamError has treated and whose body was body before, what its
// header got: those trailers that name the operator's account or are the
// upstream's own go (see apierror.StripUpstream), both the names the
// answer announces in its Trailer header, which httputil.ReverseProxy
// announces to the client before the body, and the values that arrive
// after the body, announced or not, which the ReverseProxy sends once it
// has read it. An answer whose body was replaced with a generic one loses
// them all: they were the upstream's body's. A 101 Switching Protocols,
// whose body is the switched connection, has none.
func stripTrailer(resp *http.Response, body io.ReadCloser) {
	_, spilled := resp.Body.(*apierror.Replaced) // replaced by package spill
	switch {
	case resp.Body != body || spilled:
		resp.Trailer = nil
	case resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody:
		apierror.StripUpstream(resp.Trailer)
	default:
		// Those that arrived already: the Transport reads a short body to
		// its end while it waits for the first event.
		apierror.StripUpstream(resp.Trailer)
		resp.Body = &trailerBody{ReadCloser: resp.Body, resp: resp}
	}
}

// trailerBody is the body of resp, whose trailers lose, as it ends, what
// stripTrailer strips: net/http adds the trailers that follow a body to
// its answer's Trailer before the Read that reaches the body's end
// returns, on the goroutine that reads it.
type trailerBody struct {
	io.ReadCloser
	resp *http.Response
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		apierror.StripUpstream(b.resp.Trailer)
	}
	return n, err
}
