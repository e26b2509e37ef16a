package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
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
		if !b.TryWithdraw() {
			t.Fatalf("withdrawal %d of the reserve refused", i)
		}
	}
	if b.TryWithdraw() {
		t.Fatal("withdrawal beyond the reserve granted")
	}
	// 5 deposits at 20% buy exactly one retry.
	for i := 0; i < 4; i++ {
		b.Deposit()
	}
	if b.TryWithdraw() {
		t.Fatal("4 deposits bought a retry")
	}
	b.Deposit()
	if !b.TryWithdraw() {
		t.Fatal("5 deposits did not buy a retry")
	}
	if b.TryWithdraw() {
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
	b, _ := NewPercentBudget(PercentConfig{TTL: time.Second, MinRetriesPerSec: 1e-9, PercentCanRetry: 1, Clock: clk})
	b.Deposit() // slot 0
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
	}{{0.2, 0.5}, {0.1, 3}, {0.5, 1e-9}, {1, 2}} {
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
				b.Deposit()
				dep[s]++
			}
			if rng.IntN(1+s%7) == 0 && b.TryWithdraw() {
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
	budget, err := NewPercentBudget(PercentConfig{Clock: clk}) // 10 s, 10/s, 20%
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
	th, err := NewThrottle(ThrottleConfig{MaxTokens: 10, TokenRatio: 0.1})
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
		th.Success()
	}
	if th.Allow() {
		t.Fatal("retries allowed at exactly max/2 tokens")
	}
	th.Success()
	if !th.Allow() {
		t.Fatal("retries still throttled above max/2 tokens")
	}
	for i := 0; i < 1000; i++ {
		th.Success()
	}
	if th.Tokens() != 10 {
		t.Fatalf("tokens = %v, want capped at 10", th.Tokens())
	}
}

func TestConcurrentBudget(t *testing.T) {
	b, err := NewConcurrentBudget(ConcurrentConfig{})
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
	cases := []struct {
		name string
		err  error
	}{
		{"percent/negative", second(NewPercentBudget(PercentConfig{PercentCanRetry: -0.1}))},
		{"percent/above-1", second(NewPercentBudget(PercentConfig{PercentCanRetry: 1.5}))},
		{"percent/nan", second(NewPercentBudget(PercentConfig{PercentCanRetry: nan()}))},
		{"percent/tiny", second(NewPercentBudget(PercentConfig{PercentCanRetry: 1e-6}))},
		{"ttl/negative", second(NewPercentBudget(PercentConfig{TTL: -time.Second}))},
		{"ttl/tiny", second(NewPercentBudget(PercentConfig{TTL: time.Millisecond}))},
		{"min/negative", second(NewPercentBudget(PercentConfig{MinRetriesPerSec: -1}))},
		{"min/inf", second(NewPercentBudget(PercentConfig{MinRetriesPerSec: inf()}))},
		{"throttle/max", second(NewThrottle(ThrottleConfig{MaxTokens: -1}))},
		{"throttle/max-big", second(NewThrottle(ThrottleConfig{MaxTokens: 1001}))},
		{"throttle/ratio", second(NewThrottle(ThrottleConfig{TokenRatio: -0.1}))},
		{"throttle/ratio-big", second(NewThrottle(ThrottleConfig{MaxTokens: 2, TokenRatio: 3}))},
		{"concurrent/percent", second(NewConcurrentBudget(ConcurrentConfig{BudgetPercent: -5}))},
		{"concurrent/percent-big", second(NewConcurrentBudget(ConcurrentConfig{BudgetPercent: 101}))},
		{"concurrent/min", second(NewConcurrentBudget(ConcurrentConfig{MinRetryConcurrency: -1}))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", tc.err)
			}
		})
	}
}

func second[T any](_ T, err error) error { return err }

func TestBudgetAllocs(t *testing.T) {
	clk := newFakeClock()
	pb, _ := NewPercentBudget(PercentConfig{Clock: clk})
	th, _ := NewThrottle(ThrottleConfig{})
	cb, _ := NewConcurrentBudget(ConcurrentConfig{})
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
				b.Deposit()
				if b.TryWithdraw() {
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

func BenchmarkBudget(b *testing.B) {
	pb, _ := NewPercentBudget(PercentConfig{})
	th, _ := NewThrottle(ThrottleConfig{})
	cb, _ := NewConcurrentBudget(ConcurrentConfig{})
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
