package llmlb

import (
	"testing"
	"time"
)

// TestSegregatedForwardsLearning checks that a balancer over pools of which
// one chooses with Default keeps the speed estimates Default learns from, as
// it does over Default alone, and that pools of policies that learn nothing
// keep none.
func TestSegregatedForwardsLearning(t *testing.T) {
	d, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Segregated(
		Pool{Name: "long", MinPromptTokens: 32000, Endpoints: []string{"ep0"}, Policy: d},
		Pool{Name: "general"},
	)
	if err != nil {
		t.Fatal(err)
	}
	if b := mustNew(t, p); !b.learn {
		t.Fatal("a balancer over a pool of Default does not learn")
	}
	q, err := Segregated(Pool{Name: "general", Policy: LeastTokens()})
	if err != nil {
		t.Fatal(err)
	}
	if b := mustNew(t, q); b.learn {
		t.Fatal("a balancer over pools that learn nothing keeps speed estimates")
	}
}

// TestSegregatedUnpricedPickTeachesNoPrefill checks that a request chosen by
// a pool whose policy prices no prefill work does not teach the speed
// estimate of an endpoint it shares with a pool of Default a prefill of no
// work, while a request that Default priced does.
func TestSegregatedUnpricedPickTeachesNoPrefill(t *testing.T) {
	d, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Segregated(
		Pool{Name: "long", MinPromptTokens: 32000, Endpoints: []string{"ep0"}, Policy: d},
		Pool{Name: "general", Endpoints: []string{"ep0"}, Policy: LeastTokens()},
	)
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	b := mustNew(t, p, WithClock(clock))
	mustUpdate(t, b, eps(1))
	est := b.snap.Load().eps[0].est
	if est == nil {
		t.Fatal("the balancer keeps no speed estimate for a pool of Default")
	}
	observed := func() float64 {
		est.mu.Lock()
		defer est.mu.Unlock()
		return est.c
	}
	pk := mustPick(t, b, Request{PromptTokens: 1000})
	clock.Advance(time.Second)
	pk.FirstToken()
	pk.Done(nil)
	if c := observed(); c != 0 {
		t.Fatalf("a request LeastTokens chose taught %v prefill observations", c)
	}
	pk = mustPick(t, b, Request{PromptTokens: 40000})
	clock.Advance(time.Second)
	pk.FirstToken()
	pk.Done(nil)
	if c := observed(); c != 1 {
		t.Fatalf("a request Default priced taught %v prefill observations, want 1", c)
	}
}
