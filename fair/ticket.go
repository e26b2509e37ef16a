package fair

import (
	"math"
	"time"
)

// Ticket states.
const (
	stateNew      = iota
	stateQueued   // waiting in its principal's queue
	stateAdmitted // admitted, holding capacity
	stateRefused  // shed or past its deadline; err says why
	stateDone     // released, or abandoned while queued
)

// Ticket is an admitted request, or with [Queue.Enter] one that may be
// waiting for admission. Its holder charges it the output tokens
// the request produces ([Ticket.Charge]) and calls [Ticket.Done] when the
// request ends, which gives its capacity to the next waiter. Its methods
// are safe for concurrent use.
type Ticket struct {
	q      *Queue
	p      *principal
	rank   int
	prompt int64 // prompt tokens, counted in flight from admission

	// Protected by q.mu.
	state    int
	cost     float64 // the counter charge at admission
	price    float64 // the prompt and output charged so far, before weight
	vfrom    float64 // the virtual time before its admission
	vto      float64 // and after
	tokens   int64   // tokens in flight: prompt plus output charged
	output   int64   // output tokens charged, at most maxRequestTokens
	seq      uint64  // arrival order, when queued
	enq      time.Time
	deadline time.Time
	prev     *Ticket // neighbours in the principal's queue of the class
	next     *Ticket
	ready    chan struct{} // of Admit: closed when a queued ticket is admitted or refused
	notify   func(error)   // of Enter: called when a queued ticket is admitted or refused
	err      error         // why it was refused
}

// Charge charges n output tokens (streamed since the last call) to the
// request's principal and counts them in flight until Done. Call it as
// output streams, per token or per chunk, so that a long generation is
// accounted for while it lasts and not only at its end. It takes the
// queue's lock briefly. n <= 0, and calls after Done, do nothing. A request
// is charged at most 1<<31-1 output tokens in all, far beyond any model's
// output: the charges past that (a backend's bogus usage report) count
// nothing.
func (t *Ticket) Charge(n int) {
	if n <= 0 {
		return
	}
	q := t.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.state != stateAdmitted {
		return
	}
	// A bogus count charged in full would lift the counters of the
	// principals served after this one so high that a request's charge no
	// longer changes them (see maxRequestTokens).
	add := min(int64(n), maxRequestTokens-t.output)
	if add <= 0 {
		return
	}
	t.output += add
	price := float64(add) * q.outW
	t.price += price
	t.p.counter += price / t.p.weight
	// The tokens in flight saturate rather than wrap, which would let
	// everything past the token cap.
	add = min(add, math.MaxInt64-q.tokens)
	t.tokens += add
	q.tokens += add
}

// Done ends the request: its place and its tokens in flight are released,
// and the next waiters are admitted if they now fit. The charges stay with
// the principal. A ticket still queued (see [Queue.Enter]) leaves the queue
// instead, with nothing charged. Calls after the first do nothing.
func (t *Ticket) Done() {
	q := t.q
	now := q.clock.Now()
	q.mu.Lock()
	defer q.unlock()
	switch t.state {
	case stateAdmitted:
		q.advanceLocked(t) // with the output it was charged
		q.releaseLocked(t)
	case stateQueued:
		q.unlinkLocked(t)
		t.state = stateDone
		q.settleLocked(t.p)
	default:
		return
	}
	q.dispatchLocked(now)
}
