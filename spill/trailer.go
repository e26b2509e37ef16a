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
// has none and must stay writable. The announced names are stripped now
// unless a read ahead of the body (see isContextLength) may still be
// reading it, which would add the trailers at its end meanwhile.
func stripTrailer(resp *http.Response) {
	if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return
	}
	reading := false
	if p, ok := resp.Body.(*peekedBody); ok {
		select {
		case <-p.done: // the read ahead is over
		default:
			reading = true
		}
	}
	if !reading {
		apierror.StripUpstream(resp.Trailer)
	}
	if _, replaced := resp.Body.(*apierror.Replaced); replaced || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	// The wrapper unwraps to the body, so that httplb's
	// NewUpstreamErrorHandler finds the body of an httplb.Transport tier
	// under it, to rewrite the stream's error events.
	apierror.StripTrailerAtEnd(resp)
}
