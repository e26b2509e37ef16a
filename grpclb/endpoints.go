package grpclb

import "google.golang.org/grpc/resolver"

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
// grpc-go also counts an address as often as an endpoint lists it, so that
// [A, B] and [B, A, A] would be two children, and [A, A] and [A] one server
// with two identities, reconnected when a resolver update changes one into
// the other.
//
// So endpoints that share a first address are merged into one: the first
// listed, with the addresses of the others appended in the order listed
// (they are failover addresses of the server at the first one). No
// endpoint lists an address twice: of the repeats of an address in one
// endpoint or in merged ones, the first is kept. Of endpoints with the same
// set of addresses, only the first listed is kept. An endpoint's attributes
// are those of the first listed of the endpoints merged into it, and each
// address keeps its own. Both rules depend only on eps, so every update of
// the same list gives the same children and keys. eps itself is not
// modified, and the work is linear in the number of addresses.
//
// Every address maps to a key: a first address to itself, even where it is
// also a later address of another endpoint; another address to the key of
// the first endpoint that lists it.
func keyEndpoints(eps []resolver.Endpoint) ([]resolver.Endpoint, map[string]string) {
	// listed is an address of out[i].
	type listed struct {
		i    int
		addr string
	}
	out := make([]resolver.Endpoint, 0, len(eps))
	at := make(map[string]int, len(eps)) // first address -> index in out
	has := make(map[listed]bool, len(eps))
	for _, ep := range eps {
		if len(ep.Addresses) == 0 {
			out = append(out, ep)
			continue
		}
		i, dup := at[ep.Addresses[0].Addr]
		if !dup {
			i = len(out)
			at[ep.Addresses[0].Addr] = i
			e := ep
			e.Addresses = make([]resolver.Address, 0, len(ep.Addresses)) // a copy of its own
			out = append(out, e)
		}
		m := &out[i]
		for _, a := range ep.Addresses {
			if k := (listed{i, a.Addr}); !has[k] {
				has[k] = true
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
	clear(out[len(kept):]) // drop references to the dropped endpoints

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
