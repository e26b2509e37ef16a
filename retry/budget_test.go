package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

func TestPercentBudgetReserveAndPercent(t *testing.T) {
	clk := newFakeClock()
	b, err := NewPercentBudget(PercentConfig{TTL: 10 * time.Second, MinRetriesPerSec: 1, PercentCanRetry: 0.2, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	// Reserve: 1/s * 10 s = 10 retries with no traffic at all.
	if got := b.Available(); got != 10 {
		t.Fatalf("Available = %d, want 10", got)
	}
	for i := 0; i < 10; i++ {
		if !b.Withdraw() {
			t.Fatalf("withdrawal %d of the reserve refused", i)
		}
	}
	if b.Withdraw() {
		t.Fatal("withdrawal beyond the reserve granted")
	}
	// 5 deposits at 20% buy exactly one retry.
	for i := 0; i < 4; i++ {
		b.Start()
	}
	if b.Withdraw() {
		t.Fatal("4 deposits bought a retry")
	}
	b.Start()
	if !b.Withdraw() {
		t.Fatal("5 deposits did not buy a retry")
	}
	if b.Withdraw() {
		t.Fatal("second retry granted")
	}
	// After one TTL every deposit and withdrawal has expired: the reserve
	// is whole again.
	clk.Advance(10 * time.Second)
	if got := b.Available(); got != 10 {
		t.Fatalf("after one TTL Available = %d, want 10", got)
	}
}

func TestPercentBudgetExpiry(t *testing.T) {
	clk := newFakeClock()
	b, _ := NewPercentBudget(PercentConfig{TTL: time.Second, MinRetriesPerSec: 0, PercentCanRetry: 1, Clock: clk})
	b.Start() // slot 0
	clk.Advance(850 * time.Millisecond)
	if got := b.Available(); got != 1 {
		t.Fatalf("deposit gone before 0.9 TTL: Available = %d", got)
	}
	clk.Advance(150 * time.Millisecond) // t = 1.0 s: slot 10 replaces slot 0
	if got := b.Available(); got != 0 {
		t.Fatalf("deposit alive after one TTL: Available = %d", got)
	}
}

// TestPercentBudgetBound checks the documented bound exactly, for every run
// of consecutive slots, under random traffic.
func TestPercentBudgetBound(t *testing.T) {
	for _, tc := range []struct {
		percent, minPerSec float64
	}{{0.2, 0.5}, {0.1, 3}, {0.5, 0}, {1, 2}, {0, 2.5}} {
		clk := newFakeClock()
		ttl := time.Second
		b, err := NewPercentBudget(PercentConfig{TTL: ttl, MinRetriesPerSec: tc.minPerSec, PercentCanRetry: tc.percent, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, uint64(tc.percent*100)))
		const slots = 400
		var dep, wd [slots]int64
		for clk.Now().Sub(b.start) < slots*ttl/budgetSlots {
			s := int(clk.Now().Sub(b.start) / (ttl / budgetSlots))
			// Bursty traffic: deposits and withdrawal attempts with
			// rates changing over time.
			if rng.IntN(3) == 0 {
				b.Start()
				dep[s]++
			}
			if rng.IntN(1+s%7) == 0 && b.Withdraw() {
				wd[s]++
			}
			clk.Advance(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
		for a := 0; a < slots; a++ {
			var w, d int64
			for k := max(a-budgetSlots+1, 0); k < a; k++ {
				d += dep[k]
			}
			for e := a; e < slots; e++ {
				w += wd[e]
				d += dep[e]
				m := int64(e - a + 1)
				chunks := (m + budgetSlots - 1) / budgetSlots
				if w*b.cost > d*b.deposit+b.reserve*chunks {
					t.Fatalf("percent %v: slots %d..%d: %d retries > %v*%d deposits + reserve*%d",
						tc.percent, a, e, w, tc.percent, d, chunks)
				}
			}
		}
	}
}

// TestPercentBudgetModel replays random traffic, with the clock jumping
// forward now and then, against a reference model of the documented
// semantics: each deposit and withdrawal counts in the slot of its time while
// that slot is one of the 10 latest, and a withdrawal is granted exactly when
// the reserve plus the live net balance covers it. Used from one goroutine,
// the budget must agree with the model on every decision.
func TestPercentBudgetModel(t *testing.T) {
	for _, tc := range []struct {
		percent, minPerSec float64
	}{{0.2, 10}, {0.1, 0}, {0, 3}, {1, 0.5}, {0.37, 2}} {
		clk := newFakeClock()
		ttl := time.Second
		b, err := NewPercentBudget(PercentConfig{TTL: ttl, MinRetriesPerSec: tc.minPerSec, PercentCanRetry: tc.percent, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		width := ttl / budgetSlots
		net := map[int64]int64{} // units per slot
		balance := func(e int64) int64 {
			sum := b.reserve
			for k := e - budgetSlots + 1; k <= e; k++ {
				sum += net[k]
			}
			return sum
		}
		rng := rand.New(rand.NewPCG(11, uint64(tc.percent*1000+tc.minPerSec)))
		granted := 0
		for step := 0; step < 20000; step++ {
			e := int64(clk.Now().Sub(b.start) / width)
			switch r := rng.IntN(100); {
			case r < 45:
				b.Start()
				net[e] += b.deposit
			case r < 90:
				want := balance(e) >= b.cost
				if got := b.Withdraw(); got != want {
					t.Fatalf("percent %v, min %v: step %d, slot %d: Withdraw = %v, model says %v",
						tc.percent, tc.minPerSec, step, e, got, want)
				}
				if want {
					net[e] -= b.cost
					granted++
				}
			case r < 99:
				clk.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
			default:
				clk.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
			}
			e = int64(clk.Now().Sub(b.start) / width)
			if got, want := b.Available(), max(balance(e), 0)/b.cost; got != want {
				t.Fatalf("percent %v, min %v: step %d: Available = %d, model says %d", tc.percent, tc.minPerSec, step, got, want)
			}
		}
		if granted == 0 {
			t.Fatalf("percent %v, min %v: no withdrawal granted; the test exercises nothing", tc.percent, tc.minPerSec)
		}
	}
}

// stormLoop runs 1,000 requests a second for the given time against an
// endpoint set that always fails, and returns the attempts sent.
func stormLoop(t *testing.T, clk *fakeClock, budget Budget, seconds int, fail bool) (requests, attempts int) {
	t.Helper()
	b := newBalancer(t, "a", "b", "c")
	loop, err := NewLoop(b, LoopConfig{Budget: budget, Backoff: noBackoff{}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < seconds*1000; i++ {
		clk.Advance(time.Millisecond)
		requests++
		err := loop.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
			attempts++
			if fail {
				return &StatusError{Code: 503}
			}
			return nil
		})
		if fail != (err != nil) {
			t.Fatalf("Do = %v, fail = %v", err, fail)
		}
	}
	assertIdle(t, b)
	return requests, attempts
}

func TestStormPercentBudget(t *testing.T) {
	clk := newFakeClock()
	budget, err := NewPercentBudget(defaultPercent(clk)) // 10 s, 10/s, 20%
	if err != nil {
		t.Fatal(err)
	}
	reqs, attempts := stormLoop(t, clk, budget, 60, true)
	retries := attempts - reqs
	// Bound: 20% of the requests plus the reserve (10/s * 10 s) per
	// started run of 10 slots. The requests were sent at 1 ms .. 60 s
	// after the budget was created, in slots 0 .. 60: 61 slots, 7 runs.
	slots := int(clk.Now().Sub(budget.start)/time.Second) + 1
	bound := int(0.2*float64(reqs)) + 100*((slots+9)/10)
	t.Logf("requests %d, retries %d, bound %d", reqs, retries, bound)
	if retries > bound {
		t.Fatalf("retries %d above the bound %d", retries, bound)
	}
	if retries < int(0.2*float64(reqs)) {
		t.Fatalf("retries %d below 20%% of requests: the budget is stricter than documented", retries)
	}
	// Failures stop; with no traffic for one TTL the whole reserve is back.
	clk.Advance(DefaultBudgetTTL)
	if got := budget.Available(); got != 100 {
		t.Fatalf("one TTL after the storm Available = %d, want the reserve 100", got)
	}
	// With healthy traffic, retries are available throughout the next TTL.
	_, _ = stormLoop(t, clk, budget, 10, false)
	if got := budget.Available(); got < 100+int64(0.2*9000) {
		t.Fatalf("after a TTL of successes Available = %d", got)
	}
}

// recordingBudget wraps a Throttle and records the tokens seen at each
// granted retry.
type recordingBudget struct {
	*Throttle
	mu      sync.Mutex
	granted []float64
}

func (r *recordingBudget) Withdraw() bool {
	tokens := r.Tokens()
	ok := r.Throttle.Withdraw()
	if ok {
		r.mu.Lock()
		r.granted = append(r.granted, tokens)
		r.mu.Unlock()
	}
	return ok
}

func TestStormThrottle(t *testing.T) {
	clk := newFakeClock()
	th, err := NewThrottle(DefaultThrottleConfig()) // 10 tokens, 0.1
	if err != nil {
		t.Fatal(err)
	}
	rb := &recordingBudget{Throttle: th}
	reqs, attempts := stormLoop(t, clk, rb, 60, true)
	for _, tokens := range rb.granted {
		if tokens <= 5 {
			t.Fatalf("retry granted with %v tokens <= max/2", tokens)
		}
	}
	// Tokens 10 -> 9 (retry) -> 8 (retry) -> 7, then 6 (retry) -> 5: 3.
	if retries := attempts - reqs; retries != 3 {
		t.Fatalf("retries = %d, want 3", retries)
	}
	if th.Tokens() != 0 {
		t.Fatalf("tokens after the storm = %v, want 0", th.Tokens())
	}
	// Failures stop: 50 successes bring 5 tokens (not enough), 51 more than 5.
	for i := 0; i < 50; i++ {
		th.Finish(false, Succeeded)
	}
	if th.Withdraw() {
		t.Fatal("retries allowed at exactly max/2 tokens")
	}
	th.Finish(false, Succeeded)
	if !th.Withdraw() {
		t.Fatal("retries still throttled above max/2 tokens")
	}
	if th.Tokens() != 5.1 {
		t.Fatalf("tokens after a granted Withdraw = %v, want 5.1: Withdraw takes no token", th.Tokens())
	}
	for i := 0; i < 1000; i++ {
		th.Finish(false, Succeeded)
	}
	if th.Tokens() != 10 {
		t.Fatalf("tokens = %v, want capped at 10", th.Tokens())
	}
}

// TestThrottleFinish checks each outcome's effect on the bucket, for first
// attempts and retries alike, the bounds at empty and full, and that
// Withdraw and Start change nothing.
func TestThrottleFinish(t *testing.T) {
	th, err := NewThrottle(ThrottleConfig{MaxTokens: 4, TokenRatio: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name  string
		op    func()
		want  float64
		allow bool
	}{
		{"start", th.Start, 4, true},
		{"succeeded at full", func() { th.Finish(false, Succeeded) }, 4, true},
		{"failed", func() { th.Finish(false, Failed) }, 3, true},
		{"failed retry", func() { th.Finish(true, Failed) }, 2, false},
		{"abandoned", func() { th.Finish(false, Abandoned) }, 2, false},
		{"abandoned retry", func() { th.Finish(true, Abandoned) }, 2, false},
		{"unknown outcome", func() { th.Finish(false, Outcome(9)) }, 2, false},
		{"succeeded", func() { th.Finish(false, Succeeded) }, 2.5, true},
		{"succeeded retry", func() { th.Finish(true, Succeeded) }, 3, true},
		{"failed to 2", func() { th.Finish(false, Failed) }, 2, false},
		{"failed to 1", func() { th.Finish(false, Failed) }, 1, false},
		{"failed to 0", func() { th.Finish(false, Failed) }, 0, false},
		{"failed at empty", func() { th.Finish(false, Failed) }, 0, false},
		{"succeeded from empty", func() { th.Finish(false, Succeeded) }, 0.5, false},
	}
	for _, s := range steps {
		s.op()
		if got := th.Tokens(); got != s.want {
			t.Fatalf("%s: tokens = %v, want %v", s.name, got, s.want)
		}
		for range 3 {
			if got := th.Withdraw(); got != s.allow {
				t.Fatalf("%s: Withdraw = %v, want %v", s.name, got, s.allow)
			}
		}
		if got := th.Tokens(); got != s.want {
			t.Fatalf("%s: tokens after Withdraw = %v, want %v unchanged", s.name, got, s.want)
		}
	}
}

func TestConcurrentBudget(t *testing.T) {
	b, err := NewConcurrentBudget(DefaultConcurrentConfig()) // 20%, 3
	if err != nil {
		t.Fatal(err)
	}
	// Idle: the minimum of 3 retries in flight.
	for i := 0; i < 3; i++ {
		if !b.Withdraw() {
			t.Fatalf("retry %d refused below the minimum", i)
		}
	}
	if b.Withdraw() {
		t.Fatal("fourth retry granted with no other traffic")
	}
	for i := 0; i < 3; i++ {
		b.Finish(true, Failed)
	}
	// 100 active requests: 20% = 20 retries in flight.
	for i := 0; i < 100; i++ {
		b.Start()
	}
	granted := 0
	for b.Withdraw() {
		granted++
	}
	if granted < 20 || granted > 25 { // retries count as active too
		t.Fatalf("granted %d retries with 100 active, want about 20", granted)
	}
	for i := 0; i < granted; i++ {
		b.Finish(true, Succeeded)
	}
	for i := 0; i < 100; i++ {
		b.Finish(false, Succeeded)
	}
	if a, r := b.Active(); a != 0 || r != 0 {
		t.Fatalf("Active = %d, %d after all finished", a, r)
	}
}

func TestBudgetBadConfig(t *testing.T) {
	percent := func(f func(*PercentConfig)) error {
		cfg := DefaultPercentConfig()
		f(&cfg)
		_, err := NewPercentBudget(cfg)
		return err
	}
	throttle := func(f func(*ThrottleConfig)) error {
		cfg := DefaultThrottleConfig()
		f(&cfg)
		_, err := NewThrottle(cfg)
		return err
	}
	concurrent := func(f func(*ConcurrentConfig)) error {
		cfg := DefaultConcurrentConfig()
		f(&cfg)
		_, err := NewConcurrentBudget(cfg)
		return err
	}
	cases := []struct {
		name string
		err  error
		want string // a substring of the message
	}{
		{"percent/zero-config", second(NewPercentBudget(PercentConfig{})), "TTL is required (DefaultPercentConfig"},
		{"percent/negative", percent(func(c *PercentConfig) { c.PercentCanRetry = -0.1 }), "PercentCanRetry -0.1"},
		{"percent/above-1", percent(func(c *PercentConfig) { c.PercentCanRetry = 1.5 }), "must be in [0, 1]"},
		{"percent/nan", percent(func(c *PercentConfig) { c.PercentCanRetry = nan() }), "PercentCanRetry NaN"},
		{"percent/inf", percent(func(c *PercentConfig) { c.PercentCanRetry = inf() }), "PercentCanRetry +Inf"},
		{"percent/tiny", percent(func(c *PercentConfig) { c.PercentCanRetry = 1e-6 }), "precision"},
		{"ttl/zero", percent(func(c *PercentConfig) { c.TTL = 0 }), "TTL is required"},
		{"ttl/negative", percent(func(c *PercentConfig) { c.TTL = -time.Second }), "at least 100ms"},
		{"ttl/tiny", percent(func(c *PercentConfig) { c.TTL = time.Millisecond }), "at least 100ms"},
		{"min/negative", percent(func(c *PercentConfig) { c.MinRetriesPerSec = -1 }), "non-negative"},
		{"min/nan", percent(func(c *PercentConfig) { c.MinRetriesPerSec = nan() }), "non-negative"},
		{"min/inf", percent(func(c *PercentConfig) { c.MinRetriesPerSec = inf() }), "finite"},
		{"min/huge", percent(func(c *PercentConfig) { c.MinRetriesPerSec = 1e12 }), "too large"},
		{"min/over 2^30 per TTL", percent(func(c *PercentConfig) { c.MinRetriesPerSec = 1.1e8 }), "too large"},
		{"throttle/zero-config", second(NewThrottle(ThrottleConfig{})), "required (DefaultThrottleConfig"},
		{"throttle/max-zero", throttle(func(c *ThrottleConfig) { c.MaxTokens = 0 }), "required"},
		{"throttle/ratio-zero", throttle(func(c *ThrottleConfig) { c.TokenRatio = 0 }), "required"},
		{"throttle/max", throttle(func(c *ThrottleConfig) { c.MaxTokens = -1 }), "(0, 1000]"},
		{"throttle/max-nan", throttle(func(c *ThrottleConfig) { c.MaxTokens = nan() }), "(0, 1000]"},
		{"throttle/max-big", throttle(func(c *ThrottleConfig) { c.MaxTokens = 1001 }), "(0, 1000]"},
		{"throttle/ratio", throttle(func(c *ThrottleConfig) { c.TokenRatio = -0.1 }), "(0, MaxTokens]"},
		{"throttle/ratio-nan", throttle(func(c *ThrottleConfig) { c.TokenRatio = nan() }), "(0, MaxTokens]"},
		{"throttle/ratio-big", throttle(func(c *ThrottleConfig) { c.MaxTokens, c.TokenRatio = 2, 3 }), "(0, MaxTokens]"},
		{"throttle/ratio-tiny", throttle(func(c *ThrottleConfig) { c.TokenRatio = 1e-4 }), "precision"},
		{"concurrent/percent", concurrent(func(c *ConcurrentConfig) { c.BudgetPercent = -5 }), "[0, 100]"},
		{"concurrent/percent-nan", concurrent(func(c *ConcurrentConfig) { c.BudgetPercent = nan() }), "[0, 100]"},
		{"concurrent/percent-big", concurrent(func(c *ConcurrentConfig) { c.BudgetPercent = 101 }), "[0, 100]"},
		{"concurrent/percent-tiny", concurrent(func(c *ConcurrentConfig) { c.BudgetPercent = 0.01 }), "precision"},
		{"concurrent/min", concurrent(func(c *ConcurrentConfig) { c.MinRetryConcurrency = -1 }), "negative"},
		{"backoff/cap-below-base", second(NewFullJitter(BackoffConfig{Base: time.Second, Cap: time.Millisecond})), "below the base"},
		{"backoff/decorrelated-cap-below-base", second(NewDecorrelatedJitter(BackoffConfig{Base: time.Second, Cap: time.Millisecond})), "below the base"},
		{"backoff/negative-base", second(NewFullJitter(BackoffConfig{Base: -time.Second})), "negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", tc.err)
			}
			if !strings.Contains(tc.err.Error(), tc.want) || !strings.HasPrefix(tc.err.Error(), "retry: ") {
				t.Fatalf("err = %q, want a message with %q", tc.err, tc.want)
			}
		})
	}
}

// TestBudgetExplicitConfig checks that zero fields mean zero, not a default.
func TestBudgetExplicitConfig(t *testing.T) {
	clk := newFakeClock()
	// No percentage: only the reserve of 2/s * 1 s, whatever the traffic.
	b, err := NewPercentBudget(PercentConfig{TTL: time.Second, MinRetriesPerSec: 2.5, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		b.Start()
	}
	if got := b.Available(); got != 2 {
		t.Fatalf("percent 0, reserve 2.5: Available = %d, want 2", got)
	}
	// No reserve: nothing until deposits pay for a retry.
	b, err = NewPercentBudget(PercentConfig{TTL: time.Second, PercentCanRetry: 0.5, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if b.Withdraw() {
		t.Fatal("retry granted with no reserve and no deposits")
	}
	b.Start()
	b.Start()
	if !b.Withdraw() || b.Withdraw() {
		t.Fatal("two deposits at 50% did not buy exactly one retry")
	}
	// Neither: a budget that never allows a retry.
	b, err = NewPercentBudget(PercentConfig{TTL: time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	if b.Withdraw() {
		t.Fatal("retry granted by an empty budget")
	}
	// The zero ConcurrentConfig allows no retry; a minimum alone allows
	// exactly that many.
	cb, err := NewConcurrentBudget(ConcurrentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cb.Start()
	if cb.Withdraw() {
		t.Fatal("zero ConcurrentConfig granted a retry")
	}
	cb, _ = NewConcurrentBudget(ConcurrentConfig{MinRetryConcurrency: 2})
	for i := 0; i < 100; i++ {
		cb.Start()
	}
	first, second, third := cb.Withdraw(), cb.Withdraw(), cb.Withdraw()
	if !first || !second || third {
		t.Fatal("MinRetryConcurrency 2 with percent 0 did not grant exactly 2")
	}
}

func TestDefaultConfigs(t *testing.T) {
	if got, want := DefaultPercentConfig(), (PercentConfig{TTL: 10 * time.Second, MinRetriesPerSec: 10, PercentCanRetry: 0.2}); got != want {
		t.Errorf("DefaultPercentConfig() = %+v, want %+v", got, want)
	}
	if got, want := DefaultThrottleConfig(), (ThrottleConfig{MaxTokens: 10, TokenRatio: 0.1}); got != want {
		t.Errorf("DefaultThrottleConfig() = %+v, want %+v", got, want)
	}
	if got, want := DefaultConcurrentConfig(), (ConcurrentConfig{BudgetPercent: 20, MinRetryConcurrency: 3}); got != want {
		t.Errorf("DefaultConcurrentConfig() = %+v, want %+v", got, want)
	}
	// The default Finagle budget: a reserve of 10/s * 10 s.
	pb, err := NewPercentBudget(defaultPercent(newFakeClock()))
	if err != nil {
		t.Fatal(err)
	}
	if got := pb.Available(); got != 100 {
		t.Errorf("default budget Available = %d, want 100", got)
	}
}

// defaultPercent returns DefaultPercentConfig on clk.
func defaultPercent(clk llmlb.Clock) PercentConfig {
	cfg := DefaultPercentConfig()
	cfg.Clock = clk
	return cfg
}

func second[T any](_ T, err error) error { return err }

func TestBudgetAllocs(t *testing.T) {
	clk := newFakeClock()
	pb, _ := NewPercentBudget(defaultPercent(clk))
	th, _ := NewThrottle(DefaultThrottleConfig())
	cb, _ := NewConcurrentBudget(DefaultConcurrentConfig())
	for name, b := range map[string]Budget{"percent": pb, "throttle": th, "concurrent": cb} {
		allocs := testing.AllocsPerRun(1000, func() {
			b.Start()
			if b.Withdraw() {
				b.Finish(true, Failed)
			}
			b.Finish(false, Succeeded)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per request, want 0", name, allocs)
		}
	}
}

func TestPercentBudgetConcurrent(t *testing.T) {
	clk := newFakeClock()
	b, _ := NewPercentBudget(PercentConfig{TTL: time.Second, MinRetriesPerSec: 10, PercentCanRetry: 0.5, Clock: clk})
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for i := 0; i < 1000; i++ {
				b.Start()
				if b.Withdraw() {
					n++
				}
			}
			mu.Lock()
			granted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Within one slot: at most 50% of 8,000 deposits plus a reserve of 10.
	if granted > 4010 {
		t.Fatalf("granted %d retries, bound 4010", granted)
	}
	if granted < 3900 {
		t.Fatalf("granted only %d retries under contention", granted)
	}
}

// BenchmarkBudget measures one deposit and one withdrawal per operation,
// from every P, in each budget's own terms: a PercentBudget's request
// deposit and retry withdrawal; a Throttle's retry check with the failure
// that charges it and a success's deposit; a ConcurrentBudget's retry taking
// a place among the retries in flight and giving it back. BenchmarkBudgetRequest
// measures a whole request with one retry through the Budget interface.
func BenchmarkBudget(b *testing.B) {
	pb, _ := NewPercentBudget(DefaultPercentConfig())
	th, _ := NewThrottle(DefaultThrottleConfig())
	cb, _ := NewConcurrentBudget(DefaultConcurrentConfig())
	for _, bc := range []struct {
		kind string
		op   func()
	}{
		{"finagle", func() { pb.Start(); pb.Withdraw() }},
		{"grpc", func() {
			if th.Withdraw() {
				th.Finish(true, Failed)
			}
			th.Finish(false, Succeeded)
		}},
		{"concurrent", func() {
			if cb.Withdraw() {
				cb.Finish(true, Failed)
			}
		}},
	} {
		b.Run("kind="+bc.kind, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.op()
				}
			})
		})
	}
}

// BenchmarkBudgetRequest runs whole requests against each budget from every
// P, through the Budget interface as a retry loop calls it: Start, a
// withdrawal and, if granted, its Finish, then the first attempt's Finish.
// What bounds the cost: every budget keeps one exact state that all Ps
// update, so with several Ps its cache line moves between cores on most
// operations. A PercentBudget makes one atomic write per request and one per
// granted retry, a Throttle one or two, and a ConcurrentBudget four, one at
// each attempt's start and end: BenchmarkSharedCounter measures those floors.
func BenchmarkBudgetRequest(b *testing.B) {
	pb, _ := NewPercentBudget(DefaultPercentConfig())
	th, _ := NewThrottle(DefaultThrottleConfig())
	cb, _ := NewConcurrentBudget(DefaultConcurrentConfig())
	for _, bc := range []struct {
		kind string
		b    Budget
	}{{"finagle", pb}, {"grpc", th}, {"concurrent", cb}} {
		b.Run("kind="+bc.kind, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.b.Start()
					if bc.b.Withdraw() {
						bc.b.Finish(true, Failed)
					}
					bc.b.Finish(false, Succeeded)
				}
			})
		})
	}
}

// BenchmarkSharedCounter is the floor the budget benchmarks are measured
// against: atomic adds on a word that every P updates, one per request (the
// least any exact shared budget pays) and four (the state changes a
// ConcurrentBudget makes per request: each attempt's start and end). Compare
// them in one run.
func BenchmarkSharedCounter(b *testing.B) {
	for _, adds := range []int{1, 4} {
		b.Run("adds="+strconv.Itoa(adds), func(b *testing.B) {
			var n atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					for range adds {
						n.Add(1)
					}
				}
			})
		})
	}
}

// TestPercentBudgetConcurrentSlots runs goroutines against a budget while
// the clock moves through many slots, so that slot changes race with
// deposits and withdrawals. The bound for traffic from an idle start must
// hold in total, and the budget must still grant nearly all of it.
func TestPercentBudgetConcurrentSlots(t *testing.T) {
	clk := newFakeClock()
	const ttl = time.Second
	b, _ := NewPercentBudget(PercentConfig{TTL: ttl, MinRetriesPerSec: 10, PercentCanRetry: 0.5, Clock: clk})
	var wg sync.WaitGroup
	var requests, granted atomic.Int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20000; i++ {
				b.Start()
				requests.Add(1)
				if b.Withdraw() {
					granted.Add(1)
				}
				if g == 0 && i%10 == 0 {
					clk.Advance(time.Millisecond) // 2,000 ms: 20 slots
				}
			}
		}()
	}
	wg.Wait()
	slots := int64(clk.Now().Sub(b.start)/(ttl/budgetSlots)) + 1
	bound := requests.Load()/2 + 10*((slots+budgetSlots-1)/budgetSlots)
	t.Logf("requests %d, retries %d, bound %d over %d slots", requests.Load(), granted.Load(), bound, slots)
	if granted.Load() > bound {
		t.Fatalf("granted %d retries, bound %d", granted.Load(), bound)
	}
	// Deposits expire after a TTL, so a share of them is never spent; but
	// most of the 50% must be granted.
	if granted.Load() < requests.Load()*4/10 {
		t.Fatalf("granted only %d retries for %d requests at 50%%", granted.Load(), requests.Load())
	}
}

// TestPercentBudgetClockBackwards checks that an injected clock stepping
// back neither loses nor revives counts: calls keep the latest slot.
func TestPercentBudgetClockBackwards(t *testing.T) {
	clk := newFakeClock()
	b, err := NewPercentBudget(PercentConfig{TTL: time.Second, PercentCanRetry: 1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(500 * time.Millisecond) // slot 5
	for range 4 {
		b.Start()
	}
	clk.Advance(-time.Hour) // before the budget was created
	if got := b.Available(); got != 4 {
		t.Fatalf("after the clock stepped back: Available = %d, want 4", got)
	}
	if !b.Withdraw() {
		t.Fatal("withdrawal refused after the clock stepped back")
	}
	b.Start()
	clk.Advance(time.Hour + 1400*time.Millisecond) // slot 19: slots 5 and older expired
	if got := b.Available(); got != 0 {
		t.Fatalf("one TTL after the latest slot: Available = %d, want 0", got)
	}
	b.Start()
	if got := b.Available(); got != 1 {
		t.Fatalf("after a fresh deposit: Available = %d, want 1", got)
	}
}

// TestConcurrentBudgetUnmatchedFinish: a Finish that matches no Start or
// granted Withdraw (a caller's bug) is ignored: it must neither wrap the
// counts nor raise the cap on the retries in flight.
func TestConcurrentBudgetUnmatchedFinish(t *testing.T) {
	b, err := NewConcurrentBudget(DefaultConcurrentConfig()) // 20%, 3
	if err != nil {
		t.Fatal(err)
	}
	b.Finish(false, Succeeded) // no Start
	if a, r := b.Active(); a != 0 || r != 0 {
		t.Errorf("Active = %d, %d after a Finish without Start, want 0, 0", a, r)
	}
	b.Start()
	for range 5 {
		b.Finish(true, Failed) // no Withdraw
	}
	if a, r := b.Active(); a != 1 || r != 0 {
		t.Errorf("Active = %d, %d after a Start and 5 Finish of retries never granted, want 1, 0", a, r)
	}
	granted := 0
	for i := 0; i < 100 && b.Withdraw(); i++ {
		granted++
	}
	if granted != 3 {
		t.Errorf("granted %d retries in flight with one request active, want 3 (the minimum)", granted)
	}
}
