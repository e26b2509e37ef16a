package llmlb

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/llmlb/llmlb/prefix"
)

// Defaults of [DefaultConfig].
const (
	// DefaultSampled is the number of candidates drawn at random besides the
	// prefix holders.
	DefaultSampled = 2
	// DefaultHolders is the number of longest-prefix holders always
	// considered.
	DefaultHolders = 2
	// DefaultKVPenalty is the cost, in prefill tokens, of each token of KV
	// demand beyond an endpoint's capacity.
	DefaultKVPenalty = 2.0
)

// DefaultConfig configures [Default]. The zero value selects every default.
type DefaultConfig struct {
	// Index holds which endpoint has which prompt blocks; its block size
	// must be that of Request.Prefix. Nil means a new index with the
	// defaults of package prefix. Feed it engine KV events for precise
	// matching; otherwise the policy's own decisions feed it.
	Index *prefix.Index
	// Sampled is the number of candidates drawn at random for each pick, in
	// addition to the Holders candidates with the longest cached prefix.
	// Zero means [DefaultSampled]; a negative value scores every candidate.
	Sampled int
	// Holders is the number of candidates with the longest cached prefix
	// always scored. Zero means [DefaultHolders]; negative means none.
	Holders int
	// KVPenalty is the cost, in prefill tokens, of each token of estimated
	// KV demand beyond an endpoint's capacity (where requests wait for
	// memory or are preempted). Zero means [DefaultKVPenalty].
	KVPenalty float64
}

type defaultPolicy struct {
	t         *prefixTracker
	sampled   int
	holders   int
	kvPenalty float64
	avgPrompt atomic.Uint64 // float64 bits: moving average of prompt tokens
}

// Default returns the policy this package recommends for LLM traffic. It
// estimates, for each endpoint it considers, the prefill work the request
// would wait behind plus its own uncached prompt, and takes the cheapest:
//
//	cost = queued prefill tokens + prompt tokens - cached prompt tokens
//	       + KVPenalty * max(0, KV demand - KV capacity)
//
// divided by the endpoint's effective weight (slow start, static weight).
// Queued prefill is this balancer's requests before their first token plus,
// with a fresh signal, the other routers' waiting requests at the mean prompt
// length; cached tokens come from the prefix index; KV demand is the
// reported (or, without a signal, estimated) KV usage plus the queued work
// plus this request. A cached prefix therefore wins exactly as long as the
// queue in front of it is shorter than the prefill it saves: affinity decays
// with load by construction, with no threshold to tune, and a popular prefix
// cannot bury its holder.
//
// It scores the Holders candidates with the longest cached prefix plus
// Sampled candidates drawn at random (not every candidate): the holders
// keep locality, and the random draws keep several routers sharing a stale
// view from stampeding onto the same endpoint, as in [P2C]. Ties are broken
// at random. The choice is recorded in the index and its cached tokens are
// not charged as prefill. Give each Balancer its own policy; several may
// share one Index.
func Default(cfg DefaultConfig) (Policy, error) {
	if cfg.Sampled == 0 {
		cfg.Sampled = DefaultSampled
	}
	if cfg.Holders == 0 {
		cfg.Holders = DefaultHolders
	}
	if cfg.KVPenalty == 0 {
		cfg.KVPenalty = DefaultKVPenalty
	}
	if !(cfg.KVPenalty >= 0) || math.IsInf(cfg.KVPenalty, 0) {
		return nil, fmt.Errorf("llmlb: default KV penalty %v must be finite and non-negative", cfg.KVPenalty)
	}
	t, err := newPrefixTracker(cfg.Index)
	if err != nil {
		return nil, err
	}
	return &defaultPolicy{t: t, sampled: cfg.Sampled, holders: max(cfg.Holders, 0), kvPenalty: cfg.KVPenalty}, nil
}

func (p *defaultPolicy) Choose(c *Candidates) int {
	n := c.Len()
	avg := p.observePrompt(float64(c.req.PromptTokens))
	p.t.match(c)

	// The candidates to score: holders of the longest prefixes, then random
	// draws, each once (c.seen marks them by candidate index).
	c.seen = growBool(c.seen, n)
	clear(c.seen)
	pick := c.ties[:0]
	if p.sampled < 0 || p.holders+p.sampled >= n {
		for i := 0; i < n; i++ {
			pick = append(pick, int32(i))
		}
	} else {
		for h := 0; h < p.holders; h++ {
			best, bestBlocks := -1, int32(0)
			for i := 0; i < n; i++ {
				if !c.seen[i] && c.matched[i] > bestBlocks {
					best, bestBlocks = i, c.matched[i]
				}
			}
			if best < 0 {
				break
			}
			c.seen[best] = true
			pick = append(pick, int32(best))
		}
		for drawn := 0; drawn < p.sampled; {
			i := int(c.Uint64N(uint64(n)))
			if c.seen[i] {
				continue
			}
			c.seen[i] = true
			pick = append(pick, int32(i))
			drawn++
		}
	}

	c.loads = growLoads(c.loads, n)
	best, bestCost, ties := -1, math.Inf(1), 0
	for _, ii := range pick {
		i := int(ii)
		l := &c.loads[i]
		c.loadInto(i, l)
		cost := p.cost(c, i, l, avg) / l.Weight
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
	c.ties = pick[:0]
	if best < 0 { // every cost NaN: cannot happen with validated inputs
		best = int(pick[c.Uint64N(uint64(len(pick)))])
	}
	p.t.record(c, best, &c.loads[best])
	return best
}

// cost is the estimated prefill work, in tokens, in front of and of the
// request on candidate i, plus the KV overcommitment penalty.
func (p *defaultPolicy) cost(c *Candidates, i int, l *EndpointLoad, avgPrompt float64) float64 {
	prompt := float64(c.req.PromptTokens)
	cached := float64(p.t.cachedTokens(c, int(c.matched[i])))
	queued := float64(l.PrefillTokens)
	if l.Fresh {
		queued += float64(max(l.Waiting-l.Queued, 0)) * avgPrompt
	}
	work := queued + prompt - cached
	capacity := kvCapacity(l)
	demand := kvUsage(l)*capacity + queued + prompt - cached + float64(c.reqTok-int64(c.req.PromptTokens))
	return work + p.kvPenalty*max(demand-capacity, 0)
}

// observePrompt folds a prompt length into the moving average (weight 1/64)
// and returns the average before it.
func (p *defaultPolicy) observePrompt(x float64) float64 {
	for {
		old := p.avgPrompt.Load()
		avg := math.Float64frombits(old)
		next := x
		if old != 0 {
			next = avg + (x-avg)/64
		}
		if p.avgPrompt.CompareAndSwap(old, math.Float64bits(next)) {
			if old == 0 {
				return x
			}
			return avg
		}
	}
}

func growBool(s []bool, n int) []bool {
	if cap(s) < n {
		return make([]bool, n)
	}
	return s[:n]
}
