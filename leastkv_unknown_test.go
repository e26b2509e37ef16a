package llmlb_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// kvCapacity is llmlb.DefaultKVCapacityTokens as a float64, for prompts
// sized as fractions of an endpoint's KV capacity.
const kvCapacity = float64(llmlb.DefaultKVCapacityTokens)

// newLeastKV returns a LeastKV balancer over the endpoints keys, reading
// sig with a maximum signal age of maxAge.
func newLeastKV(t *testing.T, sig llmlb.Signal, maxAge time.Duration, keys ...string) *llmlb.Balancer {
	t.Helper()
	b, err := llmlb.New(llmlb.LeastKV(), llmlb.WithSignal(sig, maxAge), llmlb.WithRand(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	eps := make([]llmlb.Endpoint, len(keys))
	for i, k := range keys {
		eps[i] = replica(k)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	return b
}

// pick picks for r on b, failing t on an error.
func pick(t *testing.T, b *llmlb.Balancer, r *llmlb.Request) llmlb.Pick {
	t.Helper()
	p, err := b.Pick(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// An endpoint with no fresh KV usage, next to one reporting 0.1, must not
// look empty and take every request: it is priced at the reporting one's
// usage, so the two tie and share the requests.
func TestLeastKVEndpointWithoutUsageIsNotEmpty(t *testing.T) {
	const maxAge = 10 * time.Second
	cases := []struct {
		name string
		b    *llmlb.Load // b's observation; nil for none
	}{
		{name: "never observed"},
		{name: "stale", b: &llmlb.Load{At: time.Now().Add(-time.Minute), KVUsage: 0}},
		{name: "KV usage not reported", b: &llmlb.Load{At: time.Now(), Running: 1, KVUsage: math.NaN()}},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			sig := staticSignal{"a": {At: time.Now(), Running: 1, KVUsage: 0.1}}
			if test.b != nil {
				sig["b"] = *test.b
			}
			b := newLeastKV(t, sig, maxAge, "a", "b")
			// Each request ends before the next, so every pick sees the
			// same loads: the choice between the two is a fair coin.
			const picks = 200
			toB := 0
			for range picks {
				p := pick(t, b, &llmlb.Request{PromptTokens: 1000, MaxTokens: 100})
				if p.Endpoint().Key() == "b" {
					toB++
				}
				p.FirstToken()
				p.Done(nil)
			}
			if toB < picks/4 || toB > picks*3/4 {
				t.Errorf("b took %d of %d requests, want about half", toB, picks)
			}
		})
	}
}

// The same with the requests outstanding, as under load: the endpoint
// without a KV usage takes its share, not every request.
func TestLeastKVEndpointWithoutUsageTakesItsShare(t *testing.T) {
	sig := staticSignal{"a": {At: time.Now(), Running: 1, KVUsage: 0.1}}
	b := newLeastKV(t, sig, 10*time.Second, "a", "b")
	const picks = 20
	n := map[string]int{}
	for range picks {
		// Held before the first token: queued work at its endpoint.
		n[pick(t, b, &llmlb.Request{PromptTokens: 1000, MaxTokens: 100}).Endpoint().Key()]++
	}
	if n["a"] != picks/2 || n["b"] != picks/2 {
		t.Errorf("requests per endpoint %v, want %d each", n, picks/2)
	}
}

// An endpoint without a KV usage is priced at the mean usage of the
// candidates that report one (the request's candidates, not every member),
// or at the footprint of this balancer's requests there past prefill when
// that is larger.
func TestLeastKVEndpointWithoutUsageAtMean(t *testing.T) {
	// x, y and z report 0.2, 0.6 and 0.7, a mean of 0.5; b reports nothing.
	// The capacities are unknown, so each usage is as reported, and every
	// candidate's score adds the probe's tokens alike.
	cases := []struct {
		name      string
		xQueued   float64  // prompt held at x before its first token, in capacities
		bAdmitted float64  // prompt held at b past its first token, in capacities
		exclude   []string // the probe's exclusions
		want      string
	}{
		// x: 0.2 + 0.2 below b's 0.5.
		{name: "below the mean", xQueued: 0.2, want: "x"},
		// x: 0.2 + 0.35 above b's 0.5, below y's 0.6.
		{name: "above the mean", xQueued: 0.35, want: "b"},
		// Without x the mean is y's and z's, 0.65, above y's 0.6.
		{name: "mean of the candidates", exclude: []string{"x"}, want: "y"},
		// b holds 0.57 of its capacity itself, above the mean of 0.5 and
		// x's 0.2 + 0.35.
		{name: "own footprint above the mean", xQueued: 0.35, bAdmitted: 0.57, want: "x"},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			now := time.Now()
			sig := staticSignal{
				"x": {At: now, Running: 1, KVUsage: 0.2},
				"y": {At: now, Running: 1, KVUsage: 0.6},
				"z": {At: now, Running: 1, KVUsage: 0.7},
			}
			b := newLeastKV(t, sig, 10*time.Second, "x", "y", "z", "b")
			if test.xQueued > 0 {
				p := pick(t, b, &llmlb.Request{PromptTokens: int(math.Ceil(test.xQueued * kvCapacity)),
					OutputTokens: 1, Exclude: []string{"y", "z", "b"}})
				defer p.Done(nil)
			}
			if test.bAdmitted > 0 {
				p := pick(t, b, &llmlb.Request{PromptTokens: int(math.Ceil(test.bAdmitted * kvCapacity)),
					OutputTokens: 1, Exclude: []string{"x", "y", "z"}})
				p.FirstToken()
				defer p.Done(nil)
			}
			p := pick(t, b, &llmlb.Request{PromptTokens: 100, OutputTokens: 10, Exclude: test.exclude})
			defer p.Done(nil)
			if got := p.Endpoint().Key(); got != test.want {
				t.Errorf("picked %s, want %s", got, test.want)
			}
		})
	}
}

// With no candidate reporting a KV usage, the usage is the footprint of
// this balancer's requests past prefill, as it has always been.
func TestLeastKVNoEndpointWithUsage(t *testing.T) {
	now := time.Now()
	sig := staticSignal{
		"a": {At: now, Running: 1, KVUsage: math.NaN()},
		"b": {At: now, Running: 1, KVUsage: math.NaN()},
	}
	b := newLeastKV(t, sig, 10*time.Second, "a", "b")
	held := pick(t, b, &llmlb.Request{PromptTokens: 1000, OutputTokens: 1, Exclude: []string{"b"}})
	held.FirstToken()
	defer held.Done(nil)
	for range 10 {
		p := pick(t, b, &llmlb.Request{PromptTokens: 100, OutputTokens: 10})
		if got := p.Endpoint().Key(); got != "b" {
			t.Errorf("picked %s, want b", got)
		}
		p.Done(nil)
	}
}

// narrowKV is a policy that scores b with KVScore over every candidate,
// then narrows them to those but x and leaves the choice to LeastKV.
type narrowKV struct{}

func (narrowKV) Choose(c *llmlb.Candidates) int {
	for i := range c.Len() {
		if c.Key(i) == "b" {
			l := c.Load(i)
			_ = llmlb.KVScore(c, i, &l)
		}
	}
	c.Narrow(func(i int) bool { return c.Key(i) != "x" })
	return llmlb.LeastKV().Choose(c)
}

// The mean is of the candidates the policy chooses among: after Narrow,
// of those it kept.
func TestLeastKVMeanAfterNarrow(t *testing.T) {
	now := time.Now()
	sig := staticSignal{
		"x": {At: now, Running: 1, KVUsage: 0.2},
		"y": {At: now, Running: 1, KVUsage: 0.6},
		"z": {At: now, Running: 1, KVUsage: 0.7},
	}
	b, err := llmlb.New(narrowKV{}, llmlb.WithSignal(sig, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{replica("x"), replica("y"), replica("z"), replica("b")}); err != nil {
		t.Fatal(err)
	}
	// Over every candidate the mean is 0.5, below y's 0.6; over y and z it
	// is 0.65, above it.
	p := pick(t, b, &llmlb.Request{PromptTokens: 100, OutputTokens: 10})
	defer p.Done(nil)
	if got := p.Endpoint().Key(); got != "y" {
		t.Errorf("picked %s, want y", got)
	}
}

// Each pick takes the mean of the observations it reads.
func TestLeastKVMeanPerPick(t *testing.T) {
	sig := staticSignal{
		"a": {At: time.Now(), Running: 1, KVUsage: 0.2},
		"y": {At: time.Now(), Running: 1, KVUsage: 0.6},
	}
	b := newLeastKV(t, sig, 10*time.Second, "a", "y", "b")
	for _, step := range []struct {
		a    float64
		want string
	}{
		{0.2, "a"}, // b at 0.4
		{1, "y"},   // b at 0.8
		{0.2, "a"},
	} {
		sig["a"] = llmlb.Load{At: time.Now(), Running: 1, KVUsage: step.a}
		p := pick(t, b, &llmlb.Request{PromptTokens: 100, OutputTokens: 10})
		if got := p.Endpoint().Key(); got != step.want {
			t.Errorf("a at %v: picked %s, want %s", step.a, got, step.want)
		}
		p.Done(nil)
	}
}
