package llmlb

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// hold picks n requests on key through a probe balancer sharing b's states.
func holdOn(t *testing.T, b *Balancer, key string, n int, r Request) []Pick {
	t.Helper()
	var out []Pick
	for range n {
		c := candidatesPool.Get().(*Candidates)
		c.req = &r
		if err := c.init(b, b.snap.Load()); err != nil {
			t.Fatal(err)
		}
		st := b.snap.Load().byKey[key]
		out = append(out, b.commit(c, st))
		c.release()
	}
	return out
}

func TestLeastOutstandingNeverPicksBusier(t *testing.T) {
	b := mustNew(t, LeastOutstanding())
	mustUpdate(t, b, eps(8))
	rng := rand.New(rand.NewPCG(3, 4))
	var live []Pick
	for i := range 5000 {
		before := statsByKey(b)
		pk, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		got := before[pk.Endpoint().Key()].Outstanding
		for k, s := range before {
			if s.Outstanding < got {
				t.Fatalf("pick %d: chose %s with %d outstanding while %s had %d", i, pk.Endpoint().Key(), got, k, s.Outstanding)
			}
		}
		live = append(live, pk)
		for len(live) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(live))
			live[j].Done(nil)
			live = append(live[:j], live[j+1:]...)
		}
	}
}

// recordingScore wraps a score and records what it returned for each
// candidate of the current pick.
type recordingScore struct {
	seen map[int]float64
}

func (r *recordingScore) score(c *Candidates, i int, l *EndpointLoad) float64 {
	s := RequestsScore(c, i, l)
	r.seen[i] = s
	return s
}

func TestP2CNeverPicksWorseSample(t *testing.T) {
	rs := &recordingScore{}
	var chosen int
	inner := P2C(rs.score)
	pol := policyFunc(func(c *Candidates) int {
		rs.seen = map[int]float64{}
		chosen = inner.Choose(c)
		return chosen
	})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(16))
	rng := rand.New(rand.NewPCG(5, 6))
	var live []Pick
	distinct := 0
	for range 20000 {
		pk, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs.seen) != 2 {
			t.Fatalf("P2C scored %d candidates, want 2 distinct", len(rs.seen))
		}
		for i, s := range rs.seen {
			if s < rs.seen[chosen] {
				t.Fatalf("P2C chose candidate %d (score %v) over %d (score %v)", chosen, rs.seen[chosen], i, s)
			}
			if i != chosen && s != rs.seen[chosen] {
				distinct++
			}
		}
		live = append(live, pk)
		if rng.IntN(2) == 0 {
			j := rng.IntN(len(live))
			live[j].Done(nil)
			live = append(live[:j], live[j+1:]...)
		}
	}
	if distinct < 1000 {
		t.Fatalf("only %d picks had unequal samples; the test exercised little", distinct)
	}
}

func TestTiesAreRandom(t *testing.T) {
	// All endpoints idle: every full-scan policy must spread picks rather
	// than send everything to the first endpoint (SGLang issue 32983).
	for _, pol := range []Policy{LeastOutstanding(), LeastTokens(), LeastKV(), P2C(nil)} {
		b := mustNew(t, pol)
		mustUpdate(t, b, eps(4))
		counts := map[string]int{}
		for range 4000 {
			pk, _ := b.Pick(context.Background(), nil)
			counts[pk.Endpoint().Key()]++
			pk.Done(nil)
		}
		for k, n := range counts {
			if n < 800 || n > 1200 {
				t.Errorf("%T: %s got %d of 4000 picks among idle ties, want about 1000", pol, k, n)
			}
		}
		if len(counts) != 4 {
			t.Errorf("%T: only %d endpoints picked", pol, len(counts))
		}
	}
}

func TestRoundRobinAndRandom(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(3))
	var seq []string
	for range 6 {
		pk, _ := b.Pick(context.Background(), nil)
		seq = append(seq, pk.Endpoint().Key())
		pk.Done(nil)
	}
	for i := 3; i < 6; i++ {
		if seq[i] != seq[i-3] || seq[i] == seq[i-1] {
			t.Fatalf("round robin sequence %v is not a rotation", seq)
		}
	}
	b = mustNew(t, Random())
	mustUpdate(t, b, eps(5))
	counts := map[string]int{}
	for range 10000 {
		pk, _ := b.Pick(context.Background(), nil)
		counts[pk.Endpoint().Key()]++
		pk.Done(nil)
	}
	for k, n := range counts {
		if n < 1800 || n > 2200 {
			t.Errorf("random: %s got %d of 10000", k, n)
		}
	}
}

func TestWeightedLeastRequestRespectsWeights(t *testing.T) {
	pol, err := WeightedLeastRequest(DefaultActiveRequestBias)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	weights := []float64{1, 2, 3, 4}
	var members []Endpoint
	for i, w := range weights {
		members = append(members, weightedEP{testEP{key: string(rune('a' + i)), weight: w}})
	}
	mustUpdate(t, b, members)
	const picks = 100_000
	counts := map[string]int{}
	for range picks {
		pk, _ := b.Pick(context.Background(), nil)
		counts[pk.Endpoint().Key()]++
		pk.Done(nil)
	}
	for i, w := range weights {
		want := picks * w / 10
		got := float64(counts[string(rune('a'+i))])
		if math.Abs(got-want) > 0.05*want {
			t.Errorf("weight %v: %v picks, want %v within 5%%", w, got, want)
		}
	}
	// Under load the endpoint with fewer requests gains: hold 20 requests on
	// the heaviest endpoint and it must receive less than its share.
	held := holdOn(t, b, "d", 20, Request{})
	counts = map[string]int{}
	for range 10_000 {
		pk, _ := b.Pick(context.Background(), nil)
		counts[pk.Endpoint().Key()]++
		pk.Done(nil)
	}
	if counts["d"] > 1000 {
		t.Errorf("loaded heavy endpoint still got %d of 10000", counts["d"])
	}
	for _, p := range held {
		p.Done(nil)
	}
}

func TestSlowStartRamp(t *testing.T) {
	clock := newFakeClock()
	const window = 10 * time.Second
	for _, tc := range []struct {
		aggression float64
		at         time.Duration
		want       float64
	}{
		{1, 0, 0.1}, // max(1ms/10s, 10%)
		{1, window / 2, 0.5},
		{1, window, 1},
		{2, window / 2, math.Sqrt(0.5)},
		{1, window / 20, 0.1}, // floor
		{1, 2 * window, 1},
	} {
		p := &probe{}
		b := mustNew(t, p, WithClock(clock), WithSlowStart(SlowStart{Window: window, Aggression: tc.aggression}))
		mustUpdate(t, b, eps(2)) // initial members: no slow start
		start := clock.Now()
		mustUpdate(t, b, eps(3)) // ep2 joins
		clock.Advance(tc.at)
		pk, _ := b.Pick(context.Background(), nil)
		pk.Done(nil)
		if got := p.weights["ep2"]; math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("aggression %v at %v: factor %v, want %v", tc.aggression, tc.at, got, tc.want)
		}
		if got := p.weights["ep0"]; got != 1 {
			t.Errorf("initial member weight %v, want 1", got)
		}
		clock.Advance(-clock.Now().Sub(start))
	}
}

func TestSlowStartLimitsFlooding(t *testing.T) {
	clock := newFakeClock()
	b := mustNew(t, LeastOutstanding(), WithClock(clock), WithSlowStart(SlowStart{Window: time.Minute}))
	mustUpdate(t, b, eps(4))
	var live []Pick
	for range 400 { // 100 outstanding on each initial endpoint
		pk, _ := b.Pick(context.Background(), nil)
		live = append(live, pk)
	}
	mustUpdate(t, b, eps(5)) // ep4 joins idle
	got := 0
	for range 100 {
		pk, _ := b.Pick(context.Background(), nil)
		if pk.Endpoint().Key() == "ep4" {
			got++
		}
		live = append(live, pk)
	}
	// Without slow start ep4 would take all 100; at 10% weight it may hold
	// about a tenth of the others' 100 requests.
	if got > 20 {
		t.Fatalf("new endpoint took %d of 100 picks during slow start", got)
	}
	for _, p := range live {
		p.Done(nil)
	}
}

func TestHeavyTailLeastTokensBeatsRoundRobin(t *testing.T) {
	peakRR, meanRR := maxOutstandingWork(t, RoundRobin())
	peakLT, meanLT := maxOutstandingWork(t, LeastTokens())
	t.Logf("per-endpoint maximum of outstanding work: round robin peak %d mean %.0f; least tokens peak %d mean %.0f",
		peakRR, meanRR, peakLT, meanLT)
	if peakLT >= peakRR {
		t.Errorf("least tokens peak %d not below round robin %d", peakLT, peakRR)
	}
	if meanLT > 0.8*meanRR {
		t.Errorf("least tokens time-averaged maximum %.0f not 20%% below round robin %.0f", meanLT, meanRR)
	}
}

// maxOutstandingWork replays a heavy-tailed workload (log-normal tokens,
// CV^2 about 6) on 8 endpoints that each serve a fixed number of tokens per
// tick, first come first served, and returns the maximum outstanding work of
// any endpoint: its peak over the run and its mean over ticks.
func maxOutstandingWork(t *testing.T, pol Policy) (int64, float64) {
	const (
		endpoints = 8
		ticks     = 20_000
		perTick   = 1   // arrivals per tick
		service   = 150 // tokens per tick per endpoint: utilization about 0.83
	)
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(endpoints))
	rng := rand.New(rand.NewPCG(42, 42))
	type job struct {
		left int
		pk   Pick
	}
	queues := map[string][]*job{}
	var peak int64
	var sum float64
	sigma := math.Sqrt(math.Log(1 + 6.0)) // CV^2 = exp(sigma^2) - 1 = 6
	for tick := 0; tick < ticks; tick++ {
		for range perTick {
			cost := int(math.Exp(rng.NormFloat64()*sigma + math.Log(1000) - sigma*sigma/2))
			cost = min(max(cost, 1), 200_000)
			prompt := cost * 4 / 5
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: prompt, OutputTokens: cost - prompt + 1})
			if err != nil {
				t.Fatal(err)
			}
			k := pk.Endpoint().Key()
			queues[k] = append(queues[k], &job{left: cost, pk: pk})
		}
		keys := make([]string, 0, len(queues))
		for k := range queues {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			budget := service
			q := queues[k]
			for len(q) > 0 && budget > 0 {
				d := min(budget, q[0].left)
				q[0].left -= d
				budget -= d
				if q[0].left == 0 {
					q[0].pk.Done(nil)
					q = q[1:]
				}
			}
			queues[k] = q
		}
		var m int64
		for _, s := range b.Stats() {
			m = max(m, s.PrefillTokens+s.DecodeTokens)
		}
		peak = max(peak, m)
		sum += float64(m)
	}
	return peak, sum / ticks
}

// choiceFunc is a Policy that returns what its function does.
type choiceFunc func(c *Candidates) int

func (f choiceFunc) Choose(c *Candidates) int { return f(c) }

// TestInvalidPolicyErrors checks that every policy constructor rejects a
// configuration out of range with an error wrapping ErrInvalidPolicy, and
// that Pick reports a policy choosing a candidate that does not exist.
func TestInvalidPolicyErrors(t *testing.T) {
	ctors := map[string]func() (Policy, error){
		"PrefixAware/abs":   func() (Policy, error) { return PrefixAware(PrefixAwareConfig{AbsThreshold: -1}) },
		"PrefixAware/rel":   func() (Policy, error) { return PrefixAware(PrefixAwareConfig{RelThreshold: 0.5}) },
		"PrefixAware/match": func() (Policy, error) { return PrefixAware(PrefixAwareConfig{MatchThreshold: 2}) },
		"GIEDefault/weight": func() (Policy, error) { return GIEDefault(GIEConfig{QueueWeight: -1}) },
		"GIEDefault/nan":    func() (Policy, error) { return GIEDefault(GIEConfig{KVWeight: math.NaN()}) },
		"WeightedLeastRequest": func() (Policy, error) {
			return WeightedLeastRequest(math.Inf(1))
		},
		"Default/slots":   func() (Policy, error) { return Default(DefaultConfig{Slots: -1}) },
		"KVCost/weight":   func() (Policy, error) { return KVCost(KVCostConfig{OverlapScoreWeight: -1}) },
		"ConsistentHash":  func() (Policy, error) { return ConsistentHash(HashConfig{Balance: 0.5}) },
		"PrefixHash":      func() (Policy, error) { return PrefixHash(PrefixHashConfig{LoadFactor: 0.5}) },
		"Segregated/none": func() (Policy, error) { return Segregated() },
	}
	for name, ctor := range ctors {
		if _, err := ctor(); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%s: err %v, want one wrapping ErrInvalidPolicy", name, err)
		}
	}
	for _, choice := range []int{-1, 2} {
		b, err := New(choiceFunc(func(*Candidates) int { return choice }))
		if err != nil {
			t.Fatal(err)
		}
		mustUpdate(t, b, eps(2))
		if _, err := b.Pick(context.Background(), &Request{}); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("policy choosing %d of 2: err %v, want one wrapping ErrInvalidPolicy", choice, err)
		}
	}
}

// TestSlowStartAtUnixEpoch checks slow start with a clock that reads
// time.Unix(0, 0), a legitimate start for a fake clock: an endpoint added,
// or marked healthy again, at that instant ramps like at any other.
func TestSlowStartAtUnixEpoch(t *testing.T) {
	const window = 10 * time.Second
	cases := []struct {
		name   string
		before func(t *testing.T, b *Balancer) // a window before the epoch
		at     func(t *testing.T, b *Balancer) // at the epoch
	}{
		{
			name:   "added",
			before: func(*testing.T, *Balancer) {},
			at:     func(t *testing.T, b *Balancer) { mustUpdate(t, b, eps(3)) },
		},
		{
			name: "healthy again",
			// ep2 joins a window before the epoch, so its first slow
			// start ends at the epoch, when it recovers.
			before: func(t *testing.T, b *Balancer) { mustUpdate(t, b, eps(3)) },
			at: func(t *testing.T, b *Balancer) {
				if err := b.SetHealthy("ep2", false); err != nil {
					t.Fatal(err)
				}
				if err := b.SetHealthy("ep2", true); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(0, 0).Add(-window)}
			p := &probe{}
			b := mustNew(t, p, WithClock(clock), WithSlowStart(SlowStart{Window: window}))
			mustUpdate(t, b, eps(2)) // initial members: no slow start
			tc.before(t, b)
			clock.Advance(window)
			tc.at(t, b)
			clock.Advance(window / 2)
			pk, err := b.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pk.Done(nil)
			if got := p.weights["ep2"]; math.Abs(got-0.5) > 1e-9 {
				t.Errorf("weight of ep2 half way through its slow start %v, want 0.5", got)
			}
			if got := p.weights["ep0"]; got != 1 {
				t.Errorf("weight of initial member ep0 %v, want 1", got)
			}
			clock.Advance(window)
			pk, _ = b.Pick(context.Background(), nil)
			pk.Done(nil)
			if got := p.weights["ep2"]; got != 1 {
				t.Errorf("weight of ep2 after its slow start %v, want 1", got)
			}
		})
	}
}

// A clock that steps back restarts a joining endpoint's ramp from the new
// reading instead of holding it at the least weight for the step's length.
func TestSlowStartAfterTheClockStepsBack(t *testing.T) {
	clock := newFakeClock()
	const window = 10 * time.Second
	p := &probe{}
	b := mustNew(t, p, WithClock(clock), WithSlowStart(SlowStart{Window: window}))
	mustUpdate(t, b, eps(2))
	mustUpdate(t, b, eps(3)) // ep2 joins
	clock.Advance(window / 2)
	clock.Advance(-time.Hour)
	for _, tc := range []struct {
		after time.Duration
		want  float64
	}{{0, 0.1}, {window / 2, 0.5}, {window / 2, 1}} {
		clock.Advance(tc.after)
		pk, _ := b.Pick(context.Background(), nil)
		pk.Done(nil)
		if got := p.weights["ep2"]; math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%v after the step back and %v: factor %v, want %v", window/2, tc.after, got, tc.want)
		}
	}
}

// An observation stamped more than the maximum age ahead of the clock is
// not fresh: after the clock steps back, the observations taken before it
// must not count as fresh for the step's length.
func TestObservationFromTheFuture(t *testing.T) {
	clock := newFakeClock()
	b := mustNew(t, LeastOutstanding(), WithClock(clock), WithSignal(&fakeSignal{}, 10*time.Second))
	for _, tc := range []struct {
		ahead time.Duration
		fresh bool
	}{{-11 * time.Second, false}, {-10 * time.Second, true}, {0, true}, {10 * time.Second, true}, {11 * time.Second, false}, {time.Hour, false}} {
		obs := Load{At: clock.Now().Add(tc.ahead), Running: 1}
		if got := b.fresh(&obs, &clockReading{}); got != tc.fresh {
			t.Errorf("observation %v ahead: fresh %v, want %v", tc.ahead, got, tc.fresh)
		}
	}
}

// With a clock that goes back, the observer's latencies are 0, not negative.
func TestObserverLatenciesWhenTheClockGoesBack(t *testing.T) {
	clock := newFakeClock()
	var lat []time.Duration
	b := mustNew(t, RoundRobin(), WithClock(clock), WithObserver(&Observer{
		FirstToken: func(i FirstTokenInfo) { lat = append(lat, i.Latency) },
		Done:       func(i DoneInfo) { lat = append(lat, i.Latency) },
	}))
	mustUpdate(t, b, eps(2))
	pk, err := b.Pick(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(-time.Second)
	pk.FirstToken()
	pk.Done(nil)
	if len(lat) != 2 || lat[0] != 0 || lat[1] != 0 {
		t.Errorf("latencies %v, want [0 0]", lat)
	}
}
