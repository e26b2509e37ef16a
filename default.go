package llmlb

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// Defaults of [DefaultConfig]. The simulator's synthetic scenarios and the
// Mooncake trace replay chose them (see the README's policy comparison).
const (
	// DefaultCacheWeight is the credit per cached prompt token, in prefill
	// tokens, when the index guesses the caches from the policy's own
	// decisions.
	DefaultCacheWeight = 4.0
	// DefaultEventsCacheWeight is the credit per cached prompt token when
	// the index holds exactly what engine KV events report
	// ([prefix.IndexConfig.EventsOnly]): a credited block is then certainly
	// there, so it is worth more than a guess.
	DefaultEventsCacheWeight = 8.0
	// DefaultFootprintWeight is the cost per token of an endpoint's KV
	// footprint, in prefill tokens.
	DefaultFootprintWeight = 0.5
	// DefaultKVPenalty is the cost, in prefill tokens, of each token of KV
	// demand beyond an endpoint's capacity.
	DefaultKVPenalty = 2.0
	// DefaultOverloadWeight is how much each request per endpoint waiting
	// for its first token beyond DefaultOverloadQueue adds to the weight of
	// an uncached prompt token.
	DefaultOverloadWeight = 24.0
	// DefaultOverloadQueue is the mean number of requests per endpoint
	// waiting for their first token from which locality is reinforced.
	DefaultOverloadQueue = 0.5
	// DefaultQueueWeight is the cost of a waiting request, in mean prompt
	// lengths.
	DefaultQueueWeight = 1.0
	// DefaultSlotWeight is the default [DefaultConfig.SlotWeight].
	DefaultSlotWeight = 10.0
	// DefaultHolders is the number of longest-prefix holders scored when
	// a pick samples its candidates (see [DefaultConfig.Sampled]).
	DefaultHolders = 2
	// DefaultSampled is the number of candidates drawn at random to score
	// when [DefaultConfig.Sampled] is zero and a pick has more than
	// 4*DefaultSampled (64) candidates.
	DefaultSampled = 16
)

// sampleAbove is the number of candidates beyond which a Default with
// Sampled zero samples them.
const sampleAbove = 4 * DefaultSampled

// DefaultConfig configures [Default]. The zero value selects every default.
// Its weights (CacheWeight, FootprintWeight, KVPenalty, OverloadWeight,
// QueueWeight, SlotWeight) must be in [0, 1e12]: a larger one would price
// busy candidates beyond the range of a float64, where they all cost the
// same.
type DefaultConfig struct {
	// Index holds which endpoint has which prompt blocks; its block size
	// must be that of Request.Prefix. Nil means a new index with the
	// defaults of package prefix. The policy records its decisions in it.
	Index *prefix.Index
	// Events, if the engines publish KV events, is an index fed by them
	// alone ([prefix.IndexConfig.EventsOnly], the block size of Index). The
	// policy then credits a block at CacheWeight only if the engines
	// report it, and a block it merely sent a request for (still in
	// prefill, or evicted since) only under overload: at nominal load the
	// tail of TTFT is best served by the engines' truth, and under
	// overload, by holding on to where a prefix went instead of
	// prefilling it again elsewhere. Several policies may share one Events
	// index; the policy only reads it, so an endpoint leaving its
	// membership keeps its reported blocks there (whoever feeds the index
	// drops an engine that goes away, as kvevents.Subscriber does when its
	// endpoints change). On the simulator's synthetic workloads, over eight seeds,
	// this cut the TTFT p99 by 6-8% against Index alone, and in the
	// hardest overload it kept 93% of the requests within the SLO where an
	// events-only Index kept 44%.
	Events *prefix.Index
	// Sampled, when positive, limits scoring to the Holders candidates with
	// the longest cached prefix plus Sampled candidates drawn at random, as
	// P2C does (when there are no more candidates than that, every one is
	// scored). Zero means every candidate in pools of up to 64 and
	// [DefaultSampled] drawn in larger ones; negative, every candidate
	// however many.
	//
	// Sampling bounds a pick's cost in a large pool, and behind several
	// routers it keeps them from all sending to the endpoint their stale
	// views agree is the least loaded. Sixteen draws miss the least loaded
	// quarter of a pool one time in a hundred. When the number was chosen,
	// on the simulator's default workload scaled to 512 replicas behind 16
	// routers (100,000 requests, seeds 1 and 2, at the scenario's load per
	// replica and 15% above it), 16 draws left 26 requests outside the SLO
	// in all, 8 draws 69, 4 draws 123, 2 draws 228 and scoring every
	// replica 88. Up to 64 candidates, scoring every one costs a pick
	// little (a decision for a 16 KiB prompt costs 10% more at 64
	// endpoints than at 8) and sees every load. A router alone in front of
	// a large pool of unequal replicas sees its own work exactly and gains
	// from scoring every endpoint: on 512 replicas of two speeds (the mixed
	// workload at 1.25 times its rate per replica, seed 1, 200,000
	// requests), 16 draws left 46 requests outside the SLO where scoring
	// every replica left 16, and behind 16 routers 823 where it left
	// 2,785. Set Sampled negative for such a router.
	Sampled int
	// Holders is the number of longest-prefix holders scored when a pick
	// samples its candidates. Zero means [DefaultHolders].
	Holders int
	// CacheWeight is the credit per cached prompt token, in prefill tokens.
	// Above 1 it values locality beyond the prefill a hit saves now: the hit
	// keeps the prefix warm for the next request, and the prefill chunk it
	// avoids would have stalled every decode in the endpoint's batch. Zero
	// means [DefaultCacheWeight], or [DefaultEventsCacheWeight] with an
	// Events index or an Index that is [prefix.IndexConfig.EventsOnly].
	CacheWeight float64
	// FootprintWeight is the cost per token of the endpoint's KV footprint:
	// the larger of this balancer's outstanding requests' tokens and its
	// part of the reported KV usage (the usage times its share of the
	// endpoint's requests, [EndpointLoad.Outstanding] over
	// [EndpointLoad.Requests]). It spreads this balancer's decode load;
	// other routers' part of the usage is stale and the same for every
	// router, and spreading it too would herd them all onto the endpoint
	// that reported the least. Zero means [DefaultFootprintWeight].
	FootprintWeight float64
	// KVPenalty is the cost per token of estimated KV demand beyond the
	// endpoint's capacity, where requests wait for memory or are preempted.
	// Zero means [DefaultKVPenalty].
	KVPenalty float64
	// OverloadWeight and OverloadQueue reinforce locality under overload:
	// when the candidates hold on average more than OverloadQueue requests
	// waiting for their first token (averaged over about the last 100
	// picks), each uncached prompt token costs OverloadWeight more per
	// excess request. A cache miss then costs the whole pool capacity, and
	// abandoning locality because every queue is long is how cache-aware
	// routers enter a death spiral. The requests counted are this
	// balancer's before their first token or, with a fresh signal, the
	// engine's waiting requests at the observation plus this balancer's
	// dispatches since then that have not streamed yet, whichever is
	// larger: a backlog, which unlike [EndpointLoad.Waiting] does not grow
	// with the time since the observation. A pick's mean backlog counts
	// as at most 16 times the larger of the average and OverloadQueue, and
	// at most 65,536 requests, so that an absurd count from a faulty
	// metrics endpoint raises the average by at most 16% of that larger
	// value a pick: in an idle pool it takes seven picks reading it to
	// switch the reinforcement on, and however many read it, the average
	// falls back below OverloadQueue as from a real backlog of 65,536
	// (within 1,200 picks at the default OverloadQueue). Zero means
	// [DefaultOverloadWeight] and [DefaultOverloadQueue]; set OverloadQueue
	// to +Inf to turn the reinforcement off.
	OverloadWeight float64
	OverloadQueue  float64
	// QueueWeight is the cost of each request waiting at the endpoint
	// ([EndpointLoad.Waiting]), in mean prompt lengths. A waiting request
	// is not only prefill work: it may also be waiting for a batch slot or
	// for KV memory, which prefill tokens do not show. Zero means
	// [DefaultQueueWeight].
	QueueWeight float64
	// Slots, if positive, is the engines' batch slots: the requests an
	// engine runs at once (vLLM's max_num_seqs, SGLang's
	// max_running_requests, llama.cpp's --parallel). A request sent to an
	// endpoint whose requests ([EndpointLoad.Requests]) fill its slots waits
	// for one to free, which takes a running request's whole remaining
	// generation: far longer than the prefill a cache hit saves. Each
	// request at or beyond the slots, the new one included, then costs
	// SlotWeight mean prompts. Zero means the slots are unknown and not
	// priced: right for engines whose batches are bound by KV memory and
	// prefill, and wrong for small batches, where Default's tail is then
	// worse than least-outstanding's.
	Slots int
	// SlotWeight is the cost of each request waiting for a batch slot, in
	// mean prompt lengths. Zero means [DefaultSlotWeight].
	SlotWeight float64
	// TTFTObjective and TPOTObjective, when set, are the requests' latency
	// objectives: the time to first token, and the time per output token
	// after it, that a request should not exceed. The policy then also
	// prices the decode stall of a cache miss: while an endpoint prefills,
	// every request decoding there waits. A candidate costs, on top, in
	// prefill tokens (times its prefill slowness when speeds are learned),
	//
	//	streaming requests * uncached prompt tokens * TTFTObjective / (TPOTObjective * output tokens)
	//	+ prompt tokens per second recently sent to it * TTFTObjective
	//
	// The first term is the stall the request's prefill causes this
	// balancer's requests at the endpoint past their first token: a second
	// of it, spent from a decoding request's budget (TPOTObjective times
	// its output, taken to be the new request's expected output), weighs
	// what a second of the new request's wait weighs against
	// TTFTObjective. The second is the stall the request will itself
	// decode behind, the uncached prompt tokens this balancer sends the
	// endpoint (a rate decayed with a time constant of 2 s) over the
	// request's own budget; without it the first term would send every
	// long prompt to the endpoints with the fewest requests decoding, whose
	// requests would then decode behind them all.
	//
	// When the endpoints' speeds are learned to differ (see
	// DisableLearning), a candidate also costs the decode misses the
	// request would cause there, each at an eighth of a TTFTObjective of
	// prefill at the pool's speed: the requests streaming there times the
	// density, at TPOTObjective, of their times per token (spread
	// log-normally, with a standard deviation of 0.6, around the
	// endpoint's decode fit at its load), times the rise of the log of the time per token that the
	// request's decode and uncached prompt tokens bring (the pool's rate
	// of growth with the load times their number). Requests far below
	// the objective meet it anyway and those far above miss it anyway;
	// past saturation this keeps the faster endpoints' decoding within
	// the objective rather than taking it past with the slower ones'.
	//
	// Set them when requests are held to a TPOT objective: see
	// docs/learn.md for what they gain and cost in the simulator (past
	// saturation, on unequal replicas, more requests within the
	// objectives; a longer TTFT tail). Both zero (the
	// default) prices no stall; setting one without the other, or a
	// negative one, is an error.
	TTFTObjective time.Duration
	TPOTObjective time.Duration
	// DisableLearning turns off the speed estimates, so that the policy
	// prices every endpoint in prefill tokens only, as at the pool's
	// average speed (divided by its declared weight, if any).
	//
	// By default the policy measures each endpoint's speed from this
	// balancer's own requests and prices its candidates in time, not only
	// in tokens, for fleets whose replicas differ (GPU generations,
	// quantization, adapters, context lengths) or change speed. Per
	// endpoint it fits the time to first token as
	//
	//	TTFT = a + tau * work
	//
	// by weighted least squares over about the last 256 first tokens
	// (decayed geometrically), where work is the cost's waiting terms for
	// the request, in prefill tokens: the queued prefill, the waiting and
	// slot-bound requests at the mean prompt length, and the request's
	// uncached prompt. An observation of a warm endpoint is clamped to
	// within three mean absolute deviations of its prediction (on a log
	// scale), so the tail (a preemption, an evicted prefix) does not drag
	// the fit. Decode time per expected output token is measured likewise
	// from the time between the first token and a successful Done, together
	// with the mean of this balancer's tokens outstanding at the endpoint
	// meanwhile (its load), so that endpoints are compared at equal load:
	// a policy that sends the faster endpoints more work makes them decode
	// each token slower, and comparing raw times per token would measure
	// them slower than they are. A request that ends without a first token
	// (failed, retried elsewhere, hedged, cancelled) teaches nothing; a
	// caller that never calls [Pick.FirstToken] teaches nothing at all.
	//
	// At each pick the candidates' fits are averaged, by confidence, into the
	// pool's speed. A candidate's prefill slowness is its predicted TTFT for this
	// request's work over the pool's; its decode slowness is its time per token
	// over the pool's at the same load (the log of the time per token taken to
	// grow linearly with the load, at a rate the pool shares and that is fitted
	// from each endpoint's variation). Both are moved from 1 only by the
	// estimate's confidence g = n/(n+8), n its observations decayed with a
	// half-life of 30 s without new ones (an observation that ends a silence
	// longer than that, and than 8 times the endpoint's mean interval between
	// observations, finds the earlier ones aged for the time beyond both), and
	// bounded to [1/16, 16]. Slowness is
	// priced only when the candidates' fits differ by more than their noise: when
	// their deviations from the pool (decode times compared at equal load, as
	// they are priced), each the log of a ratio in standard errors of its fit,
	// average a square above 8, or one's square exceeds 12 times the log of
	// their number.
	// Otherwise every candidate's slowness is exactly 1, so that equal replicas
	// are priced as with learning off; that verdict stands for 10 ms, during which
	// picks read no estimate. The waiting terms and the uncached prompt of a
	// candidate's cost are multiplied by its prefill slowness, its KV footprint by
	// its decode slowness to the power 1.5 (a slower endpoint holds each token
	// longer; the power was chosen on the simulator's training runs). The
	// measurement takes the place of a declared weight ([Endpoint] with a Weight
	// method) rather than adding to it: the cost is divided by the weight to the
	// power 1-g, so a weight is the prior of an endpoint not yet measured and
	// fades as its speed is measured. An endpoint without observations has
	// slowness exactly 1, so a cold balancer decides exactly as without learning;
	// an endpoint avoided for being slow regains the pool's average as its
	// evidence ages, is tried again and measured anew.
	//
	// What stays a constant: the relative prices of the terms (CacheWeight,
	// QueueWeight, SlotWeight, FootprintWeight, KVPenalty), since they
	// value locality and memory rather than measure speed; and the overload
	// reinforcement (OverloadWeight, OverloadQueue), which counts requests
	// and reacts to the pool as a whole. The estimator's window, prior
	// weight, half-life, clamps and the bounds of its test are fixed: they
	// set how fast it learns and how much evidence it needs, not what it
	// learns.
	//
	// Learning needs the policy to be the one given to [New]: a policy
	// that delegates to it (a pool of [Segregated]) prices as with
	// learning off.
	DisableLearning bool
}

type defaultPolicy struct {
	t           *prefixTracker
	sampled     int
	holders     int
	cacheWeight float64
	footprint   float64
	kvPenalty   float64
	overWeight  float64
	overQueue   float64
	queueWeight float64
	slots       int64
	slotWeight  float64
	stall       float64 // TTFTObjective over TPOTObjective; 0 = no stall priced
	ttft        float64 // TTFTObjective in seconds
	logStall    float64 // the log of 1/TPOTObjective in seconds; 0 without objectives
	learn       bool
	// evenUntil is the clock reading (unix nanos) until which the last
	// test of the pool's speeds (poolSpeed.test) stands: it found them
	// even, and no candidate declared a weight.
	evenUntil atomic.Int64
	backlog   atomic.Uint64 // float64 bits: smoothed mean backlog per candidate
	avgPrompt atomic.Uint64 // float64 bits: moving average of prompt tokens

	// Placement by rendezvous (see place), without engine events only.
	placing bool
	records atomic.Uint64 // the index's Records at the last pick that read it
	known   atomic.Uint64 // float64 bits: placements recorded per own, smoothed
	unknown atomic.Uint64 // float64 bits: the unknown share at the last pick
}

// maxCostWeight bounds the weights of the cost functions' terms
// ([DefaultConfig], [KVCostConfig], [GIEConfig]). A term is a count of
// tokens, blocks or requests, up to about 10^38 from a signal reporting
// the largest counts and capacities, and a weight beyond 10^270 or so
// would price a busy candidate at +Inf, the same as every other busy one,
// or, times a zero count, at NaN: a choice at random. No useful weight
// comes near the bound.
const maxCostWeight = 1e12

// Default returns the policy this package recommends for LLM traffic. For
// each candidate it estimates the prefill work the request would wait behind,
// credits the prompt tokens the candidate holds in its prefix cache, and adds
// the candidate's KV footprint and any KV overcommitment:
//
//	cost = queued prefill tokens + QueueWeight * waiting requests * mean prompt tokens
//	       + SlotWeight * requests beyond the slots * mean prompt tokens
//	       + k * (prompt tokens - cached prompt tokens)
//	       - over * (sent-for prompt tokens)
//	       + FootprintWeight * KV footprint
//	       + KVPenalty * max(0, KV demand - KV capacity)
//	over = OverloadWeight * max(0, mean backlog - OverloadQueue)
//	k    = CacheWeight + over (+ the decode stall, given objectives)
//
// (the requests beyond the slots count the new one and are zero unless
// Slots is set; the backlog is the requests waiting for their first token
// (see OverloadQueue), its mean per candidate smoothed over about the last
// 100 picks; sent-for tokens, with an Events index only, are
// the leading prompt tokens the policy sent a request for to the candidate
// beyond those the engine reported: still in prefill, or evicted since)
//
// and takes the cheapest, at random among ties, after dividing by the
// endpoint's effective weight (static weight, slow start). Up to a constant
// the same for every candidate, k*(prompt - cached) is prompt - k*cached: a
// cached token is worth k prefill tokens. Queued prefill is
// this balancer's requests before their first token plus, with a fresh
// signal, the other routers' waiting requests: at the prefill the signal
// reports for them ([Load.PeerPrefillTokens]), else at the mean prompt length;
// cached tokens come from the prefix index; the footprint is the larger of
// this balancer's outstanding tokens and its share of the reported KV usage
// (see FootprintWeight).
//
// Locality is bought with queueing, in the same unit: a prefix holder wins
// while the work queued in front of it is smaller than what its cache saves,
// so affinity yields to imbalance by construction, with no threshold to tune,
// and a popular prefix cannot bury its holder. When every queue is long, k
// grows: a miss then costs capacity the whole pool lacks, so the policy holds
// on to locality instead of spiralling into misses. The choice is
// recorded in the index and its cached tokens are not charged as prefill.
// Give each Balancer its own policy; several over the same endpoints may
// share one Index (a balancer that removes an endpoint removes its blocks
// for all).
//
// Without engine KV events, a router behind which other routers place
// requests on the same engines does not know their placements: the next
// turn of a conversation another router placed looks new to it. The policy
// then places the prompt's unknown part where every router would place it:
// on its home, the candidate that rendezvous hashing of the prompt's first
// block beyond the prefix held on two candidates or more ranks first. The
// home is credited with the expected cached part of the prompt, the tokens
// beyond the longest match times the share of placements this router does
// not know of: one minus its requests in flight over the engines' reported
// requests (from a fresh signal), each of its own placements counting with
// those its peers share into its index (package share). The home is not
// credited when its KV memory has no room for the request beside the
// decode tokens the other routers' requests there are expected to add:
// every router sends its share of such prompts to the same home, so the
// overcommitment each would tolerate adds up there. Behind one router, or
// with every placement shared, that share is zero and nothing changes;
// behind R routers sharing nothing it is about 1-1/R. Pooled over eight
// seeds behind four routers, it cut the requests outside the SLO by about
// 20% (the simulator's prefixes workload) to 96% (its default workload),
// see docs/routers.md.
func Default(cfg DefaultConfig) (Policy, error) {
	if cfg.Holders == 0 {
		cfg.Holders = DefaultHolders
	}
	if cfg.CacheWeight == 0 {
		cfg.CacheWeight = DefaultCacheWeight
		if cfg.Events != nil || cfg.Index != nil && cfg.Index.EventsOnly() {
			cfg.CacheWeight = DefaultEventsCacheWeight
		}
	}
	if cfg.FootprintWeight == 0 {
		cfg.FootprintWeight = DefaultFootprintWeight
	}
	if cfg.KVPenalty == 0 {
		cfg.KVPenalty = DefaultKVPenalty
	}
	if cfg.OverloadWeight == 0 {
		cfg.OverloadWeight = DefaultOverloadWeight
	}
	if cfg.QueueWeight == 0 {
		cfg.QueueWeight = DefaultQueueWeight
	}
	if cfg.OverloadQueue == 0 {
		cfg.OverloadQueue = DefaultOverloadQueue
	}
	if cfg.SlotWeight == 0 {
		cfg.SlotWeight = DefaultSlotWeight
	}
	if cfg.Slots < 0 {
		return nil, policyErrorf("default policy Slots %d must not be negative", cfg.Slots)
	}
	if !(cfg.OverloadQueue >= 0) {
		return nil, policyErrorf("default policy OverloadQueue %v must not be negative", cfg.OverloadQueue)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"CacheWeight", cfg.CacheWeight}, {"FootprintWeight", cfg.FootprintWeight}, {"KVPenalty", cfg.KVPenalty}, {"OverloadWeight", cfg.OverloadWeight}, {"QueueWeight", cfg.QueueWeight}, {"SlotWeight", cfg.SlotWeight}} {
		if !(f.v >= 0 && f.v <= maxCostWeight) {
			return nil, policyErrorf("default policy %s %v out of range [0, %g]", f.name, f.v, maxCostWeight)
		}
	}
	if cfg.Holders < 0 {
		return nil, policyErrorf("default policy Holders %d must not be negative", cfg.Holders)
	}
	if cfg.TTFTObjective < 0 || cfg.TPOTObjective < 0 || (cfg.TTFTObjective == 0) != (cfg.TPOTObjective == 0) {
		return nil, policyErrorf("default policy TTFTObjective %v and TPOTObjective %v must be both positive or both zero", cfg.TTFTObjective, cfg.TPOTObjective)
	}
	t, err := newPrefixTracker(cfg.Index)
	if err != nil {
		return nil, err
	}
	if e := cfg.Events; e != nil {
		switch {
		case !e.EventsOnly():
			return nil, policyErrorf("default policy Events index must be events-only (prefix.IndexConfig.EventsOnly)")
		case e.BlockSize() != t.block:
			return nil, policyErrorf("default policy Events block size %d differs from the Index's %d", e.BlockSize(), t.block)
		}
		t.events = e
	}
	p := &defaultPolicy{
		t:           t,
		sampled:     cfg.Sampled,
		holders:     cfg.Holders,
		cacheWeight: cfg.CacheWeight,
		footprint:   cfg.FootprintWeight,
		kvPenalty:   cfg.KVPenalty,
		overWeight:  cfg.OverloadWeight,
		overQueue:   cfg.OverloadQueue,
		queueWeight: cfg.QueueWeight,
		slots:       int64(cfg.Slots),
		slotWeight:  cfg.SlotWeight,
		stall:       stallRatio(cfg.TTFTObjective, cfg.TPOTObjective),
		ttft:        cfg.TTFTObjective.Seconds(),
		learn:       !cfg.DisableLearning,
		placing:     t.events == nil && !t.index.EventsOnly(),
	}
	if p.stall > 0 {
		p.logStall = -math.Log(cfg.TPOTObjective.Seconds())
	}
	p.records.Store(t.index.Records())
	p.known.Store(math.Float64bits(1))
	return p, nil
}

// learns reports whether the balancer should keep speed estimates for the
// policy (unless [DefaultConfig].DisableLearning).
func (p *defaultPolicy) learns() bool { return p.learn }

func (p *defaultPolicy) Choose(c *Candidates) int {
	n := c.Len()
	avg := p.observePrompt(float64(c.req.PromptTokens))
	longest := p.t.match(c)
	home := -1
	drawn := p.samples(n)
	if p.placing && p.observeRecords(c) && drawn > 0 && p.unknown.Load() != 0 {
		// The home must be among the scored candidates; it is credited
		// only if some placements are still unknown at this pick.
		home = p.home(c, n)
	}
	c.loads = growLoads(c.loads, n)
	c.costs = growFloat64(c.costs, n)
	best := -1
	var pool *poolSpeed // nil: price in tokens only
	if p.learn && p.retest(c.nowNanos()) {
		c.speeds = growSpeeds(c.speeds, n)
		pool = &c.pool
		*pool = poolSpeed{}
	}
	if drawn == 0 {
		// Every candidate is scored, in order. Without speeds, the cost
		// is a function of the load and the matched blocks: a candidate
		// that shares the previous candidate's load (see loadsInto) and
		// matched as many blocks costs as much.
		c.src = growInt32(c.src, n)
		backlog := c.loadsInto(c.loads, c.src)
		if pool != nil {
			for i := range c.loads {
				p.loadSpeed(c, i, pool)
			}
			pool = p.test(c, pool, nil, avg)
		}
		over := p.overload(backlog / float64(n))
		prev := 0.0 // the previous candidate's cost
		for i := range c.loads {
			src := int(c.src[i])
			if pool == nil && p.stall == 0 && src != i && c.matched[i] == c.matched[i-1] &&
				(p.t.events == nil || c.confirmed[i] == c.confirmed[i-1]) {
				c.costs[i] = prev
				continue
			}
			l := &c.loads[src]
			prev = p.cost(c, i, l, avg, over, pool) / l.Weight
			c.costs[i] = prev
		}
		if p.placing {
			p.credit(c, -1, longest, avg, over, nil)
		}
	} else {
		c.src = c.src[:0] // every scored load is its own
		pick := p.scored(c, n, drawn, home)
		backlog := 0.0
		for _, i := range pick {
			c.loadInto(int(i), &c.loads[i])
			backlog += float64(c.loads[i].backlog)
			if pool != nil {
				p.loadSpeed(c, int(i), pool)
			}
		}
		if pool != nil {
			pool = p.test(c, pool, pick, avg)
		}
		over := p.overload(backlog / float64(len(pick)))
		for _, i := range pick {
			l := &c.loads[i]
			c.costs[i] = p.cost(c, int(i), l, avg, over, pool) / l.Weight
		}
		if p.placing {
			p.credit(c, home, longest, avg, over, pick)
		}
		best = argminScored(c, c.costs, pick)
		if best < 0 {
			// No scored cost is finite: the unscored candidates, at +Inf,
			// are among the least.
			for i := range c.costs {
				if !slices.Contains(pick, int32(i)) {
					c.costs[i] = math.Inf(1)
				}
			}
			best = argminCost(c, c.costs)
			if !slices.Contains(pick, int32(best)) {
				c.loadInto(best, &c.loads[best])
				if pool != nil {
					// Unscored: its work, which the first token is
					// fitted against, is not in c.speeds yet.
					c.speeds[best].work = p.work(c, best, &c.loads[best], avg)
				}
			}
		}
	}
	if best < 0 {
		best = argminCost(c, c.costs)
	}
	l := c.load(best)
	p.t.record(c, best, l)
	if p.stall > 0 {
		uncached := c.req.PromptTokens - p.t.cachedTokens(c, int(c.matched[best]))
		c.state(best).aux.flow.add(float64(uncached), c.nowNanos())
		c.flowed = int32(max(uncached, 0))
	}
	switch {
	case pool != nil:
		c.work = c.speeds[best].work
	case p.learn:
		c.work = p.work(c, best, l, avg)
	}
	return best
}

// retest reports whether a pick at now must read the speed estimates: the
// last test that found the pool even is older than learnRecheck, or, the
// clock having gone back, claims a time further ahead than that.
func (p *defaultPolicy) retest(now int64) bool {
	until := p.evenUntil.Load()
	return now >= until || until-now > int64(learnRecheck)
}

// test runs pool's test of the candidates' speeds (all of them, or those in
// pick) and returns pool, or nil when the pool is even and no candidate
// declares a weight: its costs are then exactly those without learning.
// That verdict stands for learnRecheck, during which picks read no
// estimates.
func (p *defaultPolicy) test(c *Candidates, pool *poolSpeed, pick []int32, avg float64) *poolSpeed {
	pool.test(c.speeds, pick, avg)
	if pool.uneven || pool.weighted {
		return pool
	}
	p.evenUntil.Store(c.nowNanos() + int64(learnRecheck))
	return nil
}

// work returns the prefill tokens, waiting and its own, that cost prices
// for the request on candidate i of load l: what its time to first token
// is fitted against.
func (p *defaultPolicy) work(c *Candidates, i int, l *EndpointLoad, avgPrompt float64) float64 {
	cached := float64(p.t.cachedTokens(c, int(c.matched[i])))
	return p.wait(l, queuedTokens(l, avgPrompt), avgPrompt) + float64(c.req.PromptTokens) - cached
}

// wait returns the prefill tokens the request would wait behind on the
// endpoint of load l, queued the tokens queued there: the queued prefill
// and the waiting and slot-bound requests at the mean prompt length.
func (p *defaultPolicy) wait(l *EndpointLoad, queued, avgPrompt float64) float64 {
	waits := p.queueWeight * float64(l.Waiting)
	if p.slots > 0 && l.Requests >= p.slots {
		waits += p.slotWeight * float64(l.Requests-p.slots+1)
	}
	return queued + waits*avgPrompt
}

// loadSpeed reads candidate i's speed estimate into c.speeds[i] and adds it
// to pool.
func (p *defaultPolicy) loadSpeed(c *Candidates, i int, pool *poolSpeed) {
	st := c.state(i)
	v := &c.speeds[i]
	v.load(st.est, st.staticWeight(), c.nowNanos())
	pool.add(v)
}

// overload returns the overload term for the mean backlog per scored
// candidate of this pick; k = CacheWeight + over is the cost of an uncached
// prompt token, in prefill tokens.
func (p *defaultPolicy) overload(meanBacklog float64) float64 {
	return p.overWeight * max(p.smoothBacklog(meanBacklog)-p.overQueue, 0)
}

// argminCost returns the candidate of least cost, uniformly at random among
// exact ties; NaN costs never win unless every cost is NaN, and then the
// choice is uniform. It chooses as pickBy with the key (cost, 0) does,
// drawing the same random numbers, without a call per candidate.
func argminCost(c *Candidates, costs []float64) int {
	ties, best, found := c.ties[:0], math.Inf(1), false
	for i, v := range costs {
		switch {
		case v < best || (v == best && !found):
			best, found = v, true
			ties = append(ties[:0], int32(i))
		case v == best:
			ties = append(ties, int32(i))
		}
	}
	c.ties = ties
	switch len(ties) {
	case 0: // every cost NaN
		return int(c.Uint64N(uint64(c.Len())))
	case 1:
		return int(ties[0])
	}
	return int(ties[c.Uint64N(uint64(len(ties)))])
}

// argminScored is argminCost for costs of which only the candidates in
// pick (each once) were scored, the others costing +Inf, without reading
// the others: it draws the same random numbers and chooses alike, or
// returns -1 if no scored cost is finite (every cost then ties at +Inf or
// is NaN, and argminCost must see them all).
func argminScored(c *Candidates, costs []float64, pick []int32) int {
	best := math.Inf(1)
	for _, i := range pick {
		if costs[i] < best { // never a NaN
			best = costs[i]
		}
	}
	if !(best < math.Inf(1)) {
		return -1
	}
	ties := c.ties[:0]
	for _, i := range pick {
		if costs[i] == best {
			ties = append(ties, i)
		}
	}
	slices.Sort(ties) // argminCost lists ties in candidate order
	c.ties = ties
	if len(ties) == 1 {
		return int(ties[0])
	}
	return int(ties[c.Uint64N(uint64(len(ties)))])
}

// samples returns the candidates a pick among n draws at random to score
// besides the holders of the longest prefixes, or 0 if it scores every
// candidate (see [DefaultConfig].Sampled).
func (p *defaultPolicy) samples(n int) int {
	s := p.sampled
	if s == 0 && n > sampleAbove {
		s = DefaultSampled
	}
	if s <= 0 || s >= n-p.holders { // not holders+s, which may overflow
		return 0
	}
	return s
}

// scored returns the candidates to score: all of them if drawn is 0, or the
// holders of the longest prefixes, the request's home (if not negative) and
// drawn random draws, each once.
func (p *defaultPolicy) scored(c *Candidates, n, drawn, home int) []int32 {
	pick := c.pick[:0]
	defer func() { c.pick = pick }()
	if drawn == 0 {
		for i := 0; i < n; i++ {
			pick = append(pick, int32(i))
		}
		return pick
	}
	c.seen = growBool(c.seen, n)
	clear(c.seen)
	for h := 0; h < p.holders; h++ {
		// The candidate of most matched blocks not yet taken, the first
		// of equals; only those in c.holding matched any.
		best, bestBlocks := -1, int32(0)
		for _, j := range c.holding {
			i := int(j)
			if !c.seen[i] && (c.matched[i] > bestBlocks || c.matched[i] == bestBlocks && i < best) {
				best, bestBlocks = i, c.matched[i]
			}
		}
		if best < 0 {
			break
		}
		c.seen[best] = true
		pick = append(pick, int32(best))
	}
	if home >= 0 && !c.seen[home] {
		c.seen[home] = true
		pick = append(pick, int32(home))
	}
	for d := 0; d < drawn; {
		i := int(c.Uint64N(uint64(n)))
		if !c.seen[i] {
			c.seen[i] = true
			pick = append(pick, int32(i))
			d++
		}
	}
	return pick
}

// cost is the estimated cost, in prefill tokens, of sending the request to
// candidate i, given the overload term over: an uncached prompt token costs
// CacheWeight + over, and a token only sent for, not reported by engine
// events, is credited over. With pool (learning), the waiting terms and the
// prefill are scaled by the candidate's prefill slowness and the footprint
// by footprintSlowness of its decode slowness, and the work the request waits for
// is noted in c.speeds[i]. The caller divides the cost by the candidate's
// weight; with a measured speed of confidence g, the cost is first
// multiplied by its declared weight to the power g, so that the
// measurement takes the weight's place as it grows certain: a declared
// weight is the prior of an endpoint not yet measured, and counting both
// would price its speed twice.
func (p *defaultPolicy) cost(c *Candidates, i int, l *EndpointLoad, avgPrompt, over float64, pool *poolSpeed) float64 {
	prompt := float64(c.req.PromptTokens)
	cached := float64(p.t.cachedTokens(c, int(c.matched[i])))
	sure := cached
	if p.t.events != nil {
		sure = float64(p.t.cachedTokens(c, int(c.confirmed[i])))
	}
	queued := queuedTokens(l, avgPrompt)
	capacity := kvCapacity(l)
	footprint := float64(l.ActiveTokens)
	if !math.IsNaN(l.KVUsage) {
		// This balancer's part of the reported usage: all of it behind one
		// router, where the estimated requests are exactly its own. Other
		// routers' part is stale and the same for all of them, so
		// spreading it would send every router to the same endpoint.
		share := 1.0
		if l.Requests > 0 {
			share = float64(l.Outstanding) / float64(l.Requests)
		}
		footprint = max(footprint, share*l.KVUsage*capacity)
	}
	demand := kvDemand(c, l, queued, cached)
	wait := p.wait(l, queued, avgPrompt)
	miss := (p.cacheWeight + over) * (prompt - sure)
	fp := p.footprint * footprint
	scale := 1.0
	s := 1.0 // the candidate's prefill slowness
	if pool != nil {
		v := &c.speeds[i]
		v.work = wait + prompt - cached
		if v.g > 0 && v.weight != 1 {
			scale = math.Pow(v.weight, v.g)
		}
		if pool.learned() {
			// Exactly 1 for an endpoint without observations, which is
			// then priced as without learning.
			var sd float64
			s, sd = pool.slowness(v, v.work)
			if s != 1 {
				wait *= s
				miss += (s - 1) * (prompt - cached)
			}
			if sd != 1 {
				fp *= footprintSlowness(sd)
			}
		}
	}
	if p.stall > 0 {
		miss += p.stallCost(c, i, l, prompt-cached) * s
		if pool != nil && pool.learned() {
			miss += p.decodeMisses(c, &c.speeds[i], l, pool, prompt-cached)
		}
	}
	return scale * (wait + miss - over*(cached-sure) + fp +
		p.kvPenalty*max(demand-capacity, 0))
}

// stallCost returns the decode stall of candidate i with load l for a
// request of uncached prompt tokens, in prefill tokens at the candidate's
// speed (see DefaultConfig.TTFTObjective): the stall its prefill causes the
// requests decoding there, each second of it weighed against a decoding
// request's budget, TPOTObjective times its output (taken to be this
// request's); and the stall the request will itself decode behind, the
// prompts sent to the candidate at its recent rate while it decodes for
// its budget, which comes to that rate times TTFTObjective. The second
// keeps the first from sending every long prompt to the candidates with
// the fewest requests decoding, whose requests would then decode behind
// them all.
func (p *defaultPolicy) stallCost(c *Candidates, i int, l *EndpointLoad, uncached float64) float64 {
	cost := p.ttft * c.state(i).aux.flow.rate(c.nowNanos())
	if streaming := l.Outstanding - l.Queued; streaming > 0 && uncached > 0 {
		out := max(float64(c.reqTok-int64(c.req.PromptTokens)), 1)
		cost += p.stall / out * float64(streaming) * uncached
	}
	return cost
}

// decodeMisses returns the requests decoding at candidate v, of load l,
// that the request, uncached prompt tokens of it to prefill there, is
// expected to take past TPOTObjective, each priced at decodeMissWeight
// TTFTObjectives of prefill at the pool's speed (see
// DefaultConfig.TTFTObjective). The candidate's time per token at its
// load is its decode fit at that load; a request's time per token spreads
// around it with a standard deviation of decodeSpread on a log scale, so
// the requests near the objective are the streaming ones times the density
// of that spread at the objective, and the request's prefill and decode
// tokens raise the log of the time per token by the pool's rate of growth
// with the load times their number. It is at most the requests streaming
// there, and 0 without a decode fit, without a rate of growth, or with
// nothing streaming there.
func (p *defaultPolicy) decodeMisses(c *Candidates, v *speedView, l *EndpointLoad, pool *poolSpeed, uncached float64) float64 {
	streaming := l.Outstanding - l.Queued
	beta := pool.beta()
	if streaming <= 0 || !(v.dtau > 0) || !(beta > 0) || !(pool.g > 0) || !(pool.tau > 0) {
		return 0
	}
	// The log of the time per token at the load, over the objective.
	lr := v.dlog + p.logStall
	if v.loaded {
		lr += beta * (float64(l.ActiveTokens) - v.lload)
	}
	z := lr / decodeSpread
	density := math.Exp(-z*z/2) / (math.Sqrt(2*math.Pi) * decodeSpread)
	tokens := float64(c.reqTok-int64(c.req.PromptTokens)) + max(uncached, 0)
	// No more than the requests streaming there; a NaN from absurd fits
	// counts as none.
	misses := min(float64(streaming)*density*beta*tokens, float64(streaming))
	if !(misses > 0) {
		return 0
	}
	// A miss costs decodeMissWeight TTFTObjectives of prefill at the
	// pool's mean seconds per prompt token.
	return decodeMissWeight * misses * p.ttft * pool.g / pool.tau
}

// decodeSpread is the standard deviation, on a log scale, of a request's
// time per output token around its endpoint's decode fit at the load, and
// decodeMissWeight the price of a decode miss in TTFTObjectives of prefill.
// Both were chosen on the training runs (the mixed scenario at 1, 1.25 and
// 1.5 times its load, the default and prefixes workloads, the Mooncake
// trace at unequal speeds and the mixed-slowdown scenario, seeds 1-8, with
// latency objectives), by the geometric mean over the runs of the requests
// outside the objectives relative to those without the term: 0.839, where
// the next best of the 17 settings tried left 0.848 (see docs/learn.md).
const (
	decodeSpread     = 0.6
	decodeMissWeight = 0.125
)

// flowTimeConstant is the time constant of prefillFlow's decay. It was
// chosen on the training runs (the mixed, default and prefixes workloads
// and the Mooncake trace at unequal speeds, seeds 1-8, with latency
// objectives), where 0.5, 2 and 8 s left 4,629, 4,362 and 4,447 requests
// outside them, and 4,561 without the rate.
const flowTimeConstant = 2 * time.Second

// prefillFlow is a rate of prompt tokens: the tokens sent, each weighted by
// exp(-age/flowTimeConstant), over flowTimeConstant.
type prefillFlow struct {
	mu  sync.Mutex    // serializes add and rate's move of a stamp far ahead
	sum atomic.Uint64 // float64 bits of the decayed sum at at
	at  atomic.Int64  // unix nanos
}

// flowTau is flowTimeConstant in nanoseconds.
const flowTau = float64(flowTimeConstant)

// add counts tokens sent at now (unix nanos). A stamp far ahead of now (see
// maxAhead) is moved back to it.
func (f *prefillFlow) add(tokens float64, now int64) {
	if !(tokens > 0) {
		return
	}
	f.mu.Lock()
	at := f.at.Load()
	sum := math.Float64frombits(f.sum.Load())
	if now > at || ahead(at, now) { // ahead: the clock went back
		sum *= math.Exp(-float64(max(now-at, 0)) / flowTau)
		at = now
	}
	f.sum.Store(math.Float64bits(sum + tokens))
	f.at.Store(at)
	f.mu.Unlock()
}

// withdraw takes back tokens that add counted a moment ago: a request whose
// prompt another endpoint prefills after all ([Disaggregated]). The sum is
// not decayed for the moment between the add and the withdrawal, which
// overstates the flow by a few millionths of tokens at most.
func (f *prefillFlow) withdraw(tokens float64) {
	if !(tokens > 0) {
		return
	}
	f.mu.Lock()
	sum := math.Float64frombits(f.sum.Load())
	f.sum.Store(math.Float64bits(max(sum-tokens, 0)))
	f.mu.Unlock()
}

// rate returns the tokens per second at now (unix nanos). A concurrent add
// may pair a new sum with an old time: the rate read is then slightly
// high, for one pick.
func (f *prefillFlow) rate(now int64) float64 {
	sum := math.Float64frombits(f.sum.Load())
	if sum == 0 {
		return 0
	}
	switch at := f.at.Load(); {
	case now > at:
		sum *= math.Exp(-float64(now-at) / flowTau)
	case ahead(at, now):
		// Stamped at a reading far ahead of the clock: the flow decays
		// from now on, rather than not at all until the clock catches up.
		f.mu.Lock()
		if ahead(f.at.Load(), now) {
			f.at.Store(now)
		}
		f.mu.Unlock()
	}
	return sum / (flowTau / 1e9)
}

// stallRatio returns the price of a second of decode stall against a second
// of waiting for the first token (see DefaultConfig.TTFTObjective), per
// output token of the stalled request: ttft over tpot, or 0 without
// objectives.
func stallRatio(ttft, tpot time.Duration) float64 {
	if ttft <= 0 || tpot <= 0 {
		return 0
	}
	return ttft.Seconds() / tpot.Seconds()
}

// footprintSlowness returns the factor of a candidate's KV footprint for its
// decode slowness sd: the footprint is tokens held over time, and a slower
// endpoint holds each token longer. It is sd to the power 1.5 (sd times
// its square root: math.Pow would cost more than the rest of the
// candidate's cost). The power was chosen on the simulator's training runs
// (the mixed scenarios and the Mooncake trace at unequal speeds, seeds
// 1-8), where 1, 1.25, 1.5 and 2 missed 24,522, 22,109, 21,583 and
// 31,702 requests in all.
func footprintSlowness(sd float64) float64 {
	return sd * math.Sqrt(sd)
}

// queuedTokens returns the prefill tokens queued at the endpoint of load l:
// this balancer's requests before their first token and, with a fresh
// signal, the other waiting requests: those of other routers whose prefill
// the signal reports at that, the rest at the mean prompt length avgPrompt.
func queuedTokens(l *EndpointLoad, avgPrompt float64) float64 {
	queued := float64(l.PrefillTokens)
	if l.Fresh {
		queued += float64(max(l.Waiting-l.Queued-l.PeerWaiting, 0))*avgPrompt + float64(l.PeerPrefillTokens)
	}
	return queued
}

// kvDemand returns the KV tokens the endpoint of load l would be asked to
// hold with the request: its estimated usage, the queued prefill, and the
// request's prompt beyond its cached tokens and its expected decode tokens.
func kvDemand(c *Candidates, l *EndpointLoad, queued, cached float64) float64 {
	return kvUsage(l)*kvCapacity(l) + queued + float64(c.req.PromptTokens) - cached + float64(c.reqTok-int64(c.req.PromptTokens))
}

// The bounds of the mean backlog a pick folds into the overload average
// (see smoothBacklog).
const (
	// backlogJump bounds a pick's mean backlog to this many times the
	// larger of the average and OverloadQueue. A real backlog builds up a
	// dispatch at a time: on the simulator's runs of seed 9 (the default,
	// prefixes and agentic workloads, mixed at 1.5 times its rate, rag at
	// 1.2, mixed behind 4 routers, pd-long, and pd with seed 10 too, whose
	// prefill queues reached 1,700 requests per worker), one pick's
	// backlog in about 300,000 exceeded 8 times it, and none 16 times; nor
	// did any in the runs of the docs' tables (one seed each).
	backlogJump = 16
	// maxBacklog is the most requests per candidate a pick's mean backlog
	// counts for.
	maxBacklog = 1 << 16
)

// smoothBacklog folds the mean backlog per candidate of this pick into a
// moving average over about the last 100 picks and returns it, so that a
// short burst does not trade the tail of TTFT for locality but a sustained
// backlog does. The backlog counts as at most backlogJump times the larger
// of the average and OverloadQueue, and at most maxBacklog: an absurd
// count (a faulty metrics endpoint reporting 2^62 waiting requests) raises
// the average by at most 16% of that larger value a pick: read by a few
// picks it does not switch an idle pool's reinforcement on, and read by
// many it keeps it on no longer than a real backlog of maxBacklog would
// (without the bounds, one pick reading 2^62 waiting requests on one of
// four endpoints kept it on for 3,750 picks).
func (p *defaultPolicy) smoothBacklog(x float64) float64 {
	for {
		old := p.backlog.Load()
		avg := math.Float64frombits(old)
		capped := min(x, backlogJump*max(avg, p.overQueue), maxBacklog)
		next := avg + (capped-avg)/100
		if p.backlog.CompareAndSwap(old, math.Float64bits(next)) {
			return next
		}
	}
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
