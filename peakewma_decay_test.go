package llmlb

import (
	"testing"
	"time"
)

// An endpoint back in service, whether its average decayed to zero over
// hours out or only to a small fraction over a minute, comes back by its
// outstanding requests, as a new endpoint does: it does not take every
// request sampled with it until its first completion.
func TestPeakEWMAReturnCountsOutstanding(t *testing.T) {
	for _, out := range []time.Duration{time.Minute, 3 * time.Hour} {
		t.Run(out.String(), func(t *testing.T) {
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
			// Traffic on ep0 alone while ep1 is out: ep0's average is
			// fresh, ep1's decays (to zero after three hours).
			for range 6 {
				clk.Advance(out / 6)
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
		})
	}
}

// An idle endpoint's decayed average still draws requests to it, so that a
// replica whose latency spiked is tried again: only one that has decayed
// to nothing counts as having no history.
func TestPeakEWMADecayedAverageDrawsRequests(t *testing.T) {
	clk := newFakeClock()
	pol, err := PeakEWMA(PeakEWMAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clk))
	mustUpdate(t, b, eps(2))
	servePeak(t, b, clk, 20, map[string]time.Duration{"ep0": time.Second, "ep1": time.Second})
	// Ten Decays on: both decayed alike, and both still have a history.
	clk.Advance(100 * time.Second)
	st := b.snap.Load().byKey["ep1"]
	if avg, ok := st.aux.lat.read(clk.Now().UnixNano(), float64(10*time.Second)); !ok || !(avg > 0) {
		t.Fatalf("ep1's average after ten Decays: %v, %v; want a positive one", avg, ok)
	}
}
