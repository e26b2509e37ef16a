package llmlb

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Defaults of [AdapterConfig].
const (
	// DefaultAdapterTTL is how long a request routed with an adapter keeps
	// the adapter resident on its endpoint in the policy's view. vLLM keeps
	// an adapter loaded in its LRU of GPU slots after its requests end, until
	// other adapters need the slot; its metrics list only the adapters of
	// requests in flight.
	DefaultAdapterTTL = 30 * time.Second
	// DefaultAdapterMemory bounds the (adapter, endpoint) pairs remembered
	// from routing decisions: about 100 bytes each.
	DefaultAdapterMemory = 4096
	// DefaultAdapterSpread is the default [AdapterConfig].Spread: a
	// further endpoint is admitted to hold an adapter once its least loaded
	// holder carries more than three times the average requests of the
	// endpoints not holding it, plus one. It was chosen on the simulator's
	// lora scenario (docs/lora.md), where 2 did best.
	DefaultAdapterSpread = 2.0
)

// AdapterConfig configures [AdapterAffinity]. The zero value selects the
// defaults.
type AdapterConfig struct {
	// TTL is how long the policy believes an adapter resident on an
	// endpoint after routing a request with it there. 0 means
	// [DefaultAdapterTTL]; negative means routing decisions are not
	// remembered, and only the adapters in use count: those of engine
	// observations ([Load].Adapters), and of the requests in flight sent
	// since them.
	TTL time.Duration
	// Memory bounds the (adapter, endpoint) pairs remembered from routing
	// decisions; the least recently routed pair is forgotten first, so
	// requests naming many adapters cannot grow it. 0 means
	// [DefaultAdapterMemory].
	Memory int
	// Spread sets how busy an adapter's holders must be before it spreads:
	// when the least loaded holder's requests per unit of weight exceed
	// (1+Spread) times the average of the candidates not holding the
	// adapter, plus one, one more endpoint is admitted beside the holders.
	// Larger values keep adapters on fewer endpoints (fewer adapters per
	// endpoint, longer queues at the hot ones). 0 means
	// [DefaultAdapterSpread].
	Spread float64
}

// The classes of a candidate for a request's adapter (Candidates.adapter).
const (
	adapterFull   = iota // not holding it, and no adapter slot known free
	adapterRoom          // not holding it, with a free slot or an unknown count
	adapterHolder        // holding it, as observed or routed recently
	adapterClass  = 3    // the bits of the class

	// adapterSlot flags a candidate whose fresh observation bounds its
	// adapters (MaxAdapters) and does not list the request's: a request
	// sent there may take a slot.
	adapterSlot = 4
)

type adapterAffinity struct {
	inner  Policy
	ttl    int64 // nanoseconds; 0: decisions are not remembered
	spread float64

	mu   sync.Mutex                    // protects seen
	seen *simplelru.LRU[uint64, int64] // adapter-endpoint pair -> unix nanos of the last pick

	// slotMu serializes the picks that may take an adapter slot, from
	// counting the candidates' free slots to taking one (see Choose).
	slotMu sync.Mutex
}

// AdapterAffinity returns a policy that routes requests naming a LoRA
// adapter ([Request].Adapter) to endpoints that hold it, and lets inner
// choose among those; requests of the base model go to inner unchanged. An
// engine serves a bounded number of adapters at once (vLLM's --max-loras)
// and stalls to load an absent one, so adapter residency is a discrete
// affinity next to the prefix affinity inner may have.
//
// For a request with an adapter the candidates are narrowed to, in order
// of preference, much as the Kubernetes Gateway API Inference Extension's
// lora-affinity-scorer ranks them (kubernetes-sigs/gateway-api-inference-extension
// at commit 33173e4c,
// pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/lora_affinity.go:
// 1 for the adapter running, 0.8 for room for another adapter, 0.6 for the
// adapter waiting, else 0):
//
//   - holders: endpoints that have the adapter in use (see below), or to
//     which this policy routed it within TTL (the scorer ranks a waiting
//     adapter below room; here a request waiting for it will load it, so
//     the endpoint holds it);
//   - with no holder, endpoints with room for one more adapter: fewer
//     adapters in use than [Load].MaxAdapters, or not reported;
//   - with neither, every candidate.
//
// The adapters in use at an endpoint are those its fresh observation lists
// (those of its running and waiting requests, [Load].Adapters) and those of
// the requests this balancer sent it since, while they are in flight, so
// that the picks between two observations do not each take the one free
// slot the last showed. An adapter leaves the count when its last such
// request is done, and every one of them when a newer observation arrives,
// which lists those still in use. The picks that may take a slot are
// serialized: however many run at once, none sends an endpoint more
// adapters than its MaxAdapters while another candidate has room. When
// every candidate is full and none holds the adapter, inner chooses among
// them all, and the engine chosen queues the request until a slot frees,
// or swaps an adapter out: the policy does not hold requests back. An
// endpoint the adapter was routed to within TTL that no longer has it in
// use, and whose slots are all in use, counts as full rather than as a
// holder.
//
// A hot adapter is spread rather than buried on its first holder: when the
// least loaded holder carries more requests (per unit of weight) than the
// average of the endpoints not holding the adapter by the margin of
// [AdapterConfig].Spread, the least loaded other endpoint with room is
// admitted beside the holders, and inner weighs it against them. The
// holder set so grows with the adapter's load, one endpoint at a time, up
// to every endpoint with room, and shrinks as decisions expire and the
// engines stop reporting it. Inner sees the narrowed candidates (see
// [Candidates.Narrow]).
//
// The policy is safe for concurrent use; its memory is bounded by
// [AdapterConfig].Memory. It returns an error wrapping [ErrInvalidPolicy]
// for a nil inner policy or a configuration out of range.
func AdapterAffinity(inner Policy, cfg AdapterConfig) (Policy, error) {
	switch {
	case inner == nil:
		return nil, policyErrorf("AdapterAffinity of a nil policy")
	case cfg.Memory < 0:
		return nil, policyErrorf("adapter memory %d is negative", cfg.Memory)
	case !(cfg.Spread >= 0) || math.IsInf(cfg.Spread, 0):
		return nil, policyErrorf("adapter spread %v must be finite and non-negative", cfg.Spread)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultAdapterTTL
	}
	if cfg.Memory == 0 {
		cfg.Memory = DefaultAdapterMemory
	}
	if cfg.Spread == 0 {
		cfg.Spread = DefaultAdapterSpread
	}
	p := &adapterAffinity{inner: inner, spread: cfg.Spread}
	if cfg.TTL > 0 {
		p.ttl = int64(cfg.TTL)
		seen, err := simplelru.NewLRU[uint64, int64](cfg.Memory, nil)
		if err != nil {
			return nil, policyErrorf("adapter memory: %v", err)
		}
		p.seen = seen
	}
	return p, nil
}

// learns forwards the inner policy's speed learning to the balancer.
func (p *adapterAffinity) learns() bool {
	l, ok := p.inner.(interface{ learns() bool })
	return ok && l.learns()
}

// peakPolicy returns the inner policy's PeakEWMA, if any (see peaked).
func (p *adapterAffinity) peakPolicy() *peakEWMA { return peakOf(p.inner) }

// pairKey identifies an adapter (by the hash of its name) on an endpoint
// (by the hash of its key).
func pairKey(adapter, endpoint uint64) uint64 {
	return adapter ^ (endpoint*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019)
}

func (p *adapterAffinity) Choose(c *Candidates) int {
	name := c.req.Adapter
	if name == "" {
		return p.inner.Choose(c)
	}
	ah := xxhash.Sum64String(name)
	now := c.nowNanos()
	k := p.classify(c, name, ah, now)
	if k.slot {
		// The pick may take an adapter slot: count the free slots again,
		// and take one, with no other such pick between.
		p.slotMu.Lock()
		defer p.slotMu.Unlock()
		k = p.classify(c, name, ah, now)
	}
	n := c.Len()
	keep := uint8(adapterHolder)
	spare := -1
	switch {
	case k.holders == 0 && k.room == 0:
		return p.record(c, name, ah, now, p.inner.Choose(c))
	case k.holders == 0:
		keep = adapterRoom
	case k.spreads(p.spread, n):
		// The holders are measured against the others, not against an
		// average that includes them: with k of n endpoints holding an
		// adapter at load L each and the rest idle, that average is k*L/n,
		// and L never exceeds (1+Spread) times it once k >= n/(1+Spread):
		// a hot adapter would stop spreading at n/(1+Spread) endpoints
		// however busy its holders were.
		spare = pickBy(c, func(i int) (float64, float64) {
			if c.adapter[i]&adapterClass != adapterRoom {
				return 1, 0
			}
			return 0, float64(c.loads[i].Requests) / c.loads[i].Weight
		})
	}
	c.Narrow(func(i int) bool { return c.adapter[i]&adapterClass == keep || i == spare })
	return p.record(c, name, ah, now, p.inner.Choose(c))
}

// adapterCounts is what classify found of the candidates.
type adapterCounts struct {
	holders, room int
	least         float64 // the least loaded holder's requests per unit of weight
	others        float64 // the non-holders' summed requests per unit of weight
	// slot reports that a candidate the pick may go to may take an
	// adapter slot there (see adapterSlot).
	slot bool
}

// spreads reports whether a further endpoint is admitted beside the
// holders of an adapter, of n candidates, with the given Spread.
func (k *adapterCounts) spreads(spread float64, n int) bool {
	return k.holders > 0 && k.room > 0 && k.least > (1+spread)*k.others/float64(n-k.holders)+1
}

// classify sets c.adapter to the class of each candidate for the adapter
// name (hashed ah) at the time now, and c.loads to their loads.
func (p *adapterAffinity) classify(c *Candidates, name string, ah uint64, now int64) adapterCounts {
	n := c.Len()
	c.adapter = growUint8(c.adapter, n)
	if p.seen != nil {
		p.mu.Lock()
		for i := 0; i < n; i++ {
			c.adapter[i] = adapterRoom
			// A decision stamped far ahead of now was made at a reading of
			// a clock that has since gone back: when is unknown, and it
			// holds nothing rather than until the clock catches up.
			if at, ok := p.seen.Peek(pairKey(ah, c.state(i).keyHash)); ok && now-at < p.ttl && !ahead(at, now) {
				c.adapter[i] = adapterHolder
			}
		}
		p.mu.Unlock()
	} else {
		for i := 0; i < n; i++ {
			c.adapter[i] = adapterRoom
		}
	}
	c.loads = growLoads(c.loads, n)
	k := adapterCounts{least: math.Inf(1)}
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		c.loadInto(i, l)
		load := float64(l.Requests) / l.Weight
		if c.b.signal != nil {
			var buf Load
			if obs := c.observe(c.state(i), &buf); obs != nil {
				c.adapter[i] = p.classOf(c, c.state(i), obs, name, ah, c.adapter[i])
			}
		}
		if c.adapter[i]&adapterClass == adapterHolder {
			k.holders++
			k.least = min(k.least, load)
			continue
		}
		k.others += load
		if c.adapter[i]&adapterClass == adapterRoom {
			k.room++
		}
	}
	// Whether a candidate that the narrowing keeps may take a slot: the
	// spare beside the holders is one of those with room.
	keep := uint8(adapterHolder)
	switch {
	case k.holders == 0 && k.room == 0:
		keep = adapterFull
	case k.holders == 0:
		keep = adapterRoom
	}
	spreads := keep == adapterHolder && k.spreads(p.spread, n)
	for i := 0; i < n && !k.slot; i++ {
		a := c.adapter[i]
		k.slot = a&adapterSlot != 0 && (a&adapterClass == keep || spreads && a&adapterClass == adapterRoom)
	}
	return k
}

// classOf classifies candidate st, whose fresh observation is obs, for the
// adapter name (hashed ah); held is adapterHolder if the adapter was routed
// there within TTL, else adapterRoom. The adapters in use there are those
// obs lists and those sent since (see adapterSlots): the endpoint holds the
// adapter if it is one of them, and otherwise has room if they leave a slot
// free, or MaxAdapters is not reported. An endpoint that holds the adapter
// only by the routing, and whose slots are all in use by others, is full.
func (p *adapterAffinity) classOf(c *Candidates, st *epState, obs *Load, name string, ah uint64, held uint8) uint8 {
	for _, a := range obs.Adapters {
		if a == name {
			return adapterHolder
		}
	}
	var slot uint8
	if obs.MaxAdapters > 0 {
		slot = adapterSlot
	}
	extra := 0 // the adapters in use beyond those obs lists
	if s := &st.aux.adapters; s.n.Load() != 0 {
		at := c.b.unixNano(obs.At)
		if s.has(ah, at) {
			return adapterHolder | slot
		}
		extra = s.extra(at)
	}
	if slot == 0 {
		return held
	}
	if len(obs.Adapters)+extra >= obs.MaxAdapters {
		return adapterFull | slot
	}
	return held | slot
}

// record remembers that the request's adapter, name hashed ah, went to
// candidate i, takes its slot there (see take), and returns i.
func (p *adapterAffinity) record(c *Candidates, name string, ah uint64, now int64, i int) int {
	if uint(i) >= uint(c.Len()) {
		return i
	}
	st := c.state(i)
	if c.b.signal != nil {
		take(c, st, name, ah)
	}
	if p.seen == nil {
		return i
	}
	key := pairKey(ah, st.keyHash)
	p.mu.Lock()
	p.seen.Add(key, now)
	p.mu.Unlock()
	return i
}

// take counts the adapter name (hashed ah) in use at st, the endpoint
// chosen for the pick, if st has a fresh observation that does not list
// it, and hands the count to the pick (Candidates.slot), whose Done
// releases it.
func take(c *Candidates, st *epState, name string, ah uint64) {
	if c.slot.st == st && c.slot.adapter == ah {
		return // taken by an AdapterAffinity within this one
	}
	c.slot.release()
	var buf Load
	obs := c.observe(st, &buf)
	if obs == nil {
		return
	}
	for _, a := range obs.Adapters {
		if a == name {
			return
		}
	}
	at := c.b.unixNano(obs.At)
	st.aux.adapters.take(ah, at)
	c.slot = adapterHold{st: st, adapter: ah, at: at}
}

// adapterSlots is what this balancer's requests hold of an endpoint's
// adapter slots beyond its observation: the adapters of the requests sent
// to it since the observation, and still in flight, that the observation
// does not list. They count as in use until their last such request is done
// or a newer observation, which lists those still in use, arrives.
type adapterSlots struct {
	// at is the time (unix nanos) of the observation the adapters count
	// against, and n their number; each is read without the lock, and a
	// reader who finds at not its observation's counts none.
	at atomic.Int64
	n  atomic.Int32
	mu sync.Mutex // serializes changes
	// uses holds the adapters counted and their requests in flight, in no
	// order; it holds as many adapters as requests sent since the
	// observation, at most, and keeps its storage for the next ones.
	uses []adapterUse
}

// adapterUse is an adapter (the hash of its name) counted in use at an
// endpoint, and its requests in flight there.
type adapterUse struct {
	adapter  uint64
	requests int32
}

// extra returns the adapters counted in use beyond the observation taken
// at at.
func (s *adapterSlots) extra(at int64) int {
	if s.at.Load() != at {
		return 0
	}
	return int(s.n.Load())
}

// has reports whether adapter is counted in use beyond the observation
// taken at at.
func (s *adapterSlots) has(adapter uint64, at int64) bool {
	if s.extra(at) == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at.Load() == at && s.find(adapter) >= 0
}

// find returns the index of adapter in uses, or -1. The caller holds s.mu.
func (s *adapterSlots) find(adapter uint64) int {
	for i := range s.uses {
		if s.uses[i].adapter == adapter {
			return i
		}
	}
	return -1
}

// take counts one more request of adapter sent beyond the observation
// taken at at, forgetting those counted beyond another observation.
func (s *adapterSlots) take(adapter uint64, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at.Load() != at {
		// The count is cleared before the observation changes, so that a
		// reader who finds the new observation finds no count of the old.
		s.uses = s.uses[:0]
		s.n.Store(0)
		s.at.Store(at)
	}
	if i := s.find(adapter); i >= 0 {
		s.uses[i].requests++
		return
	}
	s.uses = append(s.uses, adapterUse{adapter: adapter, requests: 1})
	s.n.Add(1)
}

// release counts one request of adapter fewer, unless the observation
// taken at at, against which it was counted, has been replaced.
func (s *adapterSlots) release(adapter uint64, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at.Load() != at {
		return
	}
	i := s.find(adapter)
	if i < 0 {
		return
	}
	if s.uses[i].requests--; s.uses[i].requests > 0 {
		return
	}
	last := len(s.uses) - 1
	s.uses[i] = s.uses[last]
	s.uses = s.uses[:last]
	s.n.Add(-1)
}

// adapterHold is one request's count in an endpoint's adapterSlots, which
// its Done releases; the zero value holds nothing.
type adapterHold struct {
	st      *epState
	adapter uint64 // the hash of the adapter's name
	at      int64  // the observation it was counted against
}

// release releases h, if it holds a count, and clears it.
func (h *adapterHold) release() {
	if h.st != nil {
		h.st.aux.adapters.release(h.adapter, h.at)
		*h = adapterHold{}
	}
}

func growUint8(s []uint8, n int) []uint8 {
	if cap(s) < n {
		return make([]uint8, n)
	}
	return s[:n]
}
