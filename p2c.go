package llmlb

import "math"

// A Score rates candidate i of c, whose load estimate is l, for the request
// being picked; lower is better. A score should be the candidate's load after
// it takes the request (so it is positive even for an idle endpoint): the
// selectors divide it by the candidate's effective weight l.Weight, which
// makes heavier endpoints and endpoints out of slow start take proportionally
// more. NaN scores lose to any number.
type Score func(c *Candidates, i int, l *EndpointLoad) float64

// RequestsScore is the estimated number of requests at the endpoint,
// counting this one: [EndpointLoad.Requests] + 1.
func RequestsScore(c *Candidates, i int, l *EndpointLoad) float64 {
	return float64(l.Requests + 1)
}

// TokensScore is this balancer's outstanding token work at the endpoint
// (prompt tokens not yet prefilled plus expected decode tokens), counting this
// request's.
func TokensScore(c *Candidates, i int, l *EndpointLoad) float64 {
	return float64(l.PrefillTokens+l.DecodeTokens+c.RequestTokens()) + 1
}

// DefaultKVCapacityTokens is the KV capacity assumed by [KVScore] for an
// endpoint whose signal does not report one.
const DefaultKVCapacityTokens = 1 << 18

// KVScore is the endpoint's KV usage plus the work queued for it, as a
// fraction of its KV capacity: the reported KV usage (corrected with this
// balancer's dispatches since the observation) plus this balancer's prompt
// tokens not yet prefilled plus this request's tokens. Queued work counts
// because a request waiting for admission holds no KV blocks yet but will.
// Without a fresh KV observation the usage is estimated from the KV footprint
// of this balancer's own requests past prefill, against the reported capacity
// or [DefaultKVCapacityTokens].
func KVScore(c *Candidates, i int, l *EndpointLoad) float64 {
	return kvUsage(l) + float64(l.PrefillTokens+c.RequestTokens()+1)/kvCapacity(l)
}

// weighted returns candidate i's score divided by its effective weight, with
// NaN mapped to +Inf so that it always loses.
func weighted(c *Candidates, score Score, i int) float64 {
	l := &c.scratch // a field of the pooled c, so l does not escape per call
	c.loadInto(i, l)
	s := score(c, i, l) / l.Weight
	if s != s { // NaN
		return math.Inf(1)
	}
	return s
}

type p2c struct{ score Score }

// P2C returns the power-of-two-choices policy over score: it samples two
// distinct candidates uniformly at random and picks the one with the lower
// weighted score, at random on a tie. Sampling instead of scanning keeps the
// cost of a pick constant and keeps several balancers that see the same stale
// signal from stampeding onto the same endpoint. A nil score means
// [RequestsScore].
func P2C(score Score) Policy {
	if score == nil {
		score = RequestsScore
	}
	return p2c{score}
}

func (p p2c) Choose(c *Candidates) int {
	n := uint64(c.Len())
	if n == 1 {
		return 0
	}
	// One 64-bit draw gives both samples: the high half picks a, the low
	// half picks b among the others (multiply-shift; the bias is below
	// n/2^32).
	x := c.b.uint64()
	a := int((x >> 32 * n) >> 32)
	b := int((x & (1<<32 - 1) * (n - 1)) >> 32)
	if b >= a {
		b++
	}
	sa, sb := weighted(c, p.score, a), weighted(c, p.score, b)
	switch {
	case sa < sb:
		return a
	case sb < sa:
		return b
	case c.Uint64N(2) == 0:
		return a
	default:
		return b
	}
}

type leastScore struct{ score Score }

// LeastScore returns the full-scan policy over score: it picks the candidate
// with the lowest weighted score, uniformly at random among exact ties. It
// is the most accurate choice for a single balancer with fresh counts; with
// several balancers sharing a stale signal prefer [P2C].
func LeastScore(score Score) Policy {
	if score == nil {
		score = RequestsScore
	}
	return leastScore{score}
}

func (p leastScore) Choose(c *Candidates) int {
	return argmin(c, p.score)
}

// argmin returns the candidate with the lowest weighted score, uniformly at
// random among exact ties (never by position).
func argmin(c *Candidates, score Score) int {
	ties, bestScore := c.ties[:0], math.Inf(1)
	for i, n := 0, c.Len(); i < n; i++ {
		s := weighted(c, score, i)
		switch {
		case s < bestScore:
			bestScore = s
			ties = append(ties[:0], int32(i))
		case s == bestScore:
			ties = append(ties, int32(i))
		}
	}
	c.ties = ties
	if len(ties) == 1 {
		return int(ties[0])
	}
	return int(ties[c.Uint64N(uint64(len(ties)))])
}
