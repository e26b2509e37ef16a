package llmlb

import (
	"testing"
	"time"
)

// PrefixAware's least loaded choice counts an endpoint's load per unit of
// its effective weight: an endpoint that joins in slow start is ramped up,
// not sent every request without a match until its count catches up, and
// a heavier endpoint takes proportionally more.
func TestPrefixAwareHonorsWeightAndSlowStart(t *testing.T) {
	// unique returns a request whose prompt no endpoint holds.
	unique := func(i int) *Request {
		return &Request{PromptTokens: 100, Prefix: []uint64{uint64(i)*7919 + 1, uint64(i)*104729 + 3}}
	}
	t.Run("slow start", func(t *testing.T) {
		pol, err := PrefixAware(PrefixAwareConfig{})
		if err != nil {
			t.Fatal(err)
		}
		clk := newFakeClock()
		b := mustNew(t, pol, WithClock(clk), WithSlowStart(SlowStart{Window: time.Minute}))
		mustUpdate(t, b, eps(4))
		for i := range 160 { // 40 in flight at each
			if _, err := b.Pick(t.Context(), unique(i)); err != nil {
				t.Fatal(err)
			}
		}
		mustUpdate(t, b, eps(5)) // ep4 joins, at a tenth of its weight
		clk.Advance(time.Second)
		got := 0
		for i := range 40 {
			p, err := b.Pick(t.Context(), unique(1000+i))
			if err != nil {
				t.Fatal(err)
			}
			if p.Endpoint().Key() == "ep4" {
				got++
			}
		}
		// LeastOutstanding sends it 4 of the 40 here; without the weight
		// it would take all 40.
		if got > 10 {
			t.Fatalf("the endpoint in slow start took %d of 40 requests", got)
		}
	})
	t.Run("weights", func(t *testing.T) {
		pol, err := PrefixAware(PrefixAwareConfig{})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol)
		mustUpdate(t, b, []Endpoint{weightedEP{testEP{"big", 3}}, weightedEP{testEP{"small", 1}}})
		got := map[string]int{}
		for i := range 80 { // all in flight
			p, err := b.Pick(t.Context(), unique(i))
			if err != nil {
				t.Fatal(err)
			}
			got[p.Endpoint().Key()]++
		}
		if got["big"] < 55 || got["big"] > 65 {
			t.Fatalf("in flight %v, want about 60 on the endpoint of weight 3", got)
		}
	})
}
