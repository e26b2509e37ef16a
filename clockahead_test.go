package llmlb

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// The tests of this file read an injected clock without monotonic readings
// once far ahead (an hour) and then as before, as a clock set wrong and
// corrected does. What decays from the time of that one reading must decay
// from the next reading on, rather than not at all until the clock catches
// up: every one of them used to take an endpoint out of the picks for the
// hour.

// aheadShare returns the share of the next n picks of b that go to key
// (each picked, streamed and done sequentially by run).
func aheadShare(n int, key string, run func() string) float64 {
	got := 0
	for range n {
		if run() == key {
			got++
		}
	}
	return float64(got) / float64(n)
}

// TestPrefillFlowAfterClockAhead: Default with objectives prices the
// prompt tokens recently sent to each endpoint. One pick at a reading an
// hour ahead stamped that endpoint's flow an hour ahead; the flow then
// stopped decaying while every later pick there added to it, and the
// endpoint got none of the next 1,000 sequential requests.
func TestPrefillFlowAfterClockAhead(t *testing.T) {
	p, err := Default(DefaultConfig{TTFTObjective: 2 * time.Second, TPOTObjective: 50 * time.Millisecond, DisableLearning: true})
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock))
	mustUpdate(t, b, eps(2))
	run := func() string {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(50 * time.Millisecond)
		pk.FirstToken()
		pk.Done(nil)
		clock.Advance(500 * time.Millisecond)
		return pk.Endpoint().Key()
	}
	for range 100 {
		run()
	}
	clock.Advance(time.Hour)
	key := run()
	clock.Advance(-time.Hour)
	if share := aheadShare(1000, key, run); share < 0.4 {
		t.Errorf("the endpoint picked at a reading an hour ahead got %.2f of the next 1000 picks, want about half", share)
	}
}

// TestPeakLatencyAfterClockAhead: PeakEWMA's average of an endpoint whose
// last completion was read an hour ahead stopped decaying, and the
// endpoint, slow at that completion, was not tried again for the hour.
func TestPeakLatencyAfterClockAhead(t *testing.T) {
	p, err := PeakEWMA(PeakEWMAConfig{Decay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock))
	mustUpdate(t, b, eps(2))
	slow, ahead := false, time.Duration(0)
	run := func() string {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		key := pk.Endpoint().Key()
		skew := time.Duration(0)
		if key == "ep0" {
			skew = ahead
			if slow {
				clock.Advance(2 * time.Second)
			}
		}
		clock.Advance(20 * time.Millisecond)
		pk.FirstToken()
		clock.Advance(skew)
		pk.Done(nil)
		clock.Advance(100*time.Millisecond - skew)
		return key
	}
	for range 100 {
		run()
	}
	slow = true
	for run() != "ep0" {
	}
	slow, ahead = false, time.Hour
	for run() != "ep0" {
	}
	ahead = 0
	clock.Advance(time.Minute) // 60 decay times
	if share := aheadShare(1000, "ep0", run); share < 0.4 {
		t.Errorf("the endpoint whose last completion was read an hour ahead got %.2f of the next 1000 picks, want about half", share)
	}
}

// TestLearnConfidenceAfterClockAhead: Default's confidence in an
// endpoint's speed did not decay while the first token it last measured
// was stamped an hour ahead, so that an endpoint measured slow then was
// avoided for the hour however fast it had become.
func TestLearnConfidenceAfterClockAhead(t *testing.T) {
	p, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock), WithRand(rand.NewPCG(1, 1)))
	mustUpdate(t, b, eps(2))
	ttft := map[string]time.Duration{"ep0": 100 * time.Millisecond, "ep1": 100 * time.Millisecond}
	run := func(ahead time.Duration, exclude ...string) string {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 10, Exclude: exclude})
		if err != nil {
			t.Fatal(err)
		}
		key := pk.Endpoint().Key()
		clock.Advance(ttft[key] + ahead)
		pk.FirstToken()
		clock.Advance(-ahead)
		pk.Done(errors.New("cancelled")) // teaches no decode
		clock.Advance(100 * time.Millisecond)
		return key
	}
	for range 200 {
		run(0)
	}
	ttft["ep0"] = 800 * time.Millisecond
	for range 40 {
		run(0, "ep1")
	}
	run(time.Hour, "ep1")
	ttft["ep0"] = 100 * time.Millisecond
	run(0)
	clock.Advance(20 * time.Minute) // 40 half-lives
	if share := aheadShare(1000, "ep0", func() string { return run(0) }); share < 0.4 {
		t.Errorf("the endpoint measured slow at a reading an hour ahead got %.2f of the next 1000 picks 20 minutes later, want about half", share)
	}
}

// TestAdapterDecisionAfterClockAhead: AdapterAffinity took an adapter
// routed to an endpoint at a reading an hour ahead as held there for the
// hour and its TTL, and kept the adapter's requests on it.
func TestAdapterDecisionAfterClockAhead(t *testing.T) {
	pinned := 0
	for seed := range uint64(20) {
		p, err := AdapterAffinity(LeastOutstanding(), AdapterConfig{})
		if err != nil {
			t.Fatal(err)
		}
		clock := newFakeClock()
		b := mustNew(t, p, WithClock(clock), WithRand(rand.NewPCG(seed, 1)))
		mustUpdate(t, b, eps(4))
		pick := func() string {
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, Adapter: "a"})
			if err != nil {
				t.Fatal(err)
			}
			pk.Done(nil)
			return pk.Endpoint().Key()
		}
		clock.Advance(time.Hour)
		first := pick()
		clock.Advance(-time.Hour)
		clock.Advance(DefaultAdapterTTL + time.Second)
		if pick() == first {
			pinned++
		}
	}
	// Past the TTL the adapter is held nowhere, and the least-outstanding
	// policy picks among four idle endpoints at random.
	if pinned > 12 {
		t.Errorf("%d of 20 requests a TTL after the clock went back went where the adapter was routed an hour ahead, want about a quarter", pinned)
	}
}
