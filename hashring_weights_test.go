package llmlb

import (
	"strconv"
	"testing"
	"time"
)

// ConsistentHash respects weights: an endpoint of three times the weight
// is home to about three times the keys and holds about three times the
// requests; an endpoint of a quarter of the weight is not held to the
// share of an equal one. With equal weights nothing changes (see
// TestConsistentHashStickyAndMinimalMovement).
func TestConsistentHashRespectsWeights(t *testing.T) {
	pol, err := ConsistentHash(HashConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, []Endpoint{
		weightedEP{testEP{"big", 3}}, weightedEP{testEP{"small", 1}},
	})
	got := map[string]int{}
	for i := range 400 { // all in flight, each its own session
		p, err := b.Pick(t.Context(), &Request{AffinityKey: "session-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		got[p.Endpoint().Key()]++
	}
	// The bound alone caps the small one at ceil(1.25*m/4) of m requests.
	if got["small"] > 125 || got["big"] < 275 {
		t.Fatalf("in flight %v, want about 300 on the endpoint of weight 3 and at most 125 on the other", got)
	}
	// Homes: with nothing in flight, every key goes to its owner on the
	// ring.
	b2 := mustNew(t, mustConsistentHash(t))
	mustUpdate(t, b2, []Endpoint{weightedEP{testEP{"big", 3}}, weightedEP{testEP{"small", 1}}})
	homes := map[string]int{}
	for i := range 4000 {
		p, err := b2.Pick(t.Context(), &Request{AffinityKey: "session-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		homes[p.Endpoint().Key()]++
		p.Done(nil)
	}
	if homes["big"] < 2600 || homes["big"] > 3400 {
		t.Fatalf("homes %v, want about 3000 of 4000 keys on the endpoint of weight 3", homes)
	}
}

// An endpoint that joins in slow start is held to its ramped share of the
// requests: the keys beyond it pass on along the ring.
func TestConsistentHashSlowStart(t *testing.T) {
	clk := newFakeClock()
	b := mustNew(t, mustConsistentHash(t), WithClock(clk), WithSlowStart(SlowStart{Window: time.Minute}))
	mustUpdate(t, b, eps(3))
	for i := range 300 {
		if _, err := b.Pick(t.Context(), &Request{AffinityKey: "old-" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	mustUpdate(t, b, eps(4)) // ep3 joins at a tenth of its weight
	clk.Advance(time.Second)
	got := 0
	for i := range 100 {
		p, err := b.Pick(t.Context(), &Request{AffinityKey: "new-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		if p.Endpoint().Key() == "ep3" {
			got++
		}
	}
	// Its ramped share of the 400 requests is ceil(1.25*400*0.1/3.1) = 17.
	if got > 17 {
		t.Fatalf("the endpoint in slow start holds %d requests, want at most its ramped share 17", got)
	}
}

func mustConsistentHash(t *testing.T) Policy {
	t.Helper()
	p, err := ConsistentHash(HashConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
