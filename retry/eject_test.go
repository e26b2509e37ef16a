package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

func healthy(b *llmlb.Balancer, key string) bool {
	for _, s := range b.Stats() {
		if s.Key == key {
			return s.Healthy
		}
	}
	return false
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("e%d", i)
	}
	return out
}

func TestEjectorLifecycle(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, keys(10)...)
	e, err := NewEjector(b, EjectorConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	fail := &StatusError{Code: 500}
	for i := 0; i < 4; i++ {
		e.Report("e0", fail)
	}
	e.Report("e0", nil) // a success resets the count
	for i := 0; i < 4; i++ {
		e.Report("e0", fail)
	}
	if !healthy(b, "e0") {
		t.Fatal("ejected before 5 consecutive failures")
	}
	e.Report("e0", fail)
	if healthy(b, "e0") || !slices.Equal(e.Ejected(), []string{"e0"}) {
		t.Fatalf("not ejected after 5 failures: %v", e.Ejected())
	}
	// 10% of 10 endpoints: only one at a time.
	for i := 0; i < 10; i++ {
		e.Report("e1", fail)
	}
	if !healthy(b, "e1") {
		t.Fatal("ejected beyond the 10% cap")
	}
	// Reports for the ejected endpoint (requests sent before) are ignored.
	e.Report("e0", nil)
	clk.Advance(30*time.Second - time.Nanosecond)
	e.Sweep()
	if healthy(b, "e0") {
		t.Fatal("restored before 30 s")
	}
	clk.Advance(time.Nanosecond)
	e.Report("e3", nil) // any report sweeps
	if !healthy(b, "e0") {
		t.Fatal("not restored after 30 s")
	}
	// Half-open: one failure ejects again, for 2 x 30 s.
	e.Report("e0", fail)
	if healthy(b, "e0") {
		t.Fatal("half-open endpoint not ejected on its first failure")
	}
	clk.Advance(59 * time.Second)
	e.Sweep()
	if healthy(b, "e0") {
		t.Fatal("second ejection shorter than 60 s")
	}
	clk.Advance(time.Second)
	e.Sweep()
	if !healthy(b, "e0") {
		t.Fatal("not restored after 60 s")
	}
	// A success closes it: it takes 5 failures again, and the third
	// ejection lasts 90 s.
	e.Report("e0", nil)
	for i := 0; i < 4; i++ {
		e.Report("e0", fail)
	}
	if !healthy(b, "e0") {
		t.Fatal("closed endpoint ejected before 5 failures")
	}
	e.Report("e0", fail)
	clk.Advance(89 * time.Second)
	e.Sweep()
	if healthy(b, "e0") {
		t.Fatal("third ejection shorter than 90 s")
	}
	clk.Advance(time.Second)
	e.Sweep()
	if !healthy(b, "e0") {
		t.Fatal("not restored after 90 s")
	}
	// Back in for 3 intervals, the multiplier is down from 3 to 0.
	clk.Advance(3 * DefaultSweepInterval)
	e.Report("e0", nil)
	for i := 0; i < 5; i++ {
		e.Report("e0", fail)
	}
	clk.Advance(30 * time.Second)
	e.Sweep()
	if !healthy(b, "e0") {
		t.Fatal("ejection multiplier did not come down after three intervals back in")
	}
}

func TestEjectorMaxTime(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1})
	for n := 1; n <= 12; n++ {
		e.Report("a", errors.New("connection reset"))
		want := min(time.Duration(n)*30*time.Second, 300*time.Second)
		clk.Advance(want - time.Second)
		e.Sweep()
		if healthy(b, "a") {
			t.Fatalf("ejection %d shorter than %v", n, want)
		}
		clk.Advance(time.Second)
		e.Sweep()
		if !healthy(b, "a") {
			t.Fatalf("ejection %d longer than %v", n, want)
		}
	}
}

func TestEjectorOverloadIsNotFailure(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	// Cooldowns off: overload answers asking for a wait would take the
	// endpoint out for it (TestEjectorCooldown).
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, MaxCooldown: -1})
	overloads := []error{
		&StatusError{Code: 429},
		&StatusError{Code: 503, Header: http.Header{"Retry-After": {"1"}}},
		&StatusError{Code: GRPCResourceExhausted, GRPC: true},
		&StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"100"}}},
		&OverloadError{Scope: "global", RetryAfter: time.Second},
		context.Canceled,
		&GiveUpError{Err: &StatusError{Code: 503}},
	}
	for i := 0; i < 20; i++ {
		for _, err := range overloads {
			e.Report("a", err)
		}
	}
	if !healthy(b, "a") {
		t.Fatal("overload answers ejected an endpoint")
	}
	// Overloads neither count nor reset: 4 failures + overloads + 1 failure
	// eject.
	for i := 0; i < 4; i++ {
		e.Report("a", &StatusError{Code: 503})
	}
	e.Report("a", &StatusError{Code: 429})
	e.Report("a", &StatusError{Code: GRPCUnavailable, GRPC: true})
	if healthy(b, "a") {
		t.Fatal("5 failures around an overload did not eject")
	}
}

func TestHealthOutcome(t *testing.T) {
	cases := []struct {
		err  error
		want Outcome
	}{
		{nil, Succeeded},
		{&StatusError{Code: 404}, Succeeded},
		{&StatusError{Code: 400}, Succeeded},
		{&StatusError{Code: 500}, Failed},
		{&StatusError{Code: 503}, Failed},
		{&StatusError{Code: 429}, Abandoned},
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {"120"}}}, Abandoned},
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {"Mon, 30 Nov 2026 12:00:30 GMT"}}}, Abandoned},
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {"3600"}}}, Abandoned}, // long, but a wait
		// A Retry-After that cannot be read asks for nothing: a plain 503.
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {"soon"}}}, Failed},
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {" "}}}, Failed},
		{&StatusError{Code: 503, Header: http.Header{"X-Ratelimit-Reset": {"-1"}}}, Failed},
		// A wait of zero asks for an immediate retry, not for time: a
		// plain 503, or UNAVAILABLE.
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {"0"}}}, Failed},
		{&StatusError{Code: 503, Header: http.Header{"X-Ratelimit-Reset": {"0"}}}, Failed},
		{&StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"0"}}}, Failed},
		{&StatusError{Code: 503, Header: http.Header{"Retry-After": {"0.5"}}}, Abandoned},
		{&StatusError{Code: 429, Header: http.Header{"Retry-After": {"0"}}}, Abandoned},
		{&StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"x"}}}, Abandoned}, // gRPC's "do not retry"
		{&StatusError{Code: 3, GRPC: true}, Succeeded},
		{&StatusError{Code: 13, GRPC: true}, Failed},
		// A pushback makes only UNAVAILABLE an overload answer, as only
		// 503 among the HTTP 5xx: INTERNAL and UNKNOWN fail the endpoint
		// whatever trailers come with them.
		{&StatusError{Code: 13, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"100"}}}, Failed},
		{&StatusError{Code: 2, GRPC: true, Header: http.Header{"grpc-retry-pushback-ms": {"x"}}}, Failed},
		{&StatusError{Code: 13, GRPC: true, Header: http.Header{"Retry-After": {"5"}}}, Failed},
		{&StatusError{Code: 500, Header: http.Header{"Retry-After": {"5"}}}, Failed},
		{errors.New("dial tcp: connection refused"), Failed},
		{context.DeadlineExceeded, Abandoned},
		{fmt.Errorf("wrapped: %w", ErrOverloaded), Abandoned},
	}
	for _, tc := range cases {
		if got := HealthOutcome(tc.err); got != tc.want {
			t.Errorf("HealthOutcome(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestEjectorEjectsOnMalformedRetryAfter: an endpoint that fails every
// request with a 503 and a Retry-After that cannot be read is ejected like
// any failing endpoint; the header neither hides its failures as overload
// nor cools it down.
func TestEjectorEjectsOnMalformedRetryAfter(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk})
	for i := 0; i < DefaultConsecutiveFailures; i++ {
		e.Report("a", &StatusError{Code: 503, Header: http.Header{"Retry-After": {"soon"}}})
	}
	if healthy(b, "a") {
		t.Fatal("5 answers of 503 with a malformed Retry-After did not eject")
	}
	if got := e.Ejected(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("Ejected() = %v, want [a]", got)
	}
	if got := e.Cooling(); len(got) != 0 {
		t.Fatalf("Cooling() = %v, want none", got)
	}
}

func TestEjectorUnknownAndBounded(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 2})
	for i := 0; i < 3*maxTracked; i++ {
		e.Report(fmt.Sprintf("gone-%d", i), errors.New("reset"))
	}
	e.mu.Lock()
	n := len(e.eps)
	e.mu.Unlock()
	if n > maxTracked {
		t.Fatalf("%d endpoints tracked, cap %d", n, maxTracked)
	}
	// Failing twice on a key that is not a member drops its state.
	e2, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 2})
	e2.Report("gone", errors.New("reset"))
	e2.Report("gone", errors.New("reset"))
	if len(e2.eps) != 0 || len(e2.Ejected()) != 0 {
		t.Fatalf("state kept for a non-member: %v", e2.eps)
	}
	// Ejected, then removed from the balancer: restoring drops it.
	e2.Report("a", errors.New("reset"))
	e2.Report("a", errors.New("reset"))
	if err := b.Update([]llmlb.Endpoint{ep("b")}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	e2.Sweep()
	if len(e2.eps) != 0 {
		t.Fatalf("state kept for a removed endpoint: %v", e2.eps)
	}
}

func TestEjectorAtLeastOne(t *testing.T) {
	b := newBalancer(t, "a", "b", "c")
	e, _ := NewEjector(b, EjectorConfig{ConsecutiveFailures: 1})
	e.Report("a", errors.New("reset"))
	e.Report("b", errors.New("reset"))
	if got := e.Ejected(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("ejected %v, want exactly one with 10%% of 3", got)
	}
}

func TestEjectorWithLoop(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "bad", "good")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk})
	l, _ := NewLoop(b, LoopConfig{Reporter: e, Backoff: noBackoff{}, Budget: unlimited{}, Clock: clk})
	var badHits int
	for i := 0; i < 100; i++ {
		err := l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
			if a.Endpoint().Key() == "bad" {
				badHits++
				return &StatusError{Code: 502}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if badHits != 5 || !slices.Equal(e.Ejected(), []string{"bad"}) {
		t.Fatalf("bad endpoint hit %d times, ejected %v", badHits, e.Ejected())
	}
}

func TestEjectorRun(t *testing.T) {
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{ConsecutiveFailures: 1, BaseEjectionTime: time.Millisecond, SweepInterval: time.Millisecond})
	e.Report("a", errors.New("reset"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !healthy(b, "a") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	if !healthy(b, "a") {
		t.Fatal("Run did not restore the endpoint")
	}
}

func TestEjectorBadConfig(t *testing.T) {
	b := newBalancer(t, "a")
	for _, cfg := range []EjectorConfig{
		{ConsecutiveFailures: -1},
		{BaseEjectionTime: -time.Second},
		{BaseEjectionTime: time.Minute, MaxEjectionTime: time.Second},
		{MaxEjectionPercent: -1},
		{MaxEjectionPercent: 101},
		{SweepInterval: -time.Second},
	} {
		if _, err := NewEjector(b, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewEjector(%+v) = %v", cfg, err)
		}
	}
	if _, err := NewEjector(nil, EjectorConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil health: %v", err)
	}
}

// TestEjectorSlowStart: an endpoint restored after its ejection ramps up
// through the balancer's slow start instead of taking its full share at once.
func TestEjectorSlowStart(t *testing.T) {
	clk := newFakeClock()
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clk), llmlb.WithRand(rand.NewPCG(1, 2)),
		llmlb.WithSlowStart(llmlb.SlowStart{Window: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{ep("a"), ep("b")}); err != nil {
		t.Fatal(err)
	}
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1})
	e.Report("a", errors.New("reset"))
	clk.Advance(30 * time.Second)
	e.Sweep()
	if !healthy(b, "a") {
		t.Fatal("not restored")
	}
	share := func() float64 {
		n := 0
		for i := 0; i < 2000; i++ {
			p, err := b.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Endpoint().Key() == "a" {
				n++
			}
			p.Done(nil)
		}
		return float64(n) / 2000
	}
	if s := share(); s > 0.2 {
		t.Fatalf("restored endpoint took %.0f%% of picks at once; slow start should hold it near 10%%", 100*s)
	}
	clk.Advance(time.Minute)
	if s := share(); s < 0.45 {
		t.Fatalf("after the slow-start window the endpoint takes %.0f%% of picks", 100*s)
	}
}

// An overload answer asking for a wait takes the endpoint out for that wait,
// capped, without counting as a failure or in the ejection cap, and without
// a half-open probe after it.
func TestEjectorCooldown(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b", "c")
	var cooled []time.Duration
	e, err := NewEjector(b, EjectorConfig{Clock: clk, MaxCooldown: time.Minute,
		Observer: &Observer{Cooldown: func(_ string, d time.Duration) { cooled = append(cooled, d) }}})
	if err != nil {
		t.Fatal(err)
	}
	e.Report("a", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"2"}}})
	if healthy(b, "a") || len(e.Cooling()) != 1 || len(e.Ejected()) != 0 {
		t.Fatalf("after a 429 asking for 2s: healthy %v, cooling %v, ejected %v", healthy(b, "a"), e.Cooling(), e.Ejected())
	}
	// A huge wait is capped, not ignored; OpenAI's rate-limit reset counts.
	e.Report("b", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"86400"}}})
	e.Report("c", &StatusError{Code: 429, Header: http.Header{
		"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"6m0s"}}})
	if got := e.Cooling(); len(got) != 3 {
		t.Fatalf("cooling %v, want all three (cooldowns are not capped by MaxEjectionPercent)", got)
	}
	if want := []time.Duration{2 * time.Second, time.Minute, time.Minute}; !slices.Equal(cooled, want) {
		t.Fatalf("cooldowns %v, want %v", cooled, want)
	}
	if n, next := e.Out(); n != 3 || next != 2*time.Second {
		t.Fatalf("Out() = %d, %v; want 3, 2s", n, next)
	}
	clk.Advance(2 * time.Second)
	e.Sweep()
	if n, next := e.Out(); n != 2 || next != time.Minute-2*time.Second {
		t.Fatalf("Out() = %d, %v; want 2, 58s", n, next)
	}
	if !healthy(b, "a") || healthy(b, "b") {
		t.Fatal("a should be back after 2s, b not")
	}
	// Back as it was: one failure does not eject it again (no half-open).
	e.Report("a", &StatusError{Code: 500})
	if !healthy(b, "a") {
		t.Fatal("a failure right after a cooldown ejected the endpoint")
	}
	// An answer without a wait, or a success, cools nothing.
	e.Report("a", &StatusError{Code: 429})
	e.Report("a", &StatusError{Code: 400, Header: http.Header{"Retry-After": {"5"}}})
	if !healthy(b, "a") {
		t.Fatal("an overload without a requested wait, or a 400, took the endpoint out")
	}
	clk.Advance(time.Minute)
	e.Sweep()
	if len(e.Cooling()) != 0 || !healthy(b, "b") || !healthy(b, "c") {
		t.Fatalf("after the cap: cooling %v", e.Cooling())
	}
	// Disabled.
	off, _ := NewEjector(b, EjectorConfig{Clock: clk, MaxCooldown: -1})
	off.Report("a", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"2"}}})
	if !healthy(b, "a") {
		t.Fatal("MaxCooldown < 0 still cooled an endpoint")
	}
}

// An answer whose rate-limit window has nothing left cools its endpoint
// down until the window resets, before the endpoint refuses anything.
func TestEjectorReportQuota(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, MaxCooldown: time.Minute})
	e.ReportQuota("a", http.Header{"X-Ratelimit-Remaining-Requests": {"3"}, "X-Ratelimit-Reset-Requests": {"2s"}})
	if !healthy(b, "a") {
		t.Fatal("cooled with quota left")
	}
	e.ReportQuota("a", http.Header{
		"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"2s"},
		"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"6m0s"}})
	if healthy(b, "a") {
		t.Fatal("not cooled with the windows spent")
	}
	if n, next := e.Out(); n != 1 || next != time.Minute {
		t.Fatalf("Out() = %d, %v; want 1, the 1m cap on the longer reset", n, next)
	}
}

func TestQuotaReset(t *testing.T) {
	now := time.Unix(1e9, 0)
	for _, c := range []struct {
		h    http.Header
		want Pushback
	}{
		{nil, Pushback{}},
		{http.Header{"X-Ratelimit-Reset-Requests": {"2s"}}, Pushback{}},
		{http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"2s"}}, Pushback{RetryLater, 2 * time.Second}},
		{http.Header{"X-Ratelimit-Remaining-Tokens": {" 0 "}, "X-Ratelimit-Reset-Tokens": {"1m30s"}}, Pushback{RetryLater, 90 * time.Second}},
		{http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"soon"}}, Pushback{}},
		{http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"20s"},
			"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"5s"}}, Pushback{RetryLater, 20 * time.Second}},
	} {
		if got := QuotaReset(c.h, now, 0); got != c.want {
			t.Errorf("QuotaReset(%v) = %+v, want %+v", c.h, got, c.want)
		}
	}
}

func TestQuotaHeadroom(t *testing.T) {
	now := time.Unix(1e9, 0)
	for _, c := range []struct {
		name  string
		h     http.Header
		f     float64
		reset time.Duration
		ok    bool
	}{
		{"nil", nil, 0, 0, false},
		{"no limit", http.Header{"X-Ratelimit-Remaining-Requests": {"3"}}, 0, 0, false},
		{"requests", http.Header{"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"15"}, "X-Ratelimit-Reset-Requests": {"45s"}}, 0.25, 45 * time.Second, true},
		{"tokens tighter", http.Header{
			"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"30"}, "X-Ratelimit-Reset-Requests": {"30s"},
			"X-Ratelimit-Limit-Tokens": {"10000"}, "X-Ratelimit-Remaining-Tokens": {"1000"}, "X-Ratelimit-Reset-Tokens": {"54s"}}, 0.1, 54 * time.Second, true},
		{"no reset", http.Header{"X-Ratelimit-Limit-Tokens": {"100"}, "X-Ratelimit-Remaining-Tokens": {"50"}}, 0.5, 0, true},
		{"above the limit", http.Header{"X-Ratelimit-Limit-Requests": {"10"}, "X-Ratelimit-Remaining-Requests": {"12"}}, 1, 0, true},
		{"zero limit", http.Header{"X-Ratelimit-Limit-Requests": {"0"}, "X-Ratelimit-Remaining-Requests": {"0"}}, 0, 0, false},
		{"garbage", http.Header{"X-Ratelimit-Limit-Requests": {"many"}, "X-Ratelimit-Remaining-Requests": {"NaN"}}, 0, 0, false},
		{"negative", http.Header{"X-Ratelimit-Limit-Requests": {"10"}, "X-Ratelimit-Remaining-Requests": {"-1"}}, 0, 0, false},
	} {
		f, reset, ok := QuotaHeadroom(c.h, now)
		if ok != c.ok || math.Abs(f-c.f) > 1e-12 || reset != c.reset {
			t.Errorf("%s: QuotaHeadroom = %v, %v, %v; want %v, %v, %v", c.name, f, reset, ok, c.f, c.reset, c.ok)
		}
	}
}

// The headroom an answer reports refills as a token bucket does, to the
// whole quota when the window resets.
func TestEjectorHeadroom(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk})
	start := clk.Now()
	if _, ok := e.Headroom("a"); ok {
		t.Fatal("headroom known before any report")
	}
	e.ReportQuota("a", http.Header{"X-Ratelimit-Limit-Requests": {"100"}, "X-Ratelimit-Remaining-Requests": {"20"}, "X-Ratelimit-Reset-Requests": {"10s"}})
	e.ReportQuota("b", http.Header{"X-Ratelimit-Limit-Tokens": {"100"}, "X-Ratelimit-Remaining-Tokens": {"50"}})
	e.Report("a", nil) // a success keeps the quota spent
	for _, c := range []struct {
		after time.Duration
		a, b  float64
	}{{0, 0.2, 0.5}, {5 * time.Second, 0.6, 0.5 + 0.5*5/60.0}, {10 * time.Second, 1, 0.5 + 0.5*10/60.0}, {time.Minute, 1, 1}} {
		clk.Advance(start.Add(c.after).Sub(clk.Now()))
		ha, _ := e.Headroom("a")
		hb, _ := e.Headroom("b")
		if math.Abs(ha-c.a) > 1e-9 || math.Abs(hb-c.b) > 1e-9 {
			t.Errorf("after %v: headroom %v and %v, want %v and %v", c.after, ha, hb, c.a, c.b)
		}
	}
	// A reset years ahead refills within a day.
	e.ReportQuota("a", http.Header{"X-Ratelimit-Limit-Requests": {"100"}, "X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"100000000s"}})
	clk.Advance(12 * time.Hour)
	if h, _ := e.Headroom("a"); math.Abs(h-0.5) > 1e-9 {
		t.Errorf("half a day after a reset reported years ahead: headroom %v, want 0.5", h)
	}
	clk.Advance(12 * time.Hour)
	if h, _ := e.Headroom("a"); h != 1 {
		t.Errorf("a day after a reset reported years ahead: headroom %v, want 1", h)
	}
	// Cooldowns off: the headroom is still kept.
	off, _ := NewEjector(b, EjectorConfig{Clock: clk, MaxCooldown: -1})
	off.ReportQuota("a", http.Header{"X-Ratelimit-Limit-Requests": {"4"}, "X-Ratelimit-Remaining-Requests": {"1"}, "X-Ratelimit-Reset-Requests": {"1s"}})
	if h, ok := off.Headroom("a"); !ok || h != 0.25 {
		t.Fatalf("headroom %v, %v with cooldowns off; want 0.25", h, ok)
	}
}
