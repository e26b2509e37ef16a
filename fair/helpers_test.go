package fair

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestQueue(t testing.TB, cfg Config) (*Queue, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	if cfg.Clock == nil {
		cfg.Clock = clk
	}
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q, clk
}

// push is a non-blocking Admit: it returns the ticket, admitted or queued,
// or the refusal.
func (q *Queue) push(r Request) (*Ticket, error) {
	w := q.principalWeight(r.Principal)
	t, _, err := q.enter(r, w, time.Time{}, nil)
	return t, err
}

// admitted reports whether t has been admitted (and is not done).
func (t *Ticket) admitted() bool {
	t.q.mu.Lock()
	defer t.q.mu.Unlock()
	return t.state == stateAdmitted
}

func (t *Ticket) stateNow() int {
	t.q.mu.Lock()
	defer t.q.mu.Unlock()
	return t.state
}

// counter returns the counter of principal key, and whether it is tracked.
func (q *Queue) counter(key string) (float64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p, ok := q.principals[key]
	if !ok {
		return 0, false
	}
	return p.counter, true
}

// virtualTime returns the queue's virtual time.
func (q *Queue) virtualTime() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.vtime
}

// check verifies the queue's internal invariants.
func (q *Queue) check() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	waiting, inflightP, active := 0, 0, 0
	for key, p := range q.principals {
		if p.key != key {
			return fmt.Errorf("principal %q filed under %q", p.key, key)
		}
		if p.counter < 0 {
			return fmt.Errorf("principal %q: negative counter %v", key, p.counter)
		}
		if p.waiting < 0 || p.inflight < 0 {
			return fmt.Errorf("principal %q: waiting %d, in flight %d", key, p.waiting, p.inflight)
		}
		n := 0
		for c := range numClasses {
			var prev *Ticket
			for t := p.head[c]; t != nil; t = t.next {
				if t.prev != prev || t.p != p || t.rank != c || t.state != stateQueued {
					return fmt.Errorf("principal %q class %d: broken queue", key, c)
				}
				if prev != nil && prev.seq >= t.seq {
					return fmt.Errorf("principal %q class %d: out of arrival order", key, c)
				}
				prev = t
				n++
			}
			if p.tail[c] != prev {
				return fmt.Errorf("principal %q class %d: wrong tail", key, c)
			}
		}
		if n != p.waiting {
			return fmt.Errorf("principal %q: %d queued, waiting says %d", key, n, p.waiting)
		}
		if (p.waiting > 0) != (p.bidx >= 0) || p.bidx >= 0 && q.backlog[p.bidx] != p {
			return fmt.Errorf("principal %q: backlog index %d with %d waiting", key, p.bidx, p.waiting)
		}
		if p.idle != (p.waiting == 0 && p.inflight == 0) {
			return fmt.Errorf("principal %q: idle %v with %d waiting, %d in flight", key, p.idle, p.waiting, p.inflight)
		}
		if !p.idle {
			active++
		}
		waiting += p.waiting
		inflightP += p.inflight
	}
	if waiting != q.waiting {
		return fmt.Errorf("waiting %d, principals say %d", q.waiting, waiting)
	}
	if inflightP != q.inflight {
		return fmt.Errorf("in flight %d, principals say %d", q.inflight, inflightP)
	}
	idle := 0
	for p := q.idle.head; p != nil; p = p.idleNext {
		if !p.idle || q.principals[p.key] != p {
			return fmt.Errorf("idle list holds %q, not idle or not tracked", p.key)
		}
		idle++
	}
	if idle+active != len(q.principals) {
		return fmt.Errorf("%d idle + %d active != %d tracked", idle, active, len(q.principals))
	}
	if len(q.principals) > max(q.maxPrincipals, active) {
		return fmt.Errorf("%d principals tracked, bound %d, %d active", len(q.principals), q.maxPrincipals, active)
	}
	if q.inflight < 0 || q.tokens < 0 || q.waiting > q.maxWaiting {
		return fmt.Errorf("in flight %d, tokens %d, waiting %d", q.inflight, q.tokens, q.waiting)
	}
	if q.inflight == 0 && q.tokens != 0 {
		return fmt.Errorf("nothing in flight but %d tokens", q.tokens)
	}
	if b := q.blocked; b != nil && (b.q != q || b.state != stateQueued) {
		return fmt.Errorf("the waiter keeping its place is in state %d", b.state)
	}
	return nil
}

func mustCheck(t testing.TB, q *Queue) {
	t.Helper()
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
}
