package fair

import (
	"context"
	"sync"
	"testing"
	"time"
)

// readyLog records the calls of Enter's ready functions, by name.
type readyLog struct {
	mu    sync.Mutex
	calls []string
	errs  map[string]error
}

func (l *readyLog) ready(name string) func(error) {
	return func(err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, name)
		if l.errs == nil {
			l.errs = make(map[string]error)
		}
		l.errs[name] = err
	}
}

func (l *readyLog) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

func mustEnter(t *testing.T, q *Queue, r Request, ready func(error), wantAdmitted bool) *Ticket {
	t.Helper()
	tk, admitted, err := q.Enter(r, ready)
	if err != nil {
		t.Fatal(err)
	}
	if admitted != wantAdmitted {
		t.Fatalf("Enter(%+v) admitted %v, want %v", r, admitted, wantAdmitted)
	}
	return tk
}

// Enter admits at once while there is room, queues past the cap, and tells
// a queued ticket of its admission when a release makes room, in VTC order.
func TestEnterQueuesAndNotifies(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	var log readyLog
	first := mustEnter(t, q, Request{Principal: "heavy", PromptTokens: 1000}, log.ready("first"), true)
	h2 := mustEnter(t, q, Request{Principal: "heavy", PromptTokens: 10}, log.ready("h2"), false)
	light := mustEnter(t, q, Request{Principal: "light", PromptTokens: 10}, log.ready("light"), false)
	if got := log.got(); len(got) != 0 {
		t.Fatalf("ready called %v before any release", got)
	}
	if s := q.Stats(); s.InFlight != 1 || s.Waiting != 2 {
		t.Fatalf("stats %+v", s)
	}
	first.Charge(50)
	first.Done()
	// heavy was served 1100 weighted tokens: the light principal, lifted to
	// heavy's counter only when it started waiting, is not behind it.
	if got := log.got(); len(got) != 1 || got[0] != "light" || log.errs["light"] != nil {
		t.Fatalf("ready calls %v, want [light] with nil", got)
	}
	if !light.admitted() || h2.stateNow() != stateQueued {
		t.Fatal("light should be admitted and h2 still queued")
	}
	light.Done()
	if got := log.got(); len(got) != 2 || got[1] != "h2" || !h2.admitted() {
		t.Fatalf("ready calls %v, want h2 admitted second", got)
	}
	h2.Done()
	h2.Done() // no-op
	if got := log.got(); len(got) != 2 {
		t.Fatalf("ready calls %v after the last release, want no more", got)
	}
	mustCheck(t, q)
}

// Enter refuses as Admit does, and a shed ticket is told why.
func TestEnterRefusesAndSheds(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 2, MaxWaitingPerPrincipal: 1, RetryAfter: 3 * time.Second})
	var log readyLog
	hold := mustEnter(t, q, Request{Principal: "a"}, log.ready("hold"), true)
	mustEnter(t, q, Request{Principal: "a", Class: Batch}, log.ready("batch"), false)
	if tk, _, err := q.Enter(Request{Principal: "a"}, log.ready("over")); err == nil || tk != nil {
		t.Fatalf("Enter past MaxWaitingPerPrincipal: ticket %v, error %v; want a refusal", tk, err)
	} else {
		isOverload(t, err, "principal")
	}
	mustEnter(t, q, Request{Principal: "b"}, log.ready("b"), false)
	// The queue is full: an interactive arrival sheds the batch waiter.
	mustEnter(t, q, Request{Principal: "c", Class: Interactive}, log.ready("c"), false)
	if got := log.got(); len(got) != 1 || got[0] != "batch" {
		t.Fatalf("ready calls %v, want [batch]", got)
	}
	isOverload(t, log.errs["batch"], "queue")
	hold.Done()
	if got := log.got(); len(got) != 2 || got[1] != "c" || log.errs["c"] != nil {
		t.Fatalf("ready calls %v, want c admitted next", got)
	}
	mustCheck(t, q)
}

// Done on a queued ticket takes it out of the queue with nothing charged,
// and its ready function is never called.
func TestEnterDoneWhileQueued(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	var log readyLog
	hold := mustEnter(t, q, Request{Principal: "a"}, log.ready("hold"), true)
	gone := mustEnter(t, q, Request{Principal: "b", PromptTokens: 500}, log.ready("gone"), false)
	next := mustEnter(t, q, Request{Principal: "c"}, log.ready("next"), false)
	before, _ := q.counter("b")
	gone.Done()
	if after, _ := q.counter("b"); after != before {
		t.Fatalf("counter of b moved from %v to %v by leaving the queue", before, after)
	}
	if s := q.Stats(); s.Waiting != 1 {
		t.Fatalf("stats %+v, want 1 waiting", s)
	}
	hold.Done()
	if got := log.got(); len(got) != 1 || got[0] != "next" || !next.admitted() {
		t.Fatalf("ready calls %v, want [next]", got)
	}
	next.Done()
	mustCheck(t, q)
}

// A queued ticket leaving under a token cap lets the smaller waiters behind
// it in at once.
func TestEnterDoneWhileQueuedDispatches(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxTokensInFlight: 100})
	var log readyLog
	mustEnter(t, q, Request{Principal: "a", PromptTokens: 60}, log.ready("hold"), true)
	big := mustEnter(t, q, Request{Principal: "b", PromptTokens: 80}, log.ready("big"), false)
	mustEnter(t, q, Request{Principal: "c", PromptTokens: 30}, log.ready("small"), false)
	big.Done()
	if got := log.got(); len(got) != 1 || got[0] != "small" {
		t.Fatalf("ready calls %v, want [small] once the large waiter left", got)
	}
	mustCheck(t, q)
}

// ready runs outside the queue's lock: it may release its own ticket, which
// admits the next waiter, whose ready runs in turn.
func TestEnterReadyMayCallQueue(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	var order []int
	hold := mustEnter(t, q, Request{Principal: "a"}, func(error) {}, true)
	const n = 5
	tickets := make([]*Ticket, n)
	for i := range n {
		tickets[i] = mustEnter(t, q, Request{Principal: "a"}, func(err error) {
			if err != nil {
				t.Errorf("waiter %d refused: %v", i, err)
			}
			order = append(order, i)
			tickets[i].Charge(3)
			tickets[i].Done()
		}, false)
	}
	hold.Done()
	if len(order) != n {
		t.Fatalf("admitted %v, want all %d in turn", order, n)
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("admitted in order %v, want arrival order", order)
		}
	}
	if s := q.Stats(); s.InFlight != 0 || s.Waiting != 0 || s.TokensInFlight != 0 {
		t.Fatalf("stats %+v, want an empty queue", s)
	}
	mustCheck(t, q)
}

func TestEnterNilReadyPanics(t *testing.T) {
	q, _ := newTestQueue(t, Config{})
	defer func() {
		if recover() == nil {
			t.Fatal("Enter with a nil ready did not panic")
		}
	}()
	q.Enter(Request{}, nil)
}

// Admit and Enter share one queue under concurrent use; every request is
// admitted exactly once and the queue ends empty.
func TestEnterWithAdmitConcurrently(t *testing.T) {
	q, err := New(Config{MaxInFlight: 3})
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			principal := string(rune('a' + w%3))
			for range each {
				if w%2 == 0 {
					tk, err := q.Admit(context.Background(), Request{Principal: principal, PromptTokens: 5})
					if err != nil {
						errs <- err
						continue
					}
					tk.Charge(2)
					tk.Done()
					continue
				}
				admitted := make(chan error, 1)
				tk, ok, err := q.Enter(Request{Principal: principal, PromptTokens: 5}, func(err error) { admitted <- err })
				if err != nil {
					errs <- err
					continue
				}
				if !ok {
					if err := <-admitted; err != nil {
						errs <- err
						continue
					}
				}
				tk.Charge(2)
				tk.Done()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := q.Stats(); s.InFlight != 0 || s.Waiting != 0 || s.TokensInFlight != 0 {
		t.Fatalf("stats %+v, want an empty queue", s)
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
}

// A ready function that panics does not keep the others woken with it from
// being told: the panic reaches the caller whose release woke them, and
// every admitted ticket's holder learns of its admission.
func TestEnterReadyPanicStillNotifiesTheOthers(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxTokensInFlight: 1000})
	var log readyLog
	big := mustEnter(t, q, Request{Principal: "a", PromptTokens: 1000}, log.ready("a"), true)
	mustEnter(t, q, Request{Principal: "c", PromptTokens: 10}, func(error) { panic("ready of c") }, false)
	d := mustEnter(t, q, Request{Principal: "d", PromptTokens: 10}, log.ready("d"), false)
	// The release makes room for both; c's ready function is called first.
	func() {
		defer func() {
			if r := recover(); r != "ready of c" {
				t.Fatalf("recovered %v, want the ready function's panic", r)
			}
		}()
		big.Done()
	}()
	if got := log.got(); len(got) != 1 || got[0] != "d" || !d.admitted() {
		t.Fatalf("ready calls %v, want d told of its admission", got)
	}
	if s := q.Stats(); s.InFlight != 2 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want c and d in flight", s)
	}
}
