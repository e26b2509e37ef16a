package sim

import (
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb"
)

// oracle is the full-info policy: perfect knowledge. It reads the true state of
// every replica (running and waiting sequences, their true remaining prefill
// and output, the prefix cache) and the true output length of the request,
// scores each replica with llmlb.Default's cost computed from that state, and
// adds a large penalty for every request the choice is predicted to push past
// the SLO (the request itself, and decoding sequences its prefill would
// stall); ties are broken at random. It knows everything but still decides
// greedily, one request at a time: it shows what better information buys a
// greedy cost, and is no upper bound on what a policy can reach (under
// overload Default's estimates beat it).
type oracle struct {
	run     *runner
	waiting float64 // mean backlog per replica, smoothed as Default does
	rem     []int   // scratch: remaining outputs of a replica's running sequences
}

func newOracle(env *PolicyEnv) (llmlb.Policy, error) { return &oracle{run: env.run}, nil }

func (o *oracle) Choose(c *llmlb.Candidates) int {
	s := o.run.current
	// k weighs uncached prompt tokens as llmlb.Default does when it reads
	// engine KV events (the oracle knows the caches exactly), from the true
	// mean backlog.
	waiting := 0 // requests before their first token, as Default counts them
	for i, n := 0, c.Len(); i < n; i++ {
		rep := o.run.reps[c.Member(i)]
		waiting += rep.NumWaiting()
		for _, s := range rep.Running() {
			if s.Generated() == 0 {
				waiting++
			}
		}
	}
	o.waiting += (float64(waiting)/float64(c.Len()) - o.waiting) / 100
	k := llmlb.DefaultEventsCacheWeight + llmlb.DefaultOverloadWeight*max(o.waiting-llmlb.DefaultOverloadQueue, 0)
	best, bestCost, ties := 0, math.Inf(1), 0
	for i, n := 0, c.Len(); i < n; i++ {
		cost := o.cost(o.run.reps[c.Member(i)], s.req, k)
		switch {
		case cost < bestCost:
			best, bestCost, ties = i, cost, 1
		case cost == bestCost:
			ties++
			if c.Uint64N(uint64(ties)) == 0 {
				best = i
			}
		}
	}
	return best
}

// cost scores req on rep with the cost of llmlb.Default, in prompt tokens,
// computed from the true state instead of estimates: the prefill tokens
// truly queued ahead, the wait for a batch slot (in the prefill tokens the
// engine would process meanwhile), k times the prompt tokens truly not
// cached, half the KV footprint the replica will reach (its used blocks plus
// what its sequences still need, with true output lengths), and twice the
// KV demand beyond capacity, which causes preemptions.
func (o *oracle) cost(rep *replica, req *Request, k float64) float64 {
	bs := rep.Engine().BlockSize
	queued := 0 // prefill tokens ahead of req
	demand := rep.KVUsed()
	for _, s := range rep.Running() {
		queued += s.Target() - s.Computed()
		demand += rep.BlocksFor(s.Target()+s.OutputTokens-s.Generated()) - rep.BlocksFor(s.Computed()+s.Decoded())
	}
	for _, s := range rep.Waiting() {
		queued += s.Target() - s.Computed()
		demand += rep.BlocksFor(s.Target() + s.OutputTokens - s.Generated())
	}
	footprint := float64(demand * bs)
	hit := rep.MatchTokens(req.Prefix, req.BlockTokens, req.PromptTokens)
	demand += rep.BlocksFor(req.PromptTokens - hit + req.OutputTokens)
	over := float64((demand - rep.KVTotal()) * bs)
	slotMs := o.slotWait(rep)
	slotTokens := slotMs / MockerPrefillMillis(rep.Engine().TokenBudget) * float64(rep.Engine().TokenBudget)
	cost := float64(queued) + slotTokens + k*float64(req.PromptTokens-hit) + 0.5*footprint + 2*max(over, 0)
	return cost + 1e6*float64(o.damage(rep, req, queued, hit, slotMs))
}

// slotWait returns how long, in milliseconds, a request sent to rep now
// would wait for a batch slot: until as many running sequences finish as
// there are requests ahead of it beyond the free slots, from their true
// remaining outputs at the current decode speed.
func (o *oracle) slotWait(rep *replica) float64 {
	ahead := rep.NumWaiting() + 1 - (rep.Engine().MaxRunning - len(rep.Running()))
	if ahead <= 0 || len(rep.Running()) == 0 {
		return 0
	}
	o.rem = o.rem[:0]
	for _, s := range rep.Running() {
		o.rem = append(o.rem, s.OutputTokens-s.Generated())
	}
	slices.Sort(o.rem)
	// Beyond one round of completions, count whole rounds of the longest.
	rounds := (ahead - 1) / len(o.rem)
	tokens := o.rem[(ahead-1)%len(o.rem)] + rounds*o.rem[len(o.rem)-1]
	return float64(tokens) * MockerDecodeMillis(rep.KVUsage())
}

// damage counts the requests that sending req to rep would push past the
// SLO: req itself if its predicted TTFT (after slotMs waiting for a batch
// slot) misses it, and every decoding
// sequence whose predicted TPOT its prefill chunks would push over the SLO.
func (o *oracle) damage(rep *replica, req *Request, queued, hit int, slotMs float64) int {
	eng, slo, now := rep.Engine(), o.run.cfg.SLO, o.run.now
	uncached := req.PromptTokens - hit
	chunkMs := MockerPrefillMillis(eng.TokenBudget)
	u := rep.KVUsage()
	decodeMs := MockerDecodeMillis(u)
	iters := float64(queued+uncached)/float64(eng.TokenBudget) + 1
	n := 0
	if time.Duration((slotMs+iters*(chunkMs+decodeMs))*float64(time.Millisecond)) > slo.TTFT {
		n++
	}
	// The request's prefill adds about this much to each co-running decode.
	stall := float64(uncached) / float64(eng.TokenBudget) * chunkMs
	sloMs := float64(slo.TPOT) / float64(time.Millisecond)
	for _, s := range rep.Running() {
		out := s.OutputTokens
		if s.Generated() == 0 || out <= 1 {
			continue
		}
		elapsed := float64(now-o.run.st[s.ID].firstToken) / float64(time.Millisecond)
		rest := float64(out-s.Generated()) * decodeMs
		before := (elapsed + rest) / float64(out-1)
		if before <= sloMs && before+stall/float64(out-1) > sloMs {
			n++
		}
	}
	return n
}
