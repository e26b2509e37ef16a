package fair

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/llmlb/llmlb/retry"
)

// retryAfter returns the wait suggested by err, a refusal.
func retryAfter(t *testing.T, err error, scope string) time.Duration {
	t.Helper()
	var oe *retry.OverloadError
	if !errors.As(err, &oe) || oe.Scope != scope {
		t.Fatalf("error %v, want a *retry.OverloadError of scope %q", err, scope)
	}
	return oe.RetryAfter
}

// The wait suggested to a refused caller is the time the queue takes to
// admit the requests waiting at its recent admission rate: all of them for a
// full queue, the principal's own at its share of the rate for a principal
// past its bound.
func TestRetryAfterFollowsTheDrainRate(t *testing.T) {
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 20, MaxWaitingPerPrincipal: 15, RetryAfter: 100 * time.Millisecond})
	first, err := q.push(Request{Principal: "c"})
	if err != nil {
		t.Fatal(err)
	}
	live := []*Ticket{first}
	refill := func() {
		n := map[string]int{}
		var keep []*Ticket
		for _, tk := range live {
			switch tk.stateNow() {
			case stateQueued:
				n[tk.p.key]++
				keep = append(keep, tk)
			case stateAdmitted:
				keep = append(keep, tk)
			}
		}
		live = keep
		for p, want := range map[string]int{"a": 15, "b": 5} {
			for range want - n[p] {
				tk, err := q.push(Request{Principal: p})
				if err != nil {
					t.Fatal(err)
				}
				live = append(live, tk)
			}
		}
	}
	refill()
	// One admission so far: no rate to speak of yet, about the floor.
	_, err = q.push(Request{Principal: "a"})
	if got := retryAfter(t, err, "principal"); got > time.Second {
		t.Errorf("RetryAfter %v after one admission, want about the floor", got)
	}

	// One admission every 100 ms for a minute: 10 per second, while both
	// principals keep their backlog.
	for range 600 {
		clk.Advance(100 * time.Millisecond)
		var admitted []*Ticket
		for _, tk := range live {
			if tk.stateNow() == stateAdmitted {
				admitted = append(admitted, tk)
			}
		}
		for _, tk := range admitted {
			tk.Done()
		}
		refill()
	}
	within := func(got, want time.Duration) bool {
		return math.Abs(got.Seconds()-want.Seconds()) <= 0.1*want.Seconds()
	}
	_, err = q.push(Request{Principal: "a"})
	if got := retryAfter(t, err, "principal"); !within(got, 3*time.Second) {
		t.Errorf("principal scope: RetryAfter %v, want about 3s (15 waiting, half of 10/s)", got)
	}
	_, err = q.push(Request{Principal: "d", Class: Batch})
	if got := retryAfter(t, err, "queue"); !within(got, 2*time.Second) {
		t.Errorf("queue scope: RetryAfter %v, want about 2s (20 waiting at 10/s)", got)
	}

	// Nothing admitted for a long time: the rate decays, the wait grows to
	// its cap.
	clk.Advance(10 * time.Minute)
	_, err = q.push(Request{Principal: "d", Class: Batch})
	if got := retryAfter(t, err, "queue"); got != DefaultMaxRetryAfter {
		t.Errorf("after 10 minutes without admission: RetryAfter %v, want the cap %v", got, DefaultMaxRetryAfter)
	}
	mustCheck(t, q)
}

// The observer hears of every admission with its wait, and of every refusal
// with its reason, once; a caller giving up is not a refusal.
func TestObserver(t *testing.T) {
	type refusal struct {
		c      Class
		reason Reason
	}
	var (
		waits    []time.Duration
		refusals []refusal
	)
	obs := &Observer{
		Admitted: func(_ Class, w time.Duration) { waits = append(waits, w) },
		Refused:  func(c Class, r Reason) { refusals = append(refusals, refusal{c, r}) },
	}
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 2, MaxWaitingPerPrincipal: 1, Observer: obs})
	first, _ := q.push(Request{Principal: "a"}) // admitted at once
	batch, _ := q.push(Request{Principal: "b", Class: Batch})
	q.push(Request{Principal: "b"})                                 // principal b past its bound
	std, _ := q.push(Request{Principal: "c"})                       // queued
	inter, _ := q.push(Request{Principal: "e", Class: Interactive}) // full: sheds batch
	q.push(Request{Principal: "d"})                                 // full, nothing less urgent: refused
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.Admit(ctx, Request{Principal: "f"}); err == nil || errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("a cancelled caller: %v, want a plain error", err)
	}
	past, cancel2 := context.WithDeadline(context.Background(), clk.Now().Add(-time.Second))
	defer cancel2()
	if _, err := q.Admit(past, Request{Principal: "g", Class: Batch}); !errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("a caller past its deadline: %v, want a refusal", err)
	}
	clk.Advance(300 * time.Millisecond)
	first.Done() // admits inter
	clk.Advance(200 * time.Millisecond)
	inter.Done() // admits std

	want := []refusal{{Standard, ReasonPrincipal}, {Batch, ReasonShed}, {Standard, ReasonFull}, {Batch, ReasonDeadline}}
	if len(refusals) != len(want) {
		t.Fatalf("refusals %v, want %v", refusals, want)
	}
	for i := range want {
		if refusals[i] != want[i] {
			t.Errorf("refusal %d: %v, want %v", i, refusals[i], want[i])
		}
	}
	wantWaits := []time.Duration{0, 300 * time.Millisecond, 500 * time.Millisecond}
	if len(waits) != len(wantWaits) {
		t.Fatalf("waits %v, want %v", waits, wantWaits)
	}
	for i := range wantWaits {
		if waits[i] != wantWaits[i] {
			t.Errorf("admission %d waited %v, want %v", i, waits[i], wantWaits[i])
		}
	}
	if batch.stateNow() != stateRefused || std.stateNow() != stateAdmitted {
		t.Fatal("unexpected states")
	}
	mustCheck(t, q)
}

// TestObserverClockStepsBack: a clock that steps back while a request
// waits (a fake or wall clock without a monotonic reading) reports no
// negative wait.
func TestObserverClockStepsBack(t *testing.T) {
	var waits []time.Duration
	obs := &Observer{Admitted: func(_ Class, w time.Duration) { waits = append(waits, w) }}
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, Observer: obs})
	first, _ := q.push(Request{Principal: "a"})
	q.push(Request{Principal: "b"}) // queued
	clk.Advance(-time.Minute)
	first.Done() // admits b
	if len(waits) != 2 || waits[0] != 0 || waits[1] != 0 {
		t.Fatalf("waits %v, want [0 0]", waits)
	}
	mustCheck(t, q)
}

// After the clock steps back, the wait suggested still follows the
// admission rate: the step counts as no time, neither a rate too young to
// tell nor one decayed.
func TestRetryAfterWhenTheClockGoesBack(t *testing.T) {
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 20, RetryAfter: 100 * time.Millisecond})
	var live []*Ticket
	step := func() {
		clk.Advance(100 * time.Millisecond)
		var admitted, keep []*Ticket
		for _, tk := range live {
			if tk.stateNow() == stateAdmitted {
				admitted = append(admitted, tk)
			} else {
				keep = append(keep, tk)
			}
		}
		for _, tk := range admitted {
			tk.Done() // admits the next waiter
		}
		live = keep
		for q.Stats().Waiting < 20 {
			tk, err := q.push(Request{Principal: "a"})
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, tk)
		}
	}
	for range 600 { // one admission every 100 ms for a minute: 10 per second
		step()
	}
	want := 2 * time.Second // 20 waiting at 10/s
	within := func(got time.Duration) bool { return math.Abs(got.Seconds()-want.Seconds()) <= 0.1*want.Seconds() }
	_, err := q.push(Request{Principal: "b", Class: Batch})
	if got := retryAfter(t, err, "queue"); !within(got) {
		t.Fatalf("before the step: RetryAfter %v, want about %v", got, want)
	}
	clk.Advance(-time.Hour)
	_, err = q.push(Request{Principal: "b", Class: Batch})
	if got := retryAfter(t, err, "queue"); !within(got) {
		t.Errorf("just after the clock went back: RetryAfter %v, want about %v", got, want)
	}
	for range 50 {
		step()
	}
	_, err = q.push(Request{Principal: "b", Class: Batch})
	if got := retryAfter(t, err, "queue"); !within(got) {
		t.Errorf("5 s after the clock went back: RetryAfter %v, want about %v", got, want)
	}
	mustCheck(t, q)
}

// TestRetryAfterWithinMaxRetryAfterAlone: with only MaxRetryAfter set, and
// below DefaultRetryAfter, no refusal suggests a wait above it.
func TestRetryAfterWithinMaxRetryAfterAlone(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 1, MaxRetryAfter: 200 * time.Millisecond})
	if _, err := q.push(Request{Principal: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.push(Request{Principal: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err := q.push(Request{Principal: "b"})
	if got := retryAfter(t, err, "queue"); got <= 0 || got > 200*time.Millisecond {
		t.Errorf("suggested wait %v, want one in (0, MaxRetryAfter 200ms]", got)
	}
}
