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
// has read it (see apierror.StripTrailerAtEnd, whose wrapper of the body
// heldBody looks through). An answer whose body was replaced with a
// generic one loses them all: they were the upstream's body's. A 101 Switching Protocols,
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
		apierror.StripTrailerAtEnd(resp)
	}
}
