package retry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/quantile"
)

// Picker chooses an endpoint for a request; [*llmlb.Balancer] implements it.
// A [Loop] calls it from each goroutine that runs [Loop.Do], so an
// implementation must be safe for concurrent use.
type Picker interface {
	Pick(ctx context.Context, r *llmlb.Request) (llmlb.Pick, error)
}

// Backoff computes the wait before a retry: n is the retry's number (1 for
// the first) and prev the previous wait it returned (0 before the first).
// [*FullJitter] and [*DecorrelatedJitter] implement it. It must be safe for
// concurrent use.
type Backoff interface {
	Backoff(n int, prev time.Duration) time.Duration
}

// Reporter is told how each attempt ended; [*Ejector] implements it. Report
// is called once per finished attempt, except for attempts that lost to
// another one, unless their upstream answered with a retryable status (a
// [*StatusError]); it must be safe for concurrent use. A [Loop] calls
// ReportElapsed instead of Report on a Reporter that is also an
// [ElapsedReporter], as [*Ejector] is.
type Reporter interface {
	Report(key string, err error)
}

// ElapsedReporter is a [Reporter] told how long ago each attempt was sent
// ([Ejector.ReportElapsed]); [*Ejector] is one. A [Loop], and an httplb
// Transport, whose Reporter implements it calls ReportElapsed instead of
// Report, elapsed being the time since the attempt was picked, read from
// the caller's Clock. ReportElapsed must be safe for concurrent use.
//
// A type that wraps an Ejector as a Reporter (to log, or to feed two
// Ejectors) must implement ReportElapsed too, passing elapsed on: one
// with only Report gives the Ejector no attempt's age, and the failure of
// a long stream sent before an endpoint's ejection then re-ejects the
// endpoint once it is back. Embedding a Reporter loses the method.
// Embedding *Ejector keeps it, but then a Loop calls the Ejector's
// ReportElapsed, not the wrapper's Report: a wrapper that defines Report
// must define ReportElapsed too. Assert it with
//
//	var _ retry.ElapsedReporter = (*MyReporter)(nil)
type ElapsedReporter interface {
	Reporter
	ReportElapsed(key string, elapsed time.Duration, err error)
}

// QuotaReporter is a [Reporter] that also reads the rate-limit headers of
// the answers an endpoint sends, which may say that its quota is spent
// before any request fails; [*Ejector] is one. An httplb Transport whose
// Reporter implements it gives it the headers of every answer it commits
// to. ReportQuota must be safe for concurrent use.
type QuotaReporter interface {
	Reporter
	ReportQuota(key string, h http.Header)
}

// DefaultMaxAttempts is the default number of attempts per request, the
// first included.
const DefaultMaxAttempts = 3

// LoopConfig configures a [Loop]. The zero value retries a request up to
// twice (three attempts) on the default retryable errors, with Envoy's
// full-jitter back-off and a Finagle budget of its own, without hedging.
type LoopConfig struct {
	// Budget decides whether retries and hedges may be sent; nil means a
	// [PercentBudget] with [DefaultPercentConfig] on the loop's Clock,
	// private to this loop. Share one budget among the loops that call the
	// same upstream.
	Budget Budget
	// Backoff computes the wait before a retry; nil means [FullJitter] with
	// default settings.
	Backoff Backoff
	// MaxAttempts bounds the attempts per request, hedges included; 0 means
	// [DefaultMaxAttempts], 1 disables retries and hedges.
	MaxAttempts int
	// Classify reports whether an attempt's error (before its first token)
	// may be retried; nil means [DefaultClassify].
	Classify func(err error) bool
	// MaxPushback is the longest server-requested delay honoured; a longer
	// one is ignored. 0 means [DefaultMaxPushback]. A negative value
	// honours none: a retry waits only for its back-off, as suits retries
	// that go to another endpoint than the one that asked for the wait (a
	// tier that spills, package spill). A server's "do not retry" still
	// stops the retries.
	MaxPushback time.Duration
	// Hedge enables hedging before the first token; the zero value disables
	// it.
	Hedge HedgeConfig
	// Reporter, if set, is told the outcome of every attempt, e.g. an
	// [*Ejector]; one that is an [ElapsedReporter], as the Ejector is, is
	// also told how long ago the attempt was sent.
	Reporter Reporter
	// Observer, if set, is told of every retry and hedge sent and every
	// one the budget refused.
	Observer *Observer
	// Clock tells the time; nil means the system clock.
	Clock llmlb.Clock
	// After returns a channel that receives after d, like time.After, which
	// is what nil means. The loop waits with it for back-offs and hedge
	// delays.
	After func(d time.Duration) <-chan time.Time
}

// HedgeConfig configures hedging: when an attempt has produced no first
// token after the hedge delay, one more attempt is sent to another endpoint;
// the first to stream wins and the others are cancelled at once. Hedging is
// on when Delay or Percentile is set.
type HedgeConfig struct {
	// Delay is the hedge delay, or, with Percentile set, its floor. It must
	// not be negative.
	Delay time.Duration
	// Percentile, in [0, 1), sets the delay to that quantile of the
	// time-to-first-token of the last 256 winning attempts (for example
	// 0.95), once 20 have been seen; until then Delay is used, and with no
	// Delay nothing is hedged. 0 means a fixed Delay.
	Percentile float64
	// MaxHedges bounds the hedges per request; 0 means 1.
	MaxHedges int
}

// Loop sends a request with retries and hedges: attempt, classify the
// failure, ask the budget, back off (never less than the server's
// pushback), pick again excluding the endpoints that failed, and stop at the
// commitment point: once an attempt has called [Attempt.FirstToken], its
// result is final. Create one with [NewLoop]. A Loop is safe for concurrent
// use; share one per upstream service.
type Loop struct {
	picker      Picker
	budget      Budget
	backoff     Backoff
	maxAttempts int
	classify    func(error) bool
	maxPushback time.Duration // the cap of FromHeader; > 0
	pushback    bool          // whether a server-requested delay is honoured
	hedge       HedgeConfig
	reporter    Reporter
	obs         *Observer
	clock       llmlb.Clock
	after       func(time.Duration) <-chan time.Time
	ttft        quantile.Window // with Hedge.Percentile: the winners' TTFTs
}

// NewLoop returns a loop that picks endpoints with p (usually an
// [*llmlb.Balancer]) and is configured by cfg. It rejects a nil picker and
// values out of range with an error wrapping [ErrInvalidConfig].
func NewLoop(p Picker, cfg LoopConfig) (*Loop, error) {
	if p == nil {
		return nil, invalidf("loop has a nil Picker")
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.MaxAttempts < 0 || cfg.MaxAttempts > 100 {
		return nil, invalidf("loop MaxAttempts %d must be in [1, 100]", cfg.MaxAttempts)
	}
	h := cfg.Hedge
	if h.Delay < 0 {
		return nil, invalidf("hedge Delay %v is negative", h.Delay)
	}
	if !(h.Percentile >= 0 && h.Percentile < 1) {
		return nil, invalidf("hedge Percentile %v must be in [0, 1)", h.Percentile)
	}
	if h.MaxHedges < 0 {
		return nil, invalidf("hedge MaxHedges %d is negative", h.MaxHedges)
	}
	if h.MaxHedges == 0 {
		h.MaxHedges = 1
	}
	l := &Loop{
		picker:      p,
		budget:      cfg.Budget,
		backoff:     cfg.Backoff,
		maxAttempts: cfg.MaxAttempts,
		classify:    cfg.Classify,
		maxPushback: limitOr(cfg.MaxPushback),
		pushback:    cfg.MaxPushback >= 0,
		hedge:       h,
		reporter:    cfg.Reporter,
		obs:         cfg.Observer,
		clock:       clockOr(cfg.Clock),
		after:       cfg.After,
	}
	if l.budget == nil {
		bc := DefaultPercentConfig()
		bc.Clock = cfg.Clock
		b, err := NewPercentBudget(bc)
		if err != nil {
			return nil, err
		}
		l.budget = b
	}
	if l.backoff == nil {
		b, err := NewFullJitter(BackoffConfig{})
		if err != nil {
			return nil, err
		}
		l.backoff = b
	}
	if l.classify == nil {
		l.classify = DefaultClassify
	}
	if l.after == nil {
		l.after = time.After
	}
	return l, nil
}

// Attempt is one try of a request on one endpoint, passed to the attempt
// function of [Loop.Do]. Its methods are safe for concurrent use.
type Attempt struct {
	r      *run
	pick   llmlb.Pick
	key    string
	n      int32
	hedge  bool
	retry  bool // granted by the budget's Withdraw
	start  time.Time
	cancel context.CancelFunc
	err    error
	// over reports that its result was processed. Do's goroutine sets it
	// under r.mu and reads it freely; FirstToken reads it under r.mu.
	over bool
}

// Endpoint returns the endpoint to send the attempt to.
func (a *Attempt) Endpoint() llmlb.Endpoint { return a.pick.Endpoint() }

// Number returns the attempt's number within its request, from 1.
func (a *Attempt) Number() int { return int(a.n) }

// Hedge reports whether the attempt is a hedge, sent while an earlier one
// was still waiting for its first token.
func (a *Attempt) Hedge() bool { return a.hedge }

// FirstToken marks the commitment point: the attempt received its first
// token and is about to stream it to the user. It reports whether this
// attempt won the request. If it did, every other attempt is cancelled and
// the attempt's result, whatever it is, becomes the result of [Loop.Do]:
// it is never retried. If it returns false another attempt already won; the
// attempt must not stream anything and should return (its context is being
// cancelled). Calls after the first return the same answer. Called after
// the attempt function returned, it wins nothing: the attempt's result was
// already taken as it was.
func (a *Attempt) FirstToken() bool {
	r := a.r
	if w := r.winner.Load(); w != 0 {
		return w == a.n
	}
	r.mu.Lock()
	won := !a.over && r.winner.CompareAndSwap(0, a.n)
	r.mu.Unlock()
	if !won {
		return r.winner.Load() == a.n
	}
	a.pick.FirstToken()
	if r.l.hedge.Percentile > 0 {
		r.l.ttft.Add(r.l.clock.Now().Sub(a.start))
	}
	if r.commit != nil {
		r.commit <- struct{}{} // buffered; only the winner sends
	}
	return true
}

// Do runs attempt for req until one attempt succeeds, fails with an error
// that is not retried, or commits by calling [Attempt.FirstToken] (then that
// attempt's result is returned whatever it is). The attempt function sends
// the request to a.Endpoint(), calls a.FirstToken() when the first token
// arrives, streams the response to the user only if FirstToken returned
// true, and returns nil or an error (a [*StatusError] for an upstream status,
// so that it can be classified and its pushback honoured). It must return
// promptly when its context is cancelled.
//
// Retries pick again with req.Exclude plus every endpoint that failed (a
// copy: req is not modified). When no other endpoint is left, the failed
// ones become candidates again (req.Exclude never does), so retries return
// to an endpoint only when no other is available. Hedges go to endpoints
// with no attempt in flight, draw from the same budget, and count towards
// MaxAttempts.
//
// Every attempt's pick handle is finished (Done) exactly once, when its
// function returns; without hedging the function runs on the caller's
// goroutine, with hedging each attempt runs on its own goroutine, and every
// one of them has returned before Do returns: the winner's stream is
// consumed inside its attempt function. If the function panics on the
// caller's goroutine, its pick is finished and its budget returned before
// the panic goes on; a panic on an attempt's own goroutine (with hedging)
// ends the program, as a panic on any goroutine does.
//
// Before a retry Do waits max(back-off, server pushback); if that wait
// would end after the context's deadline it gives up at once. A hedge is
// withdrawn from the budget only once its endpoint is picked, just before
// it is sent: one that is not sent (no endpoint was left, the context
// ended or an attempt committed meanwhile) takes nothing, and its pick is
// ended with an error wrapping [context.Canceled]. When retries
// run out (attempts, budget, a "do not retry" pushback, the deadline, or no
// endpoint), Do returns a [*GiveUpError] wrapping [ErrExhausted] and the
// last error. It returns pick errors of the first attempt (such as
// [llmlb.ErrNoCandidates]) as they are, and the context's error if it ends
// during a back-off.
func (l *Loop) Do(ctx context.Context, req *llmlb.Request, attempt func(ctx context.Context, a *Attempt) error) error {
	if attempt == nil {
		return invalidf("Do with a nil attempt function")
	}
	if ctx == nil {
		ctx = context.Background()
	}
	r := &run{l: l, ctx: ctx, fn: attempt}
	r.attempts = r.buf[:0]
	if req != nil {
		r.req = *req
		r.callerExclude = req.Exclude
	}
	l.budget.Start()
	p, err := r.pick(false)
	if err != nil {
		l.budget.Finish(false, Abandoned)
		return err
	}
	first := r.add(p, false, false)
	if l.maxAttempts > 1 && (l.hedge.Delay > 0 || l.hedge.Percentile > 0) {
		return r.parallel(first)
	}
	return r.serial(first)
}

// run is the state of one Do call. Fields other than mu, winner and commit
// are used only by Do's goroutine.
type run struct {
	l             *Loop
	ctx           context.Context
	fn            func(context.Context, *Attempt) error
	req           llmlb.Request
	callerExclude []string

	mu     sync.Mutex    // orders the setting of winner with that of Attempt.over
	winner atomic.Int32  // number of the attempt whose result is final; 0 = none yet; set under mu
	commit chan struct{} // the winner signals FirstToken; nil without hedging
	done   chan *Attempt // finished attempts; nil without hedging

	attempts []*Attempt // launched, in order
	first    Attempt    // storage of the first attempt
	buf      [4]*Attempt
	failed   []string // keys that failed in this round
	inflight int
	hedges   int
	retries  int
	prev     time.Duration // previous back-off
	last     *Attempt      // last failed attempt
}

func (r *run) serial(a *Attempt) error {
	for {
		a.err = r.call(a)
		if final, err := r.finished(a); final {
			return err
		}
		next, err := r.next()
		if err != nil {
			return err
		}
		a = next
	}
}

// call runs the attempt function on Do's goroutine. If it panics, the
// attempt is finished before the panic goes on: its pick is Done and its
// budget returned, so that a caller that recovers (as net/http does for a
// handler) leaks nothing.
func (r *run) call(a *Attempt) error {
	returned := false
	defer func() {
		if !returned {
			r.abandon(a)
		}
	}()
	err := r.fn(r.ctx, a)
	returned = true
	return err
}

// abandon finishes attempt a, whose function panicked, without a result.
func (r *run) abandon(a *Attempt) {
	r.mu.Lock()
	a.over = true
	r.mu.Unlock()
	a.pick.Done(errPanicked)
	r.l.budget.Finish(a.retry, Abandoned)
}

// errPanicked ends the pick of an attempt whose function panicked.
var errPanicked = errors.New("retry: the attempt function panicked")

func (r *run) parallel(a *Attempt) error {
	l := r.l
	r.commit = make(chan struct{}, 1)
	r.done = make(chan *Attempt, l.maxAttempts)
	defer func() {
		for _, a := range r.attempts {
			a.cancel()
		}
	}()
	r.launch(a)
	hedgeC := r.armHedge()
	for {
		select {
		case <-r.commit:
			r.cancelOthers(r.winner.Load())
		case a := <-r.done:
			r.inflight--
			if final, err := r.finished(a); final {
				r.cancelOthers(a.n)
				for r.inflight > 0 {
					r.inflight--
					r.finished(<-r.done)
				}
				return err
			}
			if r.inflight > 0 {
				continue
			}
			next, err := r.next()
			if err != nil {
				return err
			}
			r.launch(next)
			hedgeC = r.armHedge()
		case <-hedgeC:
			hedgeC = nil
			if r.winner.Load() != 0 {
				continue
			}
			if h := r.newHedge(); h != nil {
				r.launch(h)
				hedgeC = r.armHedge()
			}
		}
	}
}

// launch starts a on its own goroutine.
func (r *run) launch(a *Attempt) {
	ctx, cancel := context.WithCancel(r.ctx)
	a.cancel = cancel
	r.inflight++
	go func() {
		a.err = r.fn(ctx, a)
		r.done <- a
	}()
}

func (r *run) cancelOthers(winner int32) {
	for _, a := range r.attempts {
		if a.n != winner {
			a.cancel()
		}
	}
}

// armHedge returns a channel that fires when the next hedge is due, or nil
// if no hedge can be sent.
func (r *run) armHedge() <-chan time.Time {
	l := r.l
	if r.hedges >= l.hedge.MaxHedges || len(r.attempts) >= l.maxAttempts {
		return nil
	}
	d := l.hedge.Delay
	if l.hedge.Percentile > 0 {
		if q, ok := l.ttft.Quantile(l.hedge.Percentile); ok {
			d = max(d, q)
		}
	}
	if d <= 0 {
		return nil
	}
	return l.after(d)
}

// newHedge picks an endpoint with no attempt in flight for a hedge, or
// returns nil if the endpoints, the caller or the budget do not allow one.
func (r *run) newHedge() *Attempt {
	l := r.l
	if r.hedges >= l.hedge.MaxHedges || len(r.attempts) >= l.maxAttempts {
		return nil
	}
	// The pick comes before the withdrawal, so that a hedge with no
	// endpoint to go to takes no budget.
	p, err := r.pick(true)
	if err != nil {
		return nil // no other endpoint, or the caller is gone
	}
	// The caller may have gone during the pick (Pick checks the context
	// first), or an attempt committed: no hedge starts after either.
	if r.ctx.Err() != nil || r.winner.Load() != 0 {
		p.Done(errNotSent)
		return nil
	}
	if !l.budget.Withdraw() {
		p.Done(errNotSent)
		l.obs.denied()
		return nil
	}
	a := r.add(p, true, true)
	r.hedges++
	l.obs.hedge(int(a.n))
	return a
}

// finished does the bookkeeping of an attempt whose function returned and
// reports whether its result is final (and Do returns err).
func (r *run) finished(a *Attempt) (final bool, err error) {
	l := r.l
	retryable := a.err != nil && l.classify(a.err)
	r.mu.Lock()
	a.over = true // from now on a late FirstToken of a wins nothing
	w := r.winner.Load()
	if w == 0 && !retryable {
		w = a.n
		r.winner.Store(w)
	}
	r.mu.Unlock()
	o := Abandoned
	switch {
	case a.err == nil:
		o = Succeeded
	case retryable:
		o = Failed
	}
	// An attempt that lost to another is abandoned, unless its upstream
	// answered with a retryable status: that failure is the endpoint's,
	// whoever won. Any other error of a loser may come from the loop
	// cancelling it.
	lost := w != 0 && w != a.n
	var se *StatusError
	answered := retryable && errors.As(a.err, &se)
	if lost && !answered {
		o = Abandoned
	}
	a.pick.Done(a.err)
	l.budget.Finish(a.retry, o)
	if (!lost || answered) && l.reporter != nil {
		if er, ok := l.reporter.(ElapsedReporter); ok {
			er.ReportElapsed(a.key, l.clock.Now().Sub(a.start), a.err)
		} else {
			l.reporter.Report(a.key, a.err)
		}
	}
	switch {
	case w == a.n:
		return true, a.err
	case lost:
		return false, nil
	}
	r.failed = append(r.failed, a.key)
	r.last = a
	return false, nil
}

// next decides whether to retry after the last attempt failed and nothing
// is in flight. It waits the back-off and returns the next attempt, or the
// error Do returns.
func (r *run) next() (*Attempt, error) {
	l := r.l
	giveUp := func(reason string) error {
		return &GiveUpError{Attempts: len(r.attempts), Reason: reason, Err: r.last.err}
	}
	if len(r.attempts) >= l.maxAttempts {
		return nil, giveUp("attempts")
	}
	pb := r.pushback(r.last.err)
	if pb.Kind == DoNotRetry {
		return nil, giveUp("pushback")
	}
	r.retries++
	d := max(l.backoff.Backoff(r.retries, r.prev), 0)
	r.prev = d
	if pb.Kind == RetryLater && l.pushback {
		d = max(d, pb.Delay)
	}
	// Before the withdrawal: a retry that is not sent takes no budget.
	if deadline, ok := r.ctx.Deadline(); ok && time.Until(deadline) <= d { // the context's own clock
		return nil, giveUp("deadline")
	}
	if !l.budget.Withdraw() {
		l.obs.denied()
		return nil, giveUp("budget")
	}
	if d > 0 {
		select {
		case <-l.after(d):
		case <-r.ctx.Done():
			l.budget.Finish(true, Abandoned)
			return nil, fmt.Errorf("retry: waiting to retry: %w (last attempt: %w)", r.ctx.Err(), r.last.err)
		}
	}
	p, err := r.pick(false)
	if err != nil {
		l.budget.Finish(true, Abandoned)
		if errors.Is(err, llmlb.ErrNoCandidates) || errors.Is(err, llmlb.ErrNoEndpoints) {
			return nil, giveUp("endpoints")
		}
		return nil, fmt.Errorf("retry: picking for a retry: %w (last attempt: %w)", err, r.last.err)
	}
	a := r.add(p, true, false)
	l.obs.retry(int(a.n), r.last.err)
	return a, nil
}

// pushback reads the server's pushback from an attempt's error.
func (r *run) pushback(err error) Pushback {
	var se *StatusError
	if errors.As(err, &se) {
		return FromHeader(se.Header, r.l.clock.Now(), r.l.maxPushback)
	}
	var oe *OverloadError
	if errors.As(err, &oe) {
		return later(oe.RetryAfter, r.l.maxPushback)
	}
	return Pushback{}
}

// pick picks the endpoint of the next attempt, excluding the caller's
// exclusions, the endpoints that failed in this round and those with an
// attempt in flight. A retry that finds no endpoint left starts a new round
// without the failed ones; a hedge does not. The pick is not an attempt
// until add makes it one; one that is not sent is ended with errNotSent.
func (r *run) pick(hedge bool) (llmlb.Pick, error) {
	p, err := r.pickExcluding()
	if err != nil && errors.Is(err, llmlb.ErrNoCandidates) && !hedge && len(r.failed) > 0 {
		r.failed = r.failed[:0]
		p, err = r.pickExcluding()
	}
	return p, err
}

// add makes p the request's next attempt; retry tells whether Withdraw
// granted it.
func (r *run) add(p llmlb.Pick, retry, hedge bool) *Attempt {
	a := &r.first
	if len(r.attempts) > 0 {
		a = new(Attempt)
	}
	*a = Attempt{
		r:     r,
		pick:  p,
		n:     int32(len(r.attempts) + 1),
		hedge: hedge,
		retry: retry,
		start: r.l.clock.Now(),
	}
	if ep := p.Endpoint(); ep != nil {
		a.key = ep.Key()
	}
	r.attempts = append(r.attempts, a)
	return a
}

func (r *run) pickExcluding() (llmlb.Pick, error) {
	if len(r.attempts) == 0 {
		return r.l.picker.Pick(r.ctx, &r.req)
	}
	ex := make([]string, 0, len(r.callerExclude)+len(r.failed)+r.inflight)
	ex = append(ex, r.callerExclude...)
	ex = append(ex, r.failed...)
	for _, a := range r.attempts {
		if r.inflight > 0 && a.cancel != nil && !a.over {
			ex = append(ex, a.key)
		}
	}
	req := r.req
	req.Exclude = ex
	return r.l.picker.Pick(r.ctx, &req)
}
