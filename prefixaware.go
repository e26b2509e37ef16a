package llmlb

import (
	"math"
	"sync"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// Defaults of [PrefixAwareConfig], SGLang's cache-aware router defaults: the
// router's command-line defaults --balance-abs-threshold 64,
// --balance-rel-threshold 1.5 and --cache-threshold 0.3 (sgl-model-gateway,
// sgl-project/sglang; the library's CacheAwareConfig::default differs and is
// not what a deployed router runs).
const (
	DefaultBalanceAbsThreshold = 64
	DefaultBalanceRelThreshold = 1.5
	DefaultMatchThreshold      = 0.3
)

// prefixTracker is the part of a cache-aware policy that knows which
// endpoint holds which prompt blocks: a prefix.Index fed by the policy's own
// decisions (and by engine KV events, if the caller feeds the same index),
// optionally a second index fed by engine KV events alone, both kept in step
// with the membership.
type prefixTracker struct {
	index  *prefix.Index
	events *prefix.Index // optional: engine KV events only, never recorded into
	block  int           // tokens per block
	// maxBlocks, if positive, bounds the leading prompt blocks matched and
	// recorded, as routers that hash only a prompt's head do.
	maxBlocks int
	// fixedCap keeps the index's capacity instead of sizing it from the
	// engines' reported KV capacity.
	fixedCap bool
	// stride, above 1, groups that many of a request's blocks into one
	// block of the index, standing for the prompt up to the group's end
	// (the hashes are chained): the group's last hash (see GIEConfig).
	stride int
	// minBlockTokens, if above the engine's KV block size, is the block
	// size the index's capacity counts the engine's KV blocks in: the
	// index covers that many tokens per engine block (see GIEConfig).
	minBlockTokens int

	mu      sync.Mutex // protects gen, members and capacity
	gen     uint64
	members map[string]struct{}
	capKV   map[string]int // KV capacity last applied per endpoint, in index blocks
}

func newPrefixTracker(ix *prefix.Index) (*prefixTracker, error) {
	if ix == nil {
		var err error
		if ix, err = prefix.NewIndex(prefix.IndexConfig{}); err != nil {
			return nil, err
		}
	}
	return &prefixTracker{index: ix, block: ix.BlockSize(), members: map[string]struct{}{}, capKV: map[string]int{}}, nil
}

// sync drops the index entries of endpoints that left the membership. A
// pick that read the membership before the last one applied here is
// ignored: an endpoint that joined since is not gone, and its entries stay.
// (A balancer numbers its memberships in increasing order.)
func (t *prefixTracker) sync(c *Candidates) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.Generation() <= t.gen {
		return
	}
	t.gen = c.Generation()
	next := make(map[string]struct{}, c.Members())
	for m := 0; m < c.Members(); m++ {
		next[c.MemberKey(m)] = struct{}{}
	}
	for k := range t.members {
		if _, ok := next[k]; !ok {
			// The events index is not the policy's: whoever feeds it
			// drops an engine that goes away (kvevents does), and
			// another policy sharing it may still route to this one.
			t.index.RemoveEndpoint(k)
			delete(t.capKV, k)
		}
	}
	t.members = next
}

// match fills c.matched with the number of leading prompt blocks each
// candidate holds and returns the largest. With an events index it also
// fills c.confirmed with the blocks the engines reported, and c.matched
// becomes the larger of the two.
func (t *prefixTracker) match(c *Candidates) int {
	t.sync(c)
	var longest int32
	c.holding = c.holding[:0]
	c.matched, longest = t.matchInto(c, t.index, c.matched)
	if t.events == nil {
		return int(longest)
	}
	var confirmed int32
	c.confirmed, confirmed = t.matchInto(c, t.events, c.confirmed)
	for i, b := range c.confirmed {
		c.matched[i] = max(c.matched[i], b)
	}
	return int(max(longest, confirmed))
}

// matchInto sets dst, resized to the candidates, to the leading prompt
// blocks each candidate holds in ix, and returns it with the largest. It
// appends the candidates that hold any to c.holding.
func (t *prefixTracker) matchInto(c *Candidates, ix *prefix.Index, dst []int32) ([]int32, int32) {
	dst = growInt32(dst, c.Len())
	clear(dst)
	blocks := t.blocks(c)
	if len(blocks) == 0 {
		return dst, 0
	}
	c.matches = ix.Match(blocks, c.Now(), c.matches[:0])
	if len(c.matches) == 0 {
		return dst, 0
	}
	var longest int32
	if c.all {
		// Members are the candidates, in order.
		for _, m := range c.matches {
			if mi, ok := c.snap.member(m.Endpoint); ok && m.Blocks > 0 {
				dst[mi] = int32(m.Blocks)
				longest = max(longest, dst[mi])
				c.holding = append(c.holding, int32(mi))
			}
		}
		return dst, longest
	}
	cand := c.memberToCandidate()
	for _, m := range c.matches {
		if mi, ok := c.snap.member(m.Endpoint); ok && cand[mi] >= 0 && m.Blocks > 0 {
			dst[cand[mi]] = int32(m.Blocks)
			longest = max(longest, dst[cand[mi]])
			c.holding = append(c.holding, cand[mi])
		}
	}
	return dst, longest
}

// blocks returns the prompt blocks of r the tracker matches and records.
func (t *prefixTracker) blocks(c *Candidates) []uint64 {
	r := c.req
	if t.stride > 1 {
		n := len(r.Prefix) / t.stride
		if t.maxBlocks > 0 {
			n = min(n, t.maxBlocks)
		}
		c.strided = c.strided[:0]
		for k := 1; k <= n; k++ {
			c.strided = append(c.strided, r.Prefix[k*t.stride-1])
		}
		return c.strided
	}
	if t.maxBlocks > 0 && len(r.Prefix) > t.maxBlocks {
		return r.Prefix[:t.maxBlocks]
	}
	return r.Prefix
}

// cachedTokens converts matched blocks into prompt tokens.
func (t *prefixTracker) cachedTokens(c *Candidates, blocks int) int {
	return min(blocks*t.block, c.req.PromptTokens)
}

// record notes that candidate i now holds the request's prefix, sizes the
// index from the engine's reported KV capacity, and tells the balancer how
// many prompt tokens it expects to be cached there.
func (t *prefixTracker) record(c *Candidates, i int, l *EndpointLoad) {
	c.SetCachedTokens(t.cachedTokens(c, int(c.matched[i])))
	blocks := t.blocks(c)
	if len(blocks) == 0 {
		return
	}
	key := c.Key(i)
	if !t.fixedCap && l != nil && l.KVBlocks > 0 && l.BlockSize > 0 {
		blocks := min(max(mulSat(l.KVBlocks, max(l.BlockSize, t.minBlockTokens))/t.block, 1), prefix.MaxCapacity)
		// The index is resized under the lock that records the size, so
		// that concurrent picks seeing different reports apply them in
		// the order they record them.
		t.mu.Lock()
		if t.capKV[key] != blocks {
			t.capKV[key] = blocks
			_ = t.index.SetCapacity(key, blocks)
		}
		t.mu.Unlock()
	}
	// An error here means the index is full of endpoints (or holds engine
	// events only); the policy still routes, it only forgets this decision.
	if now := c.Now(); t.index.Record(key, blocks, now) == nil {
		c.undo = recorded{t: t, prefix: c.req.Prefix, from: c.matched[i], at: now}
	}
}

// recorded is the prompt blocks a tracker recorded at a pick's endpoint at
// time at: those of prefix (a Request.Prefix) from index block from on, the
// ones the endpoint did not hold already.
type recorded struct {
	t      *prefixTracker
	prefix []uint64
	from   int32
	at     time.Time
}

// forget removes from the index the blocks u recorded at the endpoint of
// key, for a request that was not sent ([ErrNotSent]), but those that a
// later pick recorded there too, which went to the endpoint with the
// request that pick sent (see prefix.Index.Unrecord).
func (u recorded) forget(key string) {
	t := u.t
	var blocks []uint64
	if t.stride > 1 {
		n := len(u.prefix) / t.stride
		if t.maxBlocks > 0 {
			n = min(n, t.maxBlocks)
		}
		for k := int(u.from) + 1; k <= n; k++ {
			blocks = append(blocks, u.prefix[k*t.stride-1])
		}
	} else {
		blocks = u.prefix
		if t.maxBlocks > 0 && len(blocks) > t.maxBlocks {
			blocks = blocks[:t.maxBlocks]
		}
		blocks = blocks[min(int(u.from), len(blocks)):]
	}
	if len(blocks) > 0 {
		_ = t.index.Unrecord(key, blocks, u.at)
	}
}

func growInt32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// PrefixAwareConfig configures [PrefixAware] and [SGLangCacheAware].
type PrefixAwareConfig struct {
	// Index holds which endpoint has which prompt blocks. Its block size
	// must be the block size of the hashes in Request.Prefix. Nil means a
	// new index with the defaults of package prefix. Feed it engine KV
	// events for precise matching; otherwise the policy's own decisions
	// feed it.
	Index *prefix.Index
	// AbsThreshold and RelThreshold define imbalance: the candidates are
	// imbalanced when max-min requests > AbsThreshold and max > min *
	// RelThreshold ([PrefixAware] counts requests per unit of weight).
	// Zero means [DefaultBalanceAbsThreshold] and
	// [DefaultBalanceRelThreshold].
	AbsThreshold int
	RelThreshold float64
	// MatchThreshold is the share of the prompt that must be cached on an
	// endpoint for locality to decide. Zero means [DefaultMatchThreshold].
	MatchThreshold float64
	// MissToSmallestTree makes [SGLangCacheAware] send a request whose best
	// match covers at most MatchThreshold of the prompt to the candidate
	// with the fewest indexed blocks (the smallest radix tree), SGLang's
	// rule before its PR 14650 (December 2025), instead of the least loaded.
	// [PrefixAware] ignores it.
	MissToSmallestTree bool
}

type prefixAware struct {
	t         *prefixTracker
	abs       float64
	rel       float64
	thresh    float64
	faithful  bool
	smallTree bool // faithful only: a miss goes to the smallest tree
}

func newPrefixAware(cfg PrefixAwareConfig, faithful bool) (*prefixAware, error) {
	if cfg.AbsThreshold == 0 {
		cfg.AbsThreshold = DefaultBalanceAbsThreshold
	}
	if cfg.RelThreshold == 0 {
		cfg.RelThreshold = DefaultBalanceRelThreshold
	}
	if cfg.MatchThreshold == 0 {
		cfg.MatchThreshold = DefaultMatchThreshold
	}
	switch {
	case cfg.AbsThreshold < 0:
		return nil, policyErrorf("prefix-aware abs threshold %d is negative", cfg.AbsThreshold)
	case !(cfg.RelThreshold >= 1) || math.IsInf(cfg.RelThreshold, 0):
		return nil, policyErrorf("prefix-aware rel threshold %v must be finite and at least 1", cfg.RelThreshold)
	case !(cfg.MatchThreshold >= 0 && cfg.MatchThreshold <= 1):
		return nil, policyErrorf("prefix-aware match threshold %v out of [0, 1]", cfg.MatchThreshold)
	}
	t, err := newPrefixTracker(cfg.Index)
	if err != nil {
		return nil, err
	}
	// SGLang's approximate tree is bounded by its own max_tree_size, not by
	// the engines' KV capacity, which its router never reads.
	t.fixedCap = faithful
	return &prefixAware{t: t, abs: float64(cfg.AbsThreshold), rel: cfg.RelThreshold, thresh: cfg.MatchThreshold,
		faithful: faithful, smallTree: faithful && cfg.MissToSmallestTree}, nil
}

// PrefixAware returns cache-aware routing with an escape hatch, improving
// on SGLang's cache_aware policy where its users found it weak. Loads are
// estimated requests ([EndpointLoad.Requests]) per unit of effective weight
// ([EndpointLoad.Weight]), so that heavier endpoints take more and an
// endpoint in slow start ([WithSlowStart]) is ramped up rather than
// flooded; the candidates are imbalanced when max-min > AbsThreshold and
// max > min*RelThreshold. The least loaded is the candidate whose
// requests, counting this one, are fewest per unit of weight.
//
//   - Balanced, and some candidate holds more than MatchThreshold of the
//     prompt: among the candidates with the longest match, the least loaded.
//     (SGLang takes the longest match whatever the load of its holders.)
//   - Balanced, no good match: the least loaded.
//   - Imbalanced: the longest match among the candidates within
//     AbsThreshold of the least loaded (SGLang PR 32195), instead of
//     dropping locality altogether.
//
// Ties are broken at random. The choice is recorded in the index, and the
// matched tokens are not charged as prefill work. Give each Balancer its own
// policy; several over the same endpoints may share one Index (a balancer
// that removes an endpoint removes its blocks for all).
func PrefixAware(cfg PrefixAwareConfig) (Policy, error) { return newPrefixAware(cfg, false) }

// SGLangCacheAware returns SGLang's cache_aware policy as its router runs it
// today (sgl-model-gateway, released as the sglang-router package 0.3.2 of
// January 2026), as a baseline. Load is the router's own count of its
// requests in flight at each candidate ([EndpointLoad.Outstanding];
// SGLang's Worker::load()), never an engine signal. When the candidates are
// imbalanced, the least loaded; otherwise, if the longest match covers more
// than MatchThreshold of the prompt, the candidate with the longest match;
// otherwise the least loaded (sgl-model-gateway/src/policies/cache_aware.rs,
// since PR 14650 of December 2025; MissToSmallestTree restores the earlier
// rule, the candidate with the fewest indexed blocks). Ties are broken at
// random (since PR 33138, which fixed issue 32983: ties on min load went to
// the first worker, as they still do in the 0.3.2 release). Among several
// holders of the longest match it picks one at random, where SGLang takes
// the most recent. The choice is recorded in the index, whose capacity is
// left as configured rather than sized from the engines' KV capacity.
func SGLangCacheAware(cfg PrefixAwareConfig) (Policy, error) { return newPrefixAware(cfg, true) }

func (p *prefixAware) Choose(c *Candidates) int {
	n := c.Len()
	c.loads = growLoads(c.loads, n)
	c.costs = growFloat64(c.costs, n)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		c.loadInto(i, l)
		r := float64(l.Requests)
		if p.faithful {
			// SGLang's load is the router's in-flight count alone.
			l.Requests = l.Outstanding
			r = float64(l.Outstanding)
		} else {
			// Requests per unit of effective weight, so that a heavier
			// endpoint takes more and one in slow start less.
			r /= l.Weight
		}
		c.costs[i] = r
		lo, hi = min(lo, r), max(hi, r)
	}
	// least orders the candidates by load for the least loaded choices:
	// SGLang's count, or here the load after taking the request, which is
	// positive even for an idle endpoint, so that dividing it by a small
	// weight (slow start) makes the endpoint worse rather than leaving it
	// at 0, the least loaded however few requests it is ramped to.
	least := func(i int) float64 {
		if p.faithful {
			return c.costs[i]
		}
		return (float64(c.loads[i].Requests) + 1) / c.loads[i].Weight
	}
	best := p.t.match(c)
	imbalanced := hi-lo > p.abs && hi > lo*p.rel
	rate := 0.0
	if c.req.PromptTokens > 0 {
		rate = float64(p.t.cachedTokens(c, best)) / float64(c.req.PromptTokens)
	}
	var i int
	switch {
	case imbalanced && p.faithful:
		i = pickBy(c, func(i int) (float64, float64) { return least(i), 0 })
	case imbalanced:
		i = pickBy(c, func(i int) (float64, float64) {
			if c.costs[i] > lo+p.abs {
				return math.Inf(1), 0
			}
			return -float64(c.matched[i]), least(i)
		})
	case rate > p.thresh && p.faithful:
		i = pickBy(c, func(i int) (float64, float64) { return -float64(c.matched[i]), 0 })
	case rate > p.thresh:
		i = pickBy(c, func(i int) (float64, float64) { return -float64(c.matched[i]), least(i) })
	case p.smallTree:
		i = pickBy(c, func(i int) (float64, float64) { return float64(p.t.index.Len(c.Key(i))), 0 })
	default:
		i = pickBy(c, func(i int) (float64, float64) { return least(i), 0 })
	}
	p.t.record(c, i, &c.loads[i])
	return i
}

// pickBy returns the candidate with the lexicographically smallest key,
// uniformly at random among exact ties.
func pickBy(c *Candidates, key func(i int) (float64, float64)) int {
	ties := c.ties[:0]
	b1, b2 := math.Inf(1), math.Inf(1)
	for i, n := 0, c.Len(); i < n; i++ {
		k1, k2 := key(i)
		switch {
		case k1 < b1 || (k1 == b1 && k2 < b2):
			b1, b2 = k1, k2
			ties = append(ties[:0], int32(i))
		case k1 == b1 && k2 == b2:
			ties = append(ties, int32(i))
		}
	}
	c.ties = ties
	if len(ties) == 0 { // every key NaN
		return int(c.Uint64N(uint64(c.Len())))
	}
	if len(ties) == 1 {
		return int(ties[0])
	}
	return int(ties[c.Uint64N(uint64(len(ties)))])
}

func growLoads(s []EndpointLoad, n int) []EndpointLoad {
	if cap(s) < n {
		return make([]EndpointLoad, n)
	}
	return s[:n]
}
