package llmlb

import (
	"testing"
	"time"
)

// An endpoint out of service for hours, whose average has decayed to
// zero, comes back by its outstanding requests, as a new endpoint does: it
// does not take every request sampled with it until its first completion.
func TestPeakEWMADecayedToZeroCountsOutstanding(t *testing.T) {
	clk := newFakeClock()
	pol, err := PeakEWMA(PeakEWMAConfig{}) // Decay 10 s
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clk))
	mustUpdate(t, b, eps(2))
	lat := map[string]time.Duration{"ep0": time.Second, "ep1": time.Second}
	servePeak(t, b, clk, 20, lat) // both have an average
	if err := b.SetHealthy("ep1", false); err != nil {
		t.Fatal(err)
	}
	// Three hours (over a thousand Decays) of traffic on ep0 alone: ep1's
	// average underflows to zero, ep0's is fresh.
	for range 18 {
		clk.Advance(10 * time.Minute)
		servePeak(t, b, clk, 5, lat)
	}
	if err := b.SetHealthy("ep1", true); err != nil {
		t.Fatal(err)
	}
	// A burst of 100 requests, none finished yet.
	got := map[string]int{}
	for range 100 {
		p, err := b.Pick(t.Context(), &Request{PromptTokens: 100, OutputTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		got[p.Endpoint().Key()]++
		defer p.Done(nil)
	}
	if got["ep1"] > 60 {
		t.Fatalf("burst after ep1's return: %v, want it shared by outstanding requests", got)
	}
}
