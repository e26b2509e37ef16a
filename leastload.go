package llmlb

import (
	"math"
	"sync"
)

// LeastOutstanding returns the full-scan policy that picks the candidate with
// the fewest estimated requests ([RequestsScore]), random among ties.
func LeastOutstanding() Policy { return LeastScore(RequestsScore) }

// LeastTokens returns the full-scan policy that picks the candidate with the
// least outstanding token work ([TokensScore]): unlike request counts it sees
// that a 30,000-token prompt and a 40-token chat turn are not the same load.
func LeastTokens() Policy { return LeastScore(TokensScore) }

// LeastKV returns the full-scan policy that picks the candidate with the
// lowest KV usage plus queued work ([KVScore]). It needs a [Signal] reporting
// KV usage to be more than [LeastTokens]. A candidate without a fresh KV
// usage (never observed, stale, or not reporting it) counts at the mean
// usage of the candidates that report one rather than as empty, so an
// endpoint whose metrics cannot be read does not draw every request.
func LeastKV() Policy { return LeastScore(KVScore) }

// DefaultActiveRequestBias is Envoy's default active_request_bias.
const DefaultActiveRequestBias = 1.0

// maxBias is the largest bias of [WeightedLeastRequest]: a power of the
// largest request count by it, in logarithms, stays far from overflow.
const maxBias = 1e6

type weightedLeastRequest struct {
	bias float64

	mu      sync.Mutex // protects gen and current
	gen     uint64
	current []float64 // smooth weighted round robin credit per member
}

// WeightedLeastRequest returns Envoy's weighted least request policy for
// heterogeneous endpoints. When every candidate has the same effective weight
// it is [P2C] over [RequestsScore]. Otherwise each candidate's dynamic weight
// is
//
//	weight / (requests + 1)^bias
//
// and candidates are chosen by smooth weighted round robin over the dynamic
// weights, so an idle pool receives requests in proportion to the weights and
// a loaded one leans towards the endpoints with fewer requests. bias 0 is
// weighted round robin; larger values approach least outstanding. A bias
// outside [0, 1e6] (or NaN) is an error. Give each Balancer its own policy.
func WeightedLeastRequest(bias float64) (Policy, error) {
	if !(bias >= 0 && bias <= maxBias) {
		return nil, policyErrorf("weighted least request bias %v out of range [0, %g]", bias, float64(maxBias))
	}
	return &weightedLeastRequest{bias: bias}, nil
}

func (p *weightedLeastRequest) Choose(c *Candidates) int {
	n := c.Len()
	// Known equal weights spare reading every candidate's weight, a
	// cache line that other cores' picks write.
	equal := c.unitWeights()
	if !equal {
		w0 := c.Weight(0)
		equal = true
		for i := 1; i < n && equal; i++ {
			equal = c.Weight(i) == w0
		}
	}
	if equal {
		return p2c{byRequests}.Choose(c)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen != c.Generation() || len(p.current) != c.Members() {
		p.gen = c.Generation()
		p.current = make([]float64, c.Members())
	}
	ws := growFloat64(c.costs, n)
	c.costs = ws
	total, most := 0.0, 0.0
	for i := 0; i < n; i++ {
		l := c.Load(i)
		w := l.Weight
		if p.bias == 1 {
			w /= float64(l.Requests) + 1
		} else if p.bias != 0 {
			w /= math.Pow(float64(l.Requests)+1, p.bias)
		}
		ws[i] = w
		total += w
		most = max(most, w)
	}
	switch {
	case math.IsInf(total, 1):
		// Weights near the largest float64 sum past it, and the credits
		// would turn to NaN: scale them by a power of two, which keeps
		// their ratios exact.
		total = 0
		for i := range ws {
			ws[i] *= 0x1p-64
			total += ws[i]
		}
	case most < minDynamicWeight:
		// Every dynamic weight underflowed, to 0 or to a few bits of
		// precision (a large bias or count, a tiny weight): the credits
		// would stop moving and every request go to one endpoint.
		total = p.rescale(c, ws)
	}
	// With steady weights a credit stays within about the weights' total
	// either way (1.2 times it at most in simulations). When the loads jump
	// (a signal reporting ten thousand requests where there were none), the
	// dynamic weights shrink by as much, and credits earned at the old
	// scale would outweigh them for as many picks, every one to the
	// endpoint holding the largest: bound them by twice the present total,
	// which steady weights do not reach.
	bound := 2 * total
	best, ties := -1, 0
	total = 0
	for i := 0; i < n; i++ {
		w := ws[i]
		m := c.Member(i)
		p.current[m] = min(max(p.current[m], -bound), bound) + w
		total += w
		switch {
		case best < 0 || p.current[m] > p.current[c.Member(best)]:
			best, ties = i, 1
		case p.current[m] == p.current[c.Member(best)]:
			ties++
			if c.Uint64N(uint64(ties)) == 0 {
				best = i
			}
		}
	}
	p.current[c.Member(best)] -= total
	return best
}

// minDynamicWeight is the least largest dynamic weight of a pick that
// weightedLeastRequest uses as computed; below it they are recomputed in
// logarithms (see rescale). Its square is still a normal float64, so that
// a weight that is a small fraction of the largest keeps its precision.
const minDynamicWeight = 0x1p-500

// rescale sets ws to the candidates' dynamic weights divided by the
// largest, computed in logarithms, so that their ratios survive weights
// and powers beyond the range of a float64, and returns their sum.
func (p *weightedLeastRequest) rescale(c *Candidates, ws []float64) (total float64) {
	most := math.Inf(-1)
	for i := range ws {
		l := c.Load(i)
		// An effective weight that underflowed to 0 counts as the least
		// positive one, so that the logarithm stays finite.
		w := max(l.Weight, math.SmallestNonzeroFloat64)
		ws[i] = math.Log(w) - p.bias*math.Log(float64(l.Requests)+1)
		most = max(most, ws[i])
	}
	for i := range ws {
		ws[i] = math.Exp(ws[i] - most)
		total += ws[i]
	}
	return total
}
