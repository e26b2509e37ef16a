package llmlb

import (
	"math"
	"reflect"
)

// A Score rates candidate i of c, whose load estimate is l, for the request
// being picked; lower is better. A score should be the candidate's load after
// it takes the request (so it is positive even for an idle endpoint): the
// selectors divide it by the candidate's effective weight l.Weight, which
// makes heavier endpoints and endpoints out of slow start take proportionally
// more. NaN scores lose to any number. Concurrent picks call a Score at the
// same time: it must be safe for concurrent use, and it should not block.
type Score func(c *Candidates, i int, l *EndpointLoad) float64

// RequestsScore is the estimated number of requests at the endpoint,
// counting this one: [EndpointLoad.Requests] + 1.
func RequestsScore(c *Candidates, i int, l *EndpointLoad) float64 {
	return float64(l.Requests) + 1
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
//
// An endpoint without a fresh KV usage (never observed, observed longer ago
// than the maximum signal age, or reporting none) is not assumed empty: its
// usage is the mean usage of the candidates that have one, or the KV
// footprint of this balancer's own requests there past prefill if that is
// larger, as grpc-go's weighted round robin gives an endpoint without a
// weight the mean weight of the others. A replica whose metrics cannot be
// read then takes its share of the traffic, not all of it. When no
// candidate has a fresh KV usage, the usage is that footprint alone. The
// footprint is counted against the reported capacity or
// [DefaultKVCapacityTokens]. The mean is computed once per pick, the first
// time a candidate without a KV usage is scored: under [P2C] such a pick
// reads every candidate's observation.
func KVScore(c *Candidates, i int, l *EndpointLoad) float64 {
	usage := kvUsage(l)
	if math.IsNaN(l.KVUsage) {
		// grpc-go v1.83.1, balancer/weightedroundrobin/scheduler.go
		// (newScheduler): "Backends with weight = 0 use the mean", the
		// mean of the non-zero weights; balancer.go (endpointWeight.weight)
		// gives 0 to an endpoint with no load report or a stale one.
		if mean, ok := c.kvUsageMean(); ok {
			usage = max(usage, mean)
		}
	}
	return usage + float64(l.PrefillTokens+c.RequestTokens()+1)/kvCapacity(l)
}

// kvUsageMean returns the mean of the candidates' fresh KV usages, each
// corrected as [EndpointLoad].KVUsage is, and whether any candidate has
// one. It computes the mean at its first call of a pick (or after Narrow)
// and keeps it for the rest.
func (c *Candidates) kvUsageMean() (float64, bool) {
	if c.kvMean.done {
		return c.kvMean.mean, c.kvMean.ok
	}
	sum, k := 0.0, 0
	if c.b.signal != nil && !c.b.unobserved() {
		var l EndpointLoad // not c.scratch: it may hold the load being scored
		for j := range c.Len() {
			c.loadInto(j, &l)
			if !math.IsNaN(l.KVUsage) {
				sum += l.KVUsage
				k++
			}
		}
	}
	c.kvMean = kvMean{done: true, ok: k > 0}
	if k > 0 {
		c.kvMean.mean = sum / float64(k)
	}
	return c.kvMean.mean, c.kvMean.ok
}

// kvMean is the mean KV usage of a pick's candidates (see kvUsageMean).
type kvMean struct {
	mean     float64
	ok, done bool // some candidate has a KV usage; mean and ok are set
}

// isRequestsScore reports whether s is [RequestsScore], which the selectors
// evaluate without building the whole load estimate when the balancer has no
// signal.
func isRequestsScore(s Score) bool { return sameFunc(s, RequestsScore) }

// sameFunc reports whether a and b are the same function.
func sameFunc(a, b Score) bool { return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer() }

// scorer is a Score plus whether it is [RequestsScore] or [TokensScore].
type scorer struct {
	score    Score
	requests bool
	tokens   bool
}

func newScorer(s Score) scorer {
	if s == nil {
		s = RequestsScore
	}
	return scorer{s, isRequestsScore(s), sameFunc(s, TokensScore)}
}

// How scorer.weighted evaluates a score for a pick.
const (
	general      = iota // the score on the whole load estimate
	requests            // RequestsScore without a signal: one counter
	requestsSlow        // the same while some member is in slow start
	tokens              // TokensScore without a signal: the two packed words
)

// mode returns how s is evaluated for c: RequestsScore on a balancer without
// a signal is this balancer's outstanding requests plus one, read from one
// counter instead of the whole load estimate, and TokensScore is read from
// this balancer's token counts alike.
func (s scorer) mode(c *Candidates) int {
	switch {
	case c.b.signal != nil:
		return general
	case s.requests && c.b.slowUntil.Load() != never:
		return requestsSlow
	case s.requests:
		return requests
	case s.tokens:
		return tokens
	}
	return general
}

// weighted returns candidate i's score divided by its effective weight, with
// NaN mapped to +Inf so that it always loses; mode is s.mode(c).
func (s scorer) weighted(c *Candidates, i int, mode int) float64 {
	switch mode {
	case general:
		return weighted(c, s.score, i)
	case tokens:
		return tokensScore(c, i)
	}
	return countScore(c, i, mode == requestsSlow)
}

// tokensScore is weighted(c, TokensScore, i) on a balancer without a
// signal, the same number computed from the counts alone.
func tokensScore(c *Candidates, i int) float64 {
	st := c.state(i)
	var n counts
	st.countsInto(&n)
	s := (float64(n.prefill+n.decode+c.reqTok) + 1) / c.weight(st)
	if s != s { // NaN
		return math.Inf(1)
	}
	return s
}

// countScore is [RequestsScore] of candidate i divided by its effective
// weight, on a balancer without a signal; slow says whether some member may
// be in slow start.
func countScore(c *Candidates, i int, slow bool) float64 {
	st := c.state(i)
	if slow {
		return float64(st.outstanding()+1) / c.weight(st)
	}
	return float64(st.outstanding()+1) / st.staticWeight()
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

type p2c struct{ s scorer }

// P2C returns the power-of-two-choices policy over score: it samples two
// distinct candidates uniformly at random and picks the one with the lower
// weighted score, at random on a tie. Sampling instead of scanning keeps the
// cost of a pick constant and keeps several balancers that see the same stale
// signal from stampeding onto the same endpoint. A nil score means
// [RequestsScore].
func P2C(score Score) Policy { return p2c{newScorer(score)} }

func (p p2c) Choose(c *Candidates) int {
	n := uint64(c.Len())
	if n == 1 {
		return 0
	}
	a, b, x := p2cDraw(c, n)
	mode := p.s.mode(c)
	return p2cPick(a, b, p.s.weighted(c, a, mode), p.s.weighted(c, b, mode), x)
}

// chooseCounts is Choose for [RequestsScore]. Unlike Choose, it never
// calls a Score, so its c does not escape.
func (p p2c) chooseCounts(c *Candidates) int {
	n := uint64(c.Len())
	if n == 1 {
		return 0
	}
	a, b, x := p2cDraw(c, n)
	if c.b.signal != nil {
		return p2cPick(a, b, requestsScore(c, a), requestsScore(c, b), x)
	}
	slow := c.b.slowUntil.Load() != never
	return p2cPick(a, b, countScore(c, a, slow), countScore(c, b, slow), x)
}

// requestsScore is weighted(c, RequestsScore, i) on a balancer with a
// signal, evaluated without the call through a Score, and without the
// whole load estimate when the candidate has no fresh observation.
func requestsScore(c *Candidates, i int) float64 {
	st := c.state(i)
	var buf Load
	obs := c.b.load(st, &buf)
	if obs == nil || !c.fresh(obs) {
		// The estimated requests are this balancer's own.
		s := float64(st.outstanding()) + 1
		if w := c.weight(st); w != 1 {
			s /= w
		}
		return s
	}
	l := &c.scratch
	c.ownLoad(st, l)
	observedLoad(st, l, obs, c.b.unixNano(obs.At), c.b.maxAge)
	s := (float64(l.Requests) + 1) / l.Weight
	if s != s { // NaN
		return math.Inf(1)
	}
	return s
}

// p2cDraw samples two distinct candidates of n > 1. One 64-bit draw gives
// both samples and the tie-break: the high half picks a, the low half picks
// b among the others (multiply-shift; the bias is below n/2^32), and the
// lowest bit, which moves b only across a boundary of its range, breaks a
// tie (see p2cPick).
func p2cDraw(c *Candidates, n uint64) (a, b int, x uint64) {
	x = c.b.uint64()
	a = int((x >> 32 * n) >> 32)
	b = int((x & (1<<32 - 1) * (n - 1)) >> 32)
	if b >= a {
		b++
	}
	return a, b, x
}

// p2cPick returns the lower scored of a and b, by x's lowest bit on a tie.
func p2cPick(a, b int, sa, sb float64, x uint64) int {
	switch {
	case sa < sb:
		return a
	case sb < sa:
		return b
	case x&1 == 0:
		return a
	default:
		return b
	}
}

type leastScore struct{ s scorer }

// LeastScore returns the full-scan policy over score: it picks the candidate
// with the lowest weighted score, uniformly at random among exact ties. It
// is the most accurate choice for a single balancer with fresh counts; with
// several balancers sharing a stale signal prefer [P2C].
func LeastScore(score Score) Policy { return leastScore{newScorer(score)} }

func (p leastScore) Choose(c *Candidates) int { return argmin(c, p.s) }

// byRequests is the scorer of [RequestsScore].
var byRequests = newScorer(RequestsScore)

// argmin returns the candidate with the lowest weighted score, uniformly at
// random among exact ties (never by position).
func argmin(c *Candidates, sc scorer) int {
	mode := sc.mode(c)
	if mode == requests && c.all && c.snap.unit {
		return argminOutstanding(c)
	}
	n := c.Len()
	if cap(c.ties) < n {
		c.ties = make([]int32, n)
	}
	ties, k, bestScore := c.ties[:n], 0, math.Inf(1)
	for i := range n {
		s := sc.weighted(c, i, mode) // never NaN, so some candidate ties
		if s < bestScore {
			bestScore, k = s, 0
		} else if s != bestScore {
			continue
		}
		ties[k] = int32(i)
		k++
	}
	if k == 1 {
		return int(ties[0])
	}
	return int(ties[c.Uint64N(uint64(k))])
}

// argminOutstanding is argmin of [RequestsScore] when every member is a
// candidate of weight 1 and there is no signal: the score is then the exact
// integer outstanding+1, so comparing the counts makes the same choice,
// drawing the same random numbers.
func argminOutstanding(c *Candidates) int {
	eps := c.snap.eps
	if cap(c.ties) < len(eps) {
		c.ties = make([]int32, len(eps))
	}
	ties, k := c.ties[:len(eps)], 0
	if !c.b.spilled.Load() {
		// No member's counts spilled, so the packed word holds them: one
		// load per member. The ties are written by position, not
		// appended, which keeps the scan's state in registers. (One loop
		// for both cases, and testing n < best first, each measured
		// slower at 512 members.)
		best := uint64(math.MaxUint64)
		for i, st := range eps {
			n := st.reqs.Load() >> 32 & low16
			if n > best {
				continue
			}
			if n < best {
				best, k = n, 0
			}
			ties[k] = int32(i)
			k++
		}
	} else {
		best := int64(math.MaxInt64)
		for i, st := range eps {
			n := st.outstanding()
			if n > best {
				continue
			}
			if n < best {
				best, k = n, 0
			}
			ties[k] = int32(i)
			k++
		}
	}
	if k == 1 {
		return int(ties[0])
	}
	return int(ties[c.Uint64N(uint64(k))])
}
