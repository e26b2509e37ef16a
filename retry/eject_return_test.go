package retry

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestEjectorIgnoresAttemptsSentBeforeReturn: the outcome of an attempt sent
// to an endpoint before it came back from an ejection (a long stream) neither
// trips nor closes its half-open state, while an attempt sent after the
// return does; after a cooldown, such an attempt's failure does not count
// either.
func TestEjectorIgnoresAttemptsSentBeforeReturn(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, err := NewEjector(b, EjectorConfig{Clock: clk, MaxEjectionPercent: 100})
	if err != nil {
		t.Fatal(err)
	}
	fail := &StatusError{Code: 502}
	stream := clk.Now() // a long stream starts on a
	clk.Advance(time.Second)
	for i := 0; i < DefaultConsecutiveFailures; i++ {
		e.ReportElapsed("a", 0, fail)
	}
	if healthy(b, "a") {
		t.Fatal("a not ejected after 5 failures")
	}
	clk.Advance(DefaultBaseEjectionTime)
	e.Sweep()
	if !healthy(b, "a") {
		t.Fatal("a not back after its ejection")
	}
	// The stream ends after the return, with a failure, then with a
	// success: neither is the half-open probe.
	e.ReportElapsed("a", clk.Now().Sub(stream), fail)
	if !healthy(b, "a") || len(e.Ejected()) != 0 {
		t.Fatalf("the failure of a stream sent before the ejection re-ejected the endpoint that came back: ejected %v", e.Ejected())
	}
	e.ReportElapsed("a", clk.Now().Sub(stream), nil)
	// The first attempt sent after the return is the probe: it fails, and
	// the endpoint is ejected again, for twice as long.
	e.ReportElapsed("a", 0, fail)
	if got := e.Ejected(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Ejected() = %v after the half-open probe failed, want [a] (a success of an attempt sent before the return closed the half-open state)", got)
	}
	if _, next := e.Out(); next != 2*DefaultBaseEjectionTime {
		t.Fatalf("second ejection lasts %v, want %v", next, 2*DefaultBaseEjectionTime)
	}

	// b cools down for 2 s; a request sent before fails after the cooldown
	// ends, with four sent after it: four failures, not five.
	sent := clk.Now()
	e.ReportElapsed("b", 0, &StatusError{Code: 429, Header: http.Header{"Retry-After": {"2"}}})
	clk.Advance(2 * time.Second)
	e.Sweep()
	for i := 0; i < DefaultConsecutiveFailures-1; i++ {
		e.ReportElapsed("b", 0, fail)
	}
	e.ReportElapsed("b", clk.Now().Sub(sent), fail)
	if !healthy(b, "b") {
		t.Fatal("the failure of an attempt sent before a cooldown counted after it")
	}
	e.Report("b", fail) // start unknown: it counts
	if healthy(b, "b") {
		t.Fatal("b not ejected by the fifth failure")
	}
	checkEjector(t, e)
}

// TestEjectorWithLoopLongStream: a Loop tells its Ejector when each attempt
// started, so a stream that was sent before its endpoint's ejection and
// breaks after the endpoint came back does not eject it again.
func TestEjectorWithLoopLongStream(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a")
	e, err := NewEjector(b, EjectorConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLoop(b, LoopConfig{Reporter: e, MaxAttempts: 1, Backoff: noBackoff{}, Budget: unlimited{}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	broken := &StatusError{Code: 502}
	err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
		if !a.FirstToken() {
			t.Error("the only attempt lost")
		}
		// While the stream runs, other requests fail and a is ejected,
		// then comes back.
		clk.Advance(time.Minute)
		for i := 0; i < DefaultConsecutiveFailures; i++ {
			e.Report("a", broken)
		}
		if healthy(b, "a") {
			t.Error("a not ejected")
		}
		clk.Advance(DefaultBaseEjectionTime)
		e.Sweep()
		return broken // the stream breaks after the return
	})
	if err == nil {
		t.Fatal("Do succeeded")
	}
	if !healthy(b, "a") || len(e.Ejected()) != 0 {
		t.Fatalf("a stream sent before the ejection re-ejected its endpoint on its failure after the return: ejected %v", e.Ejected())
	}
}

// TestEjectorRetryNow503: a 503 whose Retry-After is 0 (or a gRPC
// UNAVAILABLE whose pushback is 0 ms) asks for an immediate retry, not for
// time to recover: it counts as a failure, as a plain 503 does and as Envoy
// counts every 5xx, and cools nothing down.
func TestEjectorRetryNow503(t *testing.T) {
	cases := []struct {
		name string
		err  error
	}{
		{"http", &StatusError{Code: 503, Header: http.Header{"Retry-After": {"0"}}}},
		{"grpc", &StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"0"}}}},
		{"reset", &StatusError{Code: 503, Header: http.Header{"X-Ratelimit-Reset": {"0"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			b := newBalancer(t, "a", "b")
			var cooled []string
			e, err := NewEjector(b, EjectorConfig{Clock: clk,
				Observer: &Observer{Cooldown: func(k string, _ time.Duration) { cooled = append(cooled, k) }}})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < DefaultConsecutiveFailures-1; i++ {
				e.Report("a", c.err)
			}
			if !healthy(b, "a") || len(cooled) != 0 {
				t.Fatalf("after 4 answers: healthy %v, cooled %v", healthy(b, "a"), cooled)
			}
			e.Report("a", c.err)
			if got := e.Ejected(); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("Ejected() = %v after 5 answers asking for an immediate retry, want [a]", got)
			}
		})
	}
}

// TestEjectorCapRefusalRestartsCount: as in Envoy, an ejection that the cap
// refuses restarts the endpoint's count, so that it is ejected after
// ConsecutiveFailures more failures, not at the first failure after the cap
// makes room; a half-open probe that fails while the cap is full closes the
// half-open state.
func TestEjectorCapRefusalRestartsCount(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, keys(10)...)
	var ejected []string
	e, err := NewEjector(b, EjectorConfig{Clock: clk,
		Observer: &Observer{Eject: func(k string, _ time.Duration) { ejected = append(ejected, k) }}})
	if err != nil {
		t.Fatal(err)
	}
	fail := &StatusError{Code: 500}
	for i := 0; i < 5; i++ {
		e.Report("e0", fail) // ejected: 10% of 10 is one
	}
	for i := 0; i < 7; i++ {
		e.Report("e1", fail) // refused at the fifth; two since
	}
	if !healthy(b, "e1") {
		t.Fatal("e1 ejected beyond the cap")
	}
	clk.Advance(DefaultBaseEjectionTime)
	e.Sweep() // e0 is back, half-open: the cap has room
	e.Report("e1", fail)
	if !healthy(b, "e1") {
		t.Fatal("e1 ejected at its first failure once the cap made room: its count went on past the refusal")
	}
	e.Report("e1", fail)
	e.Report("e1", fail) // the fifth since the refusal
	if healthy(b, "e1") {
		t.Fatal("e1 not ejected after 5 failures since the refusal")
	}
	e.Report("e0", fail) // the probe fails; the cap (e1 out) refuses
	if !healthy(b, "e0") {
		t.Fatal("e0 ejected beyond the cap")
	}
	clk.Advance(DefaultBaseEjectionTime)
	e.Sweep() // e1 is back
	e.Report("e0", fail)
	if !healthy(b, "e0") {
		t.Fatal("e0 ejected by one failure: its half-open state outlived a refused ejection")
	}
	if !slices.Equal(ejected, []string{"e0", "e1"}) {
		t.Fatalf("ejections %v, want [e0 e1]", ejected)
	}
	checkEjector(t, e)
}

// TestEjectorWithLoopOtherClock: the loop tells the Ejector how long ago an
// attempt was sent, not when, so a loop whose Clock has another origin than
// the Ejector's (a test's fake clock beside the system clock) still has its
// half-open probe count after an endpoint came back.
func TestEjectorWithLoopOtherClock(t *testing.T) {
	clk := newFakeClock()
	loopClk := &fakeClock{now: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := newBalancer(t, "a")
	e, err := NewEjector(b, EjectorConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	broken := &StatusError{Code: 502}
	for i := 0; i < DefaultConsecutiveFailures; i++ {
		e.Report("a", broken)
	}
	clk.Advance(DefaultBaseEjectionTime)
	e.Sweep()
	if !healthy(b, "a") {
		t.Fatal("a not back after its ejection")
	}
	l, err := NewLoop(b, LoopConfig{Reporter: e, MaxAttempts: 1, Backoff: noBackoff{}, Budget: unlimited{}, Clock: loopClk})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
		clk.Advance(time.Second)
		loopClk.Advance(time.Second)
		return broken // the half-open probe, sent after the return, fails
	})
	if err == nil {
		t.Fatal("Do succeeded")
	}
	if got := e.Ejected(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Ejected() = %v after the half-open probe failed through a loop on another clock, want [a]", got)
	}
}
