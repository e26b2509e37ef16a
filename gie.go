package llmlb

import (
	"math"

	"github.com/llmlb/llmlb/prefix"
)

// GIEConfig configures [GIEDefault]. The zero value is the published default
// profile.
type GIEConfig struct {
	// Index holds which endpoint has which prompt blocks. Nil means a new
	// index with the defaults of package prefix.
	Index *prefix.Index
	// QueueWeight, KVWeight and PrefixWeight weigh the three scorers. All
	// zero means the default profile: 2, 2 and 3.
	QueueWeight, KVWeight, PrefixWeight float64
}

type gie struct {
	t                  *prefixTracker
	wQueue, wKV, wPref float64
}

// GIEDefault returns the default scheduling profile of the Kubernetes
// Gateway API Inference Extension endpoint picker (as developed in llm-d), as
// a baseline: each candidate gets the weighted sum of three scores in [0, 1],
//
//	queue:  (maxQ - q) / (maxQ - minQ), 1 when all queues are equal (weight 2)
//	kv:     1 - KV usage                                          (weight 2)
//	prefix: matched blocks / prompt blocks                        (weight 3)
//
// and the highest total wins, at random among ties. q is the estimated number
// of waiting requests ([EndpointLoad.Waiting]); KV usage comes from the
// signal, or from this balancer's outstanding tokens when none reports it.
// The choice is recorded in the index, as the picker's prefix plugin does.
func GIEDefault(cfg GIEConfig) (Policy, error) {
	if cfg.QueueWeight == 0 && cfg.KVWeight == 0 && cfg.PrefixWeight == 0 {
		cfg.QueueWeight, cfg.KVWeight, cfg.PrefixWeight = 2, 2, 3
	}
	for _, w := range []float64{cfg.QueueWeight, cfg.KVWeight, cfg.PrefixWeight} {
		if !(w >= 0) || math.IsInf(w, 0) {
			return nil, policyErrorf("GIE scorer weight %v must be finite and non-negative", w)
		}
	}
	t, err := newPrefixTracker(cfg.Index)
	if err != nil {
		return nil, err
	}
	return &gie{t: t, wQueue: cfg.QueueWeight, wKV: cfg.KVWeight, wPref: cfg.PrefixWeight}, nil
}

func (p *gie) Choose(c *Candidates) int {
	n := c.Len()
	c.loads = growLoads(c.loads, n)
	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for i := 0; i < n; i++ {
		c.loadInto(i, &c.loads[i])
		q := float64(c.loads[i].Waiting)
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	p.t.match(c)
	blocks := float64(len(c.req.Prefix))
	c.costs = growFloat64(c.costs, n)
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - float64(l.Waiting)) / (maxQ - minQ)
		}
		kv := 1 - min(max(kvUsage(l), 0), 1)
		pref := 0.0
		if blocks > 0 {
			pref = float64(c.matched[i]) / blocks
		}
		c.costs[i] = -(p.wQueue*queue + p.wKV*kv + p.wPref*pref) // lower is better
	}
	i := pickBy(c, func(i int) (float64, float64) { return c.costs[i], 0 })
	p.t.record(c, i, &c.loads[i])
	return i
}

// kvCapacity is the endpoint's reported KV capacity in tokens, or
// [DefaultKVCapacityTokens].
func kvCapacity(l *EndpointLoad) float64 {
	if l.KVBlocks > 0 && l.BlockSize > 0 {
		return float64(l.KVBlocks) * float64(l.BlockSize)
	}
	return DefaultKVCapacityTokens
}

// kvUsage is the reported KV usage or, when none is reported, the footprint
// of this balancer's admitted requests (those past prefill) as a share of
// the capacity.
func kvUsage(l *EndpointLoad) float64 {
	if !math.IsNaN(l.KVUsage) {
		return l.KVUsage
	}
	return float64(l.ActiveTokens-l.PrefillTokens) / kvCapacity(l)
}
