package sim

import (
	"math"
	"time"

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

// cost scores req on rep with the cost of llmlb.Default, in prompt tokens,
// computed from the true state instead of estimates: the prefill tokens
// truly queued ahead, the prompt less four times the tokens truly cached,
// half the KV footprint the replica will reach (its used blocks plus what
// its sequences still need, with true output lengths), and twice the KV
// demand beyond capacity, which causes preemptions.
func (o *oracle) cost(rep *replica, req *Request) float64 {
	bs := rep.eng.BlockSize
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
	footprint := float64(demand * bs)
	hit := rep.matchTokens(req)
	demand += rep.blocksFor(req.PromptTokens - hit + req.OutputTokens)
	over := float64((demand - rep.kv.total) * bs)
	cost := float64(queued+req.PromptTokens) - 4*float64(hit) + 0.5*footprint + 2*max(over, 0)
	return cost + 1e6*float64(o.damage(rep, req, queued, hit))
}

// damage counts the requests that sending req to rep would push past the
// SLO: req itself if its predicted TTFT misses it, and every decoding
// sequence whose predicted TPOT its prefill chunks would push over the SLO.
func (o *oracle) damage(rep *replica, req *Request, queued, hit int) int {
	eng, slo, now := rep.eng, o.run.cfg.SLO, o.run.now
	uncached := req.PromptTokens - hit
	chunkMs := MockerPrefillMillis(eng.TokenBudget)
	u := float64(rep.kv.used) / float64(rep.kv.total)
	decodeMs := MockerDecodeMillis(u)
	iters := float64(queued+uncached)/float64(eng.TokenBudget) + 1
	n := 0
	if time.Duration(iters*(chunkMs+decodeMs)*float64(time.Millisecond)) > slo.TTFT {
		n++
	}
	// The request's prefill adds about this much to each co-running decode.
	stall := float64(uncached) / float64(eng.TokenBudget) * chunkMs
	sloMs := float64(slo.TPOT) / float64(time.Millisecond)
	for _, s := range rep.running {
		out := s.req.OutputTokens
		if s.generated == 0 || out <= 1 {
			continue
		}
		elapsed := float64(now-s.firstToken) / float64(time.Millisecond)
		rest := float64(out-s.generated) * decodeMs
		before := (elapsed + rest) / float64(out-1)
		if before <= sloMs && before+stall/float64(out-1) > sloMs {
			n++
		}
	}
	return n
}
