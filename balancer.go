package llmlb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/internal/stamped"
	"github.com/llmlb/llmlb/internal/timeline"
)

// Balancer picks an endpoint for each request and accounts for the work it
// has sent to each endpoint until the request is done. Create one with [New].
//
// Pick, the methods of [Pick], Update, SetHealthy and Stats are safe for
// concurrent use by multiple goroutines; Pick and the pick handle never block
// on I/O and do not allocate for count-based policies.
type Balancer struct {
	policy    Policy
	clock     Clock
	signal    Signal
	maxAge    time.Duration
	allowance int
	slow      SlowStart
	obs       *Observer        // nil: no observer
	outputs   *outputPredictor // nil: no output prediction
	// simple is set for the policies that choose with a Candidates on
	// Pick's stack (see pickSimple).
	simple bool
	// fast is the policy's kind on pickFast's path, or fastNone.
	fast uint8
	// plain is set when a pick has nobody to tell and needs the clock at
	// most for the signal: no observer, speed estimates, latency averages
	// or output prediction.
	plain bool
	rr    *roundRobin // the policy, if it is RoundRobin
	// stamped is the signal if it stamps its observations when it records
	// them (see commitEpoch), else nil.
	stamped stamped.Signal
	// loaders is the signal if it can find an endpoint once for all its
	// reads (see load), else nil.
	loaders stamped.Loader[Load]
	// learn is set when the policy keeps speed estimates (Default,
	// unless [DefaultConfig].DisableLearning): every endpoint then has
	// one, fed at each request's first token and Done.
	learn bool
	// peak is the policy if it is PeakEWMA: every endpoint then has a
	// latency average, fed at each request's Done.
	peak *peakEWMA

	line timeline.Line // see unixNano

	randMu sync.Mutex // protects src
	src    rand.Source

	snap      atomic.Pointer[snapshot]
	unhealthy atomic.Int64 // members currently marked unhealthy
	spilled   atomic.Bool  // some member's counts spilled (see epState.charge); never cleared
	slowUntil atomic.Int64 // unix nanos after which no member is in slow start; never if none has been

	mu          sync.Mutex // serializes Update and SetHealthy
	initialized bool       // a non-empty membership was seen
	// departed holds, under mu, the accounting of endpoints that left the
	// membership while an endpoint coming back (a flap of service
	// discovery) would still need it (see departure).
	departed map[string]*departure
}

// departure is the accounting of an endpoint that left the membership,
// kept while the endpoint would need it if it came back (see
// Balancer.carries): while requests picked before it left are in flight,
// which it must still count; and, with a signal, while an observation that
// counted some of this balancer's requests that finished since may still be
// fresh, which must still have them taken from it. A new accounting would
// know neither, and count the observation's requests again until the next
// one.
type departure struct {
	// weak refers to the accounting while requests are in flight: their
	// handles keep it alive, and handles dropped without Done do not.
	weak weak.Pointer[epState]
	// held keeps the accounting alive once no request is in flight, when
	// nothing else refers to it; nil before.
	held atomic.Pointer[epState]
}

// value returns the departed accounting, or nil if it was collected.
func (d *departure) value() *epState {
	if st := d.held.Load(); st != nil {
		return st
	}
	return d.weak.Value()
}

// snapshot is an immutable membership. Pick reads it without locks; Update
// replaces it.
type snapshot struct {
	eps   []*epState
	byKey map[string]*epState
	pos   map[string]int // member index by key
	gen   uint64
	unit  bool // every member's static weight is 1
}

// member returns the member index of key.
func (s *snapshot) member(key string) (int, bool) {
	m, ok := s.pos[key]
	return m, ok
}

// generations numbers memberships across all balancers, so a policy may cache
// a structure derived from the membership under its generation.
var generations atomic.Uint64

// never stands for "no time" in the unix-nanos fields: the start of slow
// start of an endpoint not in it, the end of slow start of a balancer none of
// whose endpoints has been in it, and the time of the observation before the
// first. It is the earliest time UnixNano can represent (in 1677), so no
// clock reading that matters collides with it; time.Unix(0, 0), a natural
// start for a fake clock, is a reading like any other.
const never = math.MinInt64

// newEpState returns the accounting of an endpoint that just joined: not in
// slow start, and with no observation seen.
func newEpState(key string) *epState {
	st := &epState{key: key, keyHash: xxhash.Sum64String(key), aux: new(epAux)}
	st.started.Store(never)
	st.obsAt.Store(never)
	return st
}

// epState is the accounting of one endpoint. It lives as long as the endpoint
// is a member and past that while handles still point to it or its
// departure holds it.
//
// Its first cache line holds what every pick reads or writes: the counts of
// this balancer's requests, packed into two words so that a pick and a
// completion each change them with two atomic operations (see charge), and
// the effective-weight inputs. The struct is padded to 192 bytes, a size
// class whose objects start on a cache-line boundary, so that picks on
// different endpoints never write the same line.
type epState struct {
	// reqs is queued<<48 | outstanding<<32 | prefill and toks is
	// decode<<32 | prompt: of this balancer's requests to the endpoint, those
	// picked and not done, those of them before their first token, their
	// prompt tokens not yet prefilled, and their prompt and expected decode
	// tokens. A request whose counts do not fit (see charge) is counted in
	// the spill counters below instead.
	reqs      atomic.Uint64
	toks      atomic.Uint64
	weight    atomic.Uint64 // float64 bits of the static weight, set by Update
	started   atomic.Int64  // unix nanos slow start began; never = not in slow start
	unhealthy atomic.Bool
	spilled   atomic.Bool // some request was counted in the spill counters
	key       string
	desc      atomic.Pointer[epDesc] // replaced by Update, read by Pick

	// The spill counters, used only when a packed count would overflow.
	spReqs    atomic.Int64 // outstanding<<32 | queued
	spPrefill atomic.Int64
	spPrompt  atomic.Int64
	spDecode  atomic.Int64

	// The epoch: what changed of this balancer's own requests since the
	// current observation was first seen; used only when a signal is
	// configured. Readers load the atomics without the lock; every change
	// happens under it, so that a dispatch and its completion always count
	// in the same epoch. In epoch 0, before any observation, the counts are
	// not kept: nothing reads them, and the first observation resets them.
	mu       sync.Mutex   // serializes changes of the fields below
	obsAt    atomic.Int64 // At (unix nanos) of the observation the epoch belongs to; never before the first
	epoch    uint64
	epReqs   atomic.Int64 // dispatches since the observation, still outstanding
	epQueued atomic.Int64 // of epReqs, those before their first token
	epTokens atomic.Int64 // the tokens of epReqs
	// This balancer's requests the observation counted (picked no later
	// than it, in an earlier epoch) that finished since: those that had
	// streamed, to take from its running requests, and those that had not,
	// from its waiting ones.
	epRunDone  atomic.Int64
	epWaitDone atomic.Int64
	// est is the endpoint's speed estimate if the policy learns, else nil;
	// set before the endpoint joins a snapshot.
	est     *speedEstimate
	aux     *epAux // policies' state of the endpoint; never nil
	keyHash uint64 // xxhash of key, for placement by rendezvous hashing
	// loader reads the endpoint's observations when the signal has
	// loaders; set at the first read.
	loader atomic.Pointer[func() *Load]
}

// epAux is the state policies keep per endpoint beyond its counts, and
// what only a departed endpoint needs.
type epAux struct {
	lat      peakLatency  // PeakEWMA's latency average
	flow     prefillFlow  // Default's rate of prompt tokens sent, with objectives
	adapters adapterSlots // AdapterAffinity's adapters in use beyond the observation
	// dep is the endpoint's departure while it is out of the membership
	// with a signal configured, else nil: the Done of its last request in
	// flight holds its accounting there.
	dep atomic.Pointer[departure]
}

// areaTime is the unit of time of epState.area: unix nanoseconds over 1024,
// about microseconds.
func areaTime(nanos int64) int64 { return nanos >> 10 }

// loadArea returns the integral over time, in tokens times areaTime units,
// of the tokens of this balancer's requests outstanding at the endpoint,
// from an arbitrary origin, at now (unix nanos). The endpoint must have a
// speed estimate. With N the tokens outstanding and area
// (speedEstimate.area) the sum of tokens times charge time less tokens
// times release time, the integral up to t is t*N - area: an outstanding
// request adds k*(t-charged), a finished one k*(released-charged). The
// arithmetic wraps: only differences between two readings mean anything,
// and they are exact while the integral between them fits in 63 bits (a
// million tokens outstanding for three centuries).
func (st *epState) loadArea(now int64) int64 {
	var c counts
	st.countsInto(&c)
	return areaTime(now)*(c.prompt+c.decode) - st.est.area.Load()
}

// chargedTokens returns the tokens charged to an endpoint's prompt and
// decode counts by a record whose charge is d2 (see epState.charge).
func chargedTokens(d2 uint64) int64 { return int64(d2&low32 + d2>>32) }

// The fields of the packed counts (epState.reqs and epState.toks).
const (
	reqsOutstanding = 1 << 32 // one outstanding request in reqs
	reqsQueued      = 1 << 48 // one request before its first token in reqs
	low32           = 1<<32 - 1
	low16           = 1<<16 - 1

	// The request counts of epState.spReqs.
	oneOutstanding = 1 << 32
	oneQueued      = 1
)

// counts is a consistent-enough read of an endpoint's counts: each packed
// word is read atomically, the two words and the spill counters separately.
type counts struct {
	outstanding, queued, prefill, prompt, decode int64
}

func (st *epState) counts() counts {
	var c counts
	st.countsInto(&c)
	return c
}

// countsInto is counts writing into c, which spares hot loops the copy of
// a returned struct.
func (st *epState) countsInto(c *counts) {
	c.unpack(st.reqs.Load(), st.toks.Load())
	if st.spilled.Load() {
		st.addSpilled(c)
	}
}

// unpack sets c to the packed counts r (epState.reqs) and t (toks).
func (c *counts) unpack(r, t uint64) {
	c.outstanding = int64(r >> 32 & low16)
	c.queued = int64(r >> 48)
	c.prefill = int64(r & low32)
	c.prompt = int64(t & low32)
	c.decode = int64(t >> 32)
}

// addSpilled adds the spill counters to c.
func (st *epState) addSpilled(c *counts) {
	sr := st.spReqs.Load()
	c.outstanding += sr >> 32
	c.queued += int64(int32(sr))
	c.prefill += st.spPrefill.Load()
	c.prompt += st.spPrompt.Load()
	c.decode += st.spDecode.Load()
}

// outstanding returns the endpoint's outstanding requests.
func (st *epState) outstanding() int64 {
	n := int64(st.reqs.Load() >> 32 & low16)
	if st.spilled.Load() {
		n += st.spReqs.Load() >> 32
	}
	return n
}

func (st *epState) queued() int64        { return st.counts().queued }
func (st *epState) prefillTokens() int64 { return st.counts().prefill }
func (st *epState) promptTokens() int64  { return st.counts().prompt }
func (st *epState) decodeTokens() int64  { return st.counts().decode }

// staticWeight returns the weight the endpoint was last updated with.
func (st *epState) staticWeight() float64 { return math.Float64frombits(st.weight.Load()) }

// charge adds one request to the endpoint's counts: prefill and prompt
// tokens (each at most maxTokens) and expected decode tokens. A packed word
// takes it unless a field would overflow (65535 outstanding requests, or
// 2^32-1 tokens), in which case the request is counted in the spill
// counters; the returned flags say where, for the request's release.
func (st *epState) charge(prefill, prompt, decode int64) (d1, d2 uint64, spill uint8) {
	d1 = reqsQueued | reqsOutstanding | uint64(prefill)
	d2 = uint64(decode)<<32 | uint64(prompt)
	for {
		old := st.reqs.Load()
		if old>>32&low16 == low16 || old&low32+uint64(prefill) > low32 {
			spill |= 1
			st.spilled.Store(true)
			st.spReqs.Add(oneOutstanding + oneQueued)
			st.spPrefill.Add(prefill)
			break
		}
		if st.reqs.CompareAndSwap(old, old+d1) {
			break
		}
	}
	for {
		old := st.toks.Load()
		if old&low32+uint64(prompt) > low32 || old>>32+uint64(decode) > low32 {
			spill |= 2
			st.spilled.Store(true)
			st.spPrompt.Add(prompt)
			st.spDecode.Add(decode)
			break
		}
		if st.toks.CompareAndSwap(old, old+d2) {
			break
		}
	}
	return d1, d2, spill
}

// streamed moves a request charged with d1 (and spill) out of the queued
// requests and its prompt out of the pending prefill.
func (st *epState) streamed(d1 uint64, spill uint8) {
	if spill&1 == 0 {
		st.reqs.Add(-(d1 &^ reqsOutstanding))
		return
	}
	st.spPrefill.Add(-int64(d1 & low32))
	st.spReqs.Add(-oneQueued)
}

// release removes a request charged with d1, d2 and spill; streaming says
// whether streamed was called for it.
func (st *epState) release(d1, d2 uint64, spill uint8, streaming bool) {
	if streaming {
		d1 = reqsOutstanding
	}
	if spill&1 == 0 {
		st.reqs.Add(-d1)
	} else {
		st.spPrefill.Add(-int64(d1 & low32))
		st.spReqs.Add(-(int64(d1>>32&low16)<<32 | int64(d1>>48)))
	}
	if spill&2 == 0 {
		st.toks.Add(-d2)
	} else {
		st.spPrompt.Add(-int64(d2 & low32))
		st.spDecode.Add(-int64(d2 >> 32))
	}
}

// epDesc is the part of an endpoint that Update may change while its
// accounting continues.
type epDesc struct {
	ep     Endpoint
	weight float64
}

// New returns a Balancer that chooses with policy. It has no endpoints until
// [Balancer.Update] is called.
func New(policy Policy, opts ...Option) (*Balancer, error) {
	if policy == nil {
		return nil, fmt.Errorf("%w: nil policy", ErrInvalidOption)
	}
	cfg := config{clock: systemClock{}, allowance: DefaultDecodeAllowance}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	b := &Balancer{
		policy:    policy,
		clock:     cfg.clock,
		signal:    cfg.signal,
		maxAge:    cfg.maxSignalAge,
		allowance: cfg.allowance,
		slow:      cfg.slow,
		src:       cfg.src,
		obs:       cfg.observer,
		outputs:   cfg.outputs,
	}
	switch p := policy.(type) {
	case *roundRobin:
		b.simple, b.fast, b.rr = true, fastRoundRobin, p
	case random:
		b.simple, b.fast = true, fastRandom
	case p2c:
		b.simple = p.s.requests
		if b.simple {
			b.fast = fastP2C
		}
	}
	b.stamped, _ = cfg.signal.(stamped.Signal)
	b.loaders, _ = cfg.signal.(stamped.Loader[Load])
	if l, ok := policy.(interface{ learns() bool }); ok {
		b.learn = l.learns()
	}
	b.peak = peakOf(policy)
	b.plain = b.obs == nil && !b.learn && b.peak == nil && b.outputs == nil
	b.slowUntil.Store(never)
	b.snap.Store(&snapshot{byKey: map[string]*epState{}, gen: generations.Add(1)})
	return b, nil
}

// Update replaces the membership with eps. Endpoints whose key stays keep
// their accounting and health; requests picked before the update finish
// correctly after it even if their endpoint is gone, and an endpoint that
// comes back while they are in flight counts them again. With a signal
// ([WithSignal]), an endpoint that comes back while its observation is
// still fresh has that observation corrected as if it had stayed: the
// requests it counted that finished meanwhile are taken from it. With
// [WithSlowStart], endpoints added after the first non-empty membership
// start in slow start.
// Update rejects a nil endpoint, an empty or duplicate key, or a weight that
// is not finite and positive with an error wrapping [ErrInvalidEndpoints],
// and then leaves the membership unchanged. It scales weights of extreme
// magnitude (see [Endpoint]).
func (b *Balancer) Update(eps []Endpoint) error {
	type entry struct {
		ep     Endpoint
		weight float64
	}
	entries := make([]entry, len(eps))
	seen := make(map[string]struct{}, len(eps))
	for i, ep := range eps {
		if ep == nil {
			return fmt.Errorf("%w: endpoint %d is nil", ErrInvalidEndpoints, i)
		}
		key := ep.Key()
		if key == "" {
			return fmt.Errorf("%w: endpoint %d has an empty key", ErrInvalidEndpoints, i)
		}
		if _, dup := seen[key]; dup {
			return fmt.Errorf("%w: duplicate key %q", ErrInvalidEndpoints, key)
		}
		seen[key] = struct{}{}
		w := 1.0
		if wep, ok := ep.(interface{ Weight() float64 }); ok {
			w = wep.Weight()
			if !(w > 0) || math.IsInf(w, 0) {
				return fmt.Errorf("%w: endpoint %q has weight %v; want finite and positive", ErrInvalidEndpoints, key, w)
			}
		}
		entries[i] = entry{ep, w}
	}
	if len(entries) > 0 {
		most := 0.0
		for _, e := range entries {
			most = max(most, e.weight)
		}
		if most < minUnscaledWeight || most > 1/minUnscaledWeight {
			// Scale the weights so that the largest is in [1, 2): a score
			// divided by a weight as small as 1e-300 overflows to +Inf,
			// and every such candidate would then tie.
			_, exp := math.Frexp(most)
			for i := range entries {
				entries[i].weight = max(math.Ldexp(entries[i].weight, 1-exp), math.SmallestNonzeroFloat64)
			}
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.snap.Load()
	next := &snapshot{
		eps:   make([]*epState, len(entries)),
		byKey: make(map[string]*epState, len(entries)),
		pos:   make(map[string]int, len(entries)),
		gen:   generations.Add(1),
	}
	var t clockReading  // read when a departed endpoint's observation must be dated
	now := int64(never) // the start of slow start of added endpoints
	if b.initialized && b.slow.Window > 0 {
		now = t.nanos(b)
	}
	var unhealthy int64
	next.unit = true
	for i, e := range entries {
		next.unit = next.unit && e.weight == 1
		key := e.ep.Key()
		st := old.byKey[key]
		if st == nil {
			st = b.rejoin(key, &t)
		}
		if st == nil {
			st = newEpState(key)
			if b.learn {
				st.est = new(speedEstimate)
			}
		}
		if now != never && old.byKey[key] == nil { // joined, or came back
			st.started.Store(now)
			b.extendSlowStart(now)
		}
		st.desc.Store(&epDesc{ep: e.ep, weight: e.weight})
		st.weight.Store(math.Float64bits(e.weight))
		if st.unhealthy.Load() {
			unhealthy++
		}
		next.eps[i] = st
		next.byKey[key] = st
		next.pos[key] = i
	}
	if len(entries) > 0 {
		b.initialized = true
	}
	b.depart(old, next, &t)
	b.unhealthy.Store(unhealthy)
	b.snap.Store(next)
	return nil
}

// minUnscaledWeight bounds the weights Update keeps as declared: when the
// largest weight of a membership is below it, or above its inverse, every
// weight is scaled by the power of two that brings the largest into
// [1, 2). The ratios stay exact, unless a weight is so much smaller than
// the largest that it underflows.
const minUnscaledWeight = 0x1p-64

// rejoin returns the accounting of the departed endpoint key if it
// carries over (see carries) at the time t, else nil. The endpoint joins as
// a new one would, healthy; only its counts carry over. The caller holds
// b.mu.
func (b *Balancer) rejoin(key string, t *clockReading) *epState {
	d, ok := b.departed[key]
	if !ok {
		return nil
	}
	delete(b.departed, key)
	st := d.value()
	if st == nil {
		return nil
	}
	st.aux.dep.Store(nil)
	if !b.carries(st, t) {
		return nil
	}
	st.unhealthy.Store(false)
	st.started.Store(never)
	return st
}

// depart notes the endpoints of old that are not in next and whose
// accounting carries over, and forgets the departed endpoints whose
// accounting no longer does. The caller holds b.mu.
//
// Without a signal only the requests in flight carry over, and the
// departure refers to the accounting weakly. With one, each request's Done
// counts its completion in the epoch before it releases its counts, and the
// Done that finds no request left in flight holds the accounting in the
// departure (see Pick.done), so that what this reads of an endpoint with no
// request in flight includes every completion, and an endpoint with
// requests in flight is held by the Done of the last, whichever of the two
// comes first.
func (b *Balancer) depart(old, next *snapshot, t *clockReading) {
	for key, d := range b.departed {
		st := d.value()
		if st == nil || !b.carries(st, t) {
			if st != nil {
				st.aux.dep.Store(nil)
			}
			delete(b.departed, key)
			continue
		}
		if b.signal != nil && st.outstanding() == 0 {
			d.held.Store(st) // a Done between its release and the hold
		}
	}
	for _, st := range old.eps {
		if next.byKey[st.key] != nil {
			continue
		}
		var d *departure
		if b.signal != nil {
			// Announced before the counts are read: a Done that releases
			// the last request after they were finds it.
			d = new(departure)
			st.aux.dep.Store(d)
		}
		if !b.carries(st, t) {
			if d != nil {
				st.aux.dep.Store(nil)
			}
			continue
		}
		if d == nil {
			d = new(departure)
		} else if st.outstanding() == 0 {
			d.held.Store(st)
		}
		d.weak = weak.Make(st)
		if b.departed == nil {
			b.departed = map[string]*departure{}
		}
		b.departed[st.key] = d
	}
}

// carries reports whether the accounting of a departed endpoint st must
// carry over to its return at the time t: requests picked before it left
// are in flight, or requests its current observation counted have finished
// since, to be taken from it, and the observation is not older than the
// maximum signal age (nor that far ahead of t), so that it may still be
// trusted.
func (b *Balancer) carries(st *epState, t *clockReading) bool {
	if st.outstanding() > 0 {
		return true
	}
	if b.signal == nil || st.epRunDone.Load() == 0 && st.epWaitDone.Load() == 0 {
		return false
	}
	at := st.obsAt.Load()
	if at == never {
		return false
	}
	age := addSat(t.nanos(b), -at)
	return age <= int64(b.maxAge) && age >= -int64(b.maxAge)
}

func (b *Balancer) extendSlowStart(startNanos int64) {
	until := addSat(startNanos, int64(b.slow.Window))
	for {
		cur := b.slowUntil.Load()
		if cur >= until || b.slowUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// SetHealthy marks the endpoint with key healthy or unhealthy. Unhealthy
// endpoints are not picked while a healthy one is a candidate; when every
// candidate of a request is unhealthy the balancer picks among them anyway
// (Envoy's panic mode), since failing every request is worse than trying.
// In-flight requests of an unhealthy endpoint finish normally. With
// [WithSlowStart], an endpoint marked healthy again starts slow start. Busy
// is not unhealthy: a saturated endpoint should stay healthy and is only
// scored lower by the policy.
func (b *Balancer) SetHealthy(key string, healthy bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.snap.Load().byKey[key]
	if st == nil {
		return fmt.Errorf("%w: %q", ErrUnknownEndpoint, key)
	}
	if st.unhealthy.Load() == !healthy {
		return nil
	}
	st.unhealthy.Store(!healthy)
	if healthy {
		// PeakEWMA's average starts afresh, as Finagle gives a node back
		// in its balancer a new metric: decayed over the time out, it
		// would draw every request until the first completion.
		st.aux.lat.reset()
		b.unhealthy.Add(-1)
		if b.slow.Window > 0 {
			now := b.now()
			st.started.Store(now)
			b.extendSlowStart(now)
		}
	} else {
		b.unhealthy.Add(1)
	}
	return nil
}

// EndpointStats is this balancer's accounting of one endpoint.
type EndpointStats struct {
	Key           string // the endpoint's Key
	Outstanding   int64  // requests picked and not done
	Queued        int64  // requests picked and before their first token
	PrefillTokens int64  // prompt tokens picked and not yet prefilled
	DecodeTokens  int64  // expected decode tokens of outstanding requests
	Healthy       bool   // as last set by SetHealthy; true for new endpoints
}

// Stats returns the accounting of every member, in membership order.
func (b *Balancer) Stats() []EndpointStats {
	s := b.snap.Load()
	out := make([]EndpointStats, len(s.eps))
	for i, st := range s.eps {
		out[i] = st.stats()
	}
	return out
}

// StatsOf returns the accounting of the member whose Key is key, and
// whether there is one. Unlike [Balancer.Stats] it reads one endpoint and
// does not allocate, so a caller may use it on every request, for example
// to check that a pick's endpoint is healthy.
func (b *Balancer) StatsOf(key string) (EndpointStats, bool) {
	st := b.snap.Load().byKey[key]
	if st == nil {
		return EndpointStats{}, false
	}
	return st.stats(), true
}

// stats returns st's EndpointStats.
func (st *epState) stats() EndpointStats {
	n := st.counts()
	return EndpointStats{
		Key:           st.key,
		Outstanding:   n.outstanding,
		Queued:        n.queued,
		PrefillTokens: n.prefill,
		DecodeTokens:  n.decode,
		Healthy:       !st.unhealthy.Load(),
	}
}

// Pick chooses an endpoint for r and charges the request to it. The caller
// must call Done on the returned handle exactly when the request ends (more
// calls are no-ops), and FirstToken when the first token is streamed. A nil r
// is the zero Request. Pick returns ctx's error if ctx is done, and errors
// wrapping [ErrInvalidRequest], [ErrNoEndpoints] or [ErrNoCandidates].
func (b *Balancer) Pick(ctx context.Context, r *Request) (Pick, error) {
	if ctx != nil {
		if err := ctx.Err(); err != nil {
			return Pick{}, err
		}
	}
	if r != nil {
		if err := r.validate(); err != nil {
			return Pick{}, err
		}
	}
	snap := b.snap.Load()
	if len(snap.eps) == 0 {
		return Pick{}, b.failed(r, ErrNoEndpoints)
	}
	if b.simple && (r == nil || len(r.Exclude) == 0) && b.unhealthy.Load() == 0 {
		if b.plain && b.slowUntil.Load() == never {
			return b.pickFast(snap, r)
		}
		var c Candidates // every member is a candidate: no slice is needed
		c.req = r
		if r == nil {
			c.req = &zeroRequest
		}
		return b.pickSimple(&c, snap, r)
	}
	c := candidatesPool.Get().(*Candidates)
	c.req = r
	p, err := b.pick(c, snap, r)
	c.release()
	return p, err
}

// zeroRequest is the request of a nil *Request on pickSimple's path, whose
// policies only read it.
var zeroRequest Request

// The policies of pickFast.
const (
	fastNone = iota
	fastRoundRobin
	fastRandom
	fastP2C // P2C over RequestsScore
)

// pickFast is pickSimple for a plain balancer none of whose members is in
// slow start: it chooses on the snapshot, without a Candidates, drawing the
// same random numbers as the policy's Choose.
func (b *Balancer) pickFast(snap *snapshot, r *Request) (Pick, error) {
	if r == nil {
		r = &zeroRequest
	}
	eps := snap.eps
	var (
		i int
		t clockReading
	)
	if n := uint64(len(eps)); n > 1 {
		switch b.fast {
		case fastRoundRobin:
			i = int((b.rr.next.Add(1) - 1) % n)
		case fastRandom:
			i = int(b.uint64n(n))
		case fastP2C:
			i = b.p2cFast(eps, n, snap.unit, &t)
		}
	}
	st := eps[i]
	prompt := int64(r.PromptTokens)
	decode := int64(r.OutputTokens)
	if decode == 0 {
		decode = int64(b.allowance)
		if r.MaxTokens > 0 {
			decode = min(decode, int64(r.MaxTokens))
		}
	}
	if r.Choices > 1 {
		decode = min(decode*int64(r.Choices), maxTokens)
	}
	rec := b.newRecord(st, prompt, prompt, decode)
	rec.choices = uint32(r.choices())
	if b.signal != nil {
		b.commitEpoch(rec, st, prompt, decode, &t, false)
	}
	return Pick{rec: rec, base: rec.state.Load() &^ phaseMask, desc: st.desc.Load()}, nil
}

// p2cFast is [P2C] over [RequestsScore] on n > 1 members none of which is
// in slow start: p2c.chooseCounts without a Candidates. t is the pick's
// time.
func (b *Balancer) p2cFast(eps []*epState, n uint64, unit bool, t *clockReading) int {
	x := b.uint64()
	i := int((x >> 32 * n) >> 32)
	j := int((x & (1<<32 - 1) * (n - 1)) >> 32)
	if j >= i {
		j++
	}
	if b.signal != nil && !b.unobserved() {
		return p2cPick(i, j, b.requestsScore(eps[i], t), b.requestsScore(eps[j], t), x)
	}
	if unit {
		// The scores are outstanding+1, so comparing the counts chooses
		// alike.
		switch oi, oj := eps[i].outstanding(), eps[j].outstanding(); {
		case oi < oj:
			return i
		case oj < oi:
			return j
		}
		if x&1 == 0 {
			return i
		}
		return j
	}
	si := float64(eps[i].outstanding()+1) / eps[i].staticWeight()
	sj := float64(eps[j].outstanding()+1) / eps[j].staticWeight()
	return p2cPick(i, j, si, sj, x)
}

// requestsScore is requestsScore (of Candidates) for st, not in slow start,
// at the time t.
func (b *Balancer) requestsScore(st *epState, t *clockReading) float64 {
	var buf Load
	obs := b.load(st, &buf)
	if obs == nil || !b.fresh(obs, t) {
		s := float64(st.outstanding()) + 1
		if w := st.staticWeight(); w != 1 {
			s /= w
		}
		return s
	}
	var l EndpointLoad
	st.ownLoad(&l)
	observedLoad(st, &l, obs, b.unixNano(obs.At), b.maxAge)
	s := (float64(l.Requests) + 1) / st.staticWeight()
	if s != s { // NaN
		return math.Inf(1)
	}
	return s
}

// pickSimple is pick for the policies that need no scratch space, called
// with every member a candidate. It calls them directly, so that c does not
// escape to the heap.
func (b *Balancer) pickSimple(c *Candidates, snap *snapshot, r *Request) (Pick, error) {
	c.initAll(b, snap)
	var i int
	switch p := b.policy.(type) {
	case *roundRobin:
		i = p.Choose(c)
	case random:
		i = p.Choose(c)
	case p2c:
		i = p.chooseCounts(c)
	}
	p := b.commit(c, c.state(i))
	if b.obs != nil && b.obs.Pick != nil {
		b.notifyPick(p, c.pickInfo(p, r))
	}
	return p, nil
}

// pick is Pick once the request is valid and there are members.
func (b *Balancer) pick(c *Candidates, snap *snapshot, r *Request) (Pick, error) {
	if err := c.init(b, snap); err != nil {
		return Pick{}, b.failed(r, err)
	}
	// The policy sees every pick, even of a single candidate: a policy that
	// keeps state (a prefix index) must record where each request went, and
	// only it knows how many prompt tokens the endpoint holds.
	i := b.choose(c)
	if uint(i) >= uint(c.Len()) {
		c.slot.release()
		return Pick{}, b.failed(r, policyErrorf("policy %T chose %d of %d candidates", b.policy, i, c.Len()))
	}
	p := b.commit(c, c.state(i))
	if b.obs != nil && b.obs.Pick != nil {
		b.notifyPick(p, c.pickInfo(p, r))
	}
	return p, nil
}

// choose returns the policy's choice among c. If the policy panics (or
// exits its goroutine), the pick is never made and no Done will release
// what the policy held for it: the active blocks it added for the request
// ([KVCostConfig].Active) are released before the panic goes on, as they
// are for a pick whose Observer.Pick panics, so that the endpoint's count
// in an ActiveBlocks its other users share does not keep them for good.
func (b *Balancer) choose(c *Candidates) int {
	chose := false
	defer func() {
		if !chose {
			if c.active != nil {
				c.active.drop()
				c.active = nil
			}
			c.slot.release()
		}
	}()
	i := b.policy.Choose(c)
	chose = true
	return i
}

// pickInfo describes p, the pick of r among c, for the observer.
func (c *Candidates) pickInfo(p Pick, r *Request) PickInfo {
	return PickInfo{Endpoint: p.Endpoint(), Request: r, Candidates: c.Len(), CachedTokens: c.cached,
		DecodeTokens: int(c.reqTok) - c.req.PromptTokens, SignalAge: c.signalAge}
}

// notifyPick tells the observer of the pick p. If Observer.Pick panics (or
// exits its goroutine), Pick never returns p to its caller, who could then
// never release it: p is released, unobserved, before the panic goes on.
func (b *Balancer) notifyPick(p Pick, info PickInfo) {
	returned := false
	defer func() {
		if !returned {
			p.done(nil, false)
		}
	}()
	b.obs.Pick(info)
	returned = true
}

// failed tells the observer of a failed pick and returns err.
func (b *Balancer) failed(r *Request, err error) error {
	if b.obs != nil && b.obs.Pick != nil {
		b.obs.Pick(PickInfo{Request: r, SignalAge: -1, Err: err})
	}
	return err
}

// commit charges c's request to st and returns its handle.
func (b *Balancer) commit(c *Candidates, st *epState) Pick {
	r := c.req
	prompt := int64(r.PromptTokens)
	prefill := prompt - int64(min(c.cached, r.PromptTokens))
	decode := c.reqTok - prompt
	rec := b.newRecord(st, prefill, prompt, decode)
	rec.kind, rec.feature, rec.choices, rec.flowed = c.outKind, c.outFeature, uint32(c.req.choices()), c.flowed
	if c.active != nil || c.undo.t != nil || c.slot.st != nil {
		aux := auxPool.Get().(*recordAux)
		aux.active, aux.undo, aux.slot = c.active, c.undo, c.slot
		rec.aux, c.active, c.undo, c.slot = aux, nil, recorded{}, adapterHold{}
	}
	c.signalAge = -1
	timed := b.obs != nil || b.learn || b.peak != nil // they need the time of the pick
	if timed {
		rec.picked = c.nowNanos()
	}
	if b.learn {
		rec.work = c.work
		if st.est != nil {
			st.est.area.Add(chargedTokens(rec.d2) * areaTime(rec.picked))
		}
	}
	if b.signal != nil {
		if at, fresh := b.commitEpoch(rec, st, prefill, decode, &c.t, timed); fresh && b.obs != nil {
			c.signalAge = time.Duration(max(c.nowNanos()-at, 0))
		}
	}
	// A record waits in the pool already in the picked phase of its next
	// generation (see Done), so the handle only reads it.
	return Pick{rec: rec, base: rec.state.Load() &^ phaseMask, desc: st.desc.Load(), cached: int32(prompt - prefill)}
}

// commitEpoch counts a dispatch to st, charged in rec with prefill and
// decode tokens, in st's epoch, and sets rec.picked unless timed says it
// is set: on a balancer with a signal, Done compares it with the time of
// the observation it finds. It returns the time of st's observation and
// whether it is fresh at t.
func (b *Balancer) commitEpoch(rec *record, st *epState, prefill, decode int64, t *clockReading, timed bool) (at int64, fresh bool) {
	var (
		buf  Load
		obs  = &buf
		seen bool
	)
	if !b.unobserved() {
		if p := b.load(st, &buf); p != nil {
			obs, seen = p, true
		}
	}
	fresh = seen && b.fresh(obs, t)
	if !fresh && st.obsAt.Load() == never {
		rec.epoch = 1 // epoch 0, which keeps no counts
		// Without an observation now, a signal that stamps observations
		// when it records them makes any later one newer than the pick,
		// as the earliest time is.
		if !timed {
			if !seen && b.stamped != nil && !t.read {
				rec.picked = never + 1
			} else {
				rec.picked = t.nanos(b)
			}
		}
		return 0, false
	}
	if !timed {
		rec.picked = t.nanos(b)
	}
	st.mu.Lock()
	if fresh {
		st.roll(b.unixNano(obs.At), b.maxAge)
	}
	if st.epoch > 0 {
		st.epReqs.Add(1)
		st.epQueued.Add(1)
		st.epTokens.Add(prefill + decode)
	}
	rec.epoch = st.epoch + 1 // 0 means "not tracked"
	st.mu.Unlock()
	return b.unixNano(obs.At), fresh
}

// load returns the signal's observation of st, or nil if there is none, as
// Signal.Load reports it. The observation is the signal's own, not to be
// modified, or buf, into which Load wrote it.
func (b *Balancer) load(st *epState, buf *Load) *Load {
	if b.loaders != nil {
		f := st.loader.Load()
		if f == nil {
			if g := b.loaders.Loader(stamped.Token{}, st.key); g != nil {
				f = &g
				st.loader.Store(f)
			}
		}
		if f != nil {
			return (*f)()
		}
	}
	var ok bool
	if *buf, ok = b.signal.Load(st.key); !ok {
		return nil
	}
	return buf
}

// unobserved reports whether the signal is known to have recorded no
// observation yet, so that none need be loaded.
func (b *Balancer) unobserved() bool {
	return b.stamped != nil && !b.stamped.Recorded(stamped.Token{})
}

// newRecord charges a request to st and returns its record, with the
// fields that only some balancers use cleared.
func (b *Balancer) newRecord(st *epState, prefill, prompt, decode int64) *record {
	rec := recordPool.Get().(*record)
	rec.st, rec.b, rec.epoch, rec.picked, rec.first, rec.work, rec.area0 = st, b, 0, 0, never, 0, 0
	rec.kind, rec.feature, rec.aux, rec.prefillOnly, rec.choices, rec.flowed = 0, 0, nil, false, 1, 0
	rec.d1, rec.d2, rec.spill = st.charge(prefill, prompt, decode)
	if rec.spill != 0 && !b.spilled.Load() {
		b.spilled.Store(true)
	}
	return rec
}

// Pick is the handle of one picked request. Its zero value (returned with an
// error) is inert. A Pick may be copied; all copies refer to the same request.
//
// The request moves through two states: picked (its prompt is charged as
// prefill work) and, after FirstToken, streaming (only its decode work is
// charged). Done releases everything. FirstToken and Done are idempotent and
// safe to call concurrently; after Done both are no-ops, even if the
// balancer's storage for the handle was reused by a later request.
type Pick struct {
	rec  *record
	base uint64 // the record's generation for this request, phase bits clear
	// desc holds the picked endpoint: one word, not the two of an
	// interface, so that the handle stays small enough to pass in
	// registers.
	desc   *epDesc
	cached int32 // the prompt tokens the policy expected the endpoint to hold
}

// Endpoint returns the picked endpoint, or nil for the zero Pick.
func (p Pick) Endpoint() Endpoint {
	if p.desc == nil {
		return nil
	}
	return p.desc.ep
}

// FirstToken records that prefill is done and streaming began: the request's
// prompt tokens stop counting as pending prefill. It is the commitment point
// after which retries and hedges are no longer invisible to the user.
func (p Pick) FirstToken() { p.firstToken(true) }

// firstToken moves the request to streaming. When measure is false the
// transition teaches the speed estimator nothing and is not observed: the
// prompt did not prefill on this endpoint (see [DisaggPick]).
func (p Pick) firstToken(measure bool) {
	rec := p.rec
	if rec == nil || !rec.state.CompareAndSwap(p.base|phasePicked, p.base|phaseBusy) {
		return // done, streaming already, or another call holds it
	}
	st := rec.st
	st.streamed(rec.d1, rec.spill)
	// Before the first observation (obsAt never) the epoch keeps no counts.
	if rec.epoch != 0 && st.obsAt.Load() != never {
		st.mu.Lock()
		if st.epoch == rec.epoch-1 && st.epoch > 0 {
			st.epQueued.Add(-1)
		}
		st.mu.Unlock()
	}
	b, picked := rec.b, rec.picked
	if measure && b.learn && st.est != nil {
		now := b.now()
		if !rec.prefillOnly { // otherwise Done measures no decode
			rec.first = now
			rec.area0 = st.loadArea(now)
		}
		st.est.firstToken(rec.work, time.Duration(now-picked), now)
	}
	rec.state.Store(p.base | phaseStreaming)
	if measure && b.obs != nil && b.obs.FirstToken != nil {
		b.obs.FirstToken(FirstTokenInfo{Endpoint: p.Endpoint(), Latency: b.since(picked)})
	}
}

// Done records that the request finished: err is nil if it ended normally
// (its whole answer received, or, without FirstToken, an answer), and the
// error that ended it otherwise. It releases all the work charged to the
// endpoint. Only a request that called FirstToken and then Done(nil)
// teaches what completions teach: the decode speed Default learns, the
// output length of WithOutputPrediction and PeakEWMA's latency; pass nil
// for a stream read to its end (not io.EOF). err is passed on to
// Observer.Done and otherwise decides nothing: health and retries are the
// caller's. The exception is an err wrapping [ErrNotSent] before
// FirstToken: the request never reached the endpoint, and a prefix-aware
// policy forgets the prompt blocks it recorded there for the pick. Calls
// after the first are no-ops.
func (p Pick) Done(err error) { p.done(err, true) }

// done is Done, telling the observer if notify is set.
func (p Pick) done(err error, notify bool) {
	rec := p.rec
	if rec == nil {
		return
	}
	var streaming bool
	for {
		s := rec.state.Load()
		if s == p.base|phaseBusy { // a concurrent FirstToken is finishing
			runtime.Gosched()
			continue
		}
		if s != p.base|phasePicked && s != p.base|phaseStreaming {
			return // done already, or the record serves a later request
		}
		// Winning the record ends this generation and arms the next one:
		// no handle of it exists until commit hands the record out again,
		// after this call put it back in the pool.
		if rec.state.CompareAndSwap(s, p.base+generationStep|phasePicked) {
			streaming = s == p.base|phaseStreaming
			break
		}
	}
	st, b, picked := rec.st, rec.b, rec.picked
	var now int64 // when the policy learns, the time of Done
	if b.learn {
		now = b.now()
	}
	// The output tokens reported with Generated, if it was called for this
	// request; the count then goes back to zero, tagged for the next one.
	var out int64
	if v := rec.out.Load(); v&^outCountMask == outTag(p.base) && v&outCountMask != 0 {
		out = int64(v & outCountMask)
		rec.out.Store(outTag(p.base + generationStep))
	}
	if streaming && err == nil {
		// Only a request that streamed to its end measures decode and
		// teaches its output length. What is learned is one completion's:
		// a request's completions decode side by side, each a token an
		// iteration.
		choices := int64(rec.choices)
		if b.learn && st.est != nil && rec.first != never {
			tokens := int64(rec.d2 >> 32) // the decode charged
			if out > 0 {
				tokens = out
			}
			tokens = max(perChoice(tokens, choices), 1)
			// The mean of this balancer's tokens outstanding at the
			// endpoint while the request decoded.
			load := -1.0
			if dt := areaTime(now) - areaTime(rec.first); dt > 0 {
				load = float64(st.loadArea(now)-rec.area0) / float64(dt)
			}
			st.est.done(time.Duration(now-rec.first), tokens, now, load)
		}
		if b.outputs != nil && out > 0 {
			b.outputs.observe(rec.kind, rec.feature, max(perChoice(out, choices), 1))
		}
		if b.peak != nil {
			tokens := int64(rec.d2 >> 32) // the decode charged
			if out > 0 {
				tokens = out
			}
			tokens = max(perChoice(tokens, choices), 1)
			now := b.now()
			st.aux.lat.observe(float64(now-picked)/1e9/float64(max(tokens, 1)), now, b.peak.decay)
		}
	}
	// Whether the request never reached the endpoint matters only to the
	// epoch's counts and to a policy's recorded blocks: errors.Is walks
	// err's chain, which a cancelled pick need not pay for otherwise.
	notSent := !streaming && err != nil && (rec.epoch != 0 || rec.aux != nil && rec.aux.undo.t != nil) &&
		isNotSent(err)
	if rec.epoch != 0 {
		// The epoch counts the completion before the counts release the
		// request: an Update that finds no request of a departing
		// endpoint in flight then finds every completion (see depart).
		b.doneEpoch(st, rec, streaming, notSent)
	}
	st.release(rec.d1, rec.d2, rec.spill, streaming)
	if rec.epoch != 0 && st.outstanding() == 0 {
		// The last request in flight of an endpoint that left: no handle
		// refers to its accounting any more, which the departure keeps
		// while the endpoint's return would need it.
		if d := st.aux.dep.Load(); d != nil {
			d.held.Store(st)
		}
	}
	if b.learn && st.est != nil {
		st.est.area.Add(-chargedTokens(rec.d2) * areaTime(now))
	}
	if aux := rec.aux; aux != nil {
		if aux.active != nil {
			aux.active.drop()
		}
		aux.slot.release()
		if aux.undo.t != nil && notSent {
			aux.undo.forget(st.key)
		}
		*aux = recordAux{} // the request's Prefix is the caller's
		auxPool.Put(aux)
		rec.aux = nil
	}
	rec.st, rec.b = nil, nil
	recordPool.Put(rec)
	if notify && b.obs != nil && b.obs.Done != nil {
		b.obs.Done(DoneInfo{Endpoint: p.Endpoint(), Latency: b.since(picked), Streamed: streaming, Err: err})
	}
}

// maxAhead is how far a time stamped at one clock reading may be ahead of
// a later reading and still be taken for a reading made a moment before
// it, whose goroutine stored it late. A stamp further ahead was read from a
// clock that has since gone back (an injected clock without monotonic
// readings, read once far ahead): what decays from such a stamp decays from
// the later reading instead, so that one reading far ahead does not hold it
// until the clock catches up.
const maxAhead = time.Second

// ahead reports whether the stamp at (unix nanos) is more than maxAhead
// ahead of the reading now.
func ahead(at, now int64) bool { return at > now && uint64(at-now) > uint64(maxAhead) }

// since returns the time from start, on the balancer's time line, to the
// clock's reading, or 0 if the clock went back past start.
func (b *Balancer) since(start int64) time.Duration {
	return time.Duration(max(b.now()-start, 0))
}

// now returns the clock's reading on the balancer's time line.
func (b *Balancer) now() int64 { return b.line.UnixNano(b.clock.Now()) }

// unixNano returns t on the balancer's time line, on which it measures
// every interval: a request's time to first token and decode, an
// observation's age, slow start's progress. Readings that carry the
// monotonic clock, as time.Now's do, are placed on it, so that a step of
// the wall clock stretches or reverses none of them (see timeline.Line).
func (b *Balancer) unixNano(t time.Time) int64 { return b.line.UnixNano(t) }

// isNotSent reports whether err wraps [ErrNotSent]. An error that joins it
// to another, as the adapters' do, is recognised without the reflection of
// errors.Is.
func isNotSent(err error) bool {
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range u.Unwrap() {
			if e == ErrNotSent {
				return true
			}
		}
	}
	return errors.Is(err, ErrNotSent)
}

// doneEpoch counts the completion of rec's request in st's epoch; notSent
// says the request never reached the endpoint, whose observations then
// never counted it.
func (b *Balancer) doneEpoch(st *epState, rec *record, streaming, notSent bool) {
	at := b.observedAt(st)
	if at == never && st.obsAt.Load() == never {
		return // epoch 0 still, which keeps no counts
	}
	st.mu.Lock()
	st.roll(at, math.MaxInt64) // its observation may be stale: never back
	switch {
	case st.epoch == rec.epoch-1 && st.epoch > 0:
		st.epReqs.Add(-1)
		if !streaming {
			st.epQueued.Add(-1)
		}
		st.epTokens.Add(-int64(rec.d1&low32 + rec.d2>>32))
	case rec.picked <= st.obsAt.Load() && !notSent:
		// The observation counted it; it is gone now.
		if streaming {
			st.epRunDone.Add(1)
		} else {
			st.epWaitDone.Add(1)
		}
	}
	st.mu.Unlock()
}

// The phases of a record, in the low bits of its state; the generation, in
// the bits above, advances by one step per request.
const (
	phasePicked    = 1
	phaseStreaming = 2
	phaseBusy      = 3 // FirstToken holds the record
	phaseMask      = 3
	generationStep = 4
)

// record is the pooled storage behind a Pick. Its plain fields are written
// by commit, before the handle exists, and read only by the FirstToken or
// Done call that won the state for the handle's generation; a stale handle's
// generation never matches, so it reads nothing. A record in the pool is in
// the picked phase of the generation its next request will have.
type record struct {
	state  atomic.Uint64
	st     *epState
	d1, d2 uint64 // the request's charge to st's packed counts (see epState.charge)
	spill  uint8  // where d1 (bit 0) and d2 (bit 1) were charged
	// prefillOnly marks a request whose answer ends at its first token,
	// the prefill of a disaggregated request: it teaches the time to first
	// token, but no decode.
	prefillOnly bool
	// epoch is 1 + the epoch of st the dispatch counted in; 0 = none.
	epoch  uint64
	b      *Balancer
	picked int64   // unix nanos of the pick, when the balancer has an Observer or a Signal or learns
	first  int64   // unix nanos of the first token, when the balancer learns; never before it, and for prefillOnly
	work   float64 // the prefill work the policy priced, when the balancer learns
	area0  int64   // the endpoint's loadArea at the first token, when the balancer learns
	// out is the output tokens reported with Generated (outCountMask) and
	// the generation they count for (outTag). A count under another
	// generation's tag belongs to no live request and reads as zero; the
	// first Generated of a request replaces it. Done resets a count it
	// read, and a Generated that finds its request done after adding to
	// the count clears it, so that no count outlives its request to be
	// read by a later generation with the same tag.
	out           atomic.Uint64
	kind, feature uint64 // the request's output-prediction keys
	// aux holds what only some policies keep for a request until Done, nil
	// if none: it keeps the record within two cache lines.
	aux *recordAux
	// choices is the request's completions (Request.Choices, at least 1):
	// its decode and output count all of them, and what is learned from
	// them is one completion's.
	choices uint32
	// flowed is the prompt tokens the policy added to the endpoint's
	// prefill flow for the request (Candidates.flowed).
	flowed int32
}

// recordAux is the part of a record that only some policies fill.
type recordAux struct {
	active *activeHold // the request's active blocks, released at Done
	// undo is the prompt blocks the policy recorded at the endpoint for
	// the request, which Done forgets if the request was not sent.
	undo recorded
	slot adapterHold // the adapter slot the request holds, released at Done
}

// auxPool holds the recordAux values of no request.
var auxPool = sync.Pool{New: func() any { return new(recordAux) }}

// The packing of record.out: a generation tag, the low 33 bits of the
// generation, above a count of 31 bits, which saturates at maxTokens, the
// bound of every token count of a Request. The tag tells a handle's
// generation from the record's only modulo 2^33: a handle kept after its
// Done while its record served a multiple of 2^33 later requests, whose
// Generated finds the record's current request with a count, adds to that
// count and then clears it: the current request loses the tokens reported
// for it so far. A record serves one request at a time, so that even a
// balancer sending every request through one record at ten million a
// second reuses it 2^33 times in 14 minutes; at 100,000 requests a second,
// in a day. The tag and count share the word that Done reads with one
// load, so the split costs nothing.
const (
	outCountBits = 31
	outCountMask = 1<<outCountBits - 1 // maxTokens
)

// outTag returns the tag of record.out for a record whose state is s.
func outTag(s uint64) uint64 { return (s / generationStep) << outCountBits }

// Generated reports that n more output tokens of the request were streamed
// (for example one per server-sent event, or the usage a response reports).
// A balancer with [WithOutputPrediction] learns output lengths from the
// totals of requests that complete, and one whose policy learns speeds
// ([Default], see [DefaultConfig].DisableLearning) measures decode time per
// token with them. It may be called from any goroutine; calls after Done,
// and n <= 0, do nothing. (The exception is a handle kept until the
// storage behind it has served a multiple of 2^33 more requests, hours
// even at ten million picks a second: its call may clear the count of the
// request the storage then serves.)
func (p Pick) Generated(n int) {
	rec := p.rec
	if rec == nil || n <= 0 {
		return
	}
	tag := outTag(p.base)
	for {
		v, c := rec.out.Load(), uint64(n)
		if v&^outCountMask == tag {
			c = min(v&outCountMask+c, outCountMask)
		} else if rec.state.Load()&^phaseMask != p.base {
			return // done: the record serves a later request
		}
		// Otherwise the count is an earlier request's: start this one's.
		if !rec.out.CompareAndSwap(v, tag|min(c, outCountMask)) {
			continue
		}
		if rec.state.Load()&^phaseMask != p.base {
			// Done won meanwhile and may not have seen the count: clear
			// it, so that it never counts for a later request.
			p.clearOut()
		}
		return
	}
}

// clearOut clears a count of p's request left in its record after Done.
func (p Pick) clearOut() {
	rec, tag := p.rec, outTag(p.base)
	for {
		v := rec.out.Load()
		if v&^outCountMask != tag || rec.out.CompareAndSwap(v, outTag(p.base+generationStep)) {
			return
		}
	}
}

// recordPool holds the free records. A record is 128 bytes, a size class
// whose objects start on a cache line and fill two, so that the records of
// picks on different processors never share a line.
var recordPool = sync.Pool{New: func() any {
	rec := new(record)
	rec.state.Store(phasePicked)
	return rec
}}

// uint64 returns a uniformly distributed 64-bit number.
func (b *Balancer) uint64() uint64 {
	if b.src == nil {
		return rand.Uint64()
	}
	b.randMu.Lock()
	x := b.src.Uint64()
	b.randMu.Unlock()
	return x
}

// uint64n returns a uniformly distributed number in [0, n).
func (b *Balancer) uint64n(n uint64) uint64 {
	var x uint64
	if b.src == nil {
		return rand.Uint64N(n)
	}
	b.randMu.Lock()
	x = b.src.Uint64()
	b.randMu.Unlock()
	// Lemire's multiply-shift; the bias is below 2^-32 for the n used here.
	hi, _ := bits.Mul64(x, n)
	return hi
}

func (b *Balancer) float64() float64 {
	if b.src == nil {
		return rand.Float64()
	}
	b.randMu.Lock()
	x := b.src.Uint64()
	b.randMu.Unlock()
	return float64(x>>11) / (1 << 53)
}
