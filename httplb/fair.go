package httplb

import (
	"context"
	"net/netip"
	"strings"

	"github.com/llmlb/llmlb/fair"
)

// addrPrincipalPrefix prefixes the principal of a request without a tenant:
// its client's address, so that an address never names a tenant.
const addrPrincipalPrefix = "addr:"

// sessionPrincipalPrefix prefixes the principal of a request with neither a
// tenant nor a client address, but a session: so that a session key never
// names a tenant.
const sessionPrincipalPrefix = "session:"

// tenantPrincipalPrefix prefixes the principal of a tenant whose name
// starts with a principal prefix (this one included), so that no tenant
// shares a principal with an address, a session or another tenant: see
// tenantPrincipal.
const tenantPrincipalPrefix = "tenant:"

// ipv6PrincipalBits is the length of the IPv6 prefix that names a client
// (see addrPrincipal).
const ipv6PrincipalBits = 48

// fairRequest returns what [Config.Queue] needs to know of the request: its
// principal (the tenant; with no tenant, the client's address, see
// addrPrincipal; with no address either, the session key prefixed with
// "session:"; else ""), its class (read from the trusted class header, if
// any, else fair.Standard) and its prompt tokens.
//
// A request a server received has an address, and then its session key is
// no principal: a client chooses it, and one that sends each request under
// a new one would have each of its requests counted as a principal of its
// own, served as much as any other principal waiting, and so take nearly
// all the capacity from the clients that keep theirs. A request without an
// address comes from the program that uses the Transport as its own client
// (an agent's sessions), which chooses its sessions itself.
func (a *attempt) fairRequest() fair.Request {
	r := fair.Request{Principal: tenantPrincipal(a.lreq.Tenant), PromptTokens: a.lreq.PromptTokens}
	if r.Principal == "" {
		r.Principal = addrPrincipal(a.req.RemoteAddr)
	}
	if r.Principal == "" && a.lreq.AffinityKey != "" {
		r.Principal = sessionPrincipalPrefix + a.lreq.AffinityKey
	}
	if h := a.t.classHdr; h != "" {
		r.Class, _ = fair.ParseClass(a.req.Header.Get(h))
	}
	return r
}

// tenantPrincipal returns the principal of tenant: the tenant itself,
// unless it starts with "addr:", "session:" or "tenant:", the prefixes of
// the principals of the requests without a tenant and of such tenants,
// when it is prefixed with "tenant:". A tenant named "addr:10.0.0.1" is
// then not counted with the anonymous clients at that address, and the
// mapping stays one to one.
func tenantPrincipal(tenant string) string {
	if strings.HasPrefix(tenant, addrPrincipalPrefix) || strings.HasPrefix(tenant, sessionPrincipalPrefix) ||
		strings.HasPrefix(tenant, tenantPrincipalPrefix) {
		return tenantPrincipalPrefix + tenant
	}
	return tenant
}

// addrPrincipal returns the principal of a request without a tenant sent
// from remoteAddr (an [http.Request]'s RemoteAddr, "host:port" as the
// server sets it): "addr:" and the client's IPv4 address, or the /48
// prefix of its IPv6 address. An IPv6 site is given a prefix, up to a /48
// (RFC 6177), and may send from any address in it, so a longer prefix
// would let one client send under many principals; the clients of one /48
// share a principal as the clients behind one IPv4 NAT do. The port, which
// a client chooses with each connection, is left out. A request that has
// no address or an unparsable one (a Transport used by a client rather than
// behind a server, a Unix socket) has the principal "", shared by every
// such request.
func addrPrincipal(remoteAddr string) string {
	ip, err := netip.ParseAddr(remoteAddr)
	if err != nil {
		ap, err := netip.ParseAddrPort(remoteAddr)
		if err != nil {
			return ""
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		return addrPrincipalPrefix + netip.PrefixFrom(ip, ipv6PrincipalBits).Masked().String()
	}
	return addrPrincipalPrefix + ip.String()
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
