package grpclb

import (
	"slices"

	"google.golang.org/grpc/resolver"
)

// keyEndpoints returns the resolved endpoints eps as the children are given
// them, at most one per key, and the key of each of their addresses.
//
// An endpoint's key is its first address. grpc-go tells endpoints apart by
// the unordered set of their addresses (resolver.EndpointMap), and
// endpointsharding gives each its own child. Two endpoints that share a
// first address, such as [A] and [A, B], would then be two children, both
// connecting to A first, under one key: from one UpdateState to the next
// the key would stand for one child or the other, in the random order in
// which endpointsharding lists them. And of one endpoint listed twice with
// its addresses in another order, [A, B] and [B, A], endpointsharding keeps
// a random listing, so its key would change between resolver updates.
//
// So endpoints that share a first address are merged into one: the first
// listed, with the addresses of the others appended in the order listed,
// without repeats (they are failover addresses of the server at the first
// one). Of endpoints with the same set of addresses, only the first listed
// is kept. Both rules depend only on eps, so every update of the same list
// gives the same children and keys. eps itself is not modified.
//
// Every address maps to a key: a first address to itself, even where it is
// also a later address of another endpoint; another address to the key of
// the first endpoint that lists it.
func keyEndpoints(eps []resolver.Endpoint) ([]resolver.Endpoint, map[string]string) {
	out := make([]resolver.Endpoint, 0, len(eps))
	at := make(map[string]int, len(eps)) // first address -> index in out
	var merged map[int]bool              // out[i].Addresses is a copy of its own
	for _, ep := range eps {
		if len(ep.Addresses) == 0 {
			out = append(out, ep)
			continue
		}
		i, dup := at[ep.Addresses[0].Addr]
		if !dup {
			at[ep.Addresses[0].Addr] = len(out)
			out = append(out, ep)
			continue
		}
		m := &out[i]
		if !merged[i] {
			if merged == nil {
				merged = make(map[int]bool)
			}
			merged[i] = true
			m.Addresses = slices.Clone(m.Addresses)
		}
		for _, a := range ep.Addresses[1:] {
			if !slices.ContainsFunc(m.Addresses, func(b resolver.Address) bool { return b.Addr == a.Addr }) {
				m.Addresses = append(m.Addresses, a)
			}
		}
	}

	sets := resolver.NewEndpointMap[struct{}]() // grpc-go's identity
	kept := out[:0]
	for _, ep := range out {
		if _, dup := sets.Get(ep); dup {
			continue
		}
		sets.Set(ep, struct{}{})
		kept = append(kept, ep)
	}
	clear(out[len(kept):]) // drop references to the resolver's slices

	keys := make(map[string]string)
	for _, ep := range kept {
		if len(ep.Addresses) > 0 {
			keys[ep.Addresses[0].Addr] = ep.Addresses[0].Addr
		}
	}
	for _, ep := range kept {
		for _, a := range ep.Addresses {
			if _, ok := keys[a.Addr]; !ok {
				keys[a.Addr] = ep.Addresses[0].Addr
			}
		}
	}
	return kept, keys
}
