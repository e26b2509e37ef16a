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
	blocks := p.t.blocks(c)
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
	if len(p.t.blocks(c)) == 0 {
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
// token, if some placements are unknown and the home has room for the
// request (see roomFor). pick lists the scored candidates, nil if every
// candidate was scored; home is the request's home if already found, else
// -1; avgPrompt is the mean prompt length.
func (p *defaultPolicy) credit(c *Candidates, home, longest int, avgPrompt, over float64, pick []int32) {
	if len(p.t.blocks(c)) == 0 {
		return
	}
	var own, all int64
	add := func(l *EndpointLoad) {
		if l.Fresh {
			own, all = own+l.Outstanding, all+l.Requests
		}
	}
	switch {
	case c.b.signal == nil:
		// No load is fresh (and not every candidate has its own in
		// c.loads, see Candidates.loadsInto).
	case pick == nil:
		for i := range c.loads {
			add(&c.loads[i])
		}
	default:
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
	if !p.roomFor(c, home, avgPrompt) {
		return
	}
	tokens := float64(c.req.PromptTokens - p.t.cachedTokens(c, longest))
	c.costs[home] -= unknown * (p.cacheWeight + over) * tokens / c.load(home).Weight
}

// roomFor reports whether candidate i's KV memory can take the request
// beside what the requests already there will grow to: its KV demand with
// the request (as cost prices it) plus the expected decode tokens of the
// other routers' requests there, each counted at the mean of this
// balancer's own requests there (the request's own if it has none there).
//
// The home is the same for every router, so what one router sends there
// for the credit the others send too, and the overcommitment each
// tolerates adds up on the home; the footprint term counts only this
// router's part of the usage and cannot stop it. Pooled over eight seeds
// behind four routers on the simulator's prefixes workload, the credit
// without this check sent ten times as many requests as the policy with
// engine events to replicas at least 90% full, where they wait for memory
// or are preempted (104 preemptions against 4); the check cut the
// preemptions to 32 and the TTFT p99 from 547 ms to 488. Where memory is
// not short, as on the default workload, it changes nothing.
func (p *defaultPolicy) roomFor(c *Candidates, i int, avgPrompt float64) bool {
	l := c.load(i)
	cached := float64(p.t.cachedTokens(c, int(c.matched[i])))
	demand := kvDemand(c, l, queuedTokens(l, avgPrompt), cached)
	if others := l.Requests - l.Outstanding; others > 0 {
		decode := float64(c.reqTok - int64(c.req.PromptTokens))
		if l.Outstanding > 0 {
			decode = float64(l.DecodeTokens) / float64(l.Outstanding)
		}
		demand += float64(others) * decode
	}
	return demand <= kvCapacity(l)
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
