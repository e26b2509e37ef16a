package fair

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// Request is what the queue needs to know of a request.
type Request struct {
	// Principal is the tenant or client whose share the request uses;
	// "" is a principal like any other. It must be a name the client cannot
	// choose freely (an authenticated tenant, a client address), never a
	// session key it sends: a client that sends each request under a new
	// principal is served as that many principals, with n requests waiting
	// among m other principals waiting about n/(n+m) of the capacity. A
	// name of any length may be given: the queue keeps at most 65 bytes of
	// it while it tracks the principal (a longer name is kept as its
	// SHA-256 digest).
	Principal string
	// Class is the request's priority class; the zero value is [Standard].
	Class Class
	// PromptTokens is the request's prompt length in tokens, charged at
	// admission; a negative value counts as 0, and one above 1<<31-1 (far
	// beyond any model's context: a bogus estimate) as 1<<31-1. Every
	// admission is charged at least one token, so that a stream of empty
	// prompts still moves its principal's counter.
	PromptTokens int
}

// maxRequestTokens bounds the prompt tokens and the output tokens charged
// for one request, as package llmlb bounds the token counts of its
// Request. Principals are lifted to the counters of others (VTC), so a
// single charge of, say, math.MaxInt tokens would lift every principal
// served after it to where a float64 no longer tells one request's charge,
// and the queue would order principals by arrival alone from then on.
const maxRequestTokens = 1<<31 - 1

// Stats is a snapshot of a queue's state.
type Stats struct {
	// InFlight is the number of requests admitted and not done.
	InFlight int
	// TokensInFlight is their prompt tokens plus the output tokens charged
	// to them so far, saturating at math.MaxInt64.
	TokensInFlight int64
	// Waiting is the number of requests waiting for admission.
	Waiting int
	// Principals is the number of principals tracked.
	Principals int
}

// Queue is a bounded admission queue, token-fair across principals and
// ordered by priority class with aging; see the package documentation.
// Create one with [New]; the zero value is not usable.
//
// Admit, Enter, Stats and the methods of the tickets they return are safe
// for concurrent use. Each takes the queue's lock for a time linear in the
// number of principals with requests waiting (at most MaxWaiting), and
// constant when none wait.
type Queue struct {
	maxInFlight     int
	maxTokens       int64
	maxWaiting      int
	maxPerPrincipal int
	maxPrincipals   int
	weight          func(string) float64
	inW, outW       float64
	aging           time.Duration // <= 0: no aging
	retryAfter      time.Duration
	maxRetryAfter   time.Duration
	clock           llmlb.Clock
	observer        Observer

	mu         sync.Mutex            // protects the fields below and every principal and ticket state
	principals map[string]*principal // every principal tracked
	idle       idleList              // principals with nothing waiting or in flight, most recent first
	backlog    []*principal          // principals with requests waiting
	last       *principal            // the principal admitted last: VTC's lifting level when nothing waits
	vtime      float64               // virtual time, the least level a principal is lifted to; see advanceLocked
	blocked    *Ticket               // the waiter first in order that did not fit the token cap; nil if none
	served     [numClasses]time.Time // the last admission of a request of each class, by its own class
	rate       float64               // admissions per second, exponentially weighted, as of rateAt
	rateAt     time.Time             // the last admission
	rateFrom   time.Time             // the first admission
	seq        uint64                // arrivals so far
	inflight   int
	tokens     int64
	waiting    int
	woken      []*Ticket // tickets of Enter admitted or refused under the lock, to notify once it is released
}

// New returns a queue configured by cfg, or an error wrapping
// [ErrInvalidConfig] for a negative cap, bound or wait, a MaxRetryAfter
// below RetryAfter, or a weight that is negative, NaN or infinite.
func New(cfg Config) (*Queue, error) {
	switch {
	case cfg.MaxInFlight < 0:
		return nil, invalidf("MaxInFlight %d is negative", cfg.MaxInFlight)
	case cfg.MaxTokensInFlight < 0:
		return nil, invalidf("MaxTokensInFlight %d is negative", cfg.MaxTokensInFlight)
	case cfg.MaxWaiting < 0:
		return nil, invalidf("MaxWaiting %d is negative", cfg.MaxWaiting)
	case cfg.MaxWaitingPerPrincipal < 0:
		return nil, invalidf("MaxWaitingPerPrincipal %d is negative", cfg.MaxWaitingPerPrincipal)
	case cfg.MaxPrincipals < 0:
		return nil, invalidf("MaxPrincipals %d is negative", cfg.MaxPrincipals)
	case cfg.InputWeight != 0 && !validWeight(cfg.InputWeight):
		return nil, invalidf("InputWeight %v is not a positive finite number", cfg.InputWeight)
	case cfg.OutputWeight != 0 && !validWeight(cfg.OutputWeight):
		return nil, invalidf("OutputWeight %v is not a positive finite number", cfg.OutputWeight)
	case cfg.RetryAfter < 0:
		return nil, invalidf("RetryAfter %v is negative", cfg.RetryAfter)
	case cfg.MaxRetryAfter < 0:
		return nil, invalidf("MaxRetryAfter %v is negative", cfg.MaxRetryAfter)
	case cfg.MaxRetryAfter != 0 && cfg.MaxRetryAfter < max(cfg.RetryAfter, 0):
		return nil, invalidf("MaxRetryAfter %v is below RetryAfter %v", cfg.MaxRetryAfter, cfg.RetryAfter)
	}
	q := &Queue{
		maxInFlight:     cfg.MaxInFlight,
		maxTokens:       cfg.MaxTokensInFlight,
		maxWaiting:      cfg.MaxWaiting,
		maxPerPrincipal: cfg.MaxWaitingPerPrincipal,
		maxPrincipals:   cfg.MaxPrincipals,
		weight:          cfg.Weight,
		inW:             cfg.InputWeight,
		outW:            cfg.OutputWeight,
		aging:           cfg.AgingInterval,
		retryAfter:      cfg.RetryAfter,
		maxRetryAfter:   cfg.MaxRetryAfter,
		clock:           cfg.Clock,
		principals:      make(map[string]*principal),
	}
	if q.maxWaiting == 0 {
		q.maxWaiting = DefaultMaxWaiting
	}
	if q.maxPrincipals == 0 {
		q.maxPrincipals = DefaultMaxPrincipals
	}
	if q.inW == 0 {
		q.inW = DefaultInputWeight
	}
	if q.outW == 0 {
		q.outW = DefaultOutputWeight
	}
	if q.aging == 0 {
		q.aging = DefaultAgingInterval
	}
	if q.retryAfter == 0 {
		// Within a MaxRetryAfter set below the default, so that no wait
		// suggested is above it.
		q.retryAfter = DefaultRetryAfter
		if q.maxRetryAfter > 0 {
			q.retryAfter = min(q.retryAfter, q.maxRetryAfter)
		}
	}
	if q.maxRetryAfter == 0 {
		q.maxRetryAfter = max(DefaultMaxRetryAfter, q.retryAfter)
	}
	if cfg.Observer != nil {
		q.observer = *cfg.Observer
	}
	if q.clock == nil {
		q.clock = systemClock{}
	}
	return q, nil
}

// Admit admits r, waiting if the queue's capacity is used, and returns its
// ticket, whose Done the caller must call when the request ends. A nil ctx
// is taken as [context.Background].
//
// It returns at once with a [*retry.OverloadError] (errors.Is
// [retry.ErrOverloaded]) when r would wait and MaxWaiting or
// MaxWaitingPerPrincipal is reached, or when ctx's deadline has passed. A
// waiting request fails with one when it is shed for a more urgent request
// or when ctx's deadline passes (the error then also matches
// [context.DeadlineExceeded]). The error's Scope is "principal" when
// MaxWaitingPerPrincipal is reached and "queue" otherwise. If ctx is
// cancelled, it returns an error
// wrapping ctx.Err(). A request that fails leaves the queue with nothing
// charged to its principal and nothing held.
func (q *Queue) Admit(ctx context.Context, r Request) (*Ticket, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		return nil, q.leaveErrorLocked(r.Class.rank(), err)
	}
	w := q.principalWeight(r.Principal)
	r.Principal = principalKey(r.Principal)
	deadline, _ := ctx.Deadline()
	t, admitted, err := q.enter(r, w, deadline, nil)
	if err != nil || admitted {
		return t, err
	}
	select {
	case <-t.ready:
		// t.err was set before ready was closed.
		if t.err != nil {
			return nil, t.err
		}
		return t, nil
	case <-ctx.Done():
		return nil, q.abandon(t, ctx.Err())
	}
}

// Enter is the form of [Queue.Admit] that never waits, for callers that
// cannot block, such as an event loop or a discrete-event simulation. It
// admits r at once, queues it, or refuses it, as Admit would with a context
// that has no deadline, and returns the ticket and whether it is admitted.
//
// A refused request gets the error Admit returns and no ticket. A queued
// one is admitted or refused later, in the order and on the bounds the
// package documentation gives: ready is then called once, with nil when the
// ticket is admitted (its holder uses it as one Admit returned) or with
// the refusal, a [*retry.OverloadError], when it is shed. ready is called
// by the goroutine whose call let the ticket in or shed it (a
// [Ticket.Done], an Admit or an Enter), after the queue's lock is
// released, so it may call the queue's methods; it should not block. ready
// is never called for a request admitted or refused by Enter itself, and
// must not be nil.
//
// To give up a queued ticket, call its Done: it leaves the queue with
// nothing charged to its principal, and ready is not called. A Done that
// races with another goroutine's call admitting the ticket may come too
// late: the ticket was then admitted and is done as an admitted one, its
// prompt charged, and ready(nil) still comes, after Done; a holder that
// gives up from another goroutine than the queue's other calls ignores it.
func (q *Queue) Enter(r Request, ready func(err error)) (*Ticket, bool, error) {
	if ready == nil {
		panic("fair: Enter with a nil ready function")
	}
	w := q.principalWeight(r.Principal)
	r.Principal = principalKey(r.Principal)
	return q.enter(r, w, time.Time{}, ready)
}

// enter admits r, whose Principal is its principal's key ([principalKey]),
// at once or queues it. It returns the ticket, whether it is admitted, or
// an error if r is refused. A ticket queued with ready not nil
// is reported to ready (see [Queue.Enter]); otherwise it has a channel,
// closed when it is admitted or refused, which [Queue.Admit] waits on.
func (q *Queue) enter(r Request, weight float64, deadline time.Time, ready func(error)) (*Ticket, bool, error) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.unlock()
	if !deadline.IsZero() && !now.Before(deadline) {
		return nil, false, q.refusal(r.Class.rank(), nil, ReasonDeadline, now, context.DeadlineExceeded)
	}
	rank, prompt := r.Class.rank(), int64(min(max(r.PromptTokens, 0), maxRequestTokens))
	// Nothing waits and r fits: it enters and leaves the backlog at once.
	atOnce := q.waiting == 0 && q.fitsLocked(prompt)
	if !atOnce {
		// r would wait: refuse it if there is no room. A refusal leaves
		// the principals tracked as they were: remembering a principal the
		// queue does not know, with nothing charged to it, would make it
		// forget one it served.
		p := q.principals[r.Principal] // nil if not tracked
		if p != nil && q.maxPerPrincipal > 0 && p.waiting >= q.maxPerPrincipal {
			return nil, false, q.refusal(rank, p, ReasonPrincipal, now, nil)
		}
		if q.waiting >= q.maxWaiting && !q.shedLocked(rank, p, now) && !q.shedLongestLocked(rank, p, now) {
			return nil, false, q.refusal(rank, nil, ReasonFull, now, nil)
		}
	}
	p := q.principalLocked(r.Principal, weight)
	t := &Ticket{q: q, p: p, rank: rank, prompt: prompt}
	if atOnce {
		// Lifted like any newcomer.
		q.liftLocked(p)
		q.admitLocked(t, now)
		return t, true, nil
	}
	q.seq++
	t.seq, t.enq, t.deadline = q.seq, now, deadline
	if ready == nil {
		t.ready = make(chan struct{})
	}
	q.pushLocked(t)
	q.dispatchLocked(now)
	// ready is set only now, so that it is not called for t's own
	// admission.
	t.notify = ready
	return t, t.state == stateAdmitted, nil
}

// unlock releases the queue's lock and then notifies the tickets of Enter
// that were admitted or refused while it was held.
func (q *Queue) unlock() {
	woken := q.woken
	q.woken = nil
	q.mu.Unlock()
	notifyAll(woken)
}

// notifyAll calls the ready function of each ticket of ts. If one panics,
// the others are still told, so that none is left admitted and unknown to
// its holder, and then the panic goes on.
func notifyAll(ts []*Ticket) {
	for i, t := range ts {
		panicked := true
		func() {
			defer func() {
				if panicked {
					notifyAll(ts[i+1:])
				}
			}()
			t.notify(t.err)
			panicked = false
		}()
	}
}

// wakeLocked tells t, which was queued and is now admitted or refused (with
// t.err), that it need wait no longer.
func (q *Queue) wakeLocked(t *Ticket) {
	switch {
	case t.ready != nil:
		close(t.ready)
	case t.notify != nil:
		q.woken = append(q.woken, t)
	}
}

// abandon takes t, whose caller's context ended with cause, out of the
// queue, or gives back its admission if it was admitted meanwhile.
func (q *Queue) abandon(t *Ticket, cause error) error {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.unlock()
	observe := true // tell the observer of a refusal
	switch t.state {
	case stateRefused:
		return t.err
	case stateQueued:
		q.unlinkLocked(t)
		t.state = stateDone
		q.settleLocked(t.p)
	case stateAdmitted:
		// Admitted as the context ended: nobody will use it. Refund the
		// charge, so that the principal loses nothing. The observer was
		// told of the admission, so it is not told of a refusal too: the
		// caller still gets the error of a request that left the queue.
		if c := t.p.counter - t.cost; c > 0 {
			t.p.counter = c
		} else {
			t.p.counter = 0 // NaN-safe, unlike max
		}
		if q.vtime == t.vto {
			// Nothing moved the virtual time since: take back what the
			// admission moved it, which the principal would otherwise
			// pay when it is next lifted.
			q.vtime = t.vfrom
		}
		q.releaseLocked(t)
		observe = false
	}
	err := q.leaveError(t.rank, cause, now, observe)
	// Its leaving may let the waiters behind it in.
	q.dispatchLocked(now)
	return err
}

// leaveErrorLocked returns the error of a request of rank whose caller's
// context ended with cause before it was admitted: a refusal if its
// deadline passed.
func (q *Queue) leaveErrorLocked(rank int, cause error) error {
	return q.leaveError(rank, cause, q.clock.Now(), true)
}

// leaveError is leaveErrorLocked at now, telling the observer of the
// refusal only if observe is set. The lock is held.
func (q *Queue) leaveError(rank int, cause error, now time.Time, observe bool) error {
	if errors.Is(cause, context.DeadlineExceeded) {
		if !observe {
			return q.refusalError(nil, ReasonDeadline, now, cause)
		}
		return q.refusal(rank, nil, ReasonDeadline, now, cause)
	}
	return fmt.Errorf("fair: left the queue: %w", cause)
}

// refusalWhat says what happened, for each reason.
var refusalWhat = map[Reason]string{
	ReasonFull:      "queue full",
	ReasonPrincipal: "too many requests of the principal waiting",
	ReasonShed:      "shed for a more urgent request",
	ReasonDeadline:  "deadline passed before admission",
}

// refusal reports the refusal of a request of rank for reason to the
// observer and returns its error: a *retry.OverloadError suggesting the
// wait [Queue.retryAfterLocked] estimates, wrapped with what happened and
// with cause if not nil. p is the principal for ReasonPrincipal. The lock
// is held.
func (q *Queue) refusal(rank int, p *principal, reason Reason, now time.Time, cause error) error {
	if f := q.observer.Refused; f != nil {
		f(classOf(rank), reason)
	}
	return q.refusalError(p, reason, now, cause)
}

// refusalError is the error refusal returns, without telling the observer.
func (q *Queue) refusalError(p *principal, reason Reason, now time.Time, cause error) error {
	scope := "queue"
	if reason == ReasonPrincipal {
		scope = "principal"
	}
	oe := &retry.OverloadError{Scope: scope, RetryAfter: q.retryAfterLocked(p, now)}
	if cause != nil {
		return fmt.Errorf("fair: %s: %w: %w", refusalWhat[reason], oe, cause)
	}
	return fmt.Errorf("fair: %s: %w", refusalWhat[reason], oe)
}

// rateWindow is the time constant of the admission rate's weighting.
const rateWindow = 10 * time.Second

// retryAfterLocked returns the wait to suggest to a refused caller: the
// time to admit the requests waiting (p's, at its share of the rate, if p
// is not nil) at the recent admission rate, within [RetryAfter,
// MaxRetryAfter].
func (q *Queue) retryAfterLocked(p *principal, now time.Time) time.Duration {
	q.rewindRateLocked(now)
	if q.rateFrom.IsZero() || now.Sub(q.rateFrom) < rateWindow/10 {
		// Too soon to tell a rate.
		return q.retryAfter
	}
	tau := rateWindow.Seconds()
	rate := q.rate * math.Exp(-max(now.Sub(q.rateAt).Seconds(), 0)/tau)
	// The weighted rate starts from 0: correct the bias of its first
	// window, as for any exponentially weighted average started at 0.
	rate /= -math.Expm1(-now.Sub(q.rateFrom).Seconds() / tau)
	ahead := float64(q.waiting)
	if p != nil {
		ahead = float64(p.waiting) * float64(max(len(q.backlog), 1))
	}
	if ahead == 0 {
		// Nothing to wait for, whatever the rate, which after hours
		// without an admission decays to exactly 0.
		return q.retryAfter
	}
	wait := q.maxRetryAfter
	if rate > 0 {
		if s := ahead / rate; s < wait.Seconds() {
			wait = time.Duration(s * float64(time.Second))
		}
	}
	return max(wait, q.retryAfter)
}

// rewindRateLocked moves the times of the admission rate back by as much as
// the clock went back, if now is before the last admission: the step counts
// as no time, so that the rate neither looks too young to tell nor decays
// until the clock is back where it was.
func (q *Queue) rewindRateLocked(now time.Time) {
	if d := q.rateAt.Sub(now); d > 0 && !q.rateFrom.IsZero() {
		q.rateAt, q.rateFrom = now, q.rateFrom.Add(-d)
	}
}

// Stats returns a snapshot of the queue's state.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{InFlight: q.inflight, TokensInFlight: q.tokens, Waiting: q.waiting, Principals: len(q.principals)}
}

// fitsLocked reports whether a request of prompt tokens may be admitted now.
func (q *Queue) fitsLocked(prompt int64) bool {
	if q.maxInFlight > 0 && q.inflight >= q.maxInFlight {
		return false
	}
	return q.maxTokens == 0 || q.tokens == 0 || prompt <= q.maxTokens-q.tokens
}

// floorLocked is the level a principal's counter is lifted to when it starts
// waiting: the least counter of the principals waiting, or, when none waits,
// the counter of the principal admitted last.
func (q *Queue) floorLocked() float64 {
	if len(q.backlog) == 0 {
		if q.last != nil {
			return q.last.counter
		}
		return 0
	}
	m := math.Inf(1)
	for _, p := range q.backlog {
		m = min(m, p.counter)
	}
	return m
}

// liftLocked lifts the counter of p, which starts waiting or is admitted
// at once: to the floor, and to the virtual time if nothing of p is in
// flight. A request in flight is yet to be charged its output, which the
// virtual time may count already: lifting p to it would charge p that
// output twice, once a request of p waits while another is in flight.
func (q *Queue) liftLocked(p *principal) {
	l := q.floorLocked()
	if p.inflight == 0 {
		l = max(l, q.vtime)
	}
	p.counter = max(p.counter, l)
}

// advanceLocked raises the virtual time once t, admitted, was charged (at
// its admission, and with its output when it is done): to the counter of
// t's principal, as self-clocked fair queueing (Golestani, 1994) sets its
// virtual time to the finish tag of the packet in service, but no further
// than the counter that any principal waiting would have if t had been its
// request: its counter plus t's price (tokens times their price, before
// any weight) at its own weight. So the virtual time rises with every
// request served, and a principal lifted to it is never more than one
// request (t, priced at the weight of the principal waiting) above the
// principal waiting that was served least. The bound is what keeps weights
// meaningful: a principal of weight 0.01 is charged 100 times t's price,
// and a virtual time that followed its counter would lift every principal
// after it as far, serving it as if its weight were theirs.
func (q *Queue) advanceLocked(t *Ticket) {
	v := t.p.counter
	for _, b := range q.backlog {
		v = min(v, b.counter+t.price/b.weight)
	}
	q.vtime = max(q.vtime, v)
}

// admitLocked admits t, which is not queued, at now, and charges its
// prompt.
func (q *Queue) admitLocked(t *Ticket, now time.Time) {
	p := t.p
	t.price = float64(max(t.prompt, 1)) * q.inW
	t.cost = t.price / p.weight
	p.counter += t.cost
	t.vfrom = q.vtime
	q.advanceLocked(t)
	t.vto = q.vtime
	p.inflight++
	t.tokens = min(t.prompt, math.MaxInt64-q.tokens) // saturating, as in Charge
	q.inflight++
	q.tokens += t.tokens
	q.last = p
	q.served[t.rank] = now
	t.state = stateAdmitted
	tau := rateWindow.Seconds()
	if q.rateFrom.IsZero() {
		q.rateFrom = now
	} else {
		q.rewindRateLocked(now)
		q.rate *= math.Exp(-now.Sub(q.rateAt).Seconds() / tau)
	}
	q.rate += 1 / tau
	q.rateAt = now
	if f := q.observer.Admitted; f != nil {
		waited := time.Duration(0)
		if t.seq != 0 { // it was queued
			waited = max(now.Sub(t.enq), 0) // a clock stepped back waited nothing
		}
		f(classOf(t.rank), waited)
	}
}

// releaseLocked ends t, which is admitted.
func (q *Queue) releaseLocked(t *Ticket) {
	t.state = stateDone
	q.inflight--
	q.tokens -= t.tokens
	t.p.inflight--
	q.settleLocked(t.p)
}

// dispatchLocked admits waiters in order while they fit, and refuses those
// whose deadline has passed.
//
// A waiter first in order that does not fit the token cap keeps its place
// until it does (q.blocked): no waiter of its class or a less urgent one is
// admitted before it, however the order changes meanwhile. Otherwise the
// admissions that aging lends a less urgent class, one an interval, could
// keep tokens in flight for ever, and a request that needs them to drain
// (a prompt larger than the cap) would never be admitted.
func (q *Queue) dispatchLocked(now time.Time) {
	for q.waiting > 0 {
		t := q.nextLocked(now)
		if b := q.blocked; b != nil && t.rank >= b.rank {
			t = b
		}
		if !t.deadline.IsZero() && !now.Before(t.deadline) {
			q.unlinkLocked(t)
			q.refuseLocked(t, q.refusal(t.rank, nil, ReasonDeadline, now, context.DeadlineExceeded))
			continue
		}
		if !q.fitsLocked(t.prompt) {
			if q.maxInFlight == 0 || q.inflight < q.maxInFlight {
				q.blocked = t // only the token cap keeps it out
			}
			return
		}
		q.unlinkLocked(t)
		q.admitLocked(t, now)
		q.wakeLocked(t)
	}
}

// refuseLocked wakes t, unlinked, with err.
func (q *Queue) refuseLocked(t *Ticket, err error) {
	t.state, t.err = stateRefused, err
	q.settleLocked(t.p)
	q.wakeLocked(t)
}

// classRanks returns the effective rank of each class at now: its rank,
// less one for every full aging interval the class has waited, and never
// below 0. A class waits from the arrival of its oldest waiter or from the
// last admission of one of its requests, whichever is later. It ages as a
// whole, so that within a class waiters are always ordered by their
// principals' counters: aging lifts a less urgent class above a more
// urgent one, never one waiter above another of its own class. And since
// an admission restarts its wait, an aged class is lent one admission per
// interval, not the more urgent class's place.
//
// An arrival or an admission after now (the clock went back) is taken as
// now, and kept so: the class waits from the step, neither less urgent
// than its own rank nor unaged until the clock is back where it was.
func (q *Queue) classRanks(now time.Time) [numClasses]int {
	var oldest [numClasses]time.Time
	for _, p := range q.backlog {
		for c := range numClasses {
			t := p.head[c]
			if t == nil {
				continue
			}
			if t.enq.After(now) {
				t.enq = now
			}
			if oldest[c].IsZero() || t.enq.Before(oldest[c]) {
				oldest[c] = t.enq
			}
		}
	}
	var ranks [numClasses]int
	for c := range numClasses {
		if q.served[c].After(now) {
			q.served[c] = now
		}
		r := c
		if q.aging > 0 && r > 0 && !oldest[c].IsZero() {
			since := oldest[c]
			if q.served[c].After(since) {
				since = q.served[c]
			}
			r -= int(min(now.Sub(since)/q.aging, time.Duration(r)))
		}
		ranks[c] = r
	}
	return ranks
}

// nextLocked returns the waiter to admit next: of the classes of least
// effective rank, the one aged furthest below its own rank (an aged class
// is lent the next admission, whatever its principals' counters), then the
// waiter of the principal with the least counter, then the earliest
// arrival. Only the head of each principal's queue of each class can be
// it, since it has waited longest.
func (q *Queue) nextLocked(now time.Time) *Ticket {
	ranks := q.classRanks(now)
	var (
		best               *Ticket
		bestRank, bestAged int
	)
	for _, p := range q.backlog {
		for c := range numClasses {
			t := p.head[c]
			if t == nil {
				continue
			}
			r, aged := ranks[c], c-ranks[c]
			if best == nil || r < bestRank || r == bestRank && (aged > bestAged || aged == bestAged &&
				(p.counter < best.p.counter || p.counter == best.p.counter && t.seq < best.seq)) {
				best, bestRank, bestAged = t, r, aged
			}
		}
	}
	return best
}

// shedLocked refuses the newest waiter of the least urgent class that is
// less urgent than rank, to make room, and reports whether there was one.
// entering is the principal of the request that makes room: when the
// victim is its own, it is not settled idle (or forgotten), since it is
// about to wait again.
func (q *Queue) shedLocked(rank int, entering *principal, now time.Time) bool {
	for c := numClasses - 1; c > rank; c-- {
		var victim *Ticket
		for _, p := range q.backlog {
			if t := p.tail[c]; t != nil && (victim == nil || t.seq > victim.seq) {
				victim = t
			}
		}
		if victim != nil {
			q.unlinkLocked(victim)
			victim.state, victim.err = stateRefused, q.refusal(victim.rank, nil, ReasonShed, now, nil)
			if victim.p != entering {
				q.settleLocked(victim.p)
			}
			q.wakeLocked(victim)
			return true
		}
	}
	return false
}

// shedLongestLocked refuses the newest waiter of class rank of the
// principal with the most requests waiting, to make room for a request of
// that class of entering (nil if not tracked), and reports whether there
// was one: only if that principal has at least two requests more waiting
// than entering, so that the room goes to a principal with fewer waiting
// and two principals never shed each other's requests in turn. Without
// it, a principal that keeps the queue full would have every other
// principal's requests refused, and the order of the waiters, fair as it
// is, would serve that principal alone.
func (q *Queue) shedLongestLocked(rank int, entering *principal, now time.Time) bool {
	least := 2
	if entering != nil {
		least += entering.waiting
	}
	var victim *principal
	for _, p := range q.backlog {
		if p.tail[rank] != nil && p.waiting >= least && (victim == nil || p.waiting > victim.waiting) {
			victim = p
		}
	}
	if victim == nil {
		return false
	}
	t := victim.tail[rank]
	q.unlinkLocked(t)
	// victim still has requests waiting: it is not settled idle.
	t.state, t.err = stateRefused, q.refusal(t.rank, nil, ReasonShed, now, nil)
	q.wakeLocked(t)
	return true
}

// pushLocked appends t to its principal's queue of its class, lifting the
// principal's counter if it starts waiting.
func (q *Queue) pushLocked(t *Ticket) {
	p := t.p
	if p.waiting == 0 {
		q.liftLocked(p)
		p.bidx = len(q.backlog)
		q.backlog = append(q.backlog, p)
	}
	c := t.rank
	t.prev, t.next = p.tail[c], nil
	if p.tail[c] != nil {
		p.tail[c].next = t
	} else {
		p.head[c] = t
	}
	p.tail[c] = t
	p.waiting++
	q.waiting++
	t.state = stateQueued
}

// unlinkLocked takes t, queued, out of its principal's queue.
func (q *Queue) unlinkLocked(t *Ticket) {
	if q.blocked == t {
		q.blocked = nil
	}
	p, c := t.p, t.rank
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		p.head[c] = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		p.tail[c] = t.prev
	}
	t.prev, t.next = nil, nil
	p.waiting--
	q.waiting--
	if p.waiting == 0 {
		last := q.backlog[len(q.backlog)-1]
		q.backlog[p.bidx] = last
		last.bidx = p.bidx
		q.backlog[len(q.backlog)-1] = nil
		q.backlog = q.backlog[:len(q.backlog)-1]
		p.bidx = -1
	}
}
