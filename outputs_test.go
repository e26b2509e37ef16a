package llmlb

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func TestOutputBuckets(t *testing.T) {
	prev := -1
	for n := int64(0); n < 1<<20; n = n + 1 + n/64 {
		b := outputBucket(n)
		if b < prev || b >= outputBuckets {
			t.Fatalf("bucket(%d) = %d after %d", n, b, prev)
		}
		prev = b
		if v := outputBucketValue(b); n >= 2 && (v < float64(n)/1.26 || v > float64(n)*1.26) {
			t.Fatalf("bucket(%d) = %d stands for %v, more than a quarter octave away", n, b, v)
		}
	}
	if b := outputBucket(math.MaxInt64); b != outputBuckets-1 {
		t.Fatalf("bucket(MaxInt64) = %d", b)
	}
}

// decodeCharged picks r alone on a one-endpoint balancer and returns the
// decode work it was charged.
func decodeCharged(t *testing.T, b *Balancer, r Request) int64 {
	t.Helper()
	pk := mustPick(t, b, r)
	defer pk.Done(errors.New("not streamed"))
	return statsByKey(b)["ep0"].DecodeTokens
}

// complete picks r and completes it after n streamed output tokens.
func complete(t *testing.T, b *Balancer, r Request, n int) {
	t.Helper()
	pk := mustPick(t, b, r)
	pk.FirstToken()
	pk.Generated(n)
	pk.Done(nil)
}

func TestOutputPredictionLearnsPerKind(t *testing.T) {
	b := mustNew(t, LeastOutstanding(), WithOutputPrediction(OutputConfig{}))
	mustUpdate(t, b, eps(1))
	chat := Request{PromptTokens: 100, Tenant: "a", Feature: "chat"}
	essay := Request{PromptTokens: 100, Tenant: "a", Feature: "essay"}
	if got := decodeCharged(t, b, chat); got != DefaultDecodeAllowance {
		t.Fatalf("cold: charged %d, want the allowance %d", got, DefaultDecodeAllowance)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var chatSum, essaySum float64
	for range 2000 {
		c := int(20 * math.Exp(0.5*r.NormFloat64()))
		e := int(2000 * math.Exp(0.5*r.NormFloat64()))
		chatSum, essaySum = chatSum+float64(c), essaySum+float64(e)
		complete(t, b, chat, c)
		complete(t, b, essay, e)
	}
	for _, tc := range []struct {
		r    Request
		want float64
	}{{chat, chatSum / 2000}, {essay, essaySum / 2000}} {
		got := float64(decodeCharged(t, b, tc.r))
		if math.Abs(got-tc.want) > 0.15*tc.want {
			t.Errorf("%s: charged %v, want about the mean %v", tc.r.Feature, got, tc.want)
		}
	}
	// A tenant never seen is charged its feature's lengths; a feature
	// never seen, all requests'; MaxTokens still caps; a caller's
	// estimate is charged as given.
	if got := decodeCharged(t, b, Request{Tenant: "new", Feature: "essay"}); got < 1500 {
		t.Errorf("new tenant, known feature: charged %d, want the feature's (about 2000)", got)
	}
	if got := decodeCharged(t, b, Request{Tenant: "new", Feature: "new"}); got < 500 || got > 1500 {
		t.Errorf("new tenant and feature: charged %d, want all requests' mean (about 1000)", got)
	}
	if got := decodeCharged(t, b, Request{Tenant: "a", Feature: "essay", MaxTokens: 300}); got != 300 {
		t.Errorf("MaxTokens 300: charged %d", got)
	}
	if got := decodeCharged(t, b, Request{Tenant: "a", Feature: "essay", OutputTokens: 7}); got != 7 {
		t.Errorf("OutputTokens 7: charged %d", got)
	}
}

// Only requests that streamed to their end teach: a failed, cancelled or
// never-started request ended early. Generated after Done counts for
// nothing, not even for a later request reusing the handle's storage.
func TestOutputPredictionLearnsOnlyCompletions(t *testing.T) {
	b := mustNew(t, LeastOutstanding(), WithOutputPrediction(OutputConfig{MinObservations: 4}))
	mustUpdate(t, b, eps(1))
	r := Request{PromptTokens: 10, Feature: "f"}
	var stale []Pick
	for range 50 {
		pk := mustPick(t, b, r)
		pk.FirstToken()
		pk.Generated(5)
		pk.Done(errors.New("broke")) // streamed, then failed
		stale = append(stale, pk)
		pk = mustPick(t, b, r)
		pk.Generated(5)
		pk.Done(nil) // never streamed
		stale = append(stale, pk)
	}
	if got := decodeCharged(t, b, r); got != DefaultDecodeAllowance {
		t.Fatalf("after failures only: charged %d, want the allowance", got)
	}
	for range 8 {
		pk := mustPick(t, b, r)
		for _, s := range stale {
			s.Generated(1000) // stale handles: ignored
		}
		pk.FirstToken()
		pk.Generated(30)
		pk.Generated(0)
		pk.Generated(-5)
		pk.Done(nil)
	}
	if got := decodeCharged(t, b, r); got != 30 {
		t.Fatalf("charged %d, want 30", got)
	}
}

func TestOutputPredictionFollowsChange(t *testing.T) {
	b := mustNew(t, LeastOutstanding(), WithOutputPrediction(OutputConfig{Window: 64, Quantile: 0.9}))
	mustUpdate(t, b, eps(1))
	r := Request{Feature: "f"}
	for i := range 1000 {
		complete(t, b, r, 100+i%10)
	}
	if got := decodeCharged(t, b, r); got < 95 || got > 125 {
		t.Fatalf("p90 of 100-109: charged %d", got)
	}
	for i := range 256 {
		complete(t, b, r, 1000+i%100)
	}
	if got := decodeCharged(t, b, r); got < 900 || got > 1250 {
		t.Fatalf("four windows after the outputs grew tenfold: charged %d, want about 1090", got)
	}
}

func TestOutputPredictionConfig(t *testing.T) {
	for _, bad := range []OutputConfig{{Quantile: 1}, {Quantile: -0.1}, {Quantile: math.NaN()}, {MinObservations: -1}, {Window: -1}, {MaxKinds: -1}} {
		if _, err := New(LeastOutstanding(), WithOutputPrediction(bad)); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%+v: %v, want ErrInvalidOption", bad, err)
		}
	}
	// MaxKinds bounds the kinds remembered: the least recently used is
	// forgotten, and its requests fall back to all requests' lengths.
	b := mustNew(t, LeastOutstanding(), WithOutputPrediction(OutputConfig{MaxKinds: 2, MinObservations: 1}))
	mustUpdate(t, b, eps(1))
	complete(t, b, Request{Feature: "a"}, 10)
	for _, f := range []string{"b", "c", "d"} {
		complete(t, b, Request{Feature: f}, 1000)
	}
	if got := decodeCharged(t, b, Request{Feature: "a"}); got < 500 {
		t.Fatalf("forgotten kind: charged %d, want all requests' mean (about 750)", got)
	}
	if n := b.outputs.kinds.Len(); n > 2 {
		t.Fatalf("%d kinds remembered, want at most 2", n)
	}
}

func TestOutputPredictionPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	b := mustNew(t, LeastOutstanding(), WithOutputPrediction(OutputConfig{MinObservations: 1}))
	mustUpdate(t, b, eps(8))
	r := Request{PromptTokens: 10, Tenant: "t", Feature: "f"}
	complete(t, b, r, 10) // the kinds exist
	allocs := testing.AllocsPerRun(1000, func() {
		pk, err := b.Pick(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		pk.FirstToken()
		pk.Generated(10)
		pk.Done(nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per pick and completion", allocs)
	}
}

func BenchmarkOutputPrediction(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		var opts []Option
		if on {
			name = "on"
			opts = append(opts, WithOutputPrediction(OutputConfig{}))
		}
		b.Run("prediction="+name, func(b *testing.B) {
			bal := benchBalancer(b, P2C(nil), 64, opts...)
			features := []string{"chat", "summarize", "code", "agent"}
			reqs := make([]Request, len(features))
			for i, f := range features {
				reqs[i] = Request{PromptTokens: 1000, Tenant: "t", Feature: f}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r := &reqs[i%len(reqs)]
				i++
				pk, err := bal.Pick(context.Background(), r)
				if err != nil {
					b.Fatal(err)
				}
				pk.FirstToken()
				pk.Generated(100)
				pk.Done(nil)
			}
		})
	}
}

// TestOutputQuantileNearOne checks that a quantile just below 1 charges
// about the longest learned output, even when the buckets' weights sum to
// a little less than the total they were added to.
func TestOutputQuantileNearOne(t *testing.T) {
	p, err := newOutputPredictor(OutputConfig{Quantile: math.Nextafter(1, 0), Window: 3})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 10_000 {
		p.all.observe(int64(1000+rng.IntN(100_000)), p)
		if e := p.all.est.Load(); float64(e) < 1000/1.26 {
			t.Fatalf("completion %d: charges %d tokens, want at least the shortest output's bucket", i, e)
		}
	}
}
