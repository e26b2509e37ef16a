package llmlb

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestAccountingLifecycle(t *testing.T) {
	p := &probe{pick: "ep1"}
	b := mustNew(t, p)
	mustUpdate(t, b, eps(3))
	ctx := context.Background()

	cases := []struct {
		name          string
		req           Request
		prefill, deco int64
	}{
		{"unknown output uses allowance", Request{PromptTokens: 1000}, 1000, DefaultDecodeAllowance},
		{"max tokens caps allowance", Request{PromptTokens: 10, MaxTokens: 32}, 10, 32},
		{"caller estimate wins", Request{PromptTokens: 10, MaxTokens: 32, OutputTokens: 700}, 10, 700},
		{"zero request", Request{}, 0, DefaultDecodeAllowance},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pk, err := b.Pick(ctx, &tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := pk.Endpoint().Key(); got != "ep1" {
				t.Fatalf("picked %s, want ep1", got)
			}
			s := statsByKey(b)["ep1"]
			if s.Outstanding != 1 || s.Queued != 1 || s.PrefillTokens != tc.prefill || s.DecodeTokens != tc.deco {
				t.Fatalf("after Pick: %+v, want 1 outstanding, 1 queued, %d prefill, %d decode", s, tc.prefill, tc.deco)
			}
			pk.FirstToken()
			pk.FirstToken()
			s = statsByKey(b)["ep1"]
			if s.Outstanding != 1 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != tc.deco {
				t.Fatalf("after FirstToken: %+v", s)
			}
			pk.Done(nil)
			pk.Done(errors.New("again"))
			pk.FirstToken()
			if s := statsByKey(b)["ep1"]; s != (EndpointStats{Key: "ep1", Healthy: true}) {
				t.Fatalf("after Done: %+v, want zero", s)
			}
		})
	}
}

func TestDoneWithoutFirstTokenReleasesPrefill(t *testing.T) {
	b := mustNew(t, &probe{pick: "ep0"})
	mustUpdate(t, b, eps(2))
	pk, err := b.Pick(context.Background(), &Request{PromptTokens: 50, OutputTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	pk.Done(errors.New("failed before first token"))
	if s := statsByKey(b)["ep0"]; s.Outstanding != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 || s.Queued != 0 {
		t.Fatalf("stats %+v, want zero", s)
	}
}

func TestCachedTokensAreNotPrefill(t *testing.T) {
	b := mustNew(t, policyFunc(func(c *Candidates) int { c.SetCachedTokens(300); return 0 }))
	mustUpdate(t, b, eps(2))
	pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s := statsByKey(b)[pk.Endpoint().Key()]; s.PrefillTokens != 700 {
		t.Fatalf("prefill %d, want 700", s.PrefillTokens)
	}
	pk.Done(nil)
	if s := statsByKey(b)[pk.Endpoint().Key()]; s.PrefillTokens != 0 {
		t.Fatalf("prefill %d after Done, want 0", s.PrefillTokens)
	}
}

type policyFunc func(c *Candidates) int

func (f policyFunc) Choose(c *Candidates) int { return f(c) }

// TestStaleHandleAfterReuse checks that a second Done on a handle whose
// storage now serves a later request leaves the later request charged.
func TestStaleHandleAfterReuse(t *testing.T) {
	b := mustNew(t, &probe{pick: "ep0"})
	mustUpdate(t, b, eps(1))
	ctx := context.Background()
	reused := 0
	for range 1000 {
		first, _ := b.Pick(ctx, &Request{PromptTokens: 7})
		first.Done(nil)
		second, _ := b.Pick(ctx, &Request{PromptTokens: 9})
		if first.rec == second.rec {
			reused++
		}
		first.Done(nil)
		first.FirstToken()
		s := statsByKey(b)["ep0"]
		if s.Outstanding != 1 || s.PrefillTokens != 9 || s.Queued != 1 {
			t.Fatalf("stale handle changed a live request's accounting: %+v", s)
		}
		second.Done(nil)
	}
	if reused == 0 {
		t.Skip("the pool never reused a record; nothing was exercised")
	}
}

func TestZeroPickIsInert(t *testing.T) {
	var p Pick
	p.FirstToken()
	p.Done(nil)
	if p.Endpoint() != nil {
		t.Fatal("zero Pick has an endpoint")
	}
}

func TestDoneAfterRemoval(t *testing.T) {
	b := mustNew(t, &probe{pick: "ep2"})
	mustUpdate(t, b, eps(3))
	pk, err := b.Pick(context.Background(), &Request{PromptTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	st := b.snap.Load().byKey["ep2"]
	mustUpdate(t, b, eps(2)) // ep2 leaves
	pk.FirstToken()
	pk.Done(nil)
	if st.outstanding() != 0 || st.prefillTokens() != 0 || st.decodeTokens() != 0 {
		t.Fatal("removed endpoint's counters not released")
	}
	mustUpdate(t, b, eps(3)) // ep2 returns with fresh accounting
	if s := statsByKey(b)["ep2"]; s.Outstanding != 0 {
		t.Fatalf("re-added endpoint inherited %d outstanding", s.Outstanding)
	}
}

func TestUpdateKeepsAccounting(t *testing.T) {
	b := mustNew(t, &probe{pick: "ep1"})
	mustUpdate(t, b, eps(2))
	pk, _ := b.Pick(context.Background(), nil)
	mustUpdate(t, b, []Endpoint{testEP{key: "ep1"}, testEP{key: "ep9"}})
	if s := statsByKey(b)["ep1"]; s.Outstanding != 1 {
		t.Fatalf("ep1 outstanding %d after update, want 1", s.Outstanding)
	}
	pk.Done(nil)
	if s := statsByKey(b)["ep1"]; s.Outstanding != 0 {
		t.Fatalf("ep1 outstanding %d after done, want 0", s.Outstanding)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	b := mustNew(t, P2C(nil))
	if _, err := b.Pick(ctx, nil); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("empty membership: %v, want ErrNoEndpoints", err)
	}
	mustUpdate(t, b, eps(3))

	t.Run("nil request is the zero request", func(t *testing.T) {
		pk, err := b.Pick(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
	})
	t.Run("nil context", func(t *testing.T) {
		pk, err := b.Pick(nil, nil) //lint:ignore SA1012 a nil context is tolerated, and this checks it
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
	})
	t.Run("cancelled context", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := b.Pick(cctx, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	})
	for _, r := range []Request{
		{PromptTokens: -1},
		{MaxTokens: -5},
		{OutputTokens: -1},
		{PromptTokens: math.MaxInt},
	} {
		t.Run("invalid "+strconv.Itoa(r.PromptTokens)+"/"+strconv.Itoa(r.MaxTokens), func(t *testing.T) {
			if _, err := b.Pick(ctx, &r); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("got %v, want ErrInvalidRequest", err)
			}
		})
	}
	t.Run("every endpoint excluded", func(t *testing.T) {
		_, err := b.Pick(ctx, &Request{Exclude: []string{"ep0", "ep1", "ep2"}})
		if !errors.Is(err, ErrNoCandidates) {
			t.Fatalf("got %v, want ErrNoCandidates", err)
		}
	})
	t.Run("exclusion honoured", func(t *testing.T) {
		for range 200 {
			pk, err := b.Pick(ctx, &Request{Exclude: []string{"ep0", "ep2"}})
			if err != nil {
				t.Fatal(err)
			}
			if k := pk.Endpoint().Key(); k != "ep1" {
				t.Fatalf("picked excluded %s", k)
			}
			pk.Done(nil)
		}
	})
	for _, tc := range []struct {
		name string
		eps  []Endpoint
	}{
		{"duplicate keys", []Endpoint{testEP{key: "a"}, testEP{key: "a"}}},
		{"nil endpoint", []Endpoint{testEP{key: "a"}, nil}},
		{"empty key", []Endpoint{testEP{key: ""}}},
		{"zero weight", []Endpoint{weightedEP{testEP{key: "a", weight: 0}}}},
		{"NaN weight", []Endpoint{weightedEP{testEP{key: "a", weight: math.NaN()}}}},
		{"Inf weight", []Endpoint{weightedEP{testEP{key: "a", weight: math.Inf(1)}}}},
		{"negative weight", []Endpoint{weightedEP{testEP{key: "a", weight: -1}}}},
	} {
		t.Run("update "+tc.name, func(t *testing.T) {
			if err := b.Update(tc.eps); !errors.Is(err, ErrInvalidEndpoints) {
				t.Fatalf("got %v, want ErrInvalidEndpoints", err)
			}
			if n := len(b.Stats()); n != 3 {
				t.Fatalf("membership changed to %d endpoints after a rejected update", n)
			}
		})
	}
	t.Run("unknown endpoint health", func(t *testing.T) {
		if err := b.SetHealthy("nope", false); !errors.Is(err, ErrUnknownEndpoint) {
			t.Fatalf("got %v, want ErrUnknownEndpoint", err)
		}
	})
	t.Run("empty update then pick", func(t *testing.T) {
		b2 := mustNew(t, RoundRobin())
		mustUpdate(t, b2, nil)
		if _, err := b2.Pick(ctx, nil); !errors.Is(err, ErrNoEndpoints) {
			t.Fatalf("got %v, want ErrNoEndpoints", err)
		}
	})
}

func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
		opt  Option
	}{
		{"nil policy", nil, WithDecodeAllowance(1)},
		{"nil option", P2C(nil), nil},
		{"nil clock", P2C(nil), WithClock(nil)},
		{"nil rand", P2C(nil), WithRand(nil)},
		{"nil signal", P2C(nil), WithSignal(nil, 0)},
		{"negative max age", P2C(nil), WithSignal(&fakeSignal{}, -time.Second)},
		{"negative allowance", P2C(nil), WithDecodeAllowance(-1)},
		{"negative window", P2C(nil), WithSlowStart(SlowStart{Window: -1})},
		{"NaN aggression", P2C(nil), WithSlowStart(SlowStart{Window: time.Second, Aggression: math.NaN()})},
		{"min weight over 100", P2C(nil), WithSlowStart(SlowStart{Window: time.Second, MinWeightPercent: 150})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.p, tc.opt); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("got %v, want ErrInvalidOption", err)
			}
		})
	}
	if _, err := WeightedLeastRequest(-1); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatal("negative bias accepted")
	}
}

func TestHealth(t *testing.T) {
	ctx := context.Background()
	b := mustNew(t, Random())
	mustUpdate(t, b, eps(3))
	if err := b.SetHealthy("ep1", false); err != nil {
		t.Fatal(err)
	}
	for range 300 {
		pk, err := b.Pick(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if pk.Endpoint().Key() == "ep1" {
			t.Fatal("picked an unhealthy endpoint while healthy ones remain")
		}
		pk.Done(nil)
	}
	if statsByKey(b)["ep1"].Healthy {
		t.Fatal("Stats reports ep1 healthy")
	}
	// Only the unhealthy endpoint is left once the others are excluded:
	// panic mode still routes rather than failing.
	pk, err := b.Pick(ctx, &Request{Exclude: []string{"ep0", "ep2"}})
	if err != nil || pk.Endpoint().Key() != "ep1" {
		t.Fatalf("panic mode: got %v, %v", pk.Endpoint(), err)
	}
	pk.Done(nil)
	// Busy is not unhealthy: a saturated endpoint stays a candidate.
	mustUpdate(t, b, eps(2)) // ep1 stays unhealthy across updates
	if statsByKey(b)["ep1"].Healthy {
		t.Fatal("health lost across Update")
	}
	if err := b.SetHealthy("ep1", true); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 200 {
		pk, _ := b.Pick(ctx, nil)
		seen[pk.Endpoint().Key()] = true
		pk.Done(nil)
	}
	if !seen["ep1"] {
		t.Fatal("recovered endpoint never picked")
	}
}

// TestConcurrentAccountingProperty runs random Pick, FirstToken, Done and
// Update from many goroutines and checks that no counter of any endpoint
// state ever seen goes negative and that all return exactly to zero.
func TestConcurrentAccountingProperty(t *testing.T) {
	const (
		workers = 8
		ops     = 20_000 // per worker: 160k operations in all
		pool    = 12
	)
	sig := &fakeSignal{}
	clock := newFakeClock()
	policies := []Policy{P2C(nil), LeastTokens(), RoundRobin(), Random(), LeastKV()}
	for _, pol := range policies {
		t.Run(policyName(pol), func(t *testing.T) {
			b, err := New(boundsCheck{t, pol}, WithSignal(sig, time.Minute), WithClock(clock),
				WithSlowStart(SlowStart{Window: time.Second}))
			if err != nil {
				t.Fatal(err)
			}
			var statesMu sync.Mutex
			states := map[*epState]bool{}
			record := func() {
				statesMu.Lock()
				for _, st := range b.snap.Load().eps {
					states[st] = true
				}
				statesMu.Unlock()
			}
			all := eps(pool)
			mustUpdate(t, b, all[:6])
			record()
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					var live []Pick
					for range ops {
						switch op := rng.IntN(100); {
						case op < 45:
							r := Request{PromptTokens: rng.IntN(5000), MaxTokens: rng.IntN(600), Choices: rng.IntN(3) * rng.IntN(9)}
							if rng.IntN(4) == 0 {
								r.Exclude = []string{"ep" + strconv.Itoa(rng.IntN(pool))}
							}
							pk, err := b.Pick(context.Background(), &r)
							if err == nil {
								live = append(live, pk)
							} else if !errors.Is(err, ErrNoCandidates) {
								t.Error(err)
								return
							}
						case op < 65 && len(live) > 0:
							live[rng.IntN(len(live))].FirstToken()
						case op < 93 && len(live) > 0:
							i := rng.IntN(len(live))
							live[i].Done(nil)
							if rng.IntN(3) == 0 { // a double Done, sometimes much later
								live[i].Done(nil)
							}
							live[i] = live[len(live)-1]
							live = live[:len(live)-1]
						case op < 95:
							lo := rng.IntN(pool - 1)
							hi := lo + 1 + rng.IntN(pool-lo-1)
							if err := b.Update(all[lo:hi]); err != nil {
								t.Error(err)
								return
							}
							record()
						case op < 97:
							k := "ep" + strconv.Itoa(rng.IntN(pool))
							_ = b.SetHealthy(k, rng.IntN(2) == 0)
						case op < 98:
							k := "ep" + strconv.Itoa(rng.IntN(pool))
							sig.Set(k, Load{At: clock.Now().Add(-time.Duration(rng.IntN(20)) * time.Millisecond),
								Running: rng.IntN(10), Waiting: rng.IntN(3), KVUsage: rng.Float64(), KVBlocks: 100, BlockSize: 16})
						default:
							clock.Advance(time.Millisecond * time.Duration(rng.IntN(50)))
							for _, st := range b.snap.Load().eps {
								if st.outstanding() < 0 || st.prefillTokens() < 0 || st.decodeTokens() < 0 || st.queued() < 0 {
									t.Errorf("negative counter on %s", st.key)
									return
								}
								st.mu.Lock()
								q, r := st.epQueued.Load(), st.epReqs.Load()
								runDone, waitDone := st.epRunDone.Load(), st.epWaitDone.Load()
								st.mu.Unlock()
								if q < 0 || q > r {
									t.Errorf("%s: %d of %d dispatches since the observation before their first token", st.key, q, r)
									return
								}
								if runDone < 0 || waitDone < 0 {
									t.Errorf("%s: %d running and %d waiting requests of the observation finished", st.key, runDone, waitDone)
									return
								}
							}
						}
					}
					for _, pk := range live {
						if rng.IntN(2) == 0 {
							pk.FirstToken()
						}
						pk.Done(nil)
					}
				}()
			}
			wg.Wait()
			for st := range states {
				if o, p, d, q := st.outstanding(), st.prefillTokens(), st.decodeTokens(), st.queued(); o != 0 || p != 0 || d != 0 || q != 0 || st.promptTokens() != 0 {
					t.Errorf("%s: outstanding %d prefill %d decode %d queued %d, want all 0", st.key, o, p, d, q)
				}
				st.mu.Lock()
				if st.epReqs.Load() != 0 || st.epQueued.Load() != 0 || st.epTokens.Load() != 0 {
					t.Errorf("%s: epoch counts %d/%d/%d, want 0", st.key, st.epReqs.Load(), st.epQueued.Load(), st.epTokens.Load())
				}
				st.mu.Unlock()
			}
		})
	}
}

// boundsCheck is a policy that checks every candidate's load estimate
// against its bounds before delegating: never negative, never below this
// balancer's own counts.
type boundsCheck struct {
	t *testing.T
	Policy
}

func (p boundsCheck) Choose(c *Candidates) int {
	for i := 0; i < c.Len(); i++ {
		l := c.Load(i)
		if l.Outstanding < 0 || l.Queued < 0 || l.Queued > l.Outstanding ||
			l.Requests < l.Outstanding || l.Waiting < l.Queued || l.backlog < l.Queued || l.KVUsage < 0 {
			p.t.Errorf("%s: estimate %+v out of bounds", c.Key(i), l)
		}
	}
	return p.Policy.Choose(c)
}

func policyName(p Policy) string {
	switch p.(type) {
	case p2c:
		return "p2c"
	case leastScore:
		return "least-score"
	case *roundRobin:
		return "round-robin"
	case random:
		return "random"
	}
	return "policy"
}

// TestConcurrentFirstTokenAndDone races FirstToken and two Dones of the same
// handle, and a stale Done of an earlier handle, on every request.
func TestConcurrentFirstTokenAndDone(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(2))
	var stale Pick
	for range 5000 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(4)
		go func() { defer wg.Done(); pk.FirstToken() }()
		go func() { defer wg.Done(); pk.Done(nil) }()
		go func() { defer wg.Done(); pk.Done(nil) }()
		go func(old Pick) { defer wg.Done(); old.Done(nil); old.FirstToken() }(stale)
		wg.Wait()
		stale = pk
		for _, s := range b.Stats() {
			if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
				t.Fatalf("after racing FirstToken and Done: %+v", s)
			}
		}
	}
}

// TestStatsOf checks that StatsOf reads one member as Stats reads it, and
// allocates nothing.
func TestStatsOf(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(3))
	p, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Done(nil)
	if err := b.SetHealthy("ep1", false); err != nil {
		t.Fatal(err)
	}
	for _, want := range b.Stats() {
		got, ok := b.StatsOf(want.Key)
		if !ok || got != want {
			t.Errorf("StatsOf(%q) = %+v, %v; Stats has %+v", want.Key, got, ok, want)
		}
	}
	if got, ok := b.StatsOf(p.Endpoint().Key()); !ok || got.Outstanding != 1 || got.PrefillTokens != 100 {
		t.Errorf("StatsOf of the picked endpoint = %+v, %v", got, ok)
	}
	if got, ok := b.StatsOf("ep1"); !ok || got.Healthy {
		t.Errorf("StatsOf(ep1) = %+v, %v after SetHealthy false", got, ok)
	}
	if got, ok := b.StatsOf("nope"); ok || got != (EndpointStats{}) {
		t.Errorf("StatsOf(nope) = %+v, %v", got, ok)
	}
	if n := testing.AllocsPerRun(100, func() { b.StatsOf("ep2") }); n != 0 {
		t.Errorf("StatsOf allocates %v times", n)
	}
}
