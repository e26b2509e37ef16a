package llmlb

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// syntheticTTFT is an endpoint whose time to first token is a + work/rate,
// times lognormal noise of sigma 0.1, and 6 times longer for a share tail
// of the requests (a preemption, a lost prefix).
func syntheticTTFT(rng *rand.Rand, a, rate, work, tail float64) time.Duration {
	y := (a + work/rate) * math.Exp(0.1*rng.NormFloat64())
	if rng.Float64() < tail {
		y *= 6
	}
	return time.Duration(y * float64(time.Second))
}

// TestSpeedEstimateConverges checks that a cold estimate finds a synthetic
// endpoint's prefill rate in 200 requests, for several rates and overheads
// and 20 seeds each: within 5% with 10% noise, and with a tail of one
// request in fifty 6 times slower within 5% on average over the seeds and
// 12% on every one.
func TestSpeedEstimateConverges(t *testing.T) {
	cases := []struct {
		name    string
		a, rate float64 // seconds, tokens per second
	}{
		{"h100", 0.02, 50000},
		{"l4", 0.05, 8000},
		{"no-overhead", 0, 20000},
	}
	for _, c := range cases {
		for _, tail := range []float64{0, 0.02} {
			t.Run(c.name+"/tail="+strconv.FormatFloat(tail, 'g', -1, 64), func(t *testing.T) {
				limit := 0.05
				if tail > 0 {
					limit = 0.12
				}
				sum := 0.0
				for seed := uint64(1); seed <= 20; seed++ {
					rng := rand.New(rand.NewPCG(seed, 7))
					var e speedEstimate
					now := int64(0)
					for range 200 {
						work := 200 + rng.Float64()*12000
						now += int64(50 * time.Millisecond)
						e.firstToken(work, syntheticTTFT(rng, c.a, c.rate, work, tail), now)
					}
					got := 1 / math.Float64frombits(e.tau.Load())
					sum += got / c.rate
					if math.Abs(got/c.rate-1) > limit {
						t.Errorf("seed %d: rate %.0f tokens/s, want %.0f within %.0f%%", seed, got, c.rate, 100*limit)
					}
				}
				if mean := sum / 20; math.Abs(mean-1) > 0.05 {
					t.Errorf("mean rate %.3f of the true one, want within 5%%", mean)
				}
			})
		}
	}
}

// TestSpeedEstimateDecodeConverges checks the decode fit the same way.
func TestSpeedEstimateDecodeConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var e speedEstimate
	const perToken = 0.02 // seconds
	for i := range 200 {
		tokens := int64(16 + rng.IntN(1000))
		d := float64(tokens) * perToken * math.Exp(0.1*rng.NormFloat64())
		e.done(time.Duration(d*float64(time.Second)), tokens, int64(i), -1)
	}
	if got := math.Float64frombits(e.dtau.Load()); math.Abs(got/perToken-1) > 0.05 {
		t.Errorf("decode %.4f s/token, want %.4f within 5%%", got, perToken)
	}
}

// TestDecodeSlownessAtEqualLoad checks that decode slowness compares
// endpoints at the same load. Two endpoints take c*h(load) seconds per
// token, the second with twice the first's c; the faster one is measured
// while holding three times the tokens the slower one holds, as when a
// policy sends it more work. Their raw seconds per token then differ by far
// less than 2x. Compared at equal load they differ by 2x within 5% when
// the log of the time grows linearly with the load, as the estimate
// assumes, and within 15% when it grows as log(1 + load/40000), concave
// like an engine's decode step over its KV usage.
func TestDecodeSlownessAtEqualLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    func(load float64) float64
		tol  float64
	}{
		{"exponential", func(l float64) float64 { return math.Exp(l / 60000) }, 0.05},
		{"linear", func(l float64) float64 { return 1 + l/40000 }, 0.15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 8))
			var fast, slow speedEstimate
			observe := func(e *speedEstimate, c, meanLoad float64) {
				tokens := int64(16 + rng.IntN(1000))
				load := meanLoad * (0.5 + rng.Float64())
				perToken := c * tc.h(load) * math.Exp(0.05*rng.NormFloat64())
				e.done(time.Duration(perToken*float64(tokens)*float64(time.Second)), tokens, 0, load)
			}
			for range 200 {
				observe(&fast, 0.01, 90000)
				observe(&slow, 0.02, 30000)
			}
			var pool poolSpeed
			var f, s speedView
			f.load(&fast, 1, 0)
			s.load(&slow, 1, 0)
			pool.add(&f)
			pool.add(&s)
			raw := s.dtau / f.dtau
			if raw > 1.5 {
				t.Fatalf("raw ratio of seconds per token %.2f; the setup should hide the speeds", raw)
			}
			// Slowness moves from 1 by the confidence: undo it to compare
			// the fits.
			fit := func(p *poolSpeed, v *speedView) float64 {
				_, d := p.slowness(v, 0)
				return 1 + (d-1)/v.dg
			}
			if ratio := fit(&pool, &s) / fit(&pool, &f); math.Abs(ratio/2-1) > tc.tol {
				t.Errorf("decode slowness ratio %.3f at equal load (raw %.2f), want 2 within %.0f%%", ratio, raw, 100*tc.tol)
			}
			// Without the loads, the ratio is the raw one.
			f.loaded, s.loaded = false, false
			var raws poolSpeed
			raws.add(&f)
			raws.add(&s)
			if got := fit(&raws, &s) / fit(&raws, &f); math.Abs(got/raw-1) > 1e-9 {
				t.Errorf("decode slowness ratio without loads %.3f, want the raw %.3f", got, raw)
			}
		})
	}
}

// TestLoadArea checks the integral of an endpoint's outstanding tokens
// over time that decode observations are measured against: the mean load
// between two readings, overlapping requests, and no drift once every
// request is done.
func TestLoadArea(t *testing.T) {
	clock := newFakeClock()
	p, _ := Default(DefaultConfig{})
	bal, err := New(p, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.Update(eps(1)); err != nil {
		t.Fatal(err)
	}
	st := bal.snap.Load().eps[0]
	ctx := context.Background()
	area := func() int64 { return st.loadArea(clock.Now().UnixNano()) }
	// mean returns the mean tokens outstanding between two readings d
	// apart; areaTime's unit is 1024 ns.
	mean := func(a0, a1 int64, d time.Duration) float64 { return float64(a1-a0) / (float64(d) / 1024) }

	a0 := area()
	pa, err := bal.Pick(ctx, &Request{PromptTokens: 1000, OutputTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	a1 := area()
	if got := mean(a0, a1, time.Second); math.Abs(got/1200-1) > 1e-3 {
		t.Errorf("mean load over one request's first second %.1f, want 1200", got)
	}
	pb, err := bal.Pick(ctx, &Request{PromptTokens: 3000, OutputTokens: 800})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	a2 := area()
	if got := mean(a1, a2, 2*time.Second); math.Abs(got/5000-1) > 1e-3 {
		t.Errorf("mean load with both requests outstanding %.1f, want 5000", got)
	}
	pa.FirstToken()
	pa.Done(nil)
	clock.Advance(time.Second)
	a3 := area()
	if got := mean(a2, a3, time.Second); math.Abs(got/3800-1) > 1e-3 {
		t.Errorf("mean load after the first request is done %.1f, want 3800", got)
	}
	pb.Done(errors.New("failed"))
	a4 := area()
	clock.Advance(time.Hour)
	if a5 := area(); a5 != a4 {
		t.Errorf("the area moved by %d over an hour with nothing outstanding", a5-a4)
	}
	// The first request outstanding for 3 s, the second for 3 s.
	if got, want := mean(a0, a4, 4*time.Second), (1200.0*3+3800*3)/4; math.Abs(got/want-1) > 1e-3 {
		t.Errorf("mean load over the whole run %.1f, want %.1f", got, want)
	}
}

// TestSpeedEstimateTracksChange checks that an endpoint that halves its
// speed is seen slower within 200 requests and close to its new speed
// within 1000.
func TestSpeedEstimateTracksChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var e speedEstimate
	observe := func(n int, rate float64) {
		for range n {
			work := 200 + rng.Float64()*12000
			e.firstToken(work, syntheticTTFT(rng, 0.02, rate, work, 0.02), 0)
		}
	}
	pred := func() float64 {
		return math.Float64frombits(e.a.Load()) + math.Float64frombits(e.tau.Load())*6000
	}
	observe(1000, 50000)
	fast := pred()
	observe(200, 25000)
	if r := pred() / fast; r < 1.4 {
		t.Errorf("200 requests after halving its speed, the endpoint is predicted %.2fx slower, want at least 1.4x", r)
	}
	observe(800, 25000)
	if r := pred() / fast; math.Abs(r/2-1) > 0.1 {
		t.Errorf("1000 requests after halving its speed, the endpoint is predicted %.2fx slower, want 2x within 10%%", r)
	}
}

// learnPair returns two balancers over n endpoints on one fake clock and
// signal, seeded alike: one choosing with Default without learning, one
// with Default.
func learnPair(t *testing.T, n int, cfg DefaultConfig) (off, on *Balancer, clock *fakeClock, sig *fakeSignal) {
	t.Helper()
	clock, sig = newFakeClock(), &fakeSignal{}
	var bs [2]*Balancer
	for i, learn := range []bool{false, true} {
		cfg.DisableLearning = !learn
		p, err := Default(cfg)
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = mustNew(t, p, WithClock(clock), WithSignal(sig, 3*time.Second))
		mustUpdate(t, bs[i], eps(n))
	}
	return bs[0], bs[1], clock, sig
}

// pickPair picks req, the i-th request, on off and on and fails unless both
// chose the same endpoint.
func pickPair(t *testing.T, off, on *Balancer, req *Request, i int) (a, b Pick) {
	t.Helper()
	a, err := off.Pick(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if b, err = on.Pick(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if a.Endpoint().Key() != b.Endpoint().Key() {
		t.Fatalf("pick %d: learning off chose %s, learning on %s", i, a.Endpoint().Key(), b.Endpoint().Key())
	}
	return a, b
}

// TestLearnColdDecidesAsWithout checks that with learning on and no
// observation yet, Default makes exactly the choices it makes with learning
// off, on the same random source, over picks that build queues, share
// prefixes, and see signal observations; and that requests that end
// without a first token (failed, retried, cancelled) leave every estimate
// cold.
func TestLearnColdDecidesAsWithout(t *testing.T) {
	cases := []struct {
		name string
		cfg  DefaultConfig
	}{
		{"all", DefaultConfig{}},
		{"sampled", DefaultConfig{Sampled: 2}},
		{"slots", DefaultConfig{Slots: 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { testLearnCold(t, tc.cfg) })
	}
}

func testLearnCold(t *testing.T, cfg DefaultConfig) {
	off, on, clock, sig := learnPair(t, 8, cfg)
	rng := rand.New(rand.NewPCG(9, 9))
	prefixes := [][]uint64{{1, 2, 3, 4}, {1, 2, 5}, {7, 8, 9, 10, 11}, nil}
	var live [][2]Pick
	for i := range 3000 {
		clock.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
		if i%50 == 0 {
			for e := range 8 {
				sig.Set("ep"+strconv.Itoa(e), Load{At: clock.Now(), Running: rng.IntN(10), Waiting: rng.IntN(4), KVUsage: rng.Float64()})
			}
		}
		req := Request{PromptTokens: 16 + rng.IntN(8000), Prefix: prefixes[rng.IntN(len(prefixes))]}
		a, b := pickPair(t, off, on, &req, i)
		live = append(live, [2]Pick{a, b})
		for len(live) > 40 || (len(live) > 0 && rng.IntN(2) == 0) {
			j := rng.IntN(len(live))
			live[j][0].Done(errors.New("cancelled"))
			live[j][1].Done(errors.New("cancelled"))
			live = append(live[:j], live[j+1:]...)
		}
	}
	for _, st := range on.snap.Load().eps {
		if n := math.Float64frombits(st.est.count.Load()); n != 0 {
			t.Errorf("%s learned from %v requests that never streamed", st.key, n)
		}
	}
}

// TestLearnEvenPoolDecidesAsWithout checks that on endpoints of equal
// speed, measured with noise and a tail, Default with learning makes exactly
// the choices it makes with learning off: the differences between the fits are
// noise, and pricing them would only move requests at random.
func TestLearnEvenPoolDecidesAsWithout(t *testing.T) {
	for _, cfg := range []DefaultConfig{{}, {Sampled: 2}} {
		t.Run("sampled="+strconv.Itoa(cfg.Sampled), func(t *testing.T) {
			off, on, clock, _ := learnPair(t, 8, cfg)
			rng := rand.New(rand.NewPCG(4, 4))
			prefixes := [][]uint64{{1, 2, 3, 4}, {1, 2, 5}, {7, 8, 9, 10, 11}, {12}, nil}
			for i := range 2000 {
				req := Request{PromptTokens: 16 + rng.IntN(8000), OutputTokens: 1 + rng.IntN(400), Prefix: prefixes[rng.IntN(len(prefixes))]}
				a, b := pickPair(t, off, on, &req, i)
				clock.Advance(syntheticTTFT(rng, 0.02, 40000, float64(req.PromptTokens), 0.02))
				a.FirstToken()
				b.FirstToken()
				perToken := 0.02 * math.Exp(0.2*rng.NormFloat64())
				clock.Advance(time.Duration(perToken * float64(req.OutputTokens) * float64(time.Second)))
				a.Done(nil)
				b.Done(nil)
			}
			for _, st := range on.snap.Load().eps {
				if n := math.Float64frombits(st.est.count.Load()); n < 20 {
					t.Errorf("%s measured %v first tokens, want the pool measured", st.key, n)
				}
			}
		})
	}
}

// TestLearnRetestsAfterClockJump checks that a verdict that the pool is
// even stands for learnRecheck and no longer, even if the clock goes back:
// a slow endpoint measured meanwhile is priced at the next pick after that.
func TestLearnRetestsAfterClockJump(t *testing.T) {
	p, _ := Default(DefaultConfig{})
	dp := p.(*defaultPolicy)
	now := int64(1e18)
	if !dp.retest(now) {
		t.Fatal("a fresh policy does not test the pool")
	}
	dp.evenUntil.Store(now + int64(learnRecheck))
	for _, tc := range []struct {
		at   int64
		want bool
	}{
		{now, false},
		{now + int64(learnRecheck) - 1, false},
		{now + int64(learnRecheck), true},
		{now - 1, true}, // the clock went back: the verdict's end is too far ahead
		{now - int64(time.Hour), true},
	} {
		if got := dp.retest(tc.at); got != tc.want {
			t.Errorf("retest at %+d ns from the verdict = %v, want %v", tc.at-now, got, tc.want)
		}
	}
}

// TestLearnUpdatesOnlyFromStreamedRequests checks what teaches the
// estimate: the first token teaches prefill, a successful Done after it
// teaches decode, and a request that fails after streaming teaches no
// decode.
func TestLearnUpdatesOnlyFromStreamedRequests(t *testing.T) {
	p, _ := Default(DefaultConfig{})
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock))
	mustUpdate(t, b, eps(1))
	est := b.snap.Load().eps[0].est
	ctx := context.Background()
	req := &Request{PromptTokens: 1000}

	pk, _ := b.Pick(ctx, req)
	clock.Advance(time.Second)
	pk.Done(errors.New("retry elsewhere"))
	if n := math.Float64frombits(est.count.Load()); n != 0 {
		t.Fatalf("a request done before its first token counted: %v", n)
	}

	pk, _ = b.Pick(ctx, req)
	clock.Advance(100 * time.Millisecond)
	pk.FirstToken()
	clock.Advance(time.Second)
	pk.Done(errors.New("client went away"))
	if n, dn := math.Float64frombits(est.count.Load()), math.Float64frombits(est.dcount.Load()); n != 1 || dn != 0 {
		t.Fatalf("after a streamed request that failed: %v prefill, %v decode observations, want 1, 0", n, dn)
	}
	if tau, want := math.Float64frombits(est.tau.Load()), 0.1/1000; math.Abs(tau/want-1) > 1e-9 {
		t.Errorf("tau %v s/token, want %v", tau, want)
	}

	pk, _ = b.Pick(ctx, req)
	clock.Advance(100 * time.Millisecond)
	pk.FirstToken()
	clock.Advance(2560 * time.Millisecond)
	pk.Done(nil)
	if dn := math.Float64frombits(est.dcount.Load()); dn != 1 {
		t.Fatalf("decode observations %v, want 1", dn)
	}
	// The decode allowance is 256 tokens.
	if got, want := math.Float64frombits(est.dtau.Load()), 2.56/DefaultDecodeAllowance; math.Abs(got/want-1) > 1e-9 {
		t.Errorf("decode %v s/token, want %v", got, want)
	}
}

// TestLearnAvoidsSlowEndpoint checks that of two endpoints, one three times
// slower, Default with learning sends most requests to the fast one once it
// has measured both, while without learning it splits them evenly.
func TestLearnAvoidsSlowEndpoint(t *testing.T) {
	for _, learn := range []bool{false, true} {
		p, _ := Default(DefaultConfig{DisableLearning: !learn})
		clock := newFakeClock()
		b := mustNew(t, p, WithClock(clock))
		mustUpdate(t, b, eps(2))
		rng := rand.New(rand.NewPCG(1, 1))
		slow := 0
		for i := range 600 {
			req := &Request{PromptTokens: 100 + rng.IntN(4000)}
			pk, err := b.Pick(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			rate := 40000.0
			if pk.Endpoint().Key() == "ep1" {
				rate /= 3
				if i >= 400 {
					slow++
				}
			}
			clock.Advance(syntheticTTFT(rng, 0.02, rate, float64(req.PromptTokens), 0.02))
			pk.FirstToken()
			pk.Done(nil)
		}
		share := float64(slow) / 200
		t.Logf("learn %v: slow endpoint's share of the last 200 requests %.2f", learn, share)
		if learn && share > 0.2 {
			t.Errorf("with learning the slow endpoint got %.2f of the requests, want at most 0.2", share)
		}
		if !learn && (share < 0.35 || share > 0.65) {
			t.Errorf("without learning the slow endpoint got %.2f of the requests, want about half", share)
		}
	}
}

// TestLearnReplacesDeclaredWeight checks that a measured speed takes the
// place of a declared weight rather than adding to it: of two endpoints
// measured equally fast, the one that declares weight 4 gets about half the
// requests once both are measured, where without learning it gets most.
func TestLearnReplacesDeclaredWeight(t *testing.T) {
	for _, learn := range []bool{false, true} {
		p, _ := Default(DefaultConfig{DisableLearning: !learn})
		clock := newFakeClock()
		b := mustNew(t, p, WithClock(clock))
		mustUpdate(t, b, []Endpoint{weightedEP{testEP{key: "heavy", weight: 4}}, testEP{key: "light"}})
		if learn {
			// Both measured alike: the same TTFT for the same work and
			// the same decode time per token.
			rng := rand.New(rand.NewPCG(2, 2))
			now := clock.Now().UnixNano()
			for range 400 {
				work := float64(100 + rng.IntN(20000))
				ttft := syntheticTTFT(rng, 0.02, 40000, work, 0)
				for _, st := range b.snap.Load().eps {
					st.est.firstToken(work, ttft, now)
					st.est.done(time.Second, 100, now, -1)
				}
			}
		}
		rng := rand.New(rand.NewPCG(3, 3))
		var live []Pick
		heavy := 0
		const picks = 2000
		for range picks {
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100 + rng.IntN(4000), OutputTokens: 200})
			if err != nil {
				t.Fatal(err)
			}
			if pk.Endpoint().Key() == "heavy" {
				heavy++
			}
			live = append(live, pk)
			for len(live) > 24 {
				// Requests that end without a first token teach nothing:
				// the estimates stay as measured above.
				j := rng.IntN(len(live))
				live[j].Done(errors.New("cancelled"))
				live = append(live[:j], live[j+1:]...)
			}
		}
		share := float64(heavy) / picks
		t.Logf("learn %v: the endpoint declaring weight 4 got %.2f of the requests", learn, share)
		if learn && (share < 0.4 || share > 0.6) {
			t.Errorf("with learning the endpoint declaring weight 4 got %.2f of the requests, want about half", share)
		}
		if !learn && share < 0.7 {
			t.Errorf("without learning the endpoint declaring weight 4 got %.2f of the requests, want most", share)
		}
	}
}

// TestPoolSpeedTest checks when a pick prices measured speeds: not when
// the candidates' fits differ by their noise, and when they differ as a
// whole or one of them stands out; and that slowness is then exactly 1 for
// every candidate of an even pool.
func TestPoolSpeedTest(t *testing.T) {
	// view is a warm candidate whose prefill prediction is f times the
	// pool's (about) and decode df times, with relative standard error
	// se.
	view := func(f, df, se float64) speedView {
		return speedView{a: 0.05 * f, tau: 1e-5 * f, g: 0.97, se: se, dtau: 0.02 * df, dg: 0.97, dse: se, weight: 1}
	}
	rng := rand.New(rand.NewPCG(5, 5))
	cases := []struct {
		name    string
		f       func(i int) float64
		prefill bool // only the prefill differs
		uneven  bool
	}{
		{"equal", func(int) float64 { return 1 }, false, false},
		{"noise of one standard error", func(int) float64 { return 1 + 0.03*rng.NormFloat64() }, false, false},
		// Every fit 4 standard errors off: none stands out, all differ.
		{"two speeds", func(i int) float64 { return []float64{0.88, 1.12}[i%2] }, false, true},
		{"two prefill speeds", func(i int) float64 { return []float64{0.7, 1.3}[i%2] }, true, true},
		{"one slow among 32", func(i int) float64 { return []float64{1, 1.5}[min(i/31, 1)] }, false, true},
	}
	for _, tc := range cases {
		for _, n := range []int{8, 32} {
			if tc.name == "one slow among 32" && n != 32 {
				continue
			}
			vs := make([]speedView, n)
			var pool poolSpeed
			for i := range vs {
				f := tc.f(i)
				df := f
				if tc.prefill {
					df = 1
				}
				vs[i] = view(f, df, 0.03)
				pool.add(&vs[i])
			}
			pool.test(vs, nil, 2000)
			if pool.uneven != tc.uneven {
				t.Errorf("%s, %d candidates: uneven %v, want %v", tc.name, n, pool.uneven, tc.uneven)
			}
			if !pool.uneven {
				for i := range vs {
					if s, d := pool.slowness(&vs[i], 2000); pool.learned() && (s != 1 || d != 1) {
						t.Errorf("%s: candidate %d priced %v, %v in an even pool", tc.name, i, s, d)
					}
				}
			}
			// The same candidates, half of them picked.
			pick := []int32{}
			for i := 0; i < n; i += 2 {
				pick = append(pick, int32(i))
			}
			pool.test(vs, pick, 2000)
			if tc.name == "equal" && pool.uneven {
				t.Errorf("%s, picked: uneven", tc.name)
			}
		}
	}
}

// TestPoolTestComparesDecodeAtEqualLoad checks that the test of the pool
// compares decode times at equal load, as the price does: two fast
// endpoints carrying twice the load of six slow ones, at which their raw
// times per token are the slow ones' within the noise, still make the pool
// uneven; the same pool compared raw (loads unknown) is even, the verdict
// that once switched the pricing off whenever it had balanced the loads;
// and equal endpoints at unequal loads stay even.
func TestPoolTestComparesDecodeAtEqualLoad(t *testing.T) {
	const scale = 60000 // the load that multiplies a time per token by e
	// At these loads exp(2L/scale)*c equals exp(L/scale)*2c: the fast
	// endpoints' raw times per token are the slow ones'.
	light := scale * math.Ln2
	run := func(perToken func(i int) float64, meanLoad func(i int) float64) (uneven, raw bool) {
		rng := rand.New(rand.NewPCG(11, 12))
		const n = 8
		ests := make([]speedEstimate, n)
		now := int64(0)
		for range 300 {
			for i := range ests {
				now += int64(time.Millisecond)
				work := 1000 + 2000*rng.Float64()
				ests[i].firstToken(work, syntheticTTFT(rng, 0.05, 20000, work, 0), now)
				tokens := int64(16 + rng.IntN(1000))
				load := meanLoad(i) * (0.5 + rng.Float64())
				y := perToken(i) * math.Exp(load/scale) * math.Exp(0.05*rng.NormFloat64())
				ests[i].done(time.Duration(y*float64(tokens)*float64(time.Second)), tokens, now, load)
			}
		}
		test := func(loaded bool) bool {
			vs := make([]speedView, n)
			var pool poolSpeed
			for i := range vs {
				vs[i].load(&ests[i], 1, now)
				if !loaded {
					vs[i].loaded = false
				}
				pool.add(&vs[i])
			}
			pool.test(vs, nil, 2000)
			return pool.uneven
		}
		return test(true), test(false)
	}
	fast := func(i int) bool { return i < 2 }
	uneven, raw := run(func(i int) float64 {
		if fast(i) {
			return 0.01
		}
		return 0.02
	}, func(i int) float64 {
		if fast(i) {
			return 2 * light
		}
		return light
	})
	if !uneven {
		t.Error("endpoints twice as fast at twice the load: the pool tested even, want uneven")
	}
	if raw {
		t.Error("the same endpoints compared raw tested uneven; the setup should hide the speeds from raw times")
	}
	uneven, _ = run(func(int) float64 { return 0.015 }, func(i int) float64 {
		if fast(i) {
			return 2 * light
		}
		return light
	})
	if uneven {
		t.Error("equal endpoints at unequal loads tested uneven, want even")
	}
}

// TestPoolTestYoungSpreadFits checks a pool read early in a run of the
// Mooncake trace on equal replicas, whose first completions spread decode
// times per token widely: of eight decode fits three had a standard error, one
// a quarter of their geometric mean, one nearly four times it. Counted as
// log ratios in the fits' log-scale standard errors the differences are
// noise; counted as relative differences (3.8 - 1 for the second fit)
// they made the pool uneven.
func TestPoolTestYoungSpreadFits(t *testing.T) {
	view := func(perToken, dg, dse float64) speedView {
		return speedView{
			a: 0.05, tau: 1e-5, g: 0.5, se: 0.25, // prefill as the pool's
			dtau: 0.02 * perToken, dg: dg, dse: dse, weight: 1,
			loaded: true, lload: 30000, llog: math.Log(0.02 * perToken),
			lcov: -1, lvar: 1e8, // no growth with the load measured
		}
	}
	vs := []speedView{
		view(0.27, 0.46, 0.355), view(3.88, 0.43, 0.16), view(1.05, 0.49, 0.356),
		view(1.01, 0.27, 0), view(1.51, 0.27, 0), view(0.81, 0.38, 0), view(0.81, 0.33, 0), view(0.17, 0.27, 0),
	}
	var pool poolSpeed
	for i := range vs {
		pool.add(&vs[i])
	}
	pool.test(vs, nil, 2000)
	if pool.uneven {
		t.Error("three young fits of widely spread times made the pool uneven")
	}
	// The same fits, each as many observations further: the same spread
	// is now a difference.
	for i := range vs {
		vs[i].dse /= 3
	}
	pool.test(vs, nil, 2000)
	if !pool.uneven {
		t.Error("the same spread at a third of the standard errors left the pool even")
	}
}

// TestSlownessColdIsOne checks that a cold candidate's slowness is exactly 1
// whatever the pool learned, and a warm one's is bounded.
// TestPoolTestLeavesOutYoungFits checks that a fit of a few requests, whose
// error is not measured yet, does not make a pool of equal
// replicas uneven however far its extrapolation lands, and that the same
// endpoint, once measured slower, does.
func TestPoolTestLeavesOutYoungFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	const n = 32
	ests := make([]speedEstimate, n)
	now := int64(0)
	observe := func(e *speedEstimate, a, rate, work float64) {
		now += int64(time.Millisecond)
		e.firstToken(work, syntheticTTFT(rng, a, rate, work, 0), now)
		e.done(time.Duration(float64(200*time.Millisecond)*a/0.05*(0.95+0.1*rng.Float64())), 10, now, -1)
	}
	for range 20 {
		for i := range n - 1 {
			observe(&ests[i], 0.05, 20000, 1000+2000*rng.Float64())
		}
	}
	// Two requests of a few tokens, each stuck behind a queue: a line
	// through them predicts seconds for a long prompt.
	young := &ests[n-1]
	for range 2 {
		now += int64(time.Millisecond)
		young.firstToken(16, 400*time.Millisecond, now)
	}
	test := func() (uneven bool, r float64) {
		vs := make([]speedView, n)
		var pool poolSpeed
		for i := range vs {
			vs[i].load(&ests[i], 1, now)
			pool.add(&vs[i])
		}
		pool.test(vs, nil, 2000)
		pre := (pool.a + pool.tau*2000) / pool.g
		return pool.uneven, (vs[n-1].a + vs[n-1].tau*2000) / pre
	}
	if se := math.Float64frombits(young.se.Load()); se != 0 {
		t.Fatalf("a fit of 2 requests publishes a standard error of %v, want none", se)
	}
	if uneven, r := test(); uneven {
		t.Errorf("a fit of 2 requests predicting %.0fx the pool's made equal replicas uneven", r)
	} else if r < 16 {
		t.Fatalf("the young fit predicts %.1fx the pool's: not the extrapolation this test needs", r)
	}
	// The same endpoint, measured at twice the others' times.
	for range 20 {
		observe(young, 0.1, 10000, 1000+2000*rng.Float64())
	}
	if uneven, r := test(); !uneven {
		t.Errorf("an endpoint measured %.1fx slower left the pool even", r)
	}
}

func TestSlownessColdIsOne(t *testing.T) {
	var warm speedEstimate
	for i := range 100 {
		warm.firstToken(float64(1000+i*10), time.Duration(1000+i*10)*time.Millisecond, 0)
		warm.done(time.Second, 10, 0, float64(i*100))
	}
	var pool poolSpeed
	var w, c speedView
	w.load(&warm, 1, 0)
	c.load(nil, 1, 0)
	pool.add(&w)
	pool.add(&c)
	for _, work := range []float64{0, 1, 1e6, 1e12} {
		if s, d := pool.slowness(&c, work); s != 1 || d != 1 {
			t.Errorf("cold slowness at work %v = %v, %v; want exactly 1, 1", work, s, d)
		}
		if s, d := pool.slowness(&w, work); !(s > 0 && s <= learnMaxSlowness) || !(d > 0 && d <= learnMaxSlowness) {
			t.Errorf("warm slowness at work %v = %v, %v; want in (0, %v]", work, s, d, learnMaxSlowness)
		}
	}
}

// FuzzSpeedEstimate feeds an estimate arbitrary observations (zero,
// negative, huge, NaN and infinite latencies and works, clocks that jump
// either way) and checks that everything it publishes, and the slowness
// the policy derives from it, stays finite and positive, and that the test
// of the pool reaches the same verdict however the candidates are listed.
func FuzzSpeedEstimate(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x00\x00\x00\x00\x00\xf0\x7f"))
	f.Add([]byte("\x01\x00\x00\x00\x00\x00\x00\x80\x02\x00\x00\x00\x00\x00\x00\x00"))
	special := []float64{0, -1, 1, 1e-300, 5e-324, 1e300, math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN(), 4096, 0.5}
	f.Fuzz(func(t *testing.T, data []byte) {
		var est, other speedEstimate
		other.firstToken(1000, time.Second, 0)
		other.done(time.Second, 100, 0, 5000)
		rng := rand.New(rand.NewPCG(uint64(len(data)), 1))
		next := func() float64 {
			if len(data) == 0 {
				return special[rng.IntN(len(special))]
			}
			b := data[0]
			data = data[1:]
			if b < 128 || len(data) < 8 {
				return special[int(b)%len(special)]
			}
			var u uint64
			for _, c := range data[:8] {
				u = u<<8 | uint64(c)
			}
			data = data[8:]
			return math.Float64frombits(u)
		}
		dur := func(x float64) time.Duration {
			if math.IsNaN(x) {
				return 0
			}
			return time.Duration(min(max(x*float64(time.Second), math.MinInt64), math.MaxInt64))
		}
		for range 300 {
			work, y, now := next(), next(), int64(dur(next()))
			est.firstToken(work, dur(y), now)
			est.done(dur(next()), int64(dur(next())), now, next())
			for _, v := range []float64{
				math.Float64frombits(est.a.Load()), math.Float64frombits(est.tau.Load()),
				math.Float64frombits(est.dtau.Load()), math.Float64frombits(est.count.Load()),
				math.Float64frombits(est.dcount.Load()), math.Float64frombits(est.se.Load()),
				math.Float64frombits(est.dse.Load()), math.Float64frombits(est.lload.Load()),
				math.Float64frombits(est.lvar.Load()),
			} {
				if !(v >= 0) || math.IsInf(v, 0) {
					t.Fatalf("estimate published %v", v)
				}
			}
			for _, v := range []float64{math.Float64frombits(est.llog.Load()), math.Float64frombits(est.lcov.Load())} {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("estimate published load moment %v", v)
				}
			}
			var pool poolSpeed
			var a, b speedView
			a.load(&est, 1, now)
			b.load(&other, 2, now)
			pool.add(&a)
			pool.add(&b)
			// The test of the pool reads the standard errors: any verdict
			// will do, but it must not depend on a NaN.
			vs := []speedView{a, b}
			pool.test(vs, nil, math.Abs(work))
			uneven := pool.uneven
			pool.test(vs, []int32{1, 0}, math.Abs(work))
			if pool.uneven != uneven {
				t.Fatalf("the test found the pool uneven %v over all candidates, %v over the same picked", uneven, pool.uneven)
			}
			for _, v := range []*speedView{&a, &b} {
				s, d := pool.slowness(v, math.Abs(work))
				if !(s > 0) || math.IsInf(s, 0) || !(d > 0) || math.IsInf(d, 0) {
					t.Fatalf("slowness %v, %v at work %v", s, d, work)
				}
			}
			if len(data) == 0 && rng.IntN(20) == 0 {
				return
			}
		}
	})
}

// BenchmarkPickLearn measures Pick, FirstToken and Done of Default, with
// learning off and on; with it on, the estimates are warm (each first token
// comes 1 ms after its pick on a fake clock) and every iteration updates
// one.
func BenchmarkPickLearn(b *testing.B) {
	for _, n := range []int{8, 64} {
		for _, learn := range []bool{false, true} {
			b.Run("learn="+strconv.FormatBool(learn)+"/endpoints="+strconv.Itoa(n), func(b *testing.B) {
				p, _ := Default(DefaultConfig{DisableLearning: !learn})
				clock := newFakeClock()
				bal := benchBalancer(b, p, n, WithClock(clock))
				ctx := context.Background()
				req := &Request{PromptTokens: 1000, MaxTokens: 256}
				b.ReportAllocs()
				for b.Loop() {
					pk, err := bal.Pick(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					clock.Advance(time.Millisecond)
					pk.FirstToken()
					pk.Done(nil)
				}
			})
		}
	}
}

// TestLearnPickDoesNotAllocate checks that Pick, FirstToken and Done of
// Default with learning allocate nothing once the estimates are warm.
func TestLearnPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	p, _ := Default(DefaultConfig{})
	clock := newFakeClock()
	bal := mustNew(t, p, WithClock(clock))
	mustUpdate(t, bal, eps(64))
	req := &Request{PromptTokens: 1000, MaxTokens: 256}
	step := func() {
		pk, err := bal.Pick(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Millisecond)
		pk.FirstToken()
		clock.Advance(time.Millisecond)
		pk.Done(nil)
	}
	for range 1000 {
		step()
	}
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Errorf("%v allocs per pick with learning, want 0", allocs)
	}
}

// TestFootprintSlowness checks the footprint's factor against the power it
// computes without math.Pow.
func TestFootprintSlowness(t *testing.T) {
	for _, sd := range []float64{1.0 / learnMaxSlowness, 0.5, 0.9, 1, 1.1, 2, learnMaxSlowness} {
		if got, want := footprintSlowness(sd), math.Pow(sd, 1.5); math.Abs(got/want-1) > 1e-12 {
			t.Errorf("footprintSlowness(%v) = %v, want %v", sd, got, want)
		}
	}
}

// TestLogMaxSlowness checks the constant against the bound it is the log of.
func TestLogMaxSlowness(t *testing.T) {
	if got, want := logMaxSlowness, math.Log(learnMaxSlowness); math.Abs(got-want) > 1e-15 {
		t.Fatalf("logMaxSlowness = %v, want log(%v) = %v", got, learnMaxSlowness, want)
	}
}

// TestPoolTestPrefillLogUnits replays a pick behind 16 routers sharing equal
// replicas, where every router's fits are young: one fit that had seen only
// short prompts predicts, at this pick's work, about four times the pool's
// time. In standard errors of its log-scale fit that is within what 14
// noisy fits produce, and the pool tests even; counted as a relative
// difference it read as an outlier. The same fit at a third of the
// standard error (nine times the observations) is a difference.
func TestPoolTestPrefillLogUnits(t *testing.T) {
	const work = 2000
	view := func(predict, g, se float64) speedView {
		return speedView{a: predict / 2, tau: predict / 2 / work, g: g, se: se, weight: 1}
	}
	vs := make([]speedView, 14)
	for i := range 13 {
		vs[i] = view(0.1, 0.45, 0.12)
	}
	vs[13] = view(0.5, 0.426, 0.143)
	var pool poolSpeed
	for i := range vs {
		pool.add(&vs[i])
	}
	pre, _ := pool.slowness(&vs[13], work)
	if r := 1 + (pre-1)/0.426; r < 3.5 || r > 4.5 {
		t.Fatalf("the young fit reads %.2f times the pool, want about 4", r)
	}
	pool.test(vs, nil, work)
	if pool.uneven {
		t.Error("one young fit extrapolated to four times the pool made 14 equal replicas uneven")
	}
	vs[13].se /= 3
	pool = poolSpeed{}
	for i := range vs {
		pool.add(&vs[i])
	}
	pool.test(vs, nil, work)
	if !pool.uneven {
		t.Error("the same ratio at a third of the standard error left the pool even")
	}
}

// TestLearnDecodeOfFirstTokenAtUnixEpoch checks that a request whose first
// token streams at the clock reading time.Unix(0, 0), a natural start for a
// fake clock, still measures its decode: that reading is a time like any
// other, not the absence of a first token.
func TestLearnDecodeOfFirstTokenAtUnixEpoch(t *testing.T) {
	p, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Unix(0, 0)}
	b := mustNew(t, p, WithClock(clock))
	mustUpdate(t, b, eps(1))
	est := b.snap.Load().eps[0].est
	pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	pk.FirstToken()
	clock.Advance(2560 * time.Millisecond)
	pk.Done(nil)
	if n, dn := math.Float64frombits(est.count.Load()), math.Float64frombits(est.dcount.Load()); n != 1 || dn != 1 {
		t.Fatalf("%v prefill and %v decode observations, want 1 and 1", n, dn)
	}
	if got, want := math.Float64frombits(est.dtau.Load()), 2.56/DefaultDecodeAllowance; math.Abs(got/want-1) > 1e-9 {
		t.Errorf("decode %v s/token, want %v", got, want)
	}
}

// BenchmarkPickLearnUneven measures a pick of Default whose candidates'
// speeds differ (the odd endpoints take three times as long per token),
// with 32 requests in flight, without and with latency objectives: the
// path that prices speeds and, with objectives, decode misses.
func BenchmarkPickLearnUneven(b *testing.B) {
	for _, n := range []int{8, 64} {
		for _, slo := range []bool{false, true} {
			b.Run("objectives="+strconv.FormatBool(slo)+"/endpoints="+strconv.Itoa(n), func(b *testing.B) {
				cfg := DefaultConfig{}
				if slo {
					cfg.TTFTObjective, cfg.TPOTObjective = 2*time.Second, 50*time.Millisecond
				}
				p, _ := Default(cfg)
				clock := newFakeClock()
				bal := benchBalancer(b, p, n, WithClock(clock))
				run := unevenRun(bal, clock)
				for range 4096 { // warm the estimates
					run()
				}
				b.ReportAllocs()
				for b.Loop() {
					run()
				}
			})
		}
	}
}

// unevenRun returns a step that picks a request, sees its first token
// after a time per prompt token three times as long on the odd endpoints,
// and completes the oldest of the 32 requests in flight after a decode as
// slow, so that the estimates of a pool of two speeds stay warm.
func unevenRun(bal *Balancer, clock *fakeClock) func() {
	ctx := context.Background()
	req := &Request{PromptTokens: 1000, MaxTokens: 256}
	var ring [32]Pick
	k := 0
	return func() {
		pk, err := bal.Pick(ctx, req)
		if err != nil {
			panic(err)
		}
		slow := time.Duration(1)
		if key := pk.Endpoint().Key(); (key[len(key)-1]-'0')%2 == 1 {
			slow = 3
		}
		clock.Advance(slow * 50 * time.Microsecond)
		pk.FirstToken()
		old := ring[k]
		ring[k] = pk
		k = (k + 1) % len(ring)
		clock.Advance(slow * 50 * time.Microsecond)
		old.Done(nil)
	}
}

// TestLearnSilenceAgesEvidence checks that an endpoint avoided for being
// slow is measured anew when it is tried again after a silence: the
// observation that ends the silence must not bring the aged evidence back
// at its full weight. ep0's first tokens are slow for 40 requests, then as
// fast as ep1's again; after five minutes without a request to it (ten
// half-lives), sequential requests to an idle pool should go to either
// endpoint about as often. They used to go to ep1 alone: the first request
// ep0 was tried with restored its confidence from the silence's 0.1% to
// 97%, its fit still that of its slow spell, and it was avoided for another
// silence.
func TestLearnSilenceAgesEvidence(t *testing.T) {
	p, _ := Default(DefaultConfig{})
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock))
	mustUpdate(t, b, eps(2))
	slow := false
	run := func(exclude []string) string {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 10, Exclude: exclude})
		if err != nil {
			t.Fatal(err)
		}
		key := pk.Endpoint().Key()
		ttft := 100 * time.Millisecond
		if slow && key == "ep0" {
			ttft *= 8
		}
		clock.Advance(ttft)
		pk.FirstToken()
		clock.Advance(200 * time.Millisecond)
		pk.Done(nil)
		clock.Advance(100 * time.Millisecond)
		return key
	}
	for range 200 {
		run(nil)
	}
	slow = true
	for range 40 {
		run([]string{"ep1"})
	}
	slow = false
	clock.Advance(5 * time.Minute)
	n := 0
	for range 200 {
		if run(nil) == "ep0" {
			n++
		}
	}
	share := float64(n) / 200
	t.Logf("the recovered endpoint's share after the silence %.2f", share)
	if share < 0.3 {
		t.Errorf("the endpoint slow before a silence of 5 minutes got %.2f of the requests after it, want about half", share)
	}
}

// TestSpeedEstimateSilence checks the confidence an estimate reads right
// after an observation that ends a silence, for the prefill and the
// decode: after a silence of up to a half-life the evidence is as before
// (the window alone forgets the observations of an endpoint in use), and
// after a longer one it is aged by the half-life for the time beyond the
// first. An endpoint in steady light use, observed every 40 s, keeps its
// evidence over an interval of a minute.
func TestSpeedEstimateSilence(t *testing.T) {
	var light speedEstimate
	now := int64(time.Hour)
	for range 400 {
		now += int64(40 * time.Second)
		light.firstToken(1000, 100*time.Millisecond, now)
		light.done(time.Second, 50, now, 1000)
	}
	before := math.Float64frombits(light.count.Load())
	now += int64(time.Minute)
	light.firstToken(1000, 100*time.Millisecond, now)
	light.done(time.Second, 50, now, 1000)
	want := before*(1-1.0/learnWindow) + 1
	for _, got := range []float64{math.Float64frombits(light.count.Load()), math.Float64frombits(light.dcount.Load())} {
		if math.Abs(got-want) > 1e-9*want {
			t.Errorf("observed every 40 s, then after a minute: count %.6g, want %.6g", got, want)
		}
	}

	for _, quiet := range []time.Duration{0, learnHalfLife, 3 * learnHalfLife, 10 * learnHalfLife} {
		var e speedEstimate
		now = int64(time.Hour)
		for range 400 {
			now += int64(100 * time.Millisecond)
			e.firstToken(1000, 100*time.Millisecond, now)
			e.done(time.Second, 50, now, 1000)
		}
		before = math.Float64frombits(e.count.Load())
		now += int64(quiet)
		e.firstToken(1000, 100*time.Millisecond, now)
		e.done(time.Second, 50, now, 1000)
		keep := 1 - 1.0/learnWindow
		want = before*keep + 1
		if quiet > learnHalfLife {
			want = before*math.Exp2(-float64(quiet-learnHalfLife)/float64(learnHalfLife))*keep + 1
		}
		for _, got := range []float64{math.Float64frombits(e.count.Load()), math.Float64frombits(e.dcount.Load())} {
			if math.Abs(got-want) > 1e-9*want {
				t.Errorf("after a silence of %v: count %.6g, want %.6g", quiet, got, want)
			}
		}
		t.Logf("silence %v: confidence %.3f", quiet, confidence(math.Float64frombits(e.count.Load()), e.at.Load(), now))
	}
}
