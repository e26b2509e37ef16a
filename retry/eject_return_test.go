package retry

import (
	"context"
	"net/http"
	"slices"
	"strconv"
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

// TestEjectorPastPushbackTime: a 503 whose Retry-After is an HTTP date at
// or before the Ejector's now (or whose rate-limit reset is such a time)
// asks for no wait, as "Retry-After: 0" does: it counts as a failure and
// cools nothing down. HealthOutcome, which has no clock, still reads any
// time as a wait; a date after now cools the endpoint down.
func TestEjectorPastPushbackTime(t *testing.T) {
	now := newFakeClock().Now()
	date := func(t time.Time) string { return t.UTC().Format(http.TimeFormat) }
	cases := []struct {
		name string
		h    http.Header
	}{
		{"past date", http.Header{"Retry-After": {date(now.Add(-time.Minute))}}},
		{"date now", http.Header{"Retry-After": {date(now)}}},
		{"past unix reset", http.Header{"X-Ratelimit-Reset": {strconv.FormatInt(now.Add(-time.Hour).Unix(), 10)}}},
		{"past rfc3339 reset", http.Header{"Ratelimit-Reset": {now.Add(-time.Second).Format(time.RFC3339)}}},
		{"grpc past date", http.Header{"retry-after": {date(now.Add(-time.Minute))}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err503 := error(&StatusError{Code: 503, Header: c.h})
			if c.name == "grpc past date" {
				err503 = &StatusError{Code: GRPCUnavailable, GRPC: true, Header: c.h}
			}
			if got := HealthOutcome(err503); got != Abandoned {
				t.Errorf("HealthOutcome = %v, want abandoned (no clock: a time is a wait)", got)
			}
			clk := newFakeClock()
			b := newBalancer(t, "a", "b")
			var cooled []string
			e, err := NewEjector(b, EjectorConfig{Clock: clk,
				Observer: &Observer{Cooldown: func(k string, _ time.Duration) { cooled = append(cooled, k) }}})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < DefaultConsecutiveFailures-1; i++ {
				e.Report("a", err503)
			}
			if !healthy(b, "a") || len(cooled) != 0 {
				t.Fatalf("after 4 answers: healthy %v, cooled %v", healthy(b, "a"), cooled)
			}
			e.Report("a", err503)
			if got := e.Ejected(); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("Ejected() = %v after 5 answers whose pushback time had passed, want [a]", got)
			}
			checkEjector(t, e)
		})
	}

	// A date after now asks for a wait: the endpoint cools down, and
	// the answer counts in no ejection.
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, err := NewEjector(b, EjectorConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	future := &StatusError{Code: 503, Header: http.Header{"Retry-After": {date(clk.Now().Add(time.Minute))}}}
	e.Report("a", future)
	if got := e.Cooling(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Cooling() = %v after a 503 asking to wait until a later date, want [a]", got)
	}
	if len(e.Ejected()) != 0 {
		t.Fatalf("Ejected() = %v, want none", e.Ejected())
	}
}

// TestEjectorCooldownOnEjected: an overload answer asking for a wait that
// reaches an ejected endpoint (an attempt sent before the ejection) leaves
// the ejection as long as the Observer was told, as Envoy leaves an
// ejection; the part of the wait that outlasts it follows as a cooldown,
// which the Observer is told of and which counts in no cap, and the
// endpoint comes back half-open.
func TestEjectorCooldownOnEjected(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, keys(10)...)
	type event struct {
		kind, key string
		d         time.Duration
	}
	var events []event
	e, err := NewEjector(b, EjectorConfig{Clock: clk, Observer: &Observer{
		Eject:    func(k string, d time.Duration) { events = append(events, event{"eject", k, d}) },
		Cooldown: func(k string, d time.Duration) { events = append(events, event{"cooldown", k, d}) },
	}})
	if err != nil {
		t.Fatal(err)
	}
	fail := &StatusError{Code: 500}
	for i := 0; i < DefaultConsecutiveFailures; i++ {
		e.Report("e0", fail)
	}
	clk.Advance(10 * time.Second)
	// A wait shorter than the rest of the ejection changes nothing.
	e.Report("e0", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"5"}}})
	e.Report("e0", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"120"}}})
	want := []event{{"eject", "e0", DefaultBaseEjectionTime}, {"cooldown", "e0", 120 * time.Second}}
	if !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v", events, want)
	}
	if n, next := e.Out(); n != 1 || next != DefaultBaseEjectionTime-10*time.Second {
		t.Fatalf("Out() = %d, %v; want 1, %v: the ejection was lengthened", n, next, DefaultBaseEjectionTime-10*time.Second)
	}
	checkEjector(t, e)

	clk.Advance(DefaultBaseEjectionTime - 10*time.Second) // the ejection ends
	if got := e.Cooling(); !slices.Equal(got, []string{"e0"}) {
		t.Fatalf("Cooling() = %v after the ejection ended, want [e0]", got)
	}
	if len(e.Ejected()) != 0 || healthy(b, "e0") {
		t.Fatalf("Ejected() = %v, e0 healthy %v; want none ejected, e0 out", e.Ejected(), healthy(b, "e0"))
	}
	checkEjector(t, e)
	// The cooldown counts in no cap: e1 may be ejected (10% of 10).
	for i := 0; i < DefaultConsecutiveFailures; i++ {
		e.Report("e1", fail)
	}
	if got := e.Ejected(); !slices.Equal(got, []string{"e1"}) {
		t.Fatalf("Ejected() = %v, want [e1]: the cooldown after e0's ejection counted in the cap", got)
	}

	clk.Advance(100 * time.Second) // 120 s since the answer: e0 is back
	e.Sweep()
	if !healthy(b, "e0") || len(e.Cooling()) != 0 {
		t.Fatalf("e0 healthy %v, cooling %v after the wait it asked", healthy(b, "e0"), e.Cooling())
	}
	e.Report("e0", fail) // the half-open probe fails; e1 is back, the cap has room
	if healthy(b, "e0") {
		t.Fatal("e0 not ejected by its failed half-open probe")
	}
	checkEjector(t, e)
}

// TestEjectorRemembersReturnAfterSuccess: once an endpoint back from an
// ejection or a cooldown has succeeded and its multiplier has fallen to
// zero, the Ejector still knows when it came back, so the failure of an
// attempt sent before still does not count.
func TestEjectorRemembersReturnAfterSuccess(t *testing.T) {
	fail := &StatusError{Code: 502}
	cases := []struct {
		name string
		out  func(e *Ejector) // takes a out; it is back after a minute
	}{
		{"ejection", func(e *Ejector) {
			for i := 0; i < DefaultConsecutiveFailures; i++ {
				e.Report("a", fail)
			}
		}},
		{"cooldown", func(e *Ejector) {
			e.Report("a", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"60"}}})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			b := newBalancer(t, "a", "b")
			e, err := NewEjector(b, EjectorConfig{Clock: clk, MaxEjectionPercent: 100})
			if err != nil {
				t.Fatal(err)
			}
			stream := clk.Now() // a long stream starts on a
			clk.Advance(time.Second)
			c.out(e)
			if healthy(b, "a") {
				t.Fatal("a not out")
			}
			clk.Advance(time.Minute)
			e.Sweep()
			if !healthy(b, "a") {
				t.Fatal("a not back")
			}
			// Back for more than its multiplier takes to fall to zero, a
			// succeeds: nothing is left to count or to back off.
			clk.Advance(2 * DefaultSweepInterval)
			e.Report("a", nil)
			// The stream fails, then four attempts sent after the return:
			// four failures of a, not five.
			e.ReportElapsed("a", clk.Now().Sub(stream), fail)
			for i := 0; i < DefaultConsecutiveFailures-1; i++ {
				e.ReportElapsed("a", 0, fail)
			}
			if !healthy(b, "a") {
				t.Fatal("a ejected: the failure of an attempt sent before it came back counted")
			}
			e.ReportElapsed("a", 0, fail)
			if healthy(b, "a") {
				t.Fatal("a not ejected after 5 failures since it came back")
			}
			checkEjector(t, e)
		})
	}
}
