package llmlb

import (
	"context"
	"slices"
	"testing"
)

// TestAdapterAffinitySpreadPastHalf: two holders of a hot adapter at 80
// requests each, two idle endpoints with room. The holders are compared
// with the idle endpoints, so a third endpoint is admitted; compared with an
// average that included the holders themselves (40, and 80 <= 2*40+1 with
// a Spread of 1) the adapter stayed on two of the four endpoints however
// busy they were.
func TestAdapterAffinitySpreadPastHalf(t *testing.T) {
	b, pr, clock, sig := adapterSetup(t, 4, AdapterConfig{TTL: -1})
	now := clock.Now()
	sig.Set("ep0", Load{At: now, Running: 80, Adapters: []string{"hot"}, MaxAdapters: 4})
	sig.Set("ep1", Load{At: now, Running: 80, Adapters: []string{"hot"}, MaxAdapters: 4})
	sig.Set("ep2", Load{At: now, Adapters: []string{"x"}, MaxAdapters: 4})
	sig.Set("ep3", Load{At: now, MaxAdapters: 4})
	_, pk := pickKey(t, b, &Request{Adapter: "hot"})
	pk.Done(nil)
	if len(pr.keys) != 3 || pr.keys[0] != "ep0" || pr.keys[1] != "ep1" {
		t.Fatalf("inner saw %v, want ep0, ep1 and one of ep2, ep3", pr.keys)
	}
}

// TestAdapterAffinitySpreadGrowsWithLoad routes requests of one hot adapter,
// none finishing, over four endpoints through the policy's own decisions
// and counts: the holder set grows to every endpoint and the load stays
// balanced, while a light adapter on a busy cluster stays on one endpoint.
func TestAdapterAffinitySpreadGrowsWithLoad(t *testing.T) {
	p, err := AdapterAffinity(LeastOutstanding(), AdapterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, p, WithClock(newFakeClock()))
	mustUpdate(t, b, eps(4))
	ctx := context.Background()
	route := func(r *Request, n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for i := 0; i < n; i++ {
			pk, err := b.Pick(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			got[pk.Endpoint().Key()]++
		}
		return got
	}
	// Base-model requests load every endpoint with 10.
	if got := route(&Request{}, 40); len(got) != 4 {
		t.Fatalf("base model requests went to %v", got)
	}
	// A light adapter: 6 requests stay on one endpoint (16 <= 3*10+1).
	if got := route(&Request{Adapter: "light"}, 6); len(got) != 1 {
		t.Fatalf("a light adapter's requests went to %v, want one endpoint", got)
	}
	// A hot adapter: 200 requests spread over all four endpoints.
	got := route(&Request{Adapter: "hot"}, 200)
	if len(got) != 4 {
		t.Fatalf("a hot adapter's 200 requests went to %v, want all 4 endpoints", got)
	}
	var loads []int64
	for _, s := range b.Stats() {
		loads = append(loads, s.Outstanding)
	}
	if lo, hi := slices.Min(loads), slices.Max(loads); hi > 2*lo+2 {
		t.Fatalf("outstanding requests %v: the hot adapter's holders carry more than twice the others", loads)
	}
}
