package llmlb

import (
	"math"

	"github.com/llmlb/llmlb/prefix"
)

// KVCostConfig holds the weights of NVIDIA Dynamo's KV-block cost function.
// Unlike most configuration in this package its zero value is not the
// default, because a zero weight is meaningful: start from
// [DynamoKVCostConfig] and change what you need. Its Cost method only reads
// it and may be called from concurrent goroutines; [KVCost] keeps a copy,
// so changing a KVCostConfig afterwards does not change the policy. KVCost
// takes weights (OverlapScoreWeight, HostWeight, DiskWeight, ActiveWeight)
// in [0, 1e12], and any finite non-negative DecayK and Temperature.
type KVCostConfig struct {
	// Index holds which endpoint has which prompt blocks; costs are counted
	// in its blocks. Nil means a new index with the defaults of package
	// prefix.
	Index *prefix.Index
	// Active holds the distinct prompt blocks of the requests in flight at
	// each endpoint, for the decode term, as Dynamo's router tracks its
	// active sequences (router_track_active_blocks and
	// router_assume_kv_reuse, both on by default). The policy adds each
	// request at the endpoint it chooses and the Balancer releases it at
	// the pick's Done. Its block size must be the index's.
	// Nil means no such tracking: the decode term then counts the prompt
	// blocks of this balancer's outstanding requests, each request's in
	// full, as Dynamo's router_assume_kv_reuse off does (its decode router
	// under disaggregation runs so).
	Active *ActiveBlocks
	// NoDecode drops the decode term: the cost is the prefill alone (and
	// ActiveWeight's), as Dynamo's prefill router runs with
	// router_track_active_blocks off, prefill workers not decoding
	// (ai-dynamo/dynamo, docs/components/router, disaggregated serving).
	// Active must then be nil.
	NoDecode bool
	// OverlapScoreWeight is Dynamo's overlap_score_weight (its router's
	// --kv-overlap-score-weight, described in Dynamo's KV router
	// documentation): the weight of the prefill blocks, those of the
	// queued prefill and the prompt that the endpoint does not hold,
	// against the decode blocks. It multiplies the uncached prefill, not
	// the cached overlap: at 2 every block still to prefill costs twice as
	// much, so holders of the prompt win more often (time to first token);
	// towards 0 the decode load decides (inter-token latency). Dynamo's
	// default is 1.
	OverlapScoreWeight float64
	// DecayK brakes affinity as the endpoint's queued prefill grows beyond
	// the least queued candidate's: the device overlap is multiplied by
	// 1 / (1 + DecayK * excess_queued_blocks / request_blocks) before it
	// is subtracted from the prefill. 0 is no brake, as in Dynamo.
	DecayK float64
	// HostWeight and DiskWeight credit blocks cached in lower tiers; this
	// package's index knows only the device tier, so they apply to
	// [KVCostTerms] given by the caller.
	HostWeight, DiskWeight float64
	// ActiveWeight adds a cost per active request.
	ActiveWeight float64
	// Temperature > 0 samples endpoints with probability proportional to
	// exp(-(c - c_min) / ((c_max - c_min) * Temperature)) instead of taking
	// the cheapest; it spreads load when several routers share one view.
	Temperature float64
}

// DynamoKVCostConfig returns the published defaults of Dynamo's KV router
// (ai-dynamo/dynamo, KvRouterConfig::default in
// lib/kv-router/src/scheduling/config.rs): overlap score weight 1 (later
// releases split it into overlap_score_credit and prefill_load_scale, both 1,
// the same cost at their defaults), no decay, host 0.75, disk 0.25, no
// active-request weight, temperature 0 (the cheapest endpoint, random among
// exact ties since Dynamo PR 9516). Dynamo's router queue
// (router_queue_threshold) is off by default since its PR 11599 and is not
// modelled. Active is nil: set it to count active blocks as Dynamo does.
func DynamoKVCostConfig() KVCostConfig {
	return KVCostConfig{OverlapScoreWeight: 1, HostWeight: 0.75, DiskWeight: 0.25}
}

// KVCostTerms are the inputs of the cost of one endpoint, in KV blocks.
type KVCostTerms struct {
	// PrefillBlocks is the raw prefill: (queued prefill tokens + prompt
	// tokens) / block size.
	PrefillBlocks float64
	// RequestBlocks is the request's prompt in blocks.
	RequestBlocks float64
	// ExcessQueuedBlocks is the endpoint's queued prefill beyond the least
	// queued candidate's, in blocks.
	ExcessQueuedBlocks float64
	// DeviceOverlap, HostOverlap and DiskOverlap are the prompt blocks
	// cached on the endpoint per tier.
	DeviceOverlap, HostOverlap, DiskOverlap float64
	// DecodeBlocks is the potential decode load: the distinct prompt
	// blocks of the requests active at the endpoint plus this request's
	// blocks not already among them (Dynamo's potential_blocks; output
	// tokens are not counted, router_track_output_blocks being off by
	// default).
	DecodeBlocks float64
	// ActiveRequests is the number of requests at the endpoint.
	ActiveRequests float64
}

// Cost returns Dynamo's cost (its logit) of sending a request to an
// endpoint, in KV blocks:
//
//	decay   = 1 / (1 + DecayK * ExcessQueuedBlocks / RequestBlocks)
//	overlap = decay*DeviceOverlap + HostWeight*HostOverlap + DiskWeight*DiskOverlap
//	prefill = max(PrefillBlocks - overlap, 0)
//	cost    = OverlapScoreWeight*prefill + DecodeBlocks + ActiveWeight*ActiveRequests
//
// With DecayK, ActiveWeight and the lower tiers at 0 this is Dynamo's
// overlap_score_weight * prefill_blocks + decode_blocks. Dynamo's worked
// example, raw prefill 10 blocks on each of three workers holding 2, 5 and 8
// of them with decode blocks 10, 5 and 9, costs 18, 10 and 11 at weight 1
// (the second worker wins) and 26, 15 and 13 at weight 2 (the third wins).
func (cfg *KVCostConfig) Cost(t KVCostTerms) float64 {
	decay := 1.0
	if cfg.DecayK != 0 && t.RequestBlocks > 0 {
		decay = 1 / (1 + cfg.DecayK*t.ExcessQueuedBlocks/t.RequestBlocks)
	}
	overlap := decay*t.DeviceOverlap + cfg.HostWeight*t.HostOverlap + cfg.DiskWeight*t.DiskOverlap
	prefill := max(t.PrefillBlocks-overlap, 0)
	return cfg.OverlapScoreWeight*prefill + t.DecodeBlocks + cfg.ActiveWeight*t.ActiveRequests
}

func (cfg *KVCostConfig) validate() error {
	for _, f := range []struct {
		name   string
		v      float64
		weight bool // a weight of a term, at most maxCostWeight
	}{
		{"OverlapScoreWeight", cfg.OverlapScoreWeight, true}, {"DecayK", cfg.DecayK, false},
		{"HostWeight", cfg.HostWeight, true}, {"DiskWeight", cfg.DiskWeight, true}, {"ActiveWeight", cfg.ActiveWeight, true},
		{"Temperature", cfg.Temperature, false},
	} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return policyErrorf("KV cost %s %v must be finite and non-negative", f.name, f.v)
		}
		if f.weight && f.v > maxCostWeight {
			return policyErrorf("KV cost %s %v out of range [0, %g]", f.name, f.v, maxCostWeight)
		}
	}
	return nil
}

type kvCost struct {
	cfg KVCostConfig
	t   *prefixTracker
}

// KVCost returns the policy that sends each request to the endpoint of least
// [KVCostConfig.Cost], everything counted in KV blocks of the index's block
// size: raw prefill is the endpoint's queued prefill tokens (this balancer's
// requests before their first token, net of their expected cache hits) plus
// the prompt; the device overlap is the endpoint's matched prefix; the
// decode load is the distinct prompt blocks of the requests in flight there
// plus the request's blocks not among them ([KVCostConfig].Active). With
// Temperature > 0 it samples by softmax instead. The choice is recorded in
// the index. Give each Balancer its own policy; several over the same
// endpoints may share one Index (a balancer that removes an endpoint removes
// its blocks for all) and one ActiveBlocks.
func KVCost(cfg KVCostConfig) (Policy, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := newPrefixTracker(cfg.Index)
	if err != nil {
		return nil, err
	}
	if cfg.NoDecode && cfg.Active != nil {
		return nil, policyErrorf("KV cost with NoDecode tracks no active blocks: Active must be nil")
	}
	if cfg.Active != nil && cfg.Active.block != t.block {
		return nil, policyErrorf("KV cost active blocks of %d tokens, index blocks of %d", cfg.Active.block, t.block)
	}
	return &kvCost{cfg: cfg, t: t}, nil
}

func (p *kvCost) Choose(c *Candidates) int {
	n := c.Len()
	c.loads = growLoads(c.loads, n)
	minQueued := math.Inf(1)
	for i := 0; i < n; i++ {
		c.loadInto(i, &c.loads[i])
		minQueued = min(minQueued, float64(c.loads[i].PrefillTokens))
	}
	p.t.match(c)
	bs := float64(p.t.block)
	prompt := float64(c.req.PromptTokens)
	reqBlocks := prompt / bs
	fullBlocks := float64(c.req.PromptTokens / p.t.block)
	c.costs = growFloat64(c.costs, n)
	if a := p.cfg.Active; a != nil {
		a.mu.Lock()
	}
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		overlap := float64(c.matched[i])
		// Dynamo's potential decode blocks: the active blocks plus the
		// request's blocks not active there. Without active-block tracking,
		// each outstanding request's prompt counts in full.
		var decode float64
		switch a := p.cfg.Active; {
		case p.cfg.NoDecode: // no decode term
		case a != nil:
			active, added := a.potentialLocked(c.Key(i), c.req)
			decode = float64(active + added)
		default:
			decode = float64(l.ActiveTokens-l.DecodeTokens)/bs + fullBlocks
		}
		c.costs[i] = p.cfg.Cost(KVCostTerms{
			PrefillBlocks:      (float64(l.PrefillTokens) + prompt) / bs,
			RequestBlocks:      reqBlocks,
			ExcessQueuedBlocks: (float64(l.PrefillTokens) - minQueued) / bs,
			DeviceOverlap:      overlap,
			DecodeBlocks:       decode,
			ActiveRequests:     float64(l.Outstanding),
		}) / l.Weight
	}
	if a := p.cfg.Active; a != nil {
		a.mu.Unlock()
	}
	i := softmin(c, c.costs, p.cfg.Temperature)
	p.t.record(c, i, &c.loads[i])
	if p.cfg.Active != nil {
		c.hold(p.cfg.Active.hold(c.Key(i), c.req))
	}
	return i
}

// softmin returns the index of the lowest cost, random among exact ties, when
// temperature is 0; otherwise it samples index i with probability
// proportional to exp(-(cost_i - min) / ((max - min) * temperature)).
func softmin(c *Candidates, costs []float64, temperature float64) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range costs {
		lo, hi = min(lo, v), max(hi, v)
	}
	scale := (hi - lo) * temperature
	if !(scale > 0) || math.IsInf(hi-lo, 0) {
		// No temperature, equal or non-finite costs, or a temperature so
		// small that the scale underflows (the cheapest would then weigh
		// 0/0): the cheapest, as at the limit.
		return argminCost(c, costs)
	}
	total := 0.0
	for _, v := range costs {
		total += math.Exp(-(v - lo) / scale)
	}
	x := c.Float64() * total
	for i, v := range costs {
		x -= math.Exp(-(v - lo) / scale)
		if x < 0 {
			return i
		}
	}
	return len(costs) - 1
}

func growFloat64(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}
