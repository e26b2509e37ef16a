package llmlb

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
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
	obs       *Observer // nil: no observer

	randMu sync.Mutex // protects src
	src    rand.Source

	snap      atomic.Pointer[snapshot]
	unhealthy atomic.Int64 // members currently marked unhealthy
	slowUntil atomic.Int64 // unix nanos after which no member is in slow start; never if none has been

	mu          sync.Mutex // serializes Update and SetHealthy
	initialized bool       // a non-empty membership was seen
}

// snapshot is an immutable membership. Pick reads it without locks; Update
// replaces it.
type snapshot struct {
	eps   []*epState
	byKey map[string]*epState
	pos   map[string]int // member index by key
	gen   uint64
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
	st := &epState{key: key}
	st.started.Store(never)
	st.obsAt.Store(never)
	return st
}

// epState is the accounting of one endpoint. It lives as long as the endpoint
// is a member and past that while handles still point to it.
type epState struct {
	key  string
	desc atomic.Pointer[epDesc] // replaced by Update, read by Pick

	requests  atomic.Int64 // outstanding<<32 | queued: requests picked and not done, and of those before their first token
	prefill   atomic.Int64 // prompt tokens picked and not yet prefilled
	prompt    atomic.Int64 // prompt tokens of outstanding requests
	decode    atomic.Int64 // expected decode tokens of outstanding requests
	unhealthy atomic.Bool
	started   atomic.Int64 // unix nanos slow start began; never = not in slow start

	// The epoch: what changed of this balancer's own requests since the
	// current observation was first seen; used only when a signal is
	// configured. Readers load the atomics without the lock; every change
	// happens under it, so that a dispatch and its completion always count
	// in the same epoch.
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
	}
	b.slowUntil.Store(never)
	b.snap.Store(&snapshot{byKey: map[string]*epState{}, gen: generations.Add(1)})
	return b, nil
}

// Update replaces the membership with eps. Endpoints whose key stays keep
// their accounting and health; requests picked before the update finish
// correctly after it even if their endpoint is gone. With [WithSlowStart],
// endpoints added after the first non-empty membership start in slow start.
// Update rejects a nil endpoint, an empty or duplicate key, or a weight that
// is not finite and positive with an error wrapping [ErrInvalidEndpoints],
// and then leaves the membership unchanged.
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

	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.snap.Load()
	next := &snapshot{
		eps:   make([]*epState, len(entries)),
		byKey: make(map[string]*epState, len(entries)),
		pos:   make(map[string]int, len(entries)),
		gen:   generations.Add(1),
	}
	now := int64(never) // the start of slow start of added endpoints
	if b.initialized && b.slow.Window > 0 {
		now = b.clock.Now().UnixNano()
	}
	var unhealthy int64
	for i, e := range entries {
		key := e.ep.Key()
		st := old.byKey[key]
		if st == nil {
			st = newEpState(key)
			if now != never {
				st.started.Store(now)
				b.extendSlowStart(now)
			}
		}
		st.desc.Store(&epDesc{ep: e.ep, weight: e.weight})
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
	b.unhealthy.Store(unhealthy)
	b.snap.Store(next)
	return nil
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
		b.unhealthy.Add(-1)
		if b.slow.Window > 0 {
			now := b.clock.Now().UnixNano()
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
		out[i] = EndpointStats{
			Key:           st.key,
			Outstanding:   st.outstanding(),
			Queued:        st.queued(),
			PrefillTokens: st.prefill.Load(),
			DecodeTokens:  st.decode.Load(),
			Healthy:       !st.unhealthy.Load(),
		}
	}
	return out
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
	c := candidatesPool.Get().(*Candidates)
	defer c.release()
	if r != nil {
		if err := r.validate(); err != nil {
			return Pick{}, err
		}
	}
	c.req = r
	snap := b.snap.Load()
	if len(snap.eps) == 0 {
		return Pick{}, b.failed(r, ErrNoEndpoints)
	}
	if err := c.init(b, snap); err != nil {
		return Pick{}, b.failed(r, err)
	}
	// The policy sees every pick, even of a single candidate: a policy that
	// keeps state (a prefix index) must record where each request went, and
	// only it knows how many prompt tokens the endpoint holds.
	i := b.policy.Choose(c)
	if i < 0 || i >= c.Len() {
		return Pick{}, b.failed(r, policyErrorf("policy %T chose %d of %d candidates", b.policy, i, c.Len()))
	}
	p := b.commit(c, c.state(i))
	if b.obs != nil && b.obs.Pick != nil {
		b.obs.Pick(PickInfo{Endpoint: p.ep, Request: r, Candidates: c.Len(), CachedTokens: c.cached, SignalAge: c.signalAge})
	}
	return p, nil
}

// failed tells the observer of a failed pick and returns err.
func (b *Balancer) failed(r *Request, err error) error {
	if b.obs != nil && b.obs.Pick != nil {
		b.obs.Pick(PickInfo{Request: r, SignalAge: -1, Err: err})
	}
	return err
}

// Both request counts of an endpoint live in one word, so that a pick and a
// completion each update them with one atomic add.
const (
	oneOutstanding = 1 << 32
	oneQueued      = 1
)

func (st *epState) outstanding() int64 { return st.requests.Load() >> 32 }
func (st *epState) queued() int64      { return int64(int32(st.requests.Load())) }

// commit charges c's request to st and returns its handle.
func (b *Balancer) commit(c *Candidates, st *epState) Pick {
	r := c.req
	prefill := int64(r.PromptTokens - min(c.cached, r.PromptTokens))
	decode := b.decodeEstimate(r)
	st.requests.Add(oneOutstanding + oneQueued)
	st.prefill.Add(prefill)
	st.prompt.Add(int64(r.PromptTokens))
	st.decode.Add(decode)

	rec := recordPool.Get().(*record)
	rec.st, rec.prefill, rec.decode, rec.prompt, rec.epoch = st, prefill, decode, int64(r.PromptTokens), 0
	rec.b, rec.picked = b, 0
	c.signalAge = -1
	if b.obs != nil || b.signal != nil {
		rec.picked = c.nowNanos()
	}
	if b.signal != nil {
		obs, fresh := c.observe(st)
		if fresh && b.obs != nil {
			c.signalAge = time.Duration(c.nowNanos() - obs.At.UnixNano())
		}
		st.mu.Lock()
		if fresh {
			st.roll(obs.At.UnixNano())
		}
		st.epReqs.Add(1)
		st.epQueued.Add(1)
		st.epTokens.Add(prefill + decode)
		rec.epoch = st.epoch + 1 // 0 means "not tracked"
		st.mu.Unlock()
	}
	// Publishing the picked phase releases the fields written above to
	// whichever call wins the record next.
	base := rec.state.Add(phasePicked) - phasePicked
	return Pick{rec: rec, base: base, ep: st.desc.Load().ep}
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
	ep   Endpoint
}

// Endpoint returns the picked endpoint, or nil for the zero Pick.
func (p Pick) Endpoint() Endpoint { return p.ep }

// FirstToken records that prefill is done and streaming began: the request's
// prompt tokens stop counting as pending prefill. It is the commitment point
// after which retries and hedges are no longer invisible to the user.
func (p Pick) FirstToken() {
	rec := p.rec
	if rec == nil || !rec.state.CompareAndSwap(p.base|phasePicked, p.base|phaseBusy) {
		return // done, streaming already, or another call holds it
	}
	st := rec.st
	st.prefill.Add(-rec.prefill)
	st.requests.Add(-oneQueued)
	if rec.epoch != 0 {
		st.mu.Lock()
		if st.epoch == rec.epoch-1 {
			st.epQueued.Add(-1)
		}
		st.mu.Unlock()
	}
	b, picked := rec.b, rec.picked
	rec.state.Store(p.base | phaseStreaming)
	if b.obs != nil && b.obs.FirstToken != nil {
		b.obs.FirstToken(FirstTokenInfo{Endpoint: p.ep, Latency: time.Duration(b.clock.Now().UnixNano() - picked)})
	}
}

// Done records that the request finished, successfully or not (err is
// informational). It releases all the work charged to the endpoint. Calls
// after the first are no-ops.
func (p Pick) Done(err error) {
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
		if rec.state.CompareAndSwap(s, p.base|phaseBusy) {
			streaming = s == p.base|phaseStreaming
			break
		}
	}
	st := rec.st
	if streaming {
		st.requests.Add(-oneOutstanding)
	} else {
		st.prefill.Add(-rec.prefill)
		st.requests.Add(-oneOutstanding - oneQueued)
	}
	st.decode.Add(-rec.decode)
	st.prompt.Add(-rec.prompt)
	b, picked := rec.b, rec.picked
	if rec.epoch != 0 {
		at := b.observedAt(st)
		st.mu.Lock()
		st.roll(at)
		switch {
		case st.epoch == rec.epoch-1:
			st.epReqs.Add(-1)
			if !streaming {
				st.epQueued.Add(-1)
			}
			st.epTokens.Add(-(rec.prefill + rec.decode))
		case rec.picked <= st.obsAt.Load():
			// The observation counted it; it is gone now.
			if streaming {
				st.epRunDone.Add(1)
			} else {
				st.epWaitDone.Add(1)
			}
		}
		st.mu.Unlock()
	}
	rec.st, rec.b = nil, nil
	rec.state.Store(p.base + generationStep) // free, next generation
	recordPool.Put(rec)
	if b.obs != nil && b.obs.Done != nil {
		b.obs.Done(DoneInfo{Endpoint: p.ep, Latency: time.Duration(b.clock.Now().UnixNano() - picked), Streamed: streaming, Err: err})
	}
}

// The phases of a record, in the low bits of its state; the generation, in
// the bits above, advances by one step per request.
const (
	phaseFree      = 0
	phasePicked    = 1
	phaseStreaming = 2
	phaseBusy      = 3 // FirstToken or Done holds the record
	generationStep = 4
)

// record is the pooled storage behind a Pick. Its plain fields are written
// by commit before the state is published and read only by the FirstToken or
// Done call that moved the state to phaseBusy for the handle's generation; a
// stale handle's generation never matches, so it reads nothing.
type record struct {
	state   atomic.Uint64
	st      *epState
	prefill int64
	decode  int64
	prompt  int64
	epoch   uint64 // 1 + the epoch of st the dispatch counted in; 0 = none
	b       *Balancer
	picked  int64 // unix nanos of the pick, when the balancer has an Observer or a Signal
}

var recordPool = sync.Pool{New: func() any { return new(record) }}

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
