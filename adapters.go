package llmlb

import (
	"math"
	"sync"
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
	// remembered, and only engine observations ([Load].Adapters) count.
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
)

type adapterAffinity struct {
	inner  Policy
	ttl    int64 // nanoseconds; 0: decisions are not remembered
	spread float64

	mu   sync.Mutex                    // protects seen
	seen *simplelru.LRU[uint64, int64] // adapter-endpoint pair -> unix nanos of the last pick
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
//   - holders: endpoints whose fresh observation lists the adapter among
//     those of their running or waiting requests ([Load].Adapters), or to
//     which this policy routed the adapter within TTL (the scorer ranks a
//     waiting adapter below room; here a request waiting for it will
//     load it, so the endpoint holds it);
//   - with no holder, endpoints with room for one more adapter: fewer
//     adapters in use than [Load].MaxAdapters, or not reported;
//   - with neither, every candidate.
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
	n := c.Len()
	ah := xxhash.Sum64String(name)
	now := c.nowNanos()
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
	var others float64 // the non-holders' summed load
	holders, room := 0, 0
	least := math.Inf(1) // the least loaded holder's load
	for i := 0; i < n; i++ {
		l := &c.loads[i]
		c.loadInto(i, l)
		load := float64(l.Requests) / l.Weight
		if c.adapter[i] != adapterHolder && c.b.signal != nil {
			var buf Load
			if obs := c.observe(c.state(i), &buf); obs != nil {
				c.adapter[i] = adapterClass(obs, name)
			}
		}
		if c.adapter[i] == adapterHolder {
			holders++
			least = min(least, load)
			continue
		}
		others += load
		if c.adapter[i] == adapterRoom {
			room++
		}
	}
	keep := adapterHolder
	spare := -1
	switch {
	case holders == 0 && room == 0:
		return p.record(c, ah, now, p.inner.Choose(c))
	case holders == 0:
		keep = adapterRoom
	case room > 0 && least > (1+p.spread)*others/float64(n-holders)+1:
		// The holders are measured against the others, not against an
		// average that includes them: with k of n endpoints holding an
		// adapter at load L each and the rest idle, that average is k*L/n,
		// and L never exceeds (1+Spread) times it once k >= n/(1+Spread):
		// a hot adapter would stop spreading at n/(1+Spread) endpoints
		// however busy its holders were.
		spare = pickBy(c, func(i int) (float64, float64) {
			if c.adapter[i] != adapterRoom {
				return 1, 0
			}
			return 0, float64(c.loads[i].Requests) / c.loads[i].Weight
		})
	}
	c.Narrow(func(i int) bool { return int(c.adapter[i]) == keep || i == spare })
	return p.record(c, ah, now, p.inner.Choose(c))
}

// adapterClass classifies an endpoint not known to hold adapter name from
// its observation obs.
func adapterClass(obs *Load, name string) uint8 {
	for _, a := range obs.Adapters {
		if a == name {
			return adapterHolder
		}
	}
	if obs.MaxAdapters > 0 && len(obs.Adapters) >= obs.MaxAdapters {
		return adapterFull
	}
	return adapterRoom
}

// record remembers that the request's adapter went to candidate i, and
// returns i.
func (p *adapterAffinity) record(c *Candidates, ah uint64, now int64, i int) int {
	if p.seen == nil || uint(i) >= uint(c.Len()) {
		return i
	}
	key := pairKey(ah, c.state(i).keyHash)
	p.mu.Lock()
	p.seen.Add(key, now)
	p.mu.Unlock()
	return i
}

func growUint8(s []uint8, n int) []uint8 {
	if cap(s) < n {
		return make([]uint8, n)
	}
	return s[:n]
}
