package spill

import (
	"net/http"

	"github.com/llmlb/llmlb/internal/apierror"
)

// stripTrailer gives the trailers of resp, an answer the Transport
// returns, what its header gets (see apierror.StripUpstream): both the
// names it announces in its Trailer header, which a reverse proxy
// announces to its client before the body, and the values that arrive
// after the body, announced or not, which net/http adds to resp.Trailer
// as the body ends and a reverse proxy then sends on. The body is
// wrapped to strip those (see apierror.StripTrailerAtEnd), but for a body
// replaced with a generic one, whose trailers are gone (see replaceBody),
// and a 101 Switching Protocols answer's, the switched connection, which
// has none and must stay writable. No read ahead of the body may still be
// reading it (see detach): the names are stripped now.
func stripTrailer(resp *http.Response) {
	if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return
	}
	apierror.StripUpstream(resp.Trailer)
	if _, replaced := resp.Body.(*apierror.Replaced); replaced || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	// The wrapper unwraps to the body, so that httplb's
	// NewUpstreamErrorHandler finds the body of an httplb.Transport tier
	// under it, to rewrite the stream's error events.
	apierror.StripTrailerAtEnd(resp)
}
