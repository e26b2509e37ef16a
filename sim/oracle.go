package sim

import (
	"math"

	"github.com/llmlb/llmlb"
)

// oracle is the upper-bound policy. It reads the true state of every replica
// (running and waiting sequences, their true remaining prefill and output,
// the prefix cache) and the true output length of the request, and picks the
// replica where the request is predicted to finish its prefill soonest
// without pushing the replica's KV demand past its capacity; ties are broken
// at random.
type oracle struct{ run *runner }

func newOracle(env *PolicyEnv) (llmlb.Policy, error) { return &oracle{run: env.run}, nil }

func (o *oracle) Choose(c *llmlb.Candidates) int {
	s := o.run.current
	best, bestCost, ties := 0, math.Inf(1), 0
	for i, n := 0, c.Len(); i < n; i++ {
		cost := o.cost(o.run.reps[c.Member(i)], s.req)
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

// cost predicts, in milliseconds, the time to the first token of req on rep
// plus a penalty for KV overcommitment, which causes preemptions.
func (o *oracle) cost(rep *replica, req *Request) float64 {
	eng := rep.eng
	queued := 0 // prefill tokens ahead of req
	demand := rep.kv.used
	for _, s := range rep.running {
		queued += s.target - s.computed
		demand += rep.blocksFor(s.target+s.req.OutputTokens-s.generated) - rep.blocksFor(s.computed+s.decoded)
	}
	for _, s := range rep.waiting[rep.whead:] {
		queued += s.target - s.computed
		demand += rep.blocksFor(s.target + s.req.OutputTokens - s.generated)
	}
	hit := rep.matchTokens(req)
	work := queued + req.PromptTokens - hit
	demand += rep.blocksFor(req.PromptTokens - hit + req.OutputTokens)

	// Prefill proceeds in budget-sized chunks, each an iteration of the
	// engine's own time model alongside the running decodes.
	b := Batch{PrefillTokens: eng.TokenBudget, DecodeSeqs: len(rep.running), KVUsage: float64(rep.kv.used) / float64(rep.kv.total)}
	full := work / eng.TokenBudget
	ttft := float64(full) * ms(eng.IterTime(b))
	if rest := work - full*eng.TokenBudget; rest > 0 {
		b.PrefillTokens = rest
		ttft += ms(eng.IterTime(b))
	}
	over := float64(demand)/float64(rep.kv.total) - 1
	if over > 0 {
		ttft += over * 10000
	}
	return ttft
}
