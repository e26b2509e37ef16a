package httplb

import (
	"net/http"

	"github.com/llmlb/llmlb"
)

// ParseBody is [Parser.Parse] for a body the caller has already read, such as
// one an Envoy external processor receives in pieces: it parses body as the
// body of r, and never reads, replaces or closes r.Body. r supplies the
// headers (the session header, [ParserConfig.TrustTenantHeader],
// [ParserConfig.FeatureHeader]) and what [ParserConfig.Tenant] reads; it
// needs no body.
//
// A body longer than the cap returns an error wrapping [ErrBodyTooLarge]; an
// error of [ParserConfig.Tenant] is returned wrapped in [ErrUnauthenticated].
// Every other body, including malformed JSON and an empty one, is not an
// error, as with Parse. The returned request does not refer to body, which
// the caller may reuse at once.
func (p *Parser) ParseBody(r *http.Request, body []byte) (llmlb.Request, error) {
	req, h, err := p.headers(r)
	if err != nil {
		return req, err
	}
	return req, p.fill(&req, h, body, nil)
}

// MaxBodyBytes returns the longest body the Parser accepts, so that a caller
// that reads bodies itself (see [Parser.ParseBody]) can stop reading there.
func (p *Parser) MaxBodyBytes() int64 { return p.maxBody }
