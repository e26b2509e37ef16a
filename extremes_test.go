package llmlb

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// busyPicks loads ep0 of two endpoints with busy requests (sent there by
// excluding ep1), then returns how many of 100 picks, each done at once,
// go to ep0. Afterwards it checks that the accounting is back to zero.
func busyPicks(t *testing.T, b *Balancer, busy int) int {
	t.Helper()
	ctx := context.Background()
	held := make([]Pick, 0, busy)
	for range busy {
		pk, err := b.Pick(ctx, &Request{PromptTokens: 100, MaxTokens: 10, Exclude: []string{"ep1"}})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, pk)
	}
	n := 0
	for range 100 {
		pk, err := b.Pick(ctx, &Request{PromptTokens: 100, MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		if pk.Endpoint().Key() == "ep0" {
			n++
		}
		pk.Done(nil)
	}
	for _, pk := range held {
		pk.Done(nil)
	}
	for _, s := range b.Stats() {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			t.Errorf("accounting not back to zero after every Done: %+v", s)
		}
	}
	return n
}

// A cost function's weight that its constructor accepts must leave the
// costs comparable: a weight so large that every busy candidate costs +Inf
// (or NaN) would route at random. Each weight is either rejected with
// ErrInvalidPolicy or routes away from an endpoint holding 200 requests.
func TestCostWeightsAtTheirExtremes(t *testing.T) {
	policies := map[string]func(w float64) (Policy, error){
		"Default.CacheWeight":     func(w float64) (Policy, error) { return Default(DefaultConfig{CacheWeight: w}) },
		"Default.FootprintWeight": func(w float64) (Policy, error) { return Default(DefaultConfig{FootprintWeight: w}) },
		"Default.KVPenalty":       func(w float64) (Policy, error) { return Default(DefaultConfig{KVPenalty: w}) },
		"Default.OverloadWeight":  func(w float64) (Policy, error) { return Default(DefaultConfig{OverloadWeight: w}) },
		"Default.QueueWeight":     func(w float64) (Policy, error) { return Default(DefaultConfig{QueueWeight: w}) },
		"Default.SlotWeight":      func(w float64) (Policy, error) { return Default(DefaultConfig{SlotWeight: w, Slots: 1}) },
		"KVCost.OverlapScoreWeight": func(w float64) (Policy, error) {
			cfg := DynamoKVCostConfig()
			cfg.OverlapScoreWeight = w
			return KVCost(cfg)
		},
		"KVCost.ActiveWeight": func(w float64) (Policy, error) {
			cfg := DynamoKVCostConfig()
			cfg.ActiveWeight = w
			return KVCost(cfg)
		},
	}
	for name, mk := range policies {
		for _, w := range []float64{documentedCostWeightBound, 1e300, math.MaxFloat64} {
			p, err := mk(w)
			if err != nil {
				if !errors.Is(err, ErrInvalidPolicy) {
					t.Errorf("%s %g: error %v does not wrap ErrInvalidPolicy", name, w, err)
				}
				if w <= documentedCostWeightBound {
					t.Errorf("%s %g: rejected a weight within the documented range: %v", name, w, err)
				}
				continue
			}
			b := mustNew(t, p)
			mustUpdate(t, b, eps(2))
			if n := busyPicks(t, b, 200); n > 5 {
				t.Errorf("%s %g: the endpoint holding 200 requests took %d of 100 picks", name, w, n)
			}
		}
	}
}

// GIEDefault's scorer weights: a weighted sum past the largest float64
// makes every candidate score -Inf, and the least used KV cache no longer
// wins.
func TestGIEWeightsAtTheirExtremes(t *testing.T) {
	for _, w := range []float64{documentedCostWeightBound, 1e300, math.MaxFloat64} {
		p, err := GIEDefault(GIEConfig{QueueWeight: w, KVWeight: w, PrefixWeight: w})
		if err != nil {
			if !errors.Is(err, ErrInvalidPolicy) || w <= documentedCostWeightBound {
				t.Errorf("weight %g: error %v", w, err)
			}
			continue
		}
		sig := &fakeSignal{}
		clock := newFakeClock()
		b := mustNew(t, p, WithSignal(sig, 0), WithClock(clock))
		mustUpdate(t, b, eps(2))
		sig.Set("ep0", Load{At: clock.Now(), KVUsage: 0.9})
		sig.Set("ep1", Load{At: clock.Now(), KVUsage: 0.1})
		for range 20 {
			pk, err := b.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if pk.Endpoint().Key() != "ep1" {
				t.Fatalf("weight %g: picked %s at KV usage 0.9 over one at 0.1", w, pk.Endpoint().Key())
			}
			pk.Done(nil)
		}
	}
}

// The bounds of the cost weights are part of the error a caller sees.
func TestCostWeightErrorsNameTheField(t *testing.T) {
	_, err := Default(DefaultConfig{OverloadWeight: 1e13})
	if err == nil || !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("Default(OverloadWeight 1e13) = %v, want ErrInvalidPolicy", err)
	}
	for _, want := range []string{"OverloadWeight", "1e+13", "[0, 1e+12]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// documentedCostWeightBound is the largest weight of a cost function's term
// that the configurations document as accepted.
const documentedCostWeightBound = 1e12

// WeightedLeastRequest's dynamic weights, weight/(requests+1)^bias,
// underflow to zero with a large bias or a tiny weight; the smooth round
// robin's credits then stop moving and it sends every request to one
// endpoint, whatever its load. Here ep0 holds 200 requests at weight w0
// and ep1 100 at twice that weight: ep1 must take the new requests.
func TestWeightedLeastRequestDynamicWeightsUnderflow(t *testing.T) {
	for _, tc := range []struct {
		bias float64
		w0   float64
	}{
		{1000, 1},
		{1e6, 1},
		{1000, 5e-324},
		{200, 1e-300},
	} {
		p, err := WeightedLeastRequest(tc.bias)
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, p)
		mustUpdate(t, b, []Endpoint{weightedEP{testEP{"ep0", tc.w0}}, weightedEP{testEP{"ep1", 2 * tc.w0}}})
		ctx := context.Background()
		var held []Pick
		for i := range 300 {
			away := "ep1"
			if i%3 == 0 {
				away = "ep0"
			}
			pk, err := b.Pick(ctx, &Request{Exclude: []string{away}})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, pk)
		}
		n := 0
		for range 50 {
			pk, err := b.Pick(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if pk.Endpoint().Key() == "ep0" {
				n++
			}
			held = append(held, pk)
		}
		for _, pk := range held {
			pk.Done(nil)
		}
		if n > 0 {
			t.Errorf("bias %g, weights %g and %g: the endpoint with 200 requests at the lower weight took %d of 50 new requests against one with 100",
				tc.bias, tc.w0, 2*tc.w0, n)
		}
		for _, s := range b.Stats() {
			if s.Outstanding != 0 {
				t.Errorf("%s keeps %d outstanding after every Done", s.Key, s.Outstanding)
			}
		}
	}
	for _, bias := range []float64{1e6 + 1, 1e300, math.Inf(1), math.NaN(), -1} {
		if _, err := WeightedLeastRequest(bias); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("WeightedLeastRequest(%g) = %v, want ErrInvalidPolicy", bias, err)
		}
	}
}

// Endpoint weights are relative, so a membership of equal weights routes
// alike whatever their magnitude. A score divided by a weight near the
// least float64 overflowed to +Inf, and every candidate then tied: each
// policy routed at random, here to an endpoint holding 200 requests about
// half the time.
func TestEqualExtremeWeightsRouteAsWeightOne(t *testing.T) {
	policies := map[string]func() (Policy, error){
		"P2C":                  func() (Policy, error) { return P2C(nil), nil },
		"P2C(TokensScore)":     func() (Policy, error) { return P2C(TokensScore), nil },
		"LeastOutstanding":     func() (Policy, error) { return LeastOutstanding(), nil },
		"LeastTokens":          func() (Policy, error) { return LeastTokens(), nil },
		"LeastKV":              func() (Policy, error) { return LeastKV(), nil },
		"Default":              func() (Policy, error) { return Default(DefaultConfig{}) },
		"WeightedLeastRequest": func() (Policy, error) { return WeightedLeastRequest(1) },
		"PeakEWMA":             func() (Policy, error) { return PeakEWMA(PeakEWMAConfig{}) },
		"KVCost":               func() (Policy, error) { return KVCost(DynamoKVCostConfig()) },
	}
	for name, mk := range policies {
		for _, w := range []float64{math.SmallestNonzeroFloat64, 1e-310, 1e-300, 1e300, math.MaxFloat64} {
			p, err := mk()
			if err != nil {
				t.Fatal(err)
			}
			b := mustNew(t, p)
			mustUpdate(t, b, []Endpoint{weightedEP{testEP{"ep0", w}}, weightedEP{testEP{"ep1", w}}})
			if n := busyPicks(t, b, 200); n > 5 {
				t.Errorf("%s, both weights %g: the endpoint holding 200 requests took %d of 100 picks", name, w, n)
			}
		}
	}
}

// Update scales a membership of extreme weights by a power of two: the
// ratios stay exact, and the largest lands in [1, 2).
func TestExtremeWeightsScaledExactly(t *testing.T) {
	for _, tc := range []struct {
		weights []float64
		want    []float64
	}{
		{[]float64{1, 2, 0.5}, []float64{1, 2, 0.5}}, // ordinary: as declared
		{[]float64{0x1p-1000, 0x1p-1000}, []float64{1, 1}},
		{[]float64{3 * 0x1p-1000, 0x1p-1000}, []float64{1.5, 0.5}},
		{[]float64{math.SmallestNonzeroFloat64, 2 * math.SmallestNonzeroFloat64}, []float64{0.5, 1}},
		{[]float64{math.MaxFloat64, math.MaxFloat64 / 4}, []float64{math.MaxFloat64 * 0x1p-1023, math.MaxFloat64 * 0x1p-1025}},
		// Too small beside the largest to keep its ratio: the least
		// positive weight, never 0.
		{[]float64{math.MaxFloat64, math.SmallestNonzeroFloat64}, []float64{math.MaxFloat64 * 0x1p-1023, math.SmallestNonzeroFloat64}},
	} {
		pr := &probe{}
		b := mustNew(t, pr)
		all := make([]Endpoint, len(tc.weights))
		for i, w := range tc.weights {
			all[i] = weightedEP{testEP{key: "ep" + string(rune('0'+i)), weight: w}}
		}
		mustUpdate(t, b, all)
		pk, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		for i, want := range tc.want {
			key := "ep" + string(rune('0'+i))
			if got := pr.weights[key]; got != want {
				t.Errorf("weights %v: %s has weight %g, want %g", tc.weights, key, got, want)
			}
			if got := pr.loads[key].Weight; got != want {
				t.Errorf("weights %v: %s has EndpointLoad.Weight %g, want %g", tc.weights, key, got, want)
			}
		}
	}
}

// Endpoints at the floor of a slow start ramp must still be compared by
// their load. A floor so small that a loaded endpoint's score divided by
// it overflows to +Inf (or one that underflows to a weight of 0) made
// every such endpoint tie, and the one holding 1000 requests took about
// half the picks against one holding 200.
func TestSlowStartFloorKeepsScoresComparable(t *testing.T) {
	for _, pct := range []float64{1e-6, 1e-306, 1e-322} {
		ss := SlowStart{Window: time.Hour, Aggression: 1e-300, MinWeightPercent: pct}
		b, err := New(P2C(nil), WithSlowStart(ss), WithClock(newFakeClock()), WithRand(rand.NewPCG(1, 2)))
		if err != nil {
			if !errors.Is(err, ErrInvalidOption) || pct >= 1e-6 {
				t.Errorf("MinWeightPercent %g: %v", pct, err)
			}
			continue
		}
		mustUpdate(t, b, eps(1))
		mustUpdate(t, b, eps(3)) // ep1 and ep2 join in slow start, at the floor
		ctx := context.Background()
		var held []Pick
		for i := range 1200 {
			away := "ep2"
			if i%6 == 0 {
				away = "ep1"
			}
			pk, err := b.Pick(ctx, &Request{Exclude: []string{"ep0", away}})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, pk)
		}
		n := 0
		for range 50 {
			pk, err := b.Pick(ctx, &Request{Exclude: []string{"ep0"}})
			if err != nil {
				t.Fatal(err)
			}
			if pk.Endpoint().Key() == "ep1" {
				n++
			}
			held = append(held, pk)
		}
		for _, pk := range held {
			pk.Done(nil)
		}
		if n > 0 {
			t.Errorf("MinWeightPercent %g: the endpoint holding 1000 requests took %d of 50 against one holding 200", pct, n)
		}
	}
}

// WeightedLeastRequest's smooth round robin credits are earned at the
// scale of the dynamic weights. When a signal reports the loads jump, the
// weights shrink by as much, and credits earned before outweighed them:
// every request went to one endpoint, here the one of lower weight, for
// hundreds of thousands of picks.
func TestWeightedLeastRequestLoadJump(t *testing.T) {
	for _, jump := range []int{100, 10_000, 1_000_000} {
		p, err := WeightedLeastRequest(1)
		if err != nil {
			t.Fatal(err)
		}
		sig := &fakeSignal{}
		clock := newFakeClock()
		b := mustNew(t, p, WithSignal(sig, 0), WithClock(clock))
		mustUpdate(t, b, []Endpoint{weightedEP{testEP{"ep0", 1}}, weightedEP{testEP{"ep1", 2}}})
		ctx := context.Background()
		for range 10 {
			pk, err := b.Pick(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			pk.Done(nil)
		}
		sig.Set("ep0", Load{At: clock.Now(), Running: jump})
		sig.Set("ep1", Load{At: clock.Now(), Running: jump})
		counts := map[string]int{}
		for range 300 {
			pk, err := b.Pick(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			counts[pk.Endpoint().Key()]++
			pk.Done(nil)
		}
		if counts["ep0"] < 80 || counts["ep0"] > 120 {
			t.Errorf("%d requests on each endpoint, weights 1 and 2: picks %v, want about 100 and 200", jump, counts)
		}
	}
}
