package llmlb

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPeakDecay is [PeakEWMAConfig.Decay]'s default: Finagle's
// PeakEwma decay time.
const DefaultPeakDecay = 10 * time.Second

// PeakEWMAConfig configures [PeakEWMA]. The zero value is valid.
type PeakEWMAConfig struct {
	// Decay is the time constant of each endpoint's average: an
	// observation's weight falls by a factor e every Decay, and an endpoint
	// that completes nothing sees its average fall towards zero at that
	// pace, so that it is tried again. 0 means [DefaultPeakDecay].
	Decay time.Duration
	// Headroom, if set, returns the fraction in [0, 1] of an endpoint's
	// rate-limit quota that remains, and false when it is unknown
	// (retry.Ejector's Headroom method, fed by the answers' rate-limit
	// headers). An endpoint's cost is divided by its headroom, at least
	// [MinHeadroom], so that requests spread towards the deployments with
	// quota to spare before any of them runs out; an unknown headroom
	// counts as 1. It is called for the two sampled candidates of each
	// pick, and must be safe for concurrent use.
	Headroom func(key string) (float64, bool)
}

// MinHeadroom is the least headroom [PeakEWMAConfig.Headroom] divides a
// cost by: an endpoint with its quota all but spent costs at most 20 times
// its latency cost, so that it is still tried if the others are slower yet
// (one that has nothing left is cooled down by retry.Ejector instead).
const MinHeadroom = 0.05

// PeakEWMA returns the power-of-two-choices policy over latency, for
// endpoints that report no load: managed APIs (OpenAI, Anthropic, Bedrock,
// Azure OpenAI deployments) or servers without metrics. It samples two
// candidates and picks the one with the lower cost, its average latency per
// output token times its outstanding requests plus one, divided by its
// weight: Finagle's Peak EWMA, which go-zero's P2C load balancer also
// uses.
//
// The average is per endpoint and peak-sensitive: a completion slower than
// the average replaces it at once, a faster one moves it by the weight its
// time since the last one earns (1 - e^(-Δt/Decay)), so that a latency
// spike steers traffic away at its first slow answer and a recovery brings
// it back gradually. A completion's latency, from the pick to Done, is
// divided by its output tokens (those reported with [Pick.Generated], else
// the decode charged), so that long and short generations compare. Only
// requests that streamed to their end without an error teach it: pair it
// with a retry.Ejector, which takes endpoints out on failures and cools
// them down for the wait a 429 asks. An endpoint without a completion
// yet, or whose average has decayed to zero, or marked healthy again
// ([Balancer.SetHealthy]) since its last completion, costs what the other
// sampled candidate costs per request, so that new and returning
// endpoints are tried at once and by their outstanding requests.
// Wrapped in [AdapterAffinity], as a [Segregated] pool's policy or as
// [ConsistentHash]'s fallback it learns as it does alone; a balancer keeps
// one average per endpoint, with the Decay of the first pool's PeakEWMA.
func PeakEWMA(cfg PeakEWMAConfig) (Policy, error) {
	if cfg.Decay < 0 {
		return nil, policyErrorf("PeakEWMA Decay %v is negative", cfg.Decay)
	}
	d := cfg.Decay
	if d == 0 {
		d = DefaultPeakDecay
	}
	return &peakEWMA{decay: float64(d), headroom: cfg.Headroom}, nil
}

type peakEWMA struct {
	decay    float64 // nanoseconds
	headroom func(string) (float64, bool)
}

// quota divides cost by the headroom of st's endpoint.
func (p *peakEWMA) quota(cost float64, st *epState) float64 {
	h, ok := p.headroom(st.key)
	if !ok || !(h < 1) {
		return cost
	}
	return cost / max(h, MinHeadroom)
}

// String names the policy in errors and logs.
// peaked is implemented by a policy that is or wraps a PeakEWMA: the
// balancer then measures each endpoint's latency per output token, which
// PeakEWMA reads, with its decay.
type peaked interface{ peakPolicy() *peakEWMA }

// peakOf returns the PeakEWMA that p is or wraps, or nil.
func peakOf(p Policy) *peakEWMA {
	if q, ok := p.(peaked); ok {
		return q.peakPolicy()
	}
	return nil
}

func (p *peakEWMA) peakPolicy() *peakEWMA { return p }

func (p *peakEWMA) String() string {
	return fmt.Sprintf("PeakEWMA(decay %v)", time.Duration(p.decay))
}

func (p *peakEWMA) Choose(c *Candidates) int {
	n := uint64(c.Len())
	if n == 1 {
		return 0
	}
	a, b, x := p2cDraw(c, n)
	now := c.nowNanos()
	sa, sb := c.state(a), c.state(b)
	la, oka := sa.aux.lat.read(now, p.decay)
	lb, okb := sb.aux.lat.read(now, p.decay)
	// An average that decayed to nothing (after some 745 Decays without a
	// completion, as when an endpoint returns from hours out of service)
	// is no history: at a cost of 0 it would win every comparison however
	// many requests it has outstanding, and take all of them until its
	// first completion. Finagle penalizes a zero cost with requests
	// pending for the same reason (twitter/finagle,
	// finagle-core/src/main/scala/com/twitter/finagle/loadbalancer/PeakEwma.scala,
	// Metric.get: "if (cost == 0.0 && pending != 0) Penalty + pending");
	// here it costs what the other candidate costs per request, as an
	// endpoint without a completion does.
	oka, okb = oka && la > 0, okb && lb > 0
	switch {
	case !oka && !okb:
		// Nothing to compare but the outstanding requests.
		la, lb = 1, 1
	case !oka:
		la = lb
	case !okb:
		lb = la
	}
	ca := la * float64(sa.outstanding()+1) / c.weight(sa)
	cb := lb * float64(sb.outstanding()+1) / c.weight(sb)
	if p.headroom != nil {
		ca, cb = p.quota(ca, sa), p.quota(cb, sb)
	}
	return p2cPick(a, b, ca, cb, x)
}

// peakLatency is one endpoint's peak-sensitive moving average of seconds
// per output token. Updates take mu; picks read the published atomics,
// which may be torn between the two without harm.
type peakLatency struct {
	mu   sync.Mutex
	avg  atomic.Uint64 // float64 bits: seconds per output token
	at   atomic.Int64  // unix nanos of the last update; 0 before the first
	_    [40]byte      // on a cache line of its own: every completion writes it
	last float64       // avg, under mu
}

// read returns the average decayed to now, and whether there is one. An
// average stamped far ahead of now (see maxAhead) is stamped now, so that
// it decays from now on rather than not at all until the clock catches up.
func (l *peakLatency) read(now int64, decay float64) (float64, bool) {
	at := l.at.Load()
	if at == 0 {
		return 0, false
	}
	avg := math.Float64frombits(l.avg.Load())
	if dt := now - at; dt > 0 {
		avg *= math.Exp(-float64(dt) / decay)
	} else if ahead(at, now) {
		l.at.CompareAndSwap(at, max(now, 1))
	}
	return avg, true
}

// reset forgets the average: the endpoint has no history again.
func (l *peakLatency) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = 0
	l.avg.Store(0)
	l.at.Store(0)
}

// observe adds a completion of sample seconds per output token at now.
func (l *peakLatency) observe(sample float64, now int64, decay float64) {
	if !(sample >= 0) || math.IsInf(sample, 1) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	at := l.at.Load()
	keep := 1.0 // the weight of the average so far: e^(-Δt/Decay)
	if dt := now - at; at != 0 && dt > 0 {
		keep = math.Exp(-float64(dt) / decay)
	}
	if decayed := l.last * keep; at == 0 || sample > decayed {
		l.last = sample // the peak: at once
	} else {
		l.last = decayed + sample*(1-keep)
	}
	l.avg.Store(math.Float64bits(l.last))
	l.at.Store(max(now, 1))
}
