package llmlb

// Accounting at the edges: observers that panic, endpoints that leave and
// come back with requests in flight, clocks that step back, weights whose
// sum overflows.

import (
	"context"
	"testing"
	"time"
)

// An Observer.Pick that panics must not leave the picked request charged:
// the caller never receives the handle, so nothing can release it.
func TestObserverPickPanicReleases(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy Policy
	}{{"simple", P2C(nil)}, {"general", LeastTokens()}} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustNew(t, tc.policy, WithObserver(&Observer{Pick: func(PickInfo) { panic("observer") }}))
			mustUpdate(t, b, eps(2))
			func() {
				defer func() { recover() }()
				b.Pick(context.Background(), &Request{PromptTokens: 100})
			}()
			for _, s := range b.Stats() {
				if s.Outstanding != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
					t.Errorf("after a panicking Observer.Pick, %s: %+v, want nothing charged", s.Key, s)
				}
			}
		})
	}
}

// A request in flight to an endpoint that service discovery briefly drops
// and re-adds is still at that endpoint: its load must still count.
func TestReaddedEndpointKeepsInFlight(t *testing.T) {
	b := mustNew(t, &probe{pick: "ep1"})
	mustUpdate(t, b, eps(2))
	var picks []Pick
	for range 3 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		picks = append(picks, pk)
	}
	mustUpdate(t, b, eps(1)) // ep1 leaves
	mustUpdate(t, b, eps(2)) // and comes back at once
	if s := statsByKey(b)["ep1"]; s.Outstanding != 3 {
		t.Errorf("re-added ep1 with 3 requests in flight: Outstanding %d, want 3", s.Outstanding)
	}
	for _, pk := range picks {
		pk.Done(nil)
	}
	if s := statsByKey(b)["ep1"]; s.Outstanding != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
		t.Errorf("after Done: %+v, want zero", s)
	}
	// An endpoint that leaves with requests in flight and comes back after
	// they finished starts afresh.
	pk, _ := b.Pick(context.Background(), &Request{PromptTokens: 10})
	mustUpdate(t, b, eps(1))
	pk.Done(nil)
	mustUpdate(t, b, eps(2))
	if s := statsByKey(b)["ep1"]; s.Outstanding != 0 {
		t.Errorf("ep1 back after its request finished: Outstanding %d, want 0", s.Outstanding)
	}
	if len(b.departed) != 0 {
		t.Errorf("%d departed endpoints remembered, want 0", len(b.departed))
	}
}

// After a fake (non-monotonic) clock steps back past an observation, new
// observations, stamped on the stepped clock, must correct the estimate as
// before: with one router the estimated requests are exact.
func TestSignalEpochAfterClockStepsBack(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	p := &probe{pick: "ep0"}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, 10*time.Second))
	mustUpdate(t, b, eps(1))
	sig.Set("ep0", Load{At: clock.Now(), KVUsage: 0})
	ctx := context.Background()
	var picks []Pick
	pick := func() {
		pk, err := b.Pick(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		picks = append(picks, pk)
	}
	pick()
	clock.Advance(-time.Hour)
	// The engine now reports the one request; two more are sent after.
	sig.Set("ep0", Load{At: clock.Now(), Running: 1, KVUsage: 0})
	pick()
	pick()
	clock.Advance(time.Second)
	sig.Set("ep0", Load{At: clock.Now(), Running: 3, KVUsage: 0})
	pick()
	if got := p.loads["ep0"].Requests; got != 3 {
		t.Errorf("estimated requests %d with 3 in flight and observed, want 3", got)
	}
}

// Weights that are each finite and positive, as Update requires, but whose
// sum overflows, must not turn WeightedLeastRequest's credits into NaN and
// send every request to one endpoint.
func TestWeightedLeastRequestHugeWeights(t *testing.T) {
	p, err := WeightedLeastRequest(1)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, p)
	mustUpdate(t, b, []Endpoint{weightedEP{testEP{"a", 1e308}}, weightedEP{testEP{"b", 1.5e308}}, weightedEP{testEP{"c", 1e308}}})
	counts := map[string]int{}
	for range 350 {
		pk, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		counts[pk.Endpoint().Key()]++
		pk.Done(nil)
	}
	if counts["a"] != 100 || counts["b"] != 150 || counts["c"] != 100 {
		t.Errorf("picks %v of weights 1e308, 1.5e308, 1e308; want 100, 150, 100", counts)
	}
}
