package share

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
)

// A batch whose encoding exceeds what its receivers take (maxMessageBytes,
// or the NATS connection's maximum payload if smaller) is published in
// parts: each part is a batch of some of the endpoints, with the routes to
// them, published under the ID partID(id, k) for part k > 0. A receiver
// keeps each part as a snapshot of its own and adds the work of all (the
// endpoints of the parts do not overlap), and counts the parts as one
// peer, their sender (a receiver of a version before took each part for a
// peer of its own). A part not needed any more is published once empty,
// so that the work it described stops counting at once rather than after
// the TTL.

// partSep separates a replica's ID from the number of a part of its batch.
const partSep = "/part"

// maxParts bounds the parts of one batch, and so the part IDs of a
// replica a receiver keeps: the batch of maxSenderBytes in parts of NATS's
// default max_payload, 1 MiB. A receiver keeps the parts of a replica's
// batches as snapshots of their own, and sums every snapshot at each
// Load.
const maxParts = 64

// partID returns the ID of part k of the batches of replica id.
func partID(id string, k int) string {
	if k == 0 {
		return id
	}
	return id + partSep + strconv.Itoa(k)
}

// baseID returns the ID of the replica that publishes under id: id itself,
// or, for part k > 0 of its batches, id without the part's suffix.
func baseID(id string) string {
	i := strings.LastIndex(id, partSep)
	if i < 0 || !isPartNumber(id[i+len(partSep):]) {
		return id
	}
	return id[:i]
}

// isPartNumber reports whether n is the number of a part k > 0, as partID
// writes it: digits without a leading zero, at most 4 of them.
func isPartNumber[T string | []byte](n T) bool {
	if len(n) == 0 || n[0] == '0' || len(n) > 4 {
		return false
	}
	for j := 0; j < len(n); j++ {
		if n[j] < '0' || n[j] > '9' {
			return false
		}
	}
	return true
}

// isOwnID reports whether id, as bytes, is base or the ID of a part of
// base's batches (baseID(id) == base), without allocating.
func isOwnID(id []byte, base string) bool {
	if len(id) < len(base) || string(id[:len(base)]) != base {
		return false
	}
	rest := id[len(base):]
	if len(rest) == 0 {
		return true
	}
	return len(rest) > len(partSep) && string(rest[:len(partSep)]) == partSep && isPartNumber(rest[len(partSep):])
}

// routeBytes bounds the encoding of route r in a message of fewer than
// 1<<21 endpoints.
func routeBytes(r *route) int {
	return 3 + uvarintLen(uint64(len(r.blocks))) + 8*len(r.blocks)
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// split cuts m, whose encoding exceeds limit bytes, into parts of at most
// limit bytes, by endpoint, each with the routes to its endpoints, and
// appends them to parts[:0] (reusing its memory); the parts' id, inc and
// seq are left for the caller. An endpoint whose routes do not fit one
// part goes without them, the picks counted in dropped; one that does not
// fit alone, which only a maximum payload of a few kilobytes allows, or
// not in maxParts parts of maxBytes in all (maxSenderBytes, which the
// receivers keep at most), is left out and reported in tooLarge.
func split(m *message, limit, maxBytes int, parts []message) (_ []message, dropped int, tooLarge string) {
	// The largest header a part has: its id with the longest part suffix,
	// and counts of endpoints and routes of three bytes each.
	hdr := len(appendMessage(nil, &message{id: partID(m.id, maxParts), seq: ^uint64(0),
		width: m.width, phase: m.phase, horizon: m.horizon})) + 4
	byEP := make([][]int, len(m.eps))
	for i := range m.routes {
		byEP[m.routes[i].ep] = append(byEP[m.routes[i].ep], i)
	}
	// The endpoints go into the parts in the order of their keys, so that
	// each stays in its part from one batch to the next while the
	// endpoints change little: a receiver that has applied some parts of
	// a batch and not yet the others would otherwise count an endpoint
	// that moved to an earlier part twice, and one that moved to a later
	// part not at all (m.eps is in the order of a map's iteration).
	order := make([]int, len(m.eps))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(m.eps[a].key, m.eps[b].key) })
	var scratch []byte
	parts = parts[:0]
	var cur *message
	size, total := 0, 0 // bytes of cur, and of every part
	for _, i := range order {
		e := &m.eps[i]
		scratch = appendEP(scratch[:0], e)
		sz, rs := len(scratch), 0
		for _, r := range byEP[i] {
			rs += routeBytes(&m.routes[r])
		}
		routes := byEP[i]
		if hdr+sz+rs > limit {
			dropped += len(routes)
			routes, rs = nil, 0
			if hdr+sz > limit {
				if tooLarge == "" {
					tooLarge = e.key
				}
				continue
			}
		}
		next := cur == nil || size+sz+rs > limit // e starts a new part
		need := sz + rs
		if next {
			need += hdr
		}
		if (next && len(parts) == maxParts) || total+need > maxBytes {
			dropped += len(routes)
			if tooLarge == "" {
				tooLarge = e.key
			}
			continue
		}
		if next {
			parts = append(parts, message{})
			cur = &parts[len(parts)-1]
			cur.width, cur.phase, cur.horizon = m.width, m.phase, m.horizon
			size = hdr
		}
		cur.eps = append(cur.eps, *e)
		for _, r := range routes {
			cur.routes = append(cur.routes, route{ep: len(cur.eps) - 1, blocks: m.routes[r].blocks})
		}
		size += sz + rs
		total += need
	}
	return parts, dropped, tooLarge
}
