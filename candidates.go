package llmlb

import (
	"fmt"
	"math"
	"slices"

	"github.com/llmlb/llmlb/prefix"
	"sync"
	"time"
)

// Candidates is the view a [Policy] chooses from: the endpoints a request may
// go to, with the balancer's estimate of each one's load. It is valid only
// during Policy.Choose; indexes run from 0 to Len()-1. It belongs to the
// goroutine that called Choose: a policy must not keep it or hand it to
// another goroutine, and it is not safe for concurrent use.
type Candidates struct {
	b      *Balancer
	snap   *snapshot
	idx    []int32  // member indexes of the candidates; used when filtered
	all    bool     // every member is a candidate
	req    *Request // the caller's, or &zero for a nil one; nil when pooled
	zero   Request
	reqTok int64 // RequestTokens, computed once per pick
	// outKind and outFeature are the request's output-prediction keys
	// (outputKeys), or 0 without output prediction.
	outKind, outFeature uint64
	// active is the request's active blocks that the policy held at the
	// endpoint it chose; commit hands it to the pick's record.
	active  *activeHold
	ties    []int32
	pick    []int32 // candidates a policy scores, when not all
	cand    []int32 // member index -> candidate index or -1
	seen    []bool  // scratch flags: per member in ring walks, per candidate in Default
	excl    []bool  // per member: excluded by the request; set by init for a long Exclude
	scratch EndpointLoad
	kvMean  kvMean         // the candidates' mean KV usage, for KVScore
	undo    recorded       // the prompt blocks the policy recorded for the pick
	loads   []EndpointLoad // per candidate, for policies that need them all
	matched []int32        // per candidate: leading prompt blocks cached
	// holding lists the candidates with matched above zero, some perhaps
	// twice, in no particular order.
	holding []int32
	// confirmed is, per candidate, the leading prompt blocks engine KV
	// events reported, for policies with a separate events index.
	confirmed []int32
	matches   []prefix.Match
	strided   []uint64 // a request's prefix grouped into a policy's blocks (prefixTracker.blocks)
	costs     []float64
	src       []int32 // per candidate: the candidate whose estimate in loads is its own (see loadsInto)
	adapter   []uint8 // per candidate: its class for the request's adapter (AdapterAffinity)
	cached    int
	// speeds and pool are the candidates' speed estimates and their
	// average, for a policy that learns (see
	// [DefaultConfig].DisableLearning); work is the prefill work it priced
	// for the chosen candidate, which the balancer hands to the estimate
	// at the first token.
	speeds []speedView
	pool   poolSpeed
	work   float64
	// flowed is the prompt tokens the policy added to the chosen
	// candidate's prefill flow (Default with objectives), which the
	// balancer keeps in the record for a Disaggregated pick to withdraw.
	flowed    int32
	signalAge time.Duration // for the observer: age of the chosen endpoint's observation, -1 if none
	t         clockReading  // the pick's time
	// slot is the adapter slot AdapterAffinity counted at the endpoint it
	// chose; commit hands it to the pick's record.
	slot adapterHold
}

// clockReading is the time of one pick, read from the balancer's clock on
// first use.
type clockReading struct {
	at   time.Time // the clock's reading
	now  int64     // at on the balancer's time line (see Balancer.unixNano)
	read bool      // at and now hold the clock's reading
}

// nanos returns the reading on b's time line, reading b's clock the first
// time.
func (t *clockReading) nanos(b *Balancer) int64 {
	if !t.read {
		t.at = b.clock.Now()
		t.now, t.read = b.unixNano(t.at), true
	}
	return t.now
}

var candidatesPool = sync.Pool{New: func() any { return new(Candidates) }}

func (c *Candidates) release() {
	if c.active != nil { // held for a pick that was not made
		c.active.drop()
		c.active = nil
	}
	c.b, c.snap, c.req, c.cached, c.t, c.work, c.flowed = nil, nil, nil, 0, clockReading{}, 0, 0
	c.kvMean, c.undo = kvMean{}, recorded{}
	c.cand = c.cand[:0]
	candidatesPool.Put(c)
}

// init selects the candidates: members not excluded by the request, and of
// those the healthy ones if any is healthy.
func (c *Candidates) init(b *Balancer, snap *snapshot) error {
	c.b, c.snap = b, snap
	if c.req == nil {
		c.zero = Request{}
		c.req = &c.zero
	}
	c.reqTok = int64(c.req.PromptTokens) + c.decodeEstimate(b)
	c.all = len(c.req.Exclude) == 0 && b.unhealthy.Load() == 0
	if c.all {
		return nil
	}
	c.idx = c.idx[:0]
	long := c.markExcluded(snap)
	sick := 0
	for i, st := range snap.eps {
		if c.isExcluded(long, i, st.key) {
			continue
		}
		if st.unhealthy.Load() {
			sick++
			continue
		}
		c.idx = append(c.idx, int32(i))
	}
	if len(c.idx) > 0 {
		return nil
	}
	if sick == 0 {
		return fmt.Errorf("%w: all %d endpoints excluded", ErrNoCandidates, len(snap.eps))
	}
	// Panic mode: only unhealthy endpoints remain; pick among them.
	for i, st := range snap.eps {
		if !c.isExcluded(long, i, st.key) {
			c.idx = append(c.idx, int32(i))
		}
	}
	return nil
}

// maxScannedExcludes is the longest Exclude that init scans for each
// member; a longer one is looked up once per key instead, so that a pick
// excluding most of a large pool costs time linear in the pool, not in its
// square.
const maxScannedExcludes = 8

// markExcluded, for a request excluding more than maxScannedExcludes keys,
// flags the members it excludes in c.excl and reports true.
func (c *Candidates) markExcluded(snap *snapshot) bool {
	if len(c.req.Exclude) <= maxScannedExcludes {
		return false
	}
	if cap(c.excl) < len(snap.eps) {
		c.excl = make([]bool, len(snap.eps))
	}
	c.excl = c.excl[:len(snap.eps)]
	clear(c.excl)
	for _, key := range c.req.Exclude {
		if m, ok := snap.member(key); ok {
			c.excl[m] = true
		}
	}
	return true
}

// isExcluded reports whether member i, of the given key, is excluded by the
// request; long is markExcluded's result.
func (c *Candidates) isExcluded(long bool, i int, key string) bool {
	if long {
		return c.excl[i]
	}
	return excluded(c.req.Exclude, key)
}

// initAll is init for a request (c.req, not nil) that excludes nothing,
// on a balancer with every member healthy.
func (c *Candidates) initAll(b *Balancer, snap *snapshot) {
	c.b, c.snap, c.all = b, snap, true
	c.reqTok = int64(c.req.PromptTokens) + c.decodeEstimate(b)
}

func excluded(keys []string, key string) bool {
	for _, k := range keys {
		if k == key {
			return true
		}
	}
	return false
}

// Len returns the number of candidates.
func (c *Candidates) Len() int {
	if c.all {
		return len(c.snap.eps)
	}
	return len(c.idx)
}

func (c *Candidates) state(i int) *epState {
	if c.all {
		return c.snap.eps[i]
	}
	return c.snap.eps[c.idx[i]]
}

// Endpoint returns candidate i.
func (c *Candidates) Endpoint(i int) Endpoint { return c.state(i).desc.Load().ep }

// Key returns the key of candidate i.
func (c *Candidates) Key(i int) string { return c.state(i).key }

// Member returns the position of candidate i in the membership passed to the
// last [Balancer.Update]. Together with Generation it lets a policy keep
// per-endpoint state in a slice.
func (c *Candidates) Member(i int) int {
	if c.all {
		return i
	}
	return int(c.idx[i])
}

// Members returns the number of endpoints in the membership.
func (c *Candidates) Members() int { return len(c.snap.eps) }

// MemberKey returns the key of the member at position m (see Member).
func (c *Candidates) MemberKey(m int) string { return c.snap.eps[m].key }

// Generation identifies the membership: it changes with every
// [Balancer.Update] and is unique across balancers, so a policy can cache a
// structure derived from the membership (a hash ring) under it.
func (c *Candidates) Generation() uint64 { return c.snap.gen }

// Request returns the request being picked for. The policy must not modify
// it or retain it.
func (c *Candidates) Request() *Request { return c.req }

// SetCachedTokens tells the balancer how many of the request's prompt tokens
// the policy expects the chosen endpoint to serve from its prefix cache; they
// are not charged as prefill work. Policies that know nothing of prefixes
// leave it at 0.
func (c *Candidates) SetCachedTokens(n int) { c.cached = max(n, 0) }

// Uint64N returns a uniform random number in [0, n) from the balancer's
// random source. n must be positive.
func (c *Candidates) Uint64N(n uint64) uint64 { return c.b.uint64n(n) }

// Float64 returns a uniform random number in [0, 1) from the balancer's
// random source.
func (c *Candidates) Float64() float64 { return c.b.float64() }

// Now returns the balancer clock's time, read once per pick.
func (c *Candidates) Now() time.Time {
	c.t.nanos(c.b)
	return c.t.at
}

func (c *Candidates) nowNanos() int64 { return c.t.nanos(c.b) }

// RequestTokens returns the work, in tokens, that the request being picked
// adds to an endpoint: its prompt tokens plus its expected decode tokens
// (OutputTokens, else the decode allowance capped by MaxTokens, times its
// Choices).
func (c *Candidates) RequestTokens() int64 { return c.reqTok }

// EndpointLoad is the balancer's estimate of one candidate's load.
type EndpointLoad struct {
	// Outstanding, Queued, PrefillTokens and DecodeTokens are this
	// balancer's own exact counts: requests picked and not done, of those
	// the ones before their first token, prompt tokens not yet prefilled
	// (net of expected cache hits), and expected decode tokens.
	Outstanding   int64
	Queued        int64
	PrefillTokens int64
	DecodeTokens  int64
	// ActiveTokens estimates the KV footprint of this balancer's
	// outstanding requests: their prompt tokens plus expected decode tokens.
	ActiveTokens int64
	// Requests and Waiting estimate the requests at the endpoint from all
	// routers, in total and queued in the engine: with a fresh signal, the
	// observation, less this balancer's requests it counted that finished
	// since, plus this balancer's dispatches since it (never less than this
	// balancer's own counts);
	// otherwise Outstanding and Queued. An
	// observation may report counts as large as an int holds: the sums
	// saturate at math.MaxInt64 rather than wrap, so a Score should do its
	// arithmetic on them in float64.
	Requests int64
	Waiting  int64
	// KVUsage estimates the fraction of KV blocks in use, corrected with the
	// tokens dispatched since the observation when the capacity is known. It
	// may exceed 1 when more was sent than fits. NaN when no fresh signal
	// reports it.
	KVUsage float64
	// KVBlocks and BlockSize are the reported KV capacity, 0 if unknown.
	KVBlocks  int
	BlockSize int
	// Fresh reports whether a signal observation younger than the maximum
	// age was used.
	Fresh bool
	// backlog estimates the requests at the endpoint waiting for their
	// first token: with a fresh signal, the observation's waiting requests
	// (less this balancer's it counted that finished since without
	// streaming) plus this balancer's dispatches since it that have not
	// streamed yet (never less than Queued); otherwise Queued. Unlike
	// Waiting, which
	// counts every dispatch since the observation that is still
	// outstanding, it does not grow with the time since the observation.
	backlog int64
	// Weight is the endpoint's effective weight: its static weight (as
	// declared, or scaled by Update when the membership's weights are
	// extreme; see [Endpoint]) times its slow-start factor.
	Weight float64
	// PeerWaiting and PeerPrefillTokens are the fresh observation's
	// [Load.PeerWaiting] and [Load.PeerPrefillTokens]: the requests other
	// routers sent that have not streamed their first token, and the prompt
	// tokens they have still to prefill. Zero when unknown or not fresh.
	PeerWaiting       int64
	PeerPrefillTokens int64
}

// Load returns the load estimate of candidate i. It consults the signal, so a
// policy should call it once per candidate it considers.
func (c *Candidates) Load(i int) EndpointLoad {
	var l EndpointLoad
	c.loadInto(i, &l)
	return l
}

func (c *Candidates) loadInto(i int, l *EndpointLoad) {
	st := c.state(i)
	c.ownLoad(st, l)
	if c.b.signal == nil {
		return
	}
	var buf Load
	if obs := c.observe(st, &buf); obs != nil {
		observedLoad(st, l, obs, c.b.unixNano(obs.At), c.b.maxAge)
	}
}

// ownLoad sets l to the load estimate of st without a signal: this
// balancer's own counts.
func (c *Candidates) ownLoad(st *epState, l *EndpointLoad) {
	st.ownLoad(l)
	l.Weight = c.weight(st)
}

// ownLoad sets l, but for its Weight, to the load estimate of st without a
// signal.
func (st *epState) ownLoad(l *EndpointLoad) {
	var n counts
	st.countsInto(&n)
	n.setLoad(l)
}

// setLoad sets l, but for its Weight, to the load estimate of counts n
// without a signal.
func (n *counts) setLoad(l *EndpointLoad) {
	l.Outstanding = n.outstanding
	l.Queued = n.queued
	l.PrefillTokens = n.prefill
	l.DecodeTokens = n.decode
	l.ActiveTokens = n.prompt + n.decode
	l.Requests, l.Waiting, l.backlog = l.Outstanding, l.Queued, l.Queued
	l.KVUsage, l.KVBlocks, l.BlockSize, l.Fresh = math.NaN(), 0, 0, false
	l.PeerWaiting, l.PeerPrefillTokens = 0, 0
}

// observedLoad corrects l, set by ownLoad, with obs, st's fresh
// observation, taken at at on the balancer's time line; maxAge is the
// balancer's maximum signal age.
func observedLoad(st *epState, l *EndpointLoad, obs *Load, at int64, maxAge time.Duration) {
	e := st.correction(at, maxAge)
	l.Fresh = true
	// The observed counts may be as large as an int holds: saturate, never
	// wrap to a small or negative load. The epoch's counters are read
	// without a lock, so a concurrent change may show in some and not
	// others: bound each estimate below as well.
	running, waiting := int64(obs.Running), int64(obs.Waiting)
	counted := max(addSat(running, waiting)-max(e.runDone, 0)-max(e.waitDone, 0), 0)
	waiting = max(waiting-max(e.waitDone, 0), 0)
	l.Requests = max(addSat(counted, e.reqs), l.Outstanding)
	l.Waiting = max(addSat(waiting, e.reqs), l.Queued)
	l.backlog = max(addSat(waiting, e.queued), l.Queued)
	l.KVBlocks, l.BlockSize = obs.KVBlocks, obs.BlockSize
	l.PeerWaiting, l.PeerPrefillTokens = int64(obs.PeerWaiting), obs.PeerPrefillTokens
	if !math.IsNaN(obs.KVUsage) {
		l.KVUsage = obs.KVUsage
		if capacity := mulSat(obs.KVBlocks, obs.BlockSize); capacity > 0 {
			l.KVUsage += float64(e.tokens) / float64(capacity)
		}
	}
}

// loadsInto sets the load estimate of each candidate i, as loadInto does,
// and returns the sum of their backlogs. The estimate of candidate i is
// loads[src[i]]. Without a signal (or with one known to have recorded no
// observation yet), and with no member in slow start, an estimate is a
// function of the endpoint's packed counts and static weight alone: a
// candidate whose counts and weight are the previous candidate's shares its
// estimate, src[i] being the first candidate of their run, and loads[i] is
// left unset (see load). An idle pool is scored at the cost of reading its
// counts. Otherwise src[i] is i.
func (c *Candidates) loadsInto(loads []EndpointLoad, src []int32) (backlog float64) {
	// A signal known to hold no observation yet adds nothing to the
	// balancer's own counts (see loadInto), so its loads are read as
	// without one.
	if c.b.signal != nil && !c.b.unobserved() || c.b.slowUntil.Load() != never {
		for i := range loads {
			c.loadInto(i, &loads[i])
			src[i] = int32(i)
			backlog += float64(loads[i].backlog)
		}
		return backlog
	}
	var prevR, prevT, prevW uint64
	prevPacked := false // the previous candidate's counts are all packed
	run := 0            // the first candidate of the run of equal estimates
	for i := range loads {
		st := c.state(i)
		r, t, w := st.reqs.Load(), st.toks.Load(), st.weight.Load()
		packed := !st.spilled.Load()
		if !packed || !prevPacked || r != prevR || t != prevT || w != prevW {
			run = i
			var n counts
			n.unpack(r, t)
			if !packed {
				st.addSpilled(&n)
			}
			n.setLoad(&loads[i])
			loads[i].Weight = math.Float64frombits(w)
		}
		src[i] = int32(run)
		backlog += float64(loads[run].backlog)
		prevR, prevT, prevW, prevPacked = r, t, w, packed
	}
	return backlog
}

// load returns candidate i's estimate in c.loads, copied there first if
// loadsInto left it with another candidate.
func (c *Candidates) load(i int) *EndpointLoad {
	if i < len(c.src) && int(c.src[i]) != i {
		c.loads[i] = c.loads[c.src[i]]
		c.src[i] = int32(i)
	}
	return &c.loads[i]
}

// Weight returns the effective weight of candidate i: its static weight
// (see [EndpointLoad].Weight) times its slow-start factor.
func (c *Candidates) Weight(i int) float64 { return c.weight(c.state(i)) }

// unitWeights reports whether every member's effective weight is known to
// be 1 without reading any: every static weight is 1 and no member has
// been in slow start.
func (c *Candidates) unitWeights() bool {
	return c.snap.unit && c.b.slowUntil.Load() == never
}

func (c *Candidates) weight(st *epState) float64 {
	w := st.staticWeight()
	if until := c.b.slowUntil.Load(); until != never {
		if started := st.started.Load(); started != never {
			now := c.nowNanos()
			if now < started {
				// The clock went back: the ramp starts again from now,
				// rather than holding the endpoint at its least weight
				// for the length of the step.
				if st.started.CompareAndSwap(started, now) {
					c.b.extendSlowStart(now)
				}
				started, until = now, c.b.slowUntil.Load()
			}
			if now < until {
				w *= c.b.slow.factor(time.Duration(now - started))
			}
		}
	}
	return w
}

// observe returns st's observation if it is valid and younger than the
// maximum signal age, else nil; buf is the storage load may use. It does
// not load a signal known to have recorded no observation yet.
func (c *Candidates) observe(st *epState, buf *Load) *Load {
	if c.b.unobserved() {
		return nil
	}
	if obs := c.b.load(st, buf); obs != nil && c.fresh(obs) {
		return obs
	}
	return nil
}

// fresh reports whether obs is valid and younger than the maximum signal
// age.
func (c *Candidates) fresh(obs *Load) bool { return c.b.fresh(obs, &c.t) }

// fresh reports whether obs is valid and younger than the maximum signal
// age at the time t. An observation stamped further ahead of t than that is
// not fresh either: after the clock steps back, the observations taken
// before would otherwise count as fresh for the step's length, whether or
// not anything still refreshes them.
func (b *Balancer) fresh(obs *Load, t *clockReading) bool {
	if !obs.valid() {
		return false
	}
	age := t.nanos(b) - b.unixNano(obs.At)
	return age <= int64(b.maxAge) && age >= -int64(b.maxAge)
}

// epochCounts is what changed of this balancer's requests to an endpoint
// since its observation (see the epoch fields of epState).
type epochCounts struct {
	reqs, queued, tokens int64 // dispatches since the observation, still outstanding
	runDone, waitDone    int64 // requests the observation counted that finished since
}

// correction returns what changed of this balancer's requests to st since
// the observation taken at at was first seen: the dispatches made since and
// still outstanding (requests, those of them before their first token, and
// tokens), and the requests the observation counted that finished since,
// after their first token and before it. The observation is fresh, so
// one more than maxAge older than the epoch's starts a new epoch (see roll).
func (st *epState) correction(at int64, maxAge time.Duration) epochCounts {
	if cur := st.obsAt.Load(); at > cur || back(cur, at, maxAge) {
		st.mu.Lock()
		st.roll(at, maxAge)
		st.mu.Unlock()
	}
	return epochCounts{
		reqs: st.epReqs.Load(), queued: st.epQueued.Load(), tokens: st.epTokens.Load(),
		runDone: st.epRunDone.Load(), waitDone: st.epWaitDone.Load(),
	}
}

// roll starts a new epoch if the observation at is newer than the current
// epoch's, or older by more than maxAge: a fresh observation that much
// older was taken after a clock that stamps observations stepped back past
// the epoch's, which no later observation would otherwise pass for as long
// as the step, and meanwhile every observation would count again the
// dispatches it includes. Pass math.MaxInt64 for an observation that may
// be stale. The caller holds st.mu.
func (st *epState) roll(at int64, maxAge time.Duration) {
	if cur := st.obsAt.Load(); at > cur || back(cur, at, maxAge) {
		st.obsAt.Store(at)
		st.epoch++
		st.epReqs.Store(0)
		st.epQueued.Store(0)
		st.epTokens.Store(0)
		st.epRunDone.Store(0)
		st.epWaitDone.Store(0)
	}
}

// back reports whether at is more than maxAge before cur.
func back(cur, at int64, maxAge time.Duration) bool {
	return at < cur && cur != never && uint64(cur-at) > uint64(maxAge)
}

// observedAt returns the time of the signal's valid observation of st, or
// never if there is none. A completion rolls the epoch to it before
// counting, so that it counts against the observation the engine reports
// even if no pick has loaded that observation yet.
func (b *Balancer) observedAt(st *epState) int64 {
	if b.unobserved() {
		return never
	}
	var buf Load
	obs := b.load(st, &buf)
	if obs == nil || !obs.valid() {
		return never
	}
	return b.unixNano(obs.At)
}

// decodeEstimate returns the decode work charged for the request: the
// caller's estimate, else the learned length of its kind, else the
// allowance, capped by MaxTokens, times its choices (at most maxTokens).
// With output prediction it also notes the request's keys in c.
func (c *Candidates) decodeEstimate(b *Balancer) int64 {
	r := c.req
	c.outKind, c.outFeature = 0, 0
	if b.outputs != nil {
		c.outKind, c.outFeature = outputKeys(r)
	}
	if r.OutputTokens > 0 {
		return min(int64(r.OutputTokens)*r.choices(), maxTokens)
	}
	d := int64(b.allowance)
	if b.outputs != nil {
		if e := b.outputs.estimate(c.outKind, c.outFeature); e > 0 {
			d = e
		}
	}
	if r.MaxTokens > 0 {
		d = min(d, int64(r.MaxTokens))
	}
	return min(d*r.choices(), maxTokens)
}

// requests returns candidate i's estimated requests.
func (c *Candidates) requests(i int) int64 {
	var l EndpointLoad
	c.loadInto(i, &l)
	return l.Requests
}

// memberToCandidate returns a slice mapping member index to candidate index,
// -1 for members that are not candidates. It is valid for this pick.
func (c *Candidates) memberToCandidate() []int32 {
	if len(c.cand) == len(c.snap.eps) {
		return c.cand
	}
	c.cand = slices.Grow(c.cand[:0], len(c.snap.eps))[:len(c.snap.eps)]
	if c.all {
		for m := range c.cand {
			c.cand[m] = int32(m)
		}
		return c.cand
	}
	for m := range c.cand {
		c.cand[m] = -1
	}
	for i, m := range c.idx {
		c.cand[m] = int32(i)
	}
	return c.cand
}

// visitedScratch returns a zeroed per-member slice of flags.
func (c *Candidates) visitedScratch() []bool {
	c.seen = slices.Grow(c.seen[:0], len(c.snap.eps))[:len(c.snap.eps)]
	clear(c.seen)
	return c.seen
}

// Narrow keeps only the candidates for which keep returns true, renumbering
// them from 0, and reports whether any was kept; if none is, the candidates
// are left unchanged. A policy that delegates to another over a subset (a
// pool) narrows first, then calls the other policy with c: the index it
// returns refers to the narrowed candidates.
func (c *Candidates) Narrow(keep func(i int) bool) bool {
	n := c.Len()
	kept := c.ties[:0] // scratch: candidate indexes kept
	for i := 0; i < n; i++ {
		if keep(i) {
			kept = append(kept, int32(i))
		}
	}
	c.ties = kept[:0]
	if len(kept) == 0 {
		return false
	}
	if len(kept) == n {
		return true
	}
	// Rewrite idx in place: kept is increasing, so member(kept[j]) is read
	// before position j is overwritten.
	if c.all {
		c.idx = append(slices.Grow(c.idx[:0], len(kept)), kept...)
		c.all = false
	} else {
		for j, i := range kept {
			c.idx[j] = c.idx[i]
		}
		c.idx = c.idx[:len(kept)]
	}
	c.cand = c.cand[:0]
	c.kvMean = kvMean{}
	return true
}

// hold keeps h, the active blocks the policy added for the endpoint it
// chose, for the pick's record, which releases them at Done.
func (c *Candidates) hold(h *activeHold) {
	if c.active != nil {
		c.active.drop()
	}
	c.active = h
}
