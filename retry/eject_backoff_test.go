package retry

import (
	"errors"
	"testing"
	"time"
)

// ejectFor ejects key (ConsecutiveFailures 1) and returns for how long, as
// Out reports it.
func ejectFor(t *testing.T, e *Ejector, key string) time.Duration {
	t.Helper()
	e.Report(key, errors.New("connection reset"))
	n, next := e.Out()
	if n != 1 {
		t.Fatalf("%s not ejected", key)
	}
	return next
}

// TestEjectorBackoffDecays: as in Envoy, the multiplier of an endpoint's
// ejection time goes up by one at each ejection, and down by one for each
// interval the endpoint spends back in, whether or not it answers
// successfully meanwhile; it stops growing once it takes the ejection time
// past MaxEjectionTime.
func TestEjectorBackoffDecays(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, err := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1,
		BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second, SweepInterval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	back := func(d time.Duration) {
		t.Helper()
		clk.Advance(d)
		e.Sweep()
		if !healthy(b, "a") {
			t.Fatal("not restored")
		}
	}
	steps := []struct {
		in   time.Duration // time back in before the failure
		want time.Duration // the ejection it causes
	}{
		{0, 30 * time.Second},                 // multiplier 1
		{0, 60 * time.Second},                 // 2
		{9 * time.Second, 90 * time.Second},   // 3: under an interval back in
		{10 * time.Second, 90 * time.Second},  // 3 - 1 + 1
		{25 * time.Second, 60 * time.Second},  // 3 - 2 + 1
		{time.Hour, 30 * time.Second},         // 2 - 360, at least 0, + 1
		{0, 60 * time.Second},                 // 2
		{0, 90 * time.Second},                 // 3
		{0, 120 * time.Second},                // 4
		{0, 150 * time.Second},                // 5
		{0, 180 * time.Second},                // 6
		{0, 210 * time.Second},                // 7
		{0, 240 * time.Second},                // 8
		{0, 270 * time.Second},                // 9
		{0, 300 * time.Second},                // 10
		{0, 300 * time.Second},                // 11: 11*30 s is past 300 s+30 s, the last raise
		{0, 300 * time.Second},                // 11
		{0, 300 * time.Second},                // 11
		{30 * time.Second, 270 * time.Second}, // 11 - 3 + 1
	}
	var last time.Duration
	for i, s := range steps {
		if i > 0 {
			back(last)
			clk.Advance(s.in)
		}
		if got := ejectFor(t, e, "a"); got != s.want {
			t.Fatalf("step %d: ejected for %v after %v back in, want %v", i, got, s.in, s.want)
		}
		last = s.want
	}
}

// TestEjectorBackoffDecaysWithoutTraffic: the multiplier goes down while an
// endpoint gets no traffic too; no success is needed.
func TestEjectorBackoffDecaysWithoutTraffic(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1})
	for _, want := range []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second} {
		if got := ejectFor(t, e, "a"); got != want {
			t.Fatalf("ejected for %v, want %v", got, want)
		}
		clk.Advance(want)
		e.Sweep()
	}
	// Half an hour without a report, then one failure (half-open).
	clk.Advance(30 * time.Minute)
	if got := ejectFor(t, e, "a"); got != DefaultBaseEjectionTime {
		t.Fatalf("after 30 min back in without traffic: ejected for %v, want %v", got, DefaultBaseEjectionTime)
	}
}

// TestEjectorCap: the ejection cap is Envoy's: an endpoint is ejected if
// the ejected ones, it included, are at most MaxEjectionPercent of the
// members (rounding down, not up), or if none is ejected.
func TestEjectorCap(t *testing.T) {
	cases := []struct {
		members int
		percent float64
		want    int
	}{
		{3, 10, 1},  // none ejected: always one
		{9, 10, 1},  // Envoy without always_eject_one_host: none
		{1, 10, 1},  // the only one: the balancer picks it in panic mode
		{19, 10, 1}, // 2 of 19 is 10.5%
		{20, 10, 2}, // 2 of 20 is 10%
		{29, 10, 2}, // not ceil(2.9)
		{3, 50, 1},  // 2 of 3 is 67%
		{3, 67, 2},  // 2 of 3 is 66.7%
		{4, 100, 4}, // all
		{7, 100.0 / 7, 1},
		// Envoy's test, 100*(ejected+1)/members <= percent, in floating
		// point: floor(percent*members/100) reads 4 here.
		{19, 100 * 5.0 / 19, 5},
	}
	for _, c := range cases {
		clk := newFakeClock()
		b := newBalancer(t, keys(c.members)...)
		e, err := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1, MaxEjectionPercent: c.percent})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys(c.members) {
			e.Report(k, errors.New("connection reset"))
		}
		if got := len(e.Ejected()); got != c.want {
			t.Errorf("%d members, %v%%: %d ejected, want %d", c.members, c.percent, got, c.want)
		}
	}
}
