package llmlb

import (
	"errors"
	"math"
	"testing"
	"time"
)

// serve picks n requests one after another on b, each taking the latency
// its endpoint's lat says for 10 output tokens, and returns the picks per
// endpoint.
func servePeak(t *testing.T, b *Balancer, clk *fakeClock, n int, lat map[string]time.Duration) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		p, err := b.Pick(t.Context(), &Request{PromptTokens: 100, OutputTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		k := p.Endpoint().Key()
		got[k]++
		p.FirstToken()
		clk.Advance(lat[k])
		p.Generated(10)
		p.Done(nil)
	}
	return got
}

// A latency spike steers the traffic away at the first slow answer; when it
// is over, the traffic comes back as the average decays.
func TestPeakEWMAFollowsASpike(t *testing.T) {
	clk := newFakeClock()
	pol, err := PeakEWMA(PeakEWMAConfig{Decay: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clk))
	mustUpdate(t, b, eps(2))
	lat := map[string]time.Duration{"ep0": 100 * time.Millisecond, "ep1": 100 * time.Millisecond}
	even := servePeak(t, b, clk, 200, lat)
	if even["ep0"] < 60 || even["ep1"] < 60 {
		t.Fatalf("equal endpoints: %v, want both used", even)
	}
	lat["ep1"] = 2 * time.Second // a spike
	spike := servePeak(t, b, clk, 200, lat)
	if spike["ep1"] > 10 {
		t.Fatalf("during the spike: %v, want ep1 nearly avoided", spike)
	}
	lat["ep1"] = 100 * time.Millisecond
	servePeak(t, b, clk, 300, lat) // 30 s: the slow average decays; ep1 is tried again
	after := servePeak(t, b, clk, 200, lat)
	if after["ep1"] < 60 {
		t.Fatalf("after the spike: %v, want ep1 used again", after)
	}
}

// With nothing observed, a new endpoint competes by its outstanding
// requests; a slow one is avoided per output token, not per request.
func TestPeakEWMAPerToken(t *testing.T) {
	clk := newFakeClock()
	pol, _ := PeakEWMA(PeakEWMAConfig{})
	b := mustNew(t, pol, WithClock(clk))
	mustUpdate(t, b, eps(2))
	// ep0: 1000 tokens in 2 s (2 ms per token); ep1: 10 tokens in 1 s
	// (100 ms per token). Per request ep1 was faster, per token slower.
	for _, c := range []struct {
		key    string
		tokens int
		d      time.Duration
	}{{"ep0", 1000, 2 * time.Second}, {"ep1", 10, time.Second}} {
		p, err := b.Pick(t.Context(), &Request{Exclude: []string{other(c.key)}})
		if err != nil {
			t.Fatal(err)
		}
		p.FirstToken()
		clk.Advance(c.d)
		p.Generated(c.tokens)
		p.Done(nil)
	}
	got := map[string]int{}
	for range 50 {
		p, _ := b.Pick(t.Context(), &Request{})
		got[p.Endpoint().Key()]++
		p.Done(errors.New("abandoned")) // failures teach nothing
	}
	if got["ep0"] != 50 {
		t.Fatalf("picks %v, want all on ep0, the faster per token", got)
	}
}

func other(key string) string {
	if key == "ep0" {
		return "ep1"
	}
	return "ep0"
}

func TestPeakLatencyObserve(t *testing.T) {
	var l peakLatency
	decay := float64(10 * time.Second)
	if _, ok := l.read(1, decay); ok {
		t.Fatal("an average before any observation")
	}
	l.observe(0.1, 1, decay)
	l.observe(0.5, 2, decay) // the peak, at once
	if v, _ := l.read(2, decay); v != 0.5 {
		t.Fatalf("after a peak: %v, want 0.5", v)
	}
	now := int64(2 + 10*time.Second)
	l.observe(0.1, now, decay) // one decay time later: 0.5/e + 0.1(1-1/e)
	want := 0.5/math.E + 0.1*(1-1/math.E)
	if v, _ := l.read(now, decay); math.Abs(v-want) > 1e-9 {
		t.Fatalf("after a decay time: %v, want %v", v, want)
	}
	if v, _ := l.read(now+int64(10*time.Second), decay); math.Abs(v-want/math.E) > 1e-9 {
		t.Fatalf("read a decay time later: %v, want %v", v, want/math.E)
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), -1} {
		l.observe(bad, now+1, decay)
		if v, _ := l.read(now, decay); math.Abs(v-want) > 1e-9 {
			t.Fatalf("observing %v changed the average to %v", bad, v)
		}
	}
	if _, err := PeakEWMA(PeakEWMAConfig{Decay: -1}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("negative decay: %v", err)
	}
}

func TestPeakEWMAPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	clk := newFakeClock()
	pol, _ := PeakEWMA(PeakEWMAConfig{})
	b := mustNew(t, pol, WithClock(clk))
	mustUpdate(t, b, eps(8))
	req := &Request{PromptTokens: 100}
	ctx := t.Context()
	allocs := testing.AllocsPerRun(200, func() {
		p, _ := b.Pick(ctx, req)
		p.FirstToken()
		p.Generated(5)
		p.Done(nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per pick", allocs)
	}
}

// An endpoint with little of its quota left costs its latency cost divided
// by its headroom: with equal latencies, one at 10% takes a request only
// once the other has ten times its requests in flight (ties are at random,
// so the test stops before the next one).
func TestPeakEWMAHeadroom(t *testing.T) {
	room := map[string]float64{"ep0": 0.1}
	pol, err := PeakEWMA(PeakEWMAConfig{Headroom: func(key string) (float64, bool) {
		h, ok := room[key]
		return h, ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(2))
	got := map[string]int{}
	for range 20 {
		p, err := b.Pick(t.Context(), &Request{})
		if err != nil {
			t.Fatal(err)
		}
		got[p.Endpoint().Key()]++
		defer p.Done(nil)
	}
	if got["ep0"] != 1 || got["ep1"] != 19 {
		t.Fatalf("picks %v, want 1 on ep0 (10%% headroom) and 19 on ep1", got)
	}
	// Below MinHeadroom, and not a number: the floor, and unknown.
	room["ep0"], room["ep1"] = 0, math.NaN()
	p, _ := b.Pick(t.Context(), &Request{})
	defer p.Done(nil)
	// ep0 costs 2/0.05 = 40, ep1 20.
	if k := p.Endpoint().Key(); k != "ep1" {
		t.Fatalf("picked %s, want ep1", k)
	}
}

// PeakEWMA learns latencies when another policy wraps it: inside
// AdapterAffinity, as a Segregated pool's policy and as ConsistentHash's
// fallback, a slow endpoint is avoided as by PeakEWMA alone.
func TestPeakEWMAWrapped(t *testing.T) {
	wraps := map[string]func(Policy) (Policy, error){
		"adapter-affinity": func(p Policy) (Policy, error) { return AdapterAffinity(p, AdapterConfig{}) },
		"segregated":       func(p Policy) (Policy, error) { return Segregated(Pool{Name: "all", Policy: p}) },
		"hash-fallback":    func(p Policy) (Policy, error) { return ConsistentHash(HashConfig{Fallback: p}) },
	}
	for name, wrap := range wraps {
		t.Run(name, func(t *testing.T) {
			clk := newFakeClock()
			peak, err := PeakEWMA(PeakEWMAConfig{Decay: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			pol, err := wrap(peak)
			if err != nil {
				t.Fatal(err)
			}
			b := mustNew(t, pol, WithClock(clk))
			mustUpdate(t, b, eps(2))
			lat := map[string]time.Duration{"ep0": 100 * time.Millisecond, "ep1": 2 * time.Second}
			servePeak(t, b, clk, 20, lat)
			if got := servePeak(t, b, clk, 200, lat); got["ep1"] > 10 {
				t.Fatalf("%v, want the slow ep1 nearly avoided", got)
			}
		})
	}
}
