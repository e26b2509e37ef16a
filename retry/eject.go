package retry

import (
	"container/heap"
	"context"
	"errors"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/llmlb/llmlb"
)

// Defaults of [EjectorConfig], from Envoy's outlier detection.
const (
	DefaultConsecutiveFailures = 5
	DefaultBaseEjectionTime    = 30 * time.Second
	DefaultMaxEjectionTime     = 300 * time.Second
	DefaultMaxEjectionPercent  = 10
	// DefaultMaxCooldown caps the time an overload answer's requested wait
	// takes an endpoint out ([EjectorConfig.MaxCooldown]).
	DefaultMaxCooldown = 5 * time.Minute
	// DefaultSweepInterval is Envoy's outlier detection interval: how often
	// [Ejector.Run] ends the ejections that are due, and the time back in
	// that lowers an endpoint's ejection multiplier by one
	// ([EjectorConfig.SweepInterval]).
	DefaultSweepInterval = 10 * time.Second
)

// An Ejector reads the rate-limit headers that a transport gives it, and
// the age of each attempt reported.
var (
	_ QuotaReporter   = (*Ejector)(nil)
	_ ElapsedReporter = (*Ejector)(nil)
)

// maxTracked bounds the endpoints an [Ejector] keeps state for that are not
// ejected.
const maxTracked = 10000

// membersTTL is how long an [Ejector] trusts its count of the members of its
// [Health].
const membersTTL = time.Second

// Health is where an [Ejector] marks endpoints; [*llmlb.Balancer] implements
// it. The Ejector calls it under its own lock, from the goroutines that
// report outcomes and from Run, while the rest of the program (a
// Balancer's picks) uses it too: an implementation must be safe for
// concurrent use.
//
// A Balancer keeps one mark per endpoint, which the rest of the program may
// set too (its own checks, a health checker). Given an *llmlb.Balancer
// itself, the Ejector therefore marks unhealthy only an endpoint that is
// healthy when it takes it out, and marks healthy again, when the ejection
// or cooldown ends, only the endpoints it marked: an endpoint the program
// held out before stays out. A mark that the program sets while the
// Ejector holds an endpoint out is not seen: the Ejector's end marks the
// endpoint healthy. A program with several sources of health should
// therefore give the Ejector a Health of its own that records each
// source's mark and marks the balancer healthy only when no source holds
// the endpoint out; the Ejector then calls its SetHealthy(key, false) at
// every ejection and cooldown and SetHealthy(key, true) at every end.
type Health interface {
	SetHealthy(key string, healthy bool) error
	Stats() []llmlb.EndpointStats
}

// EjectorConfig configures an [Ejector]. The zero value is Envoy's default
// outlier detection: eject after 5 consecutive failures for 30 s times the
// ejection multiplier, at most 300 s, with an interval of 10 s, and never
// more than 10% of the endpoints, though always at least one (as Envoy does
// with always_eject_one_host set).
type EjectorConfig struct {
	// ConsecutiveFailures ejects an endpoint; 0 means
	// [DefaultConsecutiveFailures].
	ConsecutiveFailures int
	// BaseEjectionTime is multiplied by the endpoint's ejection
	// multiplier, which each ejection raises by one and each SweepInterval
	// the endpoint then spends back in lowers by one, down to zero; 0 means
	// [DefaultBaseEjectionTime].
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection: the multiplier stops rising once
	// it takes BaseEjectionTime past MaxEjectionTime. 0 means
	// [DefaultMaxEjectionTime], or BaseEjectionTime if that is longer. It
	// must not be below BaseEjectionTime.
	MaxEjectionTime time.Duration
	// MaxEjectionPercent bounds the share of endpoints ejected at once, in
	// (0, 100]: an endpoint is ejected only if the ejected ones, it
	// included, are at most that share of the members (rounding down, as
	// Envoy does: 10% of 29 allows 2), or if none is ejected (Envoy's
	// always_eject_one_host), so one endpoint may always be ejected. Envoy
	// leaves always_eject_one_host off by default, and then ejects nothing
	// from fewer than 10 hosts at 10%; most pools of model replicas are
	// that small, and a cap that allowed none in them would turn ejection
	// off. An ejection the cap refuses restarts the endpoint's count, as in
	// Envoy: it is tried again after ConsecutiveFailures more failures,
	// and a refused half-open probe closes the half-open state. 0 means
	// [DefaultMaxEjectionPercent].
	MaxEjectionPercent float64
	// Classify maps an attempt's error to Succeeded (resets the count),
	// Failed (counts) or Abandoned (ignored); nil means [HealthOutcome],
	// read at the Ejector's Clock: a pushback that is a time (an HTTP date
	// in Retry-After, a Unix or RFC 3339 rate-limit reset) at or before
	// now asks for no wait, so the answer is a failure, as a 503 without
	// one is.
	Classify func(err error) Outcome
	// MaxCooldown caps a cooldown: an endpoint that answers an overload
	// status (HTTP 429, HTTP 503 or gRPC UNAVAILABLE or RESOURCE_EXHAUSTED)
	// asking for a wait ([FromHeader]: Retry-After, grpc-retry-pushback-ms,
	// rate-limit resets) is marked unhealthy for that wait, at most
	// MaxCooldown, however large the wait asked; a cooldown is not a
	// failure, counts in no ejection and in no cap, and is followed by no
	// half-open probe. Unlike an ejection, a cooldown follows the server:
	// a longer wait asked of an endpoint cooling down (by an attempt sent
	// before the cooldown) keeps it out until that wait ends, and
	// [Observer.Cooldown] is told if that is a second or more after the
	// cooldown's end. A wait asked of an ejected endpoint (by an attempt
	// sent before its ejection) does not lengthen the ejection, which
	// nothing does once it starts, as in Envoy: the part of the wait that
	// outlasts it is a cooldown that follows it, and the endpoint is then
	// half-open when it comes back. 0 means [DefaultMaxCooldown]; a
	// negative value disables cooldowns.
	MaxCooldown time.Duration
	// SweepInterval is Envoy's outlier detection interval: how often
	// [Ejector.Run] calls Sweep, and the time back in after an ejection
	// that lowers the endpoint's ejection multiplier by one. 0 means
	// [DefaultSweepInterval]; it must not be negative.
	SweepInterval time.Duration
	// Clock tells the time; nil means the system clock. A reading older
	// than one already applied is applied at that later time, as a report
	// read before it that took the Ejector's lock after it; one more than a
	// minute older is a clock that went back, and the ejections,
	// cooldowns and quota refills set at later readings are bounded from
	// it (MaxEjectionTime, MaxCooldown, a day), so that a clock read once
	// far ahead does not hold later ejections as long.
	Clock llmlb.Clock
	// Observer, if set, is told of every ejection.
	Observer *Observer
}

// Ejector is outlier detection per endpoint, and cooldown after overload
// answers that ask for a wait ([EjectorConfig.MaxCooldown]): an endpoint with
// ConsecutiveFailures failures in a row is marked unhealthy in the balancer
// for BaseEjectionTime times its ejection multiplier (capped at
// MaxEjectionTime), then marked healthy again, which starts the balancer's
// slow start; the multiplier goes up by one at each ejection and down by
// one for each SweepInterval the endpoint spends back in, as in Envoy. It
// is then half-open: its first success closes it, its first failure ejects
// it again; an attempt sent before the return is not one of them if its
// start is reported ([Ejector.ReportElapsed]). Overload answers do not
// count: busy is not unhealthy. In an [*llmlb.Balancer], an endpoint that
// the program already marked unhealthy is left so, during the ejection and
// after ([Health]). Create one with [NewEjector]; report outcomes with
// Report or ReportElapsed (a [Loop] calls ReportElapsed when the Ejector is
// its Reporter, and a Reporter that wraps it must have the method too: see
// [ElapsedReporter]). Ejections end lazily, on the next Report or Sweep after
// their time; call [Ejector.Run] to end them when no traffic arrives. It
// starts no goroutines and is safe for concurrent use.
//
// Like Envoy's outlier detection, which follows the hosts of its cluster,
// an Ejector follows the membership of its Health, and reads it only when it
// must: when an ejection is due while others are in force, it counts the
// members for the cap from [Health.Stats], at most once a second, and at the
// same time forgets every endpoint that is no longer a member, freeing the
// cap's share of an ejected endpoint that left. An endpoint is also
// forgotten when marking it fails because it is not a member. State is kept
// only for endpoints that are failing, out, or have been out (for the time
// they came back; see [Ejector.ReportElapsed]), and for at most 10,000 that
// are not out: beyond that, a newly failing endpoint displaces the one
// reported least recently, which loses its count and the time it came
// back, so endpoints that come and go never stop the ejector from tracking
// current ones. A report costs the same however many endpoints there are,
// apart from that reading of the membership.
type Ejector struct {
	h         Health
	threshold int
	base, max time.Duration
	percent   float64
	classify  func(error) Outcome // Classify; nil: healthOutcome at the clock's time
	cooldown  time.Duration       // MaxCooldown; <= 0: no cooldowns
	interval  time.Duration       // SweepInterval
	clock     llmlb.Clock
	obs       *Observer
	limit     int // most entries that are not ejected; maxTracked

	mu       sync.Mutex           // protects the fields below and the entries
	eps      map[string]*epHealth // every tracked endpoint
	lru      epHealth             // sentinel of the ring of entries not ejected, least recently reported first
	live     int                  // entries in lru
	out      byUntil              // ejected and cooling entries
	cooling  int                  // entries of out cooling down, not ejected
	members  int                  // members of h at syncedAt
	synced   bool                 // members and syncedAt are set
	syncedAt time.Time
	gen      uint64    // the last membership read; marks the entries it saw
	last     time.Time // the latest time applied; see at
}

type epHealth struct {
	key         string
	consecutive int
	backoff     int       // the ejection multiplier when restored; see Ejector.backoff
	until       time.Time // end of the current ejection or cooldown; zero = neither
	coolUntil   time.Time // ejected: end of the cooldown that follows; zero = none
	cooling     bool      // until is a cooldown's, not an ejection's
	marked      bool      // out, and the Ejector marked it unhealthy
	halfOpen    bool      // restored, no outcome seen since
	restored    time.Time // when the last ejection ended
	back        time.Time // when the last ejection or cooldown ended

	// The rate-limit headroom last reported (ReportQuota): the fraction
	// left at quotaAt, refilling to 1 by quotaFull. quotaAt never goes
	// back: a report read before it is ignored.
	quota              float64
	quotaAt, quotaFull time.Time

	prev, next *epHealth // neighbours in Ejector.lru while not ejected
	idx        int       // index in Ejector.out while ejected
	seen       uint64    // the last membership read that listed it
}

// byUntil is a min-heap of ejected entries by the end of their ejection.
type byUntil []*epHealth

func (h byUntil) Len() int           { return len(h) }
func (h byUntil) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h byUntil) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *byUntil) Push(x any) {
	st := x.(*epHealth)
	st.idx = len(*h)
	*h = append(*h, st)
}
func (h *byUntil) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return st
}

// NewEjector returns an ejector that marks endpoints in h (usually an
// [*llmlb.Balancer]) and is configured by cfg. It rejects a nil h and
// values out of range with an error wrapping [ErrInvalidConfig].
func NewEjector(h Health, cfg EjectorConfig) (*Ejector, error) {
	if h == nil {
		return nil, invalidf("ejector has a nil Health")
	}
	if cfg.ConsecutiveFailures == 0 {
		cfg.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if cfg.BaseEjectionTime == 0 {
		cfg.BaseEjectionTime = DefaultBaseEjectionTime
	}
	if cfg.MaxEjectionTime == 0 {
		cfg.MaxEjectionTime = max(DefaultMaxEjectionTime, cfg.BaseEjectionTime)
	}
	if cfg.MaxEjectionPercent == 0 {
		cfg.MaxEjectionPercent = DefaultMaxEjectionPercent
	}
	if cfg.MaxCooldown == 0 {
		cfg.MaxCooldown = DefaultMaxCooldown
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	switch {
	case cfg.SweepInterval < 0:
		return nil, invalidf("ejector SweepInterval %v is negative", cfg.SweepInterval)
	case cfg.ConsecutiveFailures < 0:
		return nil, invalidf("ejector ConsecutiveFailures %d is negative", cfg.ConsecutiveFailures)
	case cfg.BaseEjectionTime < 0:
		return nil, invalidf("ejector BaseEjectionTime %v is negative", cfg.BaseEjectionTime)
	case cfg.MaxEjectionTime < cfg.BaseEjectionTime:
		return nil, invalidf("ejector MaxEjectionTime %v is below BaseEjectionTime %v", cfg.MaxEjectionTime, cfg.BaseEjectionTime)
	case !(cfg.MaxEjectionPercent > 0 && cfg.MaxEjectionPercent <= 100):
		return nil, invalidf("ejector MaxEjectionPercent %v must be in (0, 100]", cfg.MaxEjectionPercent)
	}
	e := &Ejector{
		h:         h,
		threshold: cfg.ConsecutiveFailures,
		base:      cfg.BaseEjectionTime,
		max:       cfg.MaxEjectionTime,
		percent:   cfg.MaxEjectionPercent,
		classify:  cfg.Classify,
		cooldown:  cfg.MaxCooldown,
		interval:  cfg.SweepInterval,
		clock:     clockOr(cfg.Clock),
		obs:       cfg.Observer,
		limit:     maxTracked,
		eps:       make(map[string]*epHealth),
	}
	e.lru.prev, e.lru.next = &e.lru, &e.lru
	return e, nil
}

// HealthOutcome is the default classification of an attempt's error for
// outlier detection. nil and HTTP statuses below 500 (the endpoint answered)
// are Succeeded. Overload answers are Abandoned: HTTP 429, HTTP 503 and gRPC
// UNAVAILABLE with a pushback that [FromHeader] reads and that asks for a
// wait or for no retry (Retry-After, grpc-retry-pushback-ms, rate-limit
// resets; a malformed Retry-After or reset, which it ignores, is none, and
// so is a wait of zero, "Retry-After: 0", which asks for an immediate
// retry, not for time to recover), gRPC RESOURCE_EXHAUSTED, and
// [*OverloadError]; so are context errors and errors wrapping [ErrExhausted]
// (a lower layer gave up, which says nothing of this endpoint). Other HTTP
// 5xx, gRPC UNAVAILABLE, INTERNAL and UNKNOWN, and errors without a status
// (transport failures) are Failed; other gRPC codes are Succeeded.
//
// HealthOutcome has no clock, so it reads a pushback that is a time (an
// HTTP date in Retry-After, a Unix or RFC 3339 rate-limit reset) as a wait
// however far in the past it lies: such a 503 or UNAVAILABLE is Abandoned.
// An [Ejector] without a Classify reads it at its own Clock instead, and
// counts an answer whose time is at or before now as Failed.
func HealthOutcome(err error) Outcome {
	return healthOutcome(err, time.Time{})
}

// healthOutcome is [HealthOutcome] with the pushback's times read at now;
// the zero now reads every time as a wait.
func healthOutcome(err error, now time.Time) Outcome {
	if err == nil {
		return Succeeded
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrExhausted) || errors.Is(err, ErrOverloaded) {
		return Abandoned
	}
	var se *StatusError
	if !errors.As(err, &se) {
		return Failed
	}
	if se.GRPC {
		switch se.Code {
		case GRPCResourceExhausted:
			return Abandoned
		case GRPCUnavailable:
			if hasPushback(se.Header, now) {
				return Abandoned
			}
			return Failed
		case 13, 2: // INTERNAL, UNKNOWN: failures, pushback or not, as HTTP 500
			return Failed
		}
		return Succeeded
	}
	switch {
	case se.Code == 429, se.Code == 503 && hasPushback(se.Header, now):
		return Abandoned
	case se.Code >= 500:
		return Failed
	}
	return Succeeded
}

// Report records how an attempt on the endpoint with key ended. Reports for
// an ejected endpoint (requests sent before its ejection) are ignored.
// Concurrent reports apply one at a time, each at the time Report read the
// clock or, if a report of a later time applied first, at that later time,
// so the Ejector's time never goes back. Report cannot tell an attempt sent
// before the endpoint came back from an ejection from one sent after: a
// caller that knows how long ago its attempts were sent should call
// [Ejector.ReportElapsed].
func (e *Ejector) Report(key string, err error) {
	e.ReportElapsed(key, 0, err)
}

// ReportElapsed is [Ejector.Report] for an attempt that was sent to the
// endpoint elapsed before this report (0 if unknown, as with Report). The
// success or failure of an attempt sent before the endpoint's latest return
// from an ejection or cooldown is ignored (unless the endpoint's state was
// displaced since; see [Ejector]), as it would have been had it
// ended while the endpoint was out: it tells of the endpoint before it went
// out, and a long stream sent then must not close or trip the half-open
// state of the endpoint that came back (re-ejecting it for a failure that
// preceded the ejection). An overload answer asking for a wait still cools
// the endpoint down: it is the endpoint's answer of now. The attempt's age,
// not its start, is given so that the caller's clock need not be the
// Ejector's. A [Loop] whose Reporter is an Ejector calls ReportElapsed with
// the time since the attempt was picked, and so does an httplb Transport.
// They call it only on a Reporter that has the method ([ElapsedReporter]):
// a type that wraps the Ejector (to log, say) and has only Report makes
// them call Report, and a long stream's failure then re-ejects the
// endpoint that came back. Such a wrapper must forward ReportElapsed.
func (e *Ejector) ReportElapsed(key string, elapsed time.Duration, err error) {
	now := e.clock.Now()
	if d := e.coolFor(err, now); d > 0 {
		e.mu.Lock()
		cooled := e.cool(key, d, e.at(now))
		e.mu.Unlock()
		if cooled {
			e.obs.cooldown(key, d) // outside the lock
		}
		return
	}
	o := e.outcome(err, now)
	if o == Abandoned {
		e.Sweep()
		return
	}
	e.mu.Lock()
	now = e.at(now)
	var start time.Time // unknown
	if elapsed > 0 {
		start = now.Add(-elapsed)
	}
	d, ejected := e.report(key, o, start, now)
	e.mu.Unlock()
	if ejected {
		e.obs.eject(key, d) // outside the lock
	}
}

// outcome classifies err with Classify or, if it is nil, with
// [HealthOutcome] read at now, the time at which coolFor found no wait in
// err: a Retry-After date or reset time at or before now is then a failure
// (a 503 that asks for no time to recover, as every 5xx is for Envoy's
// consecutive_5xx; see hasPushback) rather than an overload answer that
// would neither count nor cool the endpoint down.
func (e *Ejector) outcome(err error, now time.Time) Outcome {
	if e.classify != nil {
		return e.classify(err)
	}
	return healthOutcome(err, now)
}

// ReportQuota reads the rate-limit headers h of an answer of the endpoint
// with key, successful or not: when a window has nothing remaining
// ([QuotaReset]), the endpoint cools down until it resets, at most
// MaxCooldown, so that the next requests go elsewhere before it refuses
// them. httplb.Transport calls it for every answer when its Reporter has
// this method.
//
// It also keeps the fraction of the endpoint's quota that remains, for
// [Ejector.Headroom]; of concurrent calls for one endpoint, the one that
// read the clock last sets it, whichever finishes last.
func (e *Ejector) ReportQuota(key string, h http.Header) {
	now := e.clock.Now()
	if f, reset, ok := QuotaHeadroom(h, now); ok {
		if reset <= 0 {
			reset = quotaWindow
		}
		reset = min(reset, maxQuotaWindow)
		e.mu.Lock()
		e.at(now) // a clock gone back bounds quotaAt
		st := e.eps[key]
		if st == nil {
			st = e.add(key)
		}
		if !now.Before(st.quotaAt) { // else a newer answer's headroom is kept
			st.quota, st.quotaAt, st.quotaFull = f, now, now.Add(reset)
		}
		e.mu.Unlock()
	}
	if e.cooldown <= 0 {
		return
	}
	p := QuotaReset(h, now, noPushbackLimit)
	if p.Kind != RetryLater || p.Delay <= 0 {
		return
	}
	d := min(p.Delay, e.cooldown)
	e.mu.Lock()
	cooled := e.cool(key, d, e.at(now))
	e.mu.Unlock()
	if cooled {
		e.obs.cooldown(key, d)
	}
}

// quotaWindow is the time a reported headroom takes to refill when the
// answer gave no reset time: the minute of a per-minute limit, the
// commonest window.
const quotaWindow = time.Minute

// maxQuotaWindow bounds the time a reported headroom takes to refill: a
// day, the longest window providers limit (requests per day). A reset
// reported years ahead would otherwise keep the endpoint's headroom near
// what it was until it sent whole quota headers again, which an endpoint
// left without traffic for its low headroom never does.
const maxQuotaWindow = 24 * time.Hour

// Headroom returns the fraction, in [0, 1], of the endpoint's tightest
// rate-limit window that remains, as its last answer reported it
// ([Ejector.ReportQuota], [QuotaHeadroom]) and refilled since at the pace
// of a token bucket: linearly, to 1 when the window's reset time is
// reached (at most a day after the answer). ok is false for an endpoint that reported no quota, or whose
// report the Ejector no longer tracks. It is meant for
// llmlb.PeakEWMAConfig.Headroom, so that a policy spreads requests
// towards the deployments with quota to spare before any runs out.
func (e *Ejector) Headroom(key string) (float64, bool) {
	now := e.clock.Now()
	e.mu.Lock()
	st := e.eps[key]
	if st == nil || st.quotaAt.IsZero() {
		e.mu.Unlock()
		return 0, false
	}
	f, at, full := st.quota, st.quotaAt, st.quotaFull
	e.mu.Unlock()
	if !now.Before(full) {
		return 1, true
	}
	if span := full.Sub(at); span > 0 && now.After(at) {
		f += (1 - f) * float64(now.Sub(at)) / float64(span)
	}
	return min(f, 1), true
}

// at returns the time at which to apply a report or sweep whose clock
// reading is now: now, or the latest time applied if that is later by at
// most maxReorder. The clock is read before e.mu is taken (the pushback
// headers are parsed outside the lock), so a goroutine may take e.mu with a
// reading older than one already applied; applying it at its own time
// would set ejections and cooldowns to end early, already due, and sweep
// with a time gone back. A reading older still is a clock that went back
// (an injected clock without monotonic readings, after one reading too far
// ahead): it is applied, and what was set at the later times is bounded
// from it (see stepBack), so that one bad reading does not hold every
// later ejection for as long as it was ahead. e.mu is held.
func (e *Ejector) at(now time.Time) time.Time {
	if now.Before(e.last) {
		if e.last.Sub(now) <= maxReorder {
			return e.last
		}
		e.stepBack(now)
	}
	e.last = now
	return now
}

// maxReorder is how much older than the latest time applied a reading may
// be and still be taken for one read before it, by a goroutine that took
// e.mu after it.
const maxReorder = time.Minute

// stepBack bounds the times set at readings later than now, the clock
// having gone back to now: no ejection ends later than MaxEjectionTime
// from now, no cooldown later than MaxCooldown, no headroom refills later
// than a day, and no past event (an ejection's end, a quota report, the
// last membership read) is later than now. e.mu is held.
func (e *Ejector) stepBack(now time.Time) {
	bound := func(t *time.Time, most time.Time) {
		if t.After(most) {
			*t = most
		}
	}
	for _, st := range e.eps {
		if !st.until.IsZero() {
			if st.cooling {
				bound(&st.until, now.Add(e.cooldown))
			} else {
				bound(&st.until, now.Add(e.max))
			}
		}
		if !st.coolUntil.IsZero() {
			bound(&st.coolUntil, now.Add(e.cooldown))
		}
		bound(&st.restored, now)
		bound(&st.back, now)
		bound(&st.quotaAt, now)
		bound(&st.quotaFull, now.Add(maxQuotaWindow))
	}
	bound(&e.syncedAt, now)
	heap.Init(&e.out)
}

// noPushbackLimit is the pushback limit of a cooldown: every requested
// wait is read, and the longer ones are capped rather than ignored.
const noPushbackLimit = time.Duration(1<<63 - 1)

// coolFor returns the cooldown that err asks for: the wait requested by an
// overload status, at most MaxCooldown; 0 if none.
func (e *Ejector) coolFor(err error, now time.Time) time.Duration {
	if e.cooldown <= 0 || err == nil {
		return 0
	}
	var se *StatusError
	if !errors.As(err, &se) {
		return 0
	}
	switch {
	case se.GRPC && (se.Code == GRPCUnavailable || se.Code == GRPCResourceExhausted):
	case !se.GRPC && (se.Code == 429 || se.Code == 503):
	default:
		return 0
	}
	p := FromHeader(se.Header, now, noPushbackLimit)
	if p.Kind != RetryLater || p.Delay <= 0 {
		return 0
	}
	return min(p.Delay, e.cooldown)
}

// coolSlack is how much later than the end of an endpoint's cooldown a
// wait asked meanwhile must end for the move to be reported: Retry-After,
// HTTP dates and Unix rate-limit resets count whole seconds, so the answers
// of a burst that ask the same wait end up to a second apart, and telling
// the Observer of each would report one cooldown many times.
const coolSlack = time.Second

// cool takes the endpoint of key out for d and reports whether the caller
// should report it to Observer.Cooldown with d: the endpoint is then out for
// d from now. An endpoint cooling already stays out until the later of its
// cooldown's end and d from now; cool reports the move only if it is
// coolSlack or more. An
// ejected endpoint's ejection keeps its end: as Envoy's
// DetectorImpl::onConsecutiveErrorWorker (envoyproxy/envoy at 00c7146d,
// source/common/upstream/outlier_detection_impl.cc) leaves a host that is
// already ejected (FAILED_OUTLIER_CHECK) as it is, nothing lengthens an
// ejection. If d from now is later, a cooldown that ends then follows the
// ejection (sweep starts it); if one follows already, it is moved as that
// of an endpoint cooling down. e.mu is held.
func (e *Ejector) cool(key string, d time.Duration, now time.Time) bool {
	e.sweep(now)
	until := now.Add(d)
	st := e.eps[key]
	switch {
	case st == nil:
		st = e.add(key)
	case st.cooling:
		if !until.After(st.until) {
			return false
		}
		moved := until.Sub(st.until) >= coolSlack
		st.until = until
		heap.Fix(&e.out, st.idx)
		return moved
	case !st.until.IsZero(): // ejected
		if !until.After(st.until) || !until.After(st.coolUntil) {
			return false
		}
		moved := st.coolUntil.IsZero() || until.Sub(st.coolUntil) >= coolSlack
		st.coolUntil = until
		return moved
	}
	marked, ok := e.markOut(key)
	if !ok {
		e.forget(st) // not a member
		return false
	}
	st.until, st.cooling, st.marked = until, true, marked
	e.cooling++
	e.unlink(st)
	heap.Push(&e.out, st)
	return true
}

// report records the outcome o of an attempt that started at start (zero if
// unknown) and reports whether it ejected the endpoint, and for how long.
// e.mu is held.
func (e *Ejector) report(key string, o Outcome, start, now time.Time) (time.Duration, bool) {
	e.sweep(now)
	st := e.eps[key]
	switch {
	case st == nil:
		if o == Succeeded {
			return 0, false
		}
		st = e.add(key)
	case !st.until.IsZero():
		return 0, false
	case !start.IsZero() && start.Before(st.back):
		return 0, false // sent before the endpoint came back
	default:
		e.unlink(st)
		e.track(st)
	}
	if o == Succeeded {
		st.consecutive, st.halfOpen = 0, false
		if e.backoff(st, now) == 0 && !now.Before(st.quotaFull) && st.back.IsZero() {
			// Nothing to remember: no ejection, no quota spent, never
			// out. An endpoint that has been out keeps the time it came
			// back, which tells later reports of attempts sent before it
			// (long streams) from those sent after.
			e.forget(st)
		}
		return 0, false
	}
	st.consecutive++
	if st.halfOpen || st.consecutive >= e.threshold {
		return e.eject(st, now)
	}
	return 0, false
}

// eject ejects the endpoint of st, which is not ejected, if the ejection cap
// allows, and reports whether it did and for how long. e.mu is held.
func (e *Ejector) eject(st *epHealth, now time.Time) (time.Duration, bool) {
	if len(e.out) > 0 {
		e.sync(now)
		if e.eps[st.key] != st {
			return 0, false // not a member
		}
		// As Envoy's DetectorImpl::ejectHost (envoyproxy/envoy at
		// 00c7146d, source/common/upstream/outlier_detection_impl.cc):
		// eject if 100*(ejected+1)/hosts <= max_ejection_percent, or,
		// with always_eject_one_host (off by default there, always on
		// here), if none is ejected. The share is computed in floating
		// point as there, so that a percent such as 100*5/19 allows 5
		// of 19.
		active := len(e.out) - e.cooling
		if active > 0 && 100*float64(active+1)/float64(e.members) > e.percent {
			// Refused: the count starts again, as Envoy's
			// DetectorImpl::onConsecutiveErrorWorker (same file) resets
			// the consecutive counter after ejectHost whether it ejected
			// or overflowed, so that the endpoint is not tried again at
			// every further failure but after ConsecutiveFailures more.
			// A failed half-open probe that the cap refuses likewise
			// closes the half-open state.
			st.consecutive, st.halfOpen = 0, false
			return 0, false
		}
	}
	marked, ok := e.markOut(st.key)
	if !ok {
		e.forget(st) // not a member
		return 0, false
	}
	// Envoy's ejectHost and checkHostForUneject (same file): the multiplier
	// (ejectTimeBackoff) goes up by one while backoff*base < max+base,
	// and the ejection lasts min(base*backoff, max). With base >= 1 and
	// max >= base, backoff*base < max+base is backoff-1 <= (max-1)/base,
	// which cannot overflow.
	b := e.backoff(st, now)
	if time.Duration(b-1) <= (e.max-1)/e.base {
		b++
	}
	d := e.max
	if time.Duration(b) <= e.max/e.base {
		d = e.base * time.Duration(b)
	}
	st.backoff, st.until, st.marked = b, now.Add(d), marked
	st.consecutive, st.halfOpen = 0, false
	e.unlink(st)
	heap.Push(&e.out, st)
	return d, true
}

// backoff returns the ejection multiplier of st, which is not ejected, at
// now: the multiplier when its last ejection ended, less one for each
// SweepInterval since, at least 0. Envoy's DetectorImpl::onIntervalTimer
// (envoyproxy/envoy at 00c7146d,
// source/common/upstream/outlier_detection_impl.cc) decrements the
// ejectTimeBackoff of every host not ejected at each interval, from the
// first one a whole interval after its unejection; this counts the same
// decrements lazily. e.mu is held.
func (e *Ejector) backoff(st *epHealth, now time.Time) int {
	if st.backoff == 0 {
		return 0
	}
	n := now.Sub(st.restored) / e.interval
	if n >= time.Duration(st.backoff) {
		return 0
	}
	return st.backoff - int(n)
}

// markOut marks the endpoint of key unhealthy in e.h unless e.h is an
// *llmlb.Balancer in which it is unhealthy already, and reports whether it
// marked it and whether key is a member. e.mu is held.
func (e *Ejector) markOut(key string) (marked, ok bool) {
	if b, isBalancer := e.h.(*llmlb.Balancer); isBalancer {
		s, member := b.StatsOf(key)
		if !member {
			return false, false
		}
		if !s.Healthy {
			return false, true // the program's mark: left as it is
		}
	}
	if err := e.h.SetHealthy(key, false); err != nil {
		return false, false
	}
	return true, true
}

// sync reads the membership of e.h unless it did less than membersTTL ago:
// it counts the members and forgets the endpoints that are not members.
// e.mu is held.
func (e *Ejector) sync(now time.Time) {
	if e.synced && now.Before(e.syncedAt.Add(membersTTL)) {
		return
	}
	stats := e.h.Stats()
	e.synced, e.syncedAt, e.members = true, now, len(stats)
	e.gen++
	for i := range stats {
		if st := e.eps[stats[i].Key]; st != nil {
			st.seen = e.gen
		}
	}
	for _, st := range e.eps {
		if st.seen != e.gen {
			e.forget(st)
		}
	}
}

// add tracks a new entry for key as not ejected, reusing the entry of the
// least recently reported endpoint if there are e.limit already. e.mu is
// held.
func (e *Ejector) add(key string) *epHealth {
	var st *epHealth
	if e.live >= e.limit {
		st = e.lru.next
		e.forget(st)
		*st = epHealth{key: key}
	} else {
		st = &epHealth{key: key}
	}
	e.eps[key] = st
	e.track(st)
	return st
}

// track appends st, which is not ejected, to the entries not ejected as the
// most recently reported one, first forgetting the least recently reported
// one if there are e.limit already. e.mu is held.
func (e *Ejector) track(st *epHealth) {
	if e.live >= e.limit {
		e.forget(e.lru.next)
	}
	st.prev, st.next = e.lru.prev, &e.lru
	st.prev.next, e.lru.prev = st, st
	e.live++
}

// unlink removes st, which is not ejected, from the entries not ejected.
// e.mu is held.
func (e *Ejector) unlink(st *epHealth) {
	st.prev.next, st.next.prev = st.next, st.prev
	st.prev, st.next = nil, nil
	e.live--
}

// forget drops the state of st. e.mu is held.
func (e *Ejector) forget(st *epHealth) {
	delete(e.eps, st.key)
	if st.until.IsZero() {
		e.unlink(st)
	} else {
		heap.Remove(&e.out, st.idx)
		if st.cooling {
			st.cooling = false
			e.cooling--
		}
	}
}

// Sweep ends the ejections whose time has passed, marking their endpoints
// healthy again (those the Ejector marked unhealthy; see [Health]). Report
// calls it; call it (or Run) when traffic may stop.
func (e *Ejector) Sweep() {
	now := e.clock.Now()
	e.mu.Lock()
	e.sweep(e.at(now))
	e.mu.Unlock()
}

// sweep is Sweep with e.mu held.
func (e *Ejector) sweep(now time.Time) {
	for len(e.out) > 0 && !now.Before(e.out[0].until) {
		st := heap.Pop(&e.out).(*epHealth)
		if st.cooling {
			// The end of a cooldown: back as it was, on probation only if
			// an ejection had put it there.
			st.cooling = false
			e.cooling--
			st.until = time.Time{}
		} else {
			st.until, st.halfOpen, st.restored = time.Time{}, true, now
			if st.coolUntil.After(now) {
				// A wait asked while it was ejected outlasts the
				// ejection: it cools down for the rest, marked as it
				// was, half-open when it comes back.
				st.until, st.coolUntil, st.cooling = st.coolUntil, time.Time{}, true
				e.cooling++
				heap.Push(&e.out, st)
				continue
			}
			st.coolUntil = time.Time{}
		}
		st.back = now
		marked := st.marked
		st.marked = false
		if marked {
			if err := e.h.SetHealthy(st.key, true); err != nil {
				delete(e.eps, st.key) // no longer a member
				continue
			}
		}
		e.track(st)
	}
}

// Run calls Sweep every SweepInterval until ctx ends, and returns ctx's
// error.
func (e *Ejector) Run(ctx context.Context) error {
	t := time.NewTicker(e.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			e.Sweep()
		}
	}
}

// Ejected returns the keys of the endpoints ejected now, sorted; endpoints
// cooling down are not listed (see [Ejector.Cooling]). Like Out and
// Cooling, it lists only members of the Health: an endpoint that left it is
// dropped within a second.
func (e *Ejector) Ejected() []string {
	return e.outKeys(false)
}

// Out returns the number of endpoints out now, ejected or cooling down, and
// the time until the first of them is due back (0 if none is out), or
// until the end of its ejection if a cooldown follows it
// ([EjectorConfig.MaxCooldown]): a lower bound of the time until one is
// back, exact unless a wait was asked of an ejected endpoint. It costs
// the same however many endpoints are out, apart from reading the Health's
// membership at most once a second while some endpoint is out.
func (e *Ejector) Out() (n int, next time.Duration) {
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	now = e.at(now)
	e.sweep(now)
	if len(e.out) > 0 {
		e.sync(now) // forgets endpoints that left, ejected or not
	}
	if len(e.out) == 0 {
		return 0, 0
	}
	return len(e.out), e.out[0].until.Sub(now)
}

// Cooling returns the keys of the endpoints cooling down now, sorted.
func (e *Ejector) Cooling() []string {
	return e.outKeys(true)
}

// outKeys returns the keys of the endpoints out now that are cooling or not.
func (e *Ejector) outKeys(cooling bool) []string {
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	now = e.at(now)
	e.sweep(now)
	if len(e.out) > 0 {
		e.sync(now)
	}
	var keys []string
	for _, st := range e.out {
		if st.cooling == cooling {
			keys = append(keys, st.key)
		}
	}
	sort.Strings(keys)
	return keys
}

// hasPushback reports whether h carries a pushback that [FromHeader] reads
// and that makes an answer an overload answer: a wait above zero, however
// long, or gRPC's "do not retry". A header it ignores (an empty, negative or
// malformed Retry-After or rate-limit reset) is no pushback, and neither is
// a wait of zero (a Retry-After or reset of 0, a grpc-retry-pushback-ms of
// 0): "retry now" asks for no time to recover, so a 503 that says it is an
// endpoint failing the request, as every 5xx is for Envoy's consecutive_5xx
// (DetectorHostMonitorImpl::putHttpResponseCode, envoyproxy/envoy at
// 00c7146d, source/common/upstream/outlier_detection_impl.cc), and, asking
// for no wait, it cools nothing down either. A time (an HTTP date, a Unix or
// RFC 3339 reset) is read at now: one at or before now is a wait of zero,
// and so no pushback. The zero now, which [HealthOutcome] passes for want
// of a clock, makes every time a wait.
func hasPushback(h http.Header, now time.Time) bool {
	p := FromHeader(h, now, noPushbackLimit)
	return p.Kind == DoNotRetry || p.Kind == RetryLater && p.Delay > 0
}
