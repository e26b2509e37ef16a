package httplb

import (
	"context"

	"github.com/llmlb/llmlb/fair"
)

// sessionPrincipalPrefix prefixes the principal of a request that has a
// session but no tenant, so that a session key never names a tenant.
const sessionPrincipalPrefix = "session:"

// fairRequest returns what [Config.Queue] needs to know of the request: its
// principal (the tenant; with no tenant, the session key prefixed with
// "session:"; with neither, ""), its class (read from the trusted class
// header, if any, else fair.Standard) and its prompt tokens.
func (a *attempt) fairRequest() fair.Request {
	r := fair.Request{Principal: a.lreq.Tenant, PromptTokens: a.lreq.PromptTokens}
	if r.Principal == "" && a.lreq.AffinityKey != "" {
		r.Principal = sessionPrincipalPrefix + a.lreq.AffinityKey
	}
	if h := a.t.classHdr; h != "" {
		r.Class, _ = fair.ParseClass(a.req.Header.Get(h))
	}
	return r
}

// admitFair waits for the request's admission by the fair queue; the ticket
// is released with the admission caps, when the response body ends or the
// request fails.
func (a *attempt) admitFair(ctx context.Context) error {
	tk, err := a.t.queue.Admit(ctx, a.fairRequest())
	if err != nil {
		return err
	}
	a.ticket = tk
	rel := a.release
	a.release = func() {
		tk.Done()
		rel()
	}
	return nil
}
