package llmlb

import (
	"math"

	"github.com/llmlb/llmlb/prefix"
)

// Defaults of [GIEConfig], those of the Gateway API Inference Extension
// endpoint picker v1.5.0 (kubernetes-sigs/gateway-api-inference-extension,
// tag v1.5.0, commit df9f8909).
const (
	// DefaultGIEQueueWeight, DefaultGIEKVWeight and DefaultGIEPrefixWeight
	// are the scorer weights of the picker's default scheduling profile
	// (loadDefaultConfig in pkg/epp/config/loader/defaults.go: queue 2.0,
	// KV-cache utilization 2.0, prefix cache 3.0).
	DefaultGIEQueueWeight  = 2
	DefaultGIEKVWeight     = 2
	DefaultGIEPrefixWeight = 3
	// DefaultGIEMaxPrefixBlocks is how many leading prompt blocks the
	// picker's approximate prefix index hashes, matches and records
	// (defaultMaxPrefixBlocks in
	// pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/types.go).
	// Its blocks are the engine's block size in tokens (16 for vLLM) times 4
	// characters a token, 64 characters of the request body each.
	DefaultGIEMaxPrefixBlocks = 256
)

// GIEConfig configures [GIEDefault]. The zero value is the published default
// profile.
type GIEConfig struct {
	// Index holds which endpoint has which prompt blocks. Nil means a new
	// index with the defaults of package prefix. The picker's own index is
	// an LRU per endpoint sized from the engine's reported KV blocks, with
	// no expiry: give an index with an unbounded TTL to model it.
	Index *prefix.Index
	// QueueWeight, KVWeight and PrefixWeight weigh the three scorers. All
	// zero means the default profile: [DefaultGIEQueueWeight],
	// [DefaultGIEKVWeight] and [DefaultGIEPrefixWeight]. Each must be in
	// [0, 1e12].
	QueueWeight, KVWeight, PrefixWeight float64
	// MaxPrefixBlocks bounds the leading prompt blocks matched and recorded,
	// in the picker's blocks (see MinBlockTokens). Zero means
	// [DefaultGIEMaxPrefixBlocks]; negative means no bound.
	MaxPrefixBlocks int
	// MinBlockTokens, if above the engines' KV block size, is the size of
	// the picker's blocks, at most 2^24 tokens. llm-d's router, the
	// picker's successor, hashes blocks of the engine's size but at least
	// 64 tokens (minBlockSizeTokens in
	// pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/plugin.go
	// of llm-d/llm-d-router v0.10.0), and matches up to 131,072 tokens of a
	// prompt, 2,048 such blocks. The request's prefix blocks (of the
	// Index's block size) are then grouped MinBlockTokens / block size at
	// a time, rounded up, each group identified by the chained hash of its
	// last block; a partial group at the end is not hashed. The index is
	// sized as the picker sizes its LRU: one entry per engine KV block,
	// each standing for MinBlockTokens tokens. 0 means the engines' blocks,
	// as the v1.5.0 picker hashes them.
	MinBlockTokens int
}

type gie struct {
	t                  *prefixTracker
	wQueue, wKV, wPref float64
}

// GIEDefault returns the default scheduling profile of the Kubernetes
// Gateway API Inference Extension endpoint picker (v1.5.0), as a baseline:
// each candidate gets the weighted sum of three scores in [0, 1],
//
//	queue:  (maxQ - q) / (maxQ - minQ), 1 when all queues are equal (weight 2)
//	kv:     1 - KV usage                                          (weight 2)
//	prefix: matched blocks / hashed blocks                        (weight 3)
//
// and the highest total wins, at random among ties (the max-score picker
// shuffles before a stable sort). q and the KV usage are the engine's own
// numbers from the signal's last observation, as the picker reads its last
// metrics poll, without this balancer's dispatches since; an endpoint with
// no fresh observation falls back to this balancer's queued requests and
// outstanding tokens. The prefix score divides the leading blocks matched
// by the blocks hashed, at most MaxPrefixBlocks. The choice is recorded in
// the index, as the picker's prefix plugin does, and the index is sized from
// the engines' reported KV capacity. The inference gateway v1.6.0 moved the
// picker to llm-d's router, whose v0.10.0 keeps this profile, its weights
// and its 50 ms metrics refresh, with blocks of at least 64 tokens
// ([GIEConfig].MinBlockTokens) matched over up to 131,072 tokens of a
// prompt. Give each Balancer its own policy; several over the same
// endpoints may share one Index (a balancer that removes an endpoint
// removes its blocks for all).
func GIEDefault(cfg GIEConfig) (Policy, error) {
	if cfg.QueueWeight == 0 && cfg.KVWeight == 0 && cfg.PrefixWeight == 0 {
		cfg.QueueWeight, cfg.KVWeight, cfg.PrefixWeight = DefaultGIEQueueWeight, DefaultGIEKVWeight, DefaultGIEPrefixWeight
	}
	for _, f := range []struct {
		name string
		w    float64
	}{{"QueueWeight", cfg.QueueWeight}, {"KVWeight", cfg.KVWeight}, {"PrefixWeight", cfg.PrefixWeight}} {
		if !(f.w >= 0 && f.w <= maxCostWeight) {
			return nil, policyErrorf("GIE scorer %s %v out of range [0, %g]", f.name, f.w, maxCostWeight)
		}
	}
	if cfg.MinBlockTokens < 0 || cfg.MinBlockTokens > 1<<24 {
		return nil, policyErrorf("GIE minimum block of %d tokens out of range [0, %d]", cfg.MinBlockTokens, 1<<24)
	}
	if cfg.MaxPrefixBlocks == 0 {
		cfg.MaxPrefixBlocks = DefaultGIEMaxPrefixBlocks
	}
	t, err := newPrefixTracker(cfg.Index)
	if err != nil {
		return nil, err
	}
	t.maxBlocks = max(cfg.MaxPrefixBlocks, 0)
	t.minBlockTokens = cfg.MinBlockTokens
	if stride := (cfg.MinBlockTokens + t.block - 1) / t.block; stride > 1 {
		t.stride = stride
		t.block = mulSat(t.block, stride)
	}
	return &gie{t: t, wQueue: cfg.QueueWeight, wKV: cfg.KVWeight, wPref: cfg.PrefixWeight}, nil
}

func (p *gie) Choose(c *Candidates) int {
	n := c.Len()
	c.loads = growLoads(c.loads, n)
	c.costs = growFloat64(c.costs, n)
	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		c.loadInto(i, l)
		// The picker scores the raw metrics of its last poll; c.costs holds
		// each candidate's KV usage until the scores replace it.
		// The queue stays an integer in l.Waiting: a count near the
		// largest int rounds up in a float64, and converting it back
		// would wrap it to a negative queue.
		q, kv := l.Queued, kvUsage(l)
		if c.b.signal != nil {
			var buf Load
			if obs := c.observe(c.state(i), &buf); obs != nil {
				q = int64(obs.Waiting)
				if !math.IsNaN(obs.KVUsage) {
					kv = obs.KVUsage
				}
			}
		}
		l.Waiting, c.costs[i] = q, kv
		minQ, maxQ = min(minQ, float64(q)), max(maxQ, float64(q))
	}
	p.t.match(c)
	blocks := float64(len(p.t.blocks(c)))
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - float64(l.Waiting)) / (maxQ - minQ)
		}
		kv := 1 - min(max(c.costs[i], 0), 1)
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
