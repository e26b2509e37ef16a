package retry

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/llmlb/llmlb"
)

func fail503(context.Context, *Attempt) error { return &StatusError{Code: 503} }

func TestLoopFirstAttemptSucceeds(t *testing.T) {
	b := newBalancer(t, "a", "b")
	l, err := NewLoop(b, LoopConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = l.Do(context.Background(), &llmlb.Request{PromptTokens: 100}, func(ctx context.Context, a *Attempt) error {
		n++
		if a.Number() != 1 || a.Hedge() || a.Endpoint() == nil {
			t.Errorf("attempt %d hedge %v endpoint %v", a.Number(), a.Hedge(), a.Endpoint())
		}
		first, again := a.FirstToken(), a.FirstToken()
		if !first || !again {
			t.Error("FirstToken of the only attempt returned false")
		}
		return nil
	})
	if err != nil || n != 1 {
		t.Fatalf("Do = %v after %d attempts", err, n)
	}
	assertIdle(t, b)
}

// TestLoopNoRetryAfterFirstToken: a stream that fails after its first token
// is returned as is, never retried nor hedged.
func TestLoopNoRetryAfterFirstToken(t *testing.T) {
	for _, hedge := range []time.Duration{0, 10 * time.Millisecond} {
		synctest.Test(t, func(t *testing.T) {
			b := newBalancer(t, "a", "b", "c")
			l, err := NewLoop(b, LoopConfig{Backoff: noBackoff{}, MaxAttempts: 5, Hedge: HedgeConfig{Delay: hedge}})
			if err != nil {
				t.Fatal(err)
			}
			var n atomic.Int32
			streamErr := &StatusError{Code: 502}
			err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				n.Add(1)
				time.Sleep(5 * time.Millisecond)
				if !a.FirstToken() {
					return ctx.Err()
				}
				time.Sleep(time.Second) // streaming, well past the hedge delay
				return streamErr        // retryable status, but after the first token
			})
			if err != streamErr {
				t.Fatalf("hedge %v: Do = %v, want the stream's own error", hedge, err)
			}
			if n.Load() != 1 {
				t.Fatalf("hedge %v: %d attempts, want 1", hedge, n.Load())
			}
			assertIdle(t, b)
		})
	}
}

// TestLoopExclusion: retries never return to an endpoint that failed while
// another is available, and never to one the caller excluded.
func TestLoopExclusion(t *testing.T) {
	keys := []string{"a", "b", "c", "d", "e"}
	for _, pol := range []struct {
		name string
		p    llmlb.Policy
	}{{"roundrobin", llmlb.RoundRobin()}, {"random", llmlb.Random()}, {"p2c", llmlb.P2C(nil)}} {
		t.Run(pol.name, func(t *testing.T) {
			b := newBalancerWith(t, pol.p, keys...)
			l, err := NewLoop(b, LoopConfig{Backoff: noBackoff{}, MaxAttempts: 7, Budget: unlimited{}})
			if err != nil {
				t.Fatal(err)
			}
			exclude := []string{"e"}
			req := &llmlb.Request{Exclude: exclude}
			for i := 0; i < 200; i++ {
				var seen []string
				err := l.Do(context.Background(), req, func(ctx context.Context, a *Attempt) error {
					seen = append(seen, a.Endpoint().Key())
					return &StatusError{Code: 500}
				})
				var ge *GiveUpError
				if !errors.As(err, &ge) || ge.Reason != "attempts" || ge.Attempts != 7 {
					t.Fatalf("Do = %v", err)
				}
				// 4 allowed endpoints: the first 4 attempts are distinct,
				// then a new round: the next 3 are distinct again.
				first, second := slices.Clone(seen[:4]), slices.Clone(seen[4:])
				slices.Sort(first)
				slices.Sort(second)
				if !slices.Equal(first, []string{"a", "b", "c", "d"}) || len(slices.Compact(second)) != 3 || slices.Contains(second, "e") {
					t.Fatalf("attempt order %v", seen)
				}
			}
			if !slices.Equal(req.Exclude, []string{"e"}) || len(req.Exclude) != 1 {
				t.Fatalf("caller's Exclude modified: %v", req.Exclude)
			}
			assertIdle(t, b)
		})
	}
}

// unlimited is a budget that always grants.
type unlimited struct{}

func (unlimited) Start()               {}
func (unlimited) Withdraw() bool       { return true }
func (unlimited) Finish(bool, Outcome) {}

// denyAll is a budget that never grants.
type denyAll struct{ unlimited }

func (denyAll) Withdraw() bool { return false }

func TestLoopGiveUp(t *testing.T) {
	bad := &StatusError{Code: 400}
	cases := []struct {
		name     string
		budget   Budget
		attempt  func(context.Context, *Attempt) error
		attempts int
		reason   string // "" = error returned as is
		want     error
	}{
		{"non-retryable", nil, func(context.Context, *Attempt) error { return bad }, 1, "", bad},
		{"context", nil, func(context.Context, *Attempt) error { return context.Canceled }, 1, "", context.Canceled},
		{"attempts", nil, fail503, 3, "attempts", nil},
		{"budget", denyAll{}, fail503, 1, "budget", nil},
		{"pushback grpc", nil, func(context.Context, *Attempt) error {
			return &StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"-1"}}}
		}, 1, "pushback", nil},
		{"pushback grpc garbage", nil, func(context.Context, *Attempt) error {
			return &StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"whenever"}}}
		}, 1, "pushback", nil},
		// A Retry-After that cannot be parsed is ignored: the request is
		// retried on its own back-off until its attempts run out.
		{"retry-after garbage ignored", nil, func(context.Context, *Attempt) error {
			return &StatusError{Code: 429, Header: http.Header{"Retry-After": {"whenever"}}}
		}, 3, "attempts", nil},
		{"grpc retried", nil, func(context.Context, *Attempt) error {
			return &StatusError{Code: GRPCResourceExhausted, GRPC: true}
		}, 3, "attempts", nil},
		{"transport", nil, func(context.Context, *Attempt) error { return errors.New("connection refused") }, 3, "attempts", nil},
		{"inner loop gave up", nil, func(context.Context, *Attempt) error {
			return &GiveUpError{Attempts: 3, Reason: "budget", Err: &StatusError{Code: 503}}
		}, 1, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBalancer(t, "a", "b")
			l, err := NewLoop(b, LoopConfig{Budget: tc.budget, Backoff: noBackoff{}})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				n++
				return tc.attempt(ctx, a)
			})
			if n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			var ge *GiveUpError
			switch {
			case tc.reason == "" && errors.As(err, &ge) && tc.want != nil:
				t.Errorf("Do = %v, want %v as is", err, tc.want)
			case tc.reason == "" && tc.want != nil && err != tc.want:
				t.Errorf("Do = %v, want %v", err, tc.want)
			case tc.reason != "" && (!errors.As(err, &ge) || ge.Reason != tc.reason || !errors.Is(err, ErrExhausted)):
				t.Errorf("Do = %v, want a give-up for %q", err, tc.reason)
			}
			assertIdle(t, b)
		})
	}
}

func TestLoopPickErrors(t *testing.T) {
	b := newBalancer(t, "a")
	l, _ := NewLoop(b, LoopConfig{Backoff: noBackoff{}})
	err := l.Do(context.Background(), &llmlb.Request{Exclude: []string{"a"}}, fail503)
	if !errors.Is(err, llmlb.ErrNoCandidates) {
		t.Fatalf("all excluded: Do = %v", err)
	}
	if err := l.Do(context.Background(), nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil attempt: Do = %v", err)
	}
	// One endpoint: retries go back to it, since no other is available.
	n := 0
	err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
		n++
		return fail503(ctx, a)
	})
	if n != 3 || !errors.Is(err, ErrExhausted) {
		t.Fatalf("single endpoint: %d attempts, %v", n, err)
	}
	empty, _ := llmlb.New(llmlb.RoundRobin())
	l2, _ := NewLoop(empty, LoopConfig{})
	if err := l2.Do(context.Background(), nil, fail503); !errors.Is(err, llmlb.ErrNoEndpoints) {
		t.Fatalf("no endpoints: Do = %v", err)
	}
}

// fixedBackoff always returns d.
type fixedBackoff time.Duration

func (f fixedBackoff) Backoff(int, time.Duration) time.Duration { return time.Duration(f) }

func TestLoopPushbackNeverShortens(t *testing.T) {
	cases := []struct {
		retryAfter string
		want       time.Duration
	}{
		{"", 5 * time.Second},
		{"2", 5 * time.Second},
		{"7", 7 * time.Second},
		{"301", 5 * time.Second}, // above the cap: ignored
	}
	for _, tc := range cases {
		var waits []time.Duration
		after := func(d time.Duration) <-chan time.Time {
			waits = append(waits, d)
			c := make(chan time.Time, 1)
			c <- time.Time{}
			return c
		}
		b := newBalancer(t, "a", "b")
		l, _ := NewLoop(b, LoopConfig{Backoff: fixedBackoff(5 * time.Second), After: after, MaxAttempts: 2})
		h := http.Header{}
		if tc.retryAfter != "" {
			h.Set("Retry-After", tc.retryAfter)
		}
		_ = l.Do(context.Background(), nil, func(context.Context, *Attempt) error {
			return &StatusError{Code: 429, Header: h}
		})
		if len(waits) != 1 || waits[0] != tc.want {
			t.Errorf("Retry-After %q: waits %v, want [%v]", tc.retryAfter, waits, tc.want)
		}
	}
}

// With a negative MaxPushback a retry waits only for its back-off, whatever
// delay the server asked for, and a "do not retry" still stops it.
func TestLoopNegativePushback(t *testing.T) {
	cases := []struct {
		name     string
		err      error
		attempts int
		waits    []time.Duration
	}{
		{"retry-after", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"7"}}}, 2, []time.Duration{time.Second}},
		{"rate-limit reset", &StatusError{Code: 429, Header: http.Header{"X-Ratelimit-Reset-Requests": {"20s"}}}, 2, []time.Duration{time.Second}},
		{"overload", &OverloadError{Scope: "global", RetryAfter: 9 * time.Second}, 2, []time.Duration{time.Second}},
		{"do not retry", &StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"Grpc-Retry-Pushback-Ms": {"-1"}}}, 1, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var waits []time.Duration
			after := func(d time.Duration) <-chan time.Time {
				waits = append(waits, d)
				c := make(chan time.Time, 1)
				c <- time.Time{}
				return c
			}
			b := newBalancer(t, "a", "b")
			l, err := NewLoop(b, LoopConfig{Backoff: fixedBackoff(time.Second), After: after, MaxAttempts: 2, MaxPushback: -1})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			_ = l.Do(context.Background(), nil, func(context.Context, *Attempt) error {
				n++
				return tc.err
			})
			if n != tc.attempts || !slices.Equal(waits, tc.waits) {
				t.Errorf("%d attempts, waits %v; want %d, %v", n, waits, tc.attempts, tc.waits)
			}
			assertIdle(t, b)
		})
	}
}

func TestLoopDeadlineAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBalancer(t, "a", "b")
		l, _ := NewLoop(b, LoopConfig{Backoff: fixedBackoff(time.Second)})
		// The back-off would end after the deadline: give up at once.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := l.Do(ctx, nil, fail503)
		var ge *GiveUpError
		if !errors.As(err, &ge) || ge.Reason != "deadline" || time.Since(start) != 0 {
			t.Fatalf("Do = %v after %v", err, time.Since(start))
		}
		// Cancelled during the back-off.
		ctx2, cancel2 := context.WithCancel(context.Background())
		go func() {
			time.Sleep(100 * time.Millisecond)
			cancel2()
		}()
		err = l.Do(ctx2, nil, fail503)
		if !errors.Is(err, context.Canceled) || !errors.As(err, new(*StatusError)) {
			t.Fatalf("cancelled back-off: Do = %v", err)
		}
		assertIdle(t, b)
	})
}

// TestTwoLayers stacks two loops, each with its own budget, over total
// failure. Because the inner loop's give-up wraps ErrExhausted, which the
// default classifier does not retry, the outer loop sends each user request
// once and the upstream attempts are the inner loop's: at most
// (1+0.2)*U + reserve*runs, the PercentBudget bound with the inner
// deposits equal to U. A naive outer classifier that retries everything
// multiplies: up to 1.2*(1.2*U + R) + R.
func TestTwoLayers(t *testing.T) {
	for _, naive := range []bool{false, true} {
		clk := newFakeClock()
		outerBudget, _ := NewPercentBudget(defaultPercent(clk))
		innerBudget, _ := NewPercentBudget(defaultPercent(clk))
		gateways := newBalancer(t, "g1", "g2")
		replicas := newBalancer(t, "r1", "r2", "r3")
		cfg := LoopConfig{Budget: outerBudget, Backoff: noBackoff{}, Clock: clk}
		if naive {
			cfg.Classify = func(err error) bool { return err != nil }
		}
		outer, _ := NewLoop(gateways, cfg)
		inner, _ := NewLoop(replicas, LoopConfig{Budget: innerBudget, Backoff: noBackoff{}, Clock: clk})
		upstream, users := 0, 0
		for i := 0; i < 20000; i++ { // 1,000 a second for 20 s
			clk.Advance(time.Millisecond)
			users++
			err := outer.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				return inner.Do(ctx, nil, func(context.Context, *Attempt) error {
					upstream++
					return &StatusError{Code: 503}
				})
			})
			if !errors.Is(err, ErrExhausted) {
				t.Fatalf("Do = %v", err)
			}
		}
		runs := (int(clk.Now().Sub(innerBudget.start)/time.Second) + 1 + 9) / 10 // started runs of 10 slots
		reserve := 100 * runs
		single := int(1.2*float64(users)) + reserve
		t.Logf("naive=%v: %d user requests, %d upstream attempts (%.3fx), one-layer bound %d", naive, users, upstream, float64(upstream)/float64(users), single)
		if !naive && upstream > single {
			t.Fatalf("upstream attempts %d above the bound %d", upstream, single)
		}
		if naive {
			if stacked := int(1.2*float64(single)) + reserve; upstream > stacked {
				t.Fatalf("naive: upstream attempts %d above the stacked bound %d", upstream, stacked)
			}
			if upstream <= single {
				t.Fatalf("naive stacking did not multiply (%d <= %d): the test lost its point", upstream, single)
			}
		}
		assertIdle(t, gateways)
		assertIdle(t, replicas)
	}
}

// TestHedging: one endpoint stalls before its first token. The helper's
// time to first token is then at most the hedge delay plus the healthy
// endpoint's, every losing attempt is cancelled and finished (the balancer's
// accounting returns to zero), and hedges draw from the budget.
func TestHedging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			hedgeDelay = 100 * time.Millisecond
			healthy    = 20 * time.Millisecond
		)
		b := newBalancer(t, "stall", "fast")
		budget, _ := NewConcurrentBudget(DefaultConcurrentConfig())
		l, err := NewLoop(b, LoopConfig{Budget: budget, Backoff: noBackoff{}, Hedge: HedgeConfig{Delay: hedgeDelay}})
		if err != nil {
			t.Fatal(err)
		}
		var ttfts []time.Duration
		var hedges, cancelled atomic.Int32
		for i := 0; i < 200; i++ {
			start := time.Now()
			var first time.Time
			err := l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				if a.Hedge() {
					hedges.Add(1)
				}
				if a.Endpoint().Key() == "stall" {
					<-ctx.Done()
					cancelled.Add(1)
					return ctx.Err()
				}
				select {
				case <-time.After(healthy):
				case <-ctx.Done():
					return ctx.Err()
				}
				if !a.FirstToken() {
					return ctx.Err()
				}
				first = time.Now()
				time.Sleep(50 * time.Millisecond) // the rest of the stream
				return nil
			})
			if err != nil {
				t.Fatalf("Do = %v", err)
			}
			ttfts = append(ttfts, first.Sub(start))
		}
		slices.Sort(ttfts)
		p99 := ttfts[len(ttfts)*99/100]
		if p99 > hedgeDelay+healthy {
			t.Fatalf("p99 TTFT %v above hedge delay + healthy TTFT %v", p99, hedgeDelay+healthy)
		}
		if ttfts[0] != healthy {
			t.Fatalf("fastest TTFT %v, want %v", ttfts[0], healthy)
		}
		// Round robin sends half the primaries to the stalled endpoint.
		if hedges.Load() != 100 || cancelled.Load() != 100 {
			t.Fatalf("hedges %d, cancelled %d; want 100 each", hedges.Load(), cancelled.Load())
		}
		assertIdle(t, b)
		if a, r := budget.Active(); a != 0 || r != 0 {
			t.Fatalf("budget still counts %d attempts, %d retries", a, r)
		}
	})
}

// TestHedgeLosesToPrimary: a hedge that is still waiting when the primary
// streams is cancelled; the budget refusing a hedge means no hedge.
func TestHedgeEdges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBalancer(t, "a", "b")
		l, _ := NewLoop(b, LoopConfig{Backoff: noBackoff{}, Hedge: HedgeConfig{Delay: 10 * time.Millisecond}, Budget: unlimited{}})
		var lost atomic.Int32
		err := l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
			if a.Hedge() {
				select {
				case <-time.After(time.Hour):
					if !a.FirstToken() {
						lost.Add(1)
					}
				case <-ctx.Done():
					lost.Add(1)
				}
				return ctx.Err()
			}
			time.Sleep(30 * time.Millisecond) // after the hedge started
			a.FirstToken()
			return nil
		})
		if err != nil || lost.Load() != 1 {
			t.Fatalf("Do = %v, lost hedges %d", err, lost.Load())
		}
		assertIdle(t, b)

		l2, _ := NewLoop(b, LoopConfig{Backoff: noBackoff{}, Hedge: HedgeConfig{Delay: 10 * time.Millisecond}, Budget: denyAll{}})
		var n atomic.Int32
		_ = l2.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
			n.Add(1)
			time.Sleep(50 * time.Millisecond)
			a.FirstToken()
			return nil
		})
		if n.Load() != 1 {
			t.Fatalf("budget refused hedges but %d attempts ran", n.Load())
		}

		// Hedge, then both fail before a first token: the loop retries on
		// the endpoint with no failure... there is none, so a new round.
		var seen sync.Map
		var calls atomic.Int32
		err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
			calls.Add(1)
			seen.Store(a.Endpoint().Key(), true)
			time.Sleep(20 * time.Millisecond)
			return &StatusError{Code: 503}
		})
		if !errors.Is(err, ErrExhausted) || calls.Load() != 3 {
			t.Fatalf("Do = %v after %d attempts", err, calls.Load())
		}
		assertIdle(t, b)
	})
}

func TestHedgePercentile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBalancer(t, "a", "b")
		l, _ := NewLoop(b, LoopConfig{Backoff: noBackoff{}, Hedge: HedgeConfig{Percentile: 0.9}, Budget: unlimited{}})
		var slowHedged []int
		for i := 0; i < 100; i++ {
			slow := i%10 == 9 // every tenth request is slow on its primary
			_ = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				if a.Hedge() && slow {
					slowHedged = append(slowHedged, i)
				}
				d := time.Duration(5+i%7) * time.Millisecond
				if slow && !a.Hedge() {
					d = time.Second
				}
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return ctx.Err()
				}
				a.FirstToken()
				return nil
			})
		}
		// No hedging before 20 samples (and no Delay), and the first
		// quantile, cached for 16 samples, includes two slow ones. From
		// then on the p90 is a fast TTFT and every slow primary is hedged.
		want := []int{39, 49, 59, 69, 79, 89, 99}
		if len(slowHedged) > 0 && slowHedged[0] == 29 {
			slowHedged = slowHedged[1:] // a tie at 1 s: either way is right
		}
		if !slices.Equal(slowHedged, want) {
			t.Fatalf("slow requests hedged: %v, want %v", slowHedged, want)
		}
		if q, ok := l.ttft.Quantile(0.9); !ok || q > 11*time.Millisecond {
			t.Fatalf("p90 TTFT = %v, %v", q, ok)
		}
	})
}

func TestLoopBadConfig(t *testing.T) {
	b := newBalancer(t, "a")
	for _, tc := range []struct {
		name string
		p    Picker
		cfg  LoopConfig
	}{
		{"nil picker", nil, LoopConfig{}},
		{"attempts", b, LoopConfig{MaxAttempts: -1}},
		{"attempts big", b, LoopConfig{MaxAttempts: 1000}},
		{"hedge delay", b, LoopConfig{Hedge: HedgeConfig{Delay: -1}}},
		{"hedge percentile", b, LoopConfig{Hedge: HedgeConfig{Percentile: 1}}},
		{"hedge max", b, LoopConfig{Hedge: HedgeConfig{MaxHedges: -1}}},
	} {
		if _, err := NewLoop(tc.p, tc.cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
	}
}

func TestLoopConcurrent(t *testing.T) {
	b := newBalancer(t, "a", "b", "c")
	budget, _ := NewConcurrentBudget(DefaultConcurrentConfig())
	l, _ := NewLoop(b, LoopConfig{Budget: budget, Backoff: noBackoff{}, Hedge: HedgeConfig{Delay: time.Microsecond}})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				_ = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
					if (i+a.Number())%3 == 0 {
						return &StatusError{Code: 503}
					}
					if a.FirstToken() {
						return nil
					}
					return ctx.Err()
				})
			}
		}()
	}
	wg.Wait()
	assertIdle(t, b)
	if a, r := budget.Active(); a != 0 || r != 0 {
		t.Fatalf("budget still counts %d attempts, %d retries", a, r)
	}
}

func BenchmarkLoopDo(b *testing.B) {
	bal := newBalancer(b, "a", "b", "c", "d")
	for _, tc := range []struct {
		name string
		fail bool
	}{{"outcome=ok", false}, {"outcome=retry-once", true}} {
		l, _ := NewLoop(bal, LoopConfig{Backoff: noBackoff{}, Budget: unlimited{}})
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
					if tc.fail && a.Number() == 1 {
						return &StatusError{Code: 503}
					}
					a.FirstToken()
					return nil
				})
			}
		})
	}
}

// TestLoopLateFirstToken: FirstToken called by an attempt after its function
// returned (a goroutine it left behind) does not win the request: it
// returns false, and the retry that is running wins as usual.
func TestLoopLateFirstToken(t *testing.T) {
	for _, hedge := range []time.Duration{0, time.Hour} {
		synctest.Test(t, func(t *testing.T) {
			b := newBalancer(t, "a", "b", "c")
			l, err := NewLoop(b, LoopConfig{Backoff: noBackoff{}, Hedge: HedgeConfig{Delay: hedge}})
			if err != nil {
				t.Fatal(err)
			}
			var first *Attempt
			err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				if a.Number() == 1 {
					first = a
					return &StatusError{Code: 503}
				}
				if first.FirstToken() {
					t.Errorf("hedge %v: FirstToken of attempt 1, called after it failed, returned true", hedge)
				}
				if !a.FirstToken() {
					return errors.New("attempt 2 lost to attempt 1")
				}
				return nil
			})
			if err != nil {
				t.Fatalf("hedge %v: Do = %v, want nil", hedge, err)
			}
			if first.FirstToken() {
				t.Errorf("hedge %v: FirstToken of attempt 1 after Do returned true", hedge)
			}
			assertIdle(t, b)
		})
	}
}

// TestLoopAttemptPanics: an attempt function that panics on Do's goroutine
// leaves its pick finished and its budget returned, for a caller that
// recovers, as net/http does for a handler.
func TestLoopAttemptPanics(t *testing.T) {
	b := newBalancer(t, "a", "b")
	budget, err := NewConcurrentBudget(DefaultConcurrentConfig())
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLoop(b, LoopConfig{Budget: budget, Backoff: noBackoff{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, failFirst := range []bool{false, true} {
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Errorf("failFirst %v: recovered %v, want the attempt's panic", failFirst, v)
				}
			}()
			_ = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				if failFirst && a.Number() == 1 {
					return &StatusError{Code: 503} // the panic comes in a retry
				}
				a.FirstToken()
				panic("boom")
			})
			t.Errorf("failFirst %v: Do returned", failFirst)
		}()
		assertIdle(t, b)
		if a, r := budget.Active(); a != 0 || r != 0 {
			t.Errorf("failFirst %v: budget still counts %d attempts, %d retries", failFirst, a, r)
		}
	}
}

// reports records what a Reporter is told.
type reports struct {
	mu  sync.Mutex
	got map[string][]error
}

func (r *reports) Report(key string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = make(map[string][]error)
	}
	r.got[key] = append(r.got[key], err)
}

// outcomeBudget records the outcomes a budget is told.
type outcomeBudget struct {
	mu  sync.Mutex
	got []Outcome
}

func (*outcomeBudget) Start()         {}
func (*outcomeBudget) Withdraw() bool { return true }
func (b *outcomeBudget) Finish(_ bool, o Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, o)
}

// TestHedgeLoserFailsOnItsOwn: a primary whose upstream answers 503 just
// after a hedge won is the endpoint's failure, reported and counted as one;
// a primary the loop cancelled, or that failed otherwise, is not.
func TestHedgeLoserFailsOnItsOwn(t *testing.T) {
	// A loser's transport error may be the loop's cancellation: it is
	// not the endpoint's failure.
	for _, loser := range []error{nil, &StatusError{Code: 503}, errors.New("connection reset")} {
		fail := loser != nil && errors.As(loser, new(*StatusError))
		synctest.Test(t, func(t *testing.T) {
			b := newBalancer(t, "a", "b")
			rep := new(reports)
			budget := new(outcomeBudget)
			l, err := NewLoop(b, LoopConfig{Backoff: noBackoff{}, Budget: budget, Reporter: rep, Hedge: HedgeConfig{Delay: 10 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			won := make(chan struct{})
			err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				if !a.Hedge() {
					<-won
					if loser != nil {
						return loser
					}
					<-ctx.Done()
					return ctx.Err()
				}
				if !a.FirstToken() {
					t.Error("the hedge lost")
				}
				close(won)
				return nil
			})
			if err != nil {
				t.Fatalf("Do = %v", err)
			}
			slices.Sort(budget.got) // Succeeded, Failed, Abandoned
			want := []Outcome{Succeeded, Abandoned}
			if fail {
				want = []Outcome{Succeeded, Failed}
			}
			if !slices.Equal(budget.got, want) {
				t.Errorf("loser %v: outcomes %v, want %v", loser, budget.got, want)
			}
			primary := rep.got["a"]
			if fail && (len(primary) != 1 || primary[0] == nil) || !fail && len(primary) != 0 {
				t.Errorf("loser %v: primary's reports %v", loser, primary)
			}
			if hedge := rep.got["b"]; len(hedge) != 1 || hedge[0] != nil {
				t.Errorf("loser %v: hedge's reports %v, want [nil]", loser, hedge)
			}
			assertIdle(t, b)
		})
	}
}

// TestLoopDeadlineKeepsBudget: a retry given up because its wait would end
// after the deadline is never sent, and takes nothing from a PercentBudget.
func TestLoopDeadlineKeepsBudget(t *testing.T) {
	b := newBalancer(t, "a", "b")
	budget, err := NewPercentBudget(PercentConfig{TTL: 10 * time.Second, MinRetriesPerSec: 1, Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLoop(b, LoopConfig{Budget: budget, Backoff: noBackoff{}})
	if err != nil {
		t.Fatal(err)
	}
	before := budget.Available()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = l.Do(ctx, nil, func(context.Context, *Attempt) error {
		return &StatusError{Code: 429, Header: http.Header{"Retry-After": {"120"}}}
	})
	var ge *GiveUpError
	if !errors.As(err, &ge) || ge.Reason != "deadline" {
		t.Fatalf("Do = %v, want a give-up for the deadline", err)
	}
	if got := budget.Available(); got != before {
		t.Errorf("budget has %d retries after a retry that was not sent, want %d", got, before)
	}
	assertIdle(t, b)
}
