package llmlb

import (
	"math"
)

// Placement without engine events, behind several routers: see the last
// paragraphs of [Default]'s documentation. The home of a prompt is a pure
// function of its blocks and the candidates' keys, so routers that share
// nothing agree on it; what it is worth is learned from the signal and the
// index (unknownShare), not set.

// knownWindow is the number of picks over which the placements recorded
// per own placement are averaged.
const knownWindow = 64

// home returns the candidate the request's unknown part belongs to, or -1
// if the index knows the whole prompt on two candidates or more.
func (p *defaultPolicy) home(c *Candidates, n int) int {
	blocks := p.t.blocks(c.req)
	first, second := int32(0), int32(0)
	for _, m := range c.matched {
		switch {
		case m > first:
			first, second = m, first
		case m > second:
			second = m
		}
	}
	// The key is the first block beyond the longest prefix held on two
	// candidates or more: a head that many prompts share (a system prompt)
	// is not what tells a conversation apart.
	if int(second) >= len(blocks) {
		return -1
	}
	key := blocks[second]
	best, bestRank := -1, uint64(0)
	for i := 0; i < n; i++ {
		if r := mix64(key ^ c.state(i).keyHash); best < 0 || r > bestRank {
			best, bestRank = i, r
		}
	}
	return best
}

// observeRecords folds the placements recorded in the index since the
// previous pick (this policy's previous one included) into the average
// number of placements known per own placement. It reports whether the
// request has prompt blocks to place.
func (p *defaultPolicy) observeRecords(c *Candidates) bool {
	if len(p.t.blocks(c.req)) == 0 {
		return false
	}
	total := p.t.index.Records()
	var d uint64
	for {
		prev := p.records.Load()
		if total <= prev {
			break // a concurrent pick read a later total
		}
		if p.records.CompareAndSwap(prev, total) {
			d = total - prev
			break
		}
	}
	for {
		old := p.known.Load()
		k := math.Float64frombits(old)
		next := k + (float64(d)-k)/knownWindow
		if p.known.CompareAndSwap(old, math.Float64bits(next)) {
			return true
		}
	}
}

// unknownShare returns the share of all placements in front of the
// candidates whose loads are given that this policy does not know of (see
// [Default]), in [0, 1]; 0 without a fresh signal.
func (p *defaultPolicy) unknownShare(own, all int64) float64 {
	// Fewer than one request's worth of unknown placements is none: the
	// counts are whole requests, and the average only approaches its value.
	unknown := float64(all) - float64(own)*math.Float64frombits(p.known.Load())
	if unknown < 1 {
		return 0
	}
	return min(unknown/float64(all), 1)
}

// credit lowers the cost of the request's home by the expected cached part
// of the prompt beyond the longest match, at the price of an uncached
// token, if some placements are unknown. pick lists the scored candidates,
// nil if every candidate was scored; home is the request's home if already
// found, else -1.
func (p *defaultPolicy) credit(c *Candidates, home, longest int, over float64, pick []int32) {
	if len(p.t.blocks(c.req)) == 0 {
		return
	}
	var own, all int64
	add := func(l *EndpointLoad) {
		if l.Fresh {
			own, all = own+l.Outstanding, all+l.Requests
		}
	}
	if pick == nil {
		for i := range c.loads {
			add(&c.loads[i])
		}
	} else {
		for _, i := range pick {
			add(&c.loads[i])
		}
	}
	unknown := p.unknownShare(own, all)
	p.unknown.Store(math.Float64bits(unknown))
	if unknown == 0 {
		return
	}
	if home < 0 {
		if pick != nil {
			return // not scored: the next pick finds it
		}
		if home = p.home(c, c.Len()); home < 0 {
			return
		}
	}
	tokens := float64(c.req.PromptTokens - p.t.cachedTokens(c, longest))
	c.costs[home] -= unknown * (p.cacheWeight + over) * tokens / c.loads[home].Weight
}

// mix64 is a bijective mixer of 64-bit words (the finalizer of
// MurmurHash3), used to rank candidates for a key by rendezvous hashing.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb93fe1ec53d9
	x ^= x >> 33
	return x
}
