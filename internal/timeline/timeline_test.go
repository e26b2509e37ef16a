package timeline

import (
	"math"
	"testing"
	"time"
)

func TestStepWall(t *testing.T) {
	t0 := time.Now()
	t1, ok := StepWall(t0.Add(time.Second), -time.Hour)
	if !ok {
		t.Skip("time.Time is not laid out as StepWall expects")
	}
	if got := t1.Sub(t0); got != time.Second {
		t.Errorf("monotonic interval %v, want 1s", got)
	}
	if got := t1.Round(0).Sub(t0.Round(0)); got != time.Second-time.Hour {
		t.Errorf("wall interval %v, want -59m59s", got)
	}
	if _, ok := StepWall(t0.Round(0), time.Hour); ok {
		t.Error("StepWall stepped a reading without a monotonic reading")
	}
}

func TestLine(t *testing.T) {
	t0 := time.Now()
	if _, ok := StepWall(t0, time.Hour); !ok {
		t.Skip("time.Time is not laid out as StepWall expects")
	}
	var l Line
	// Readings without a monotonic reading are their UnixNano, before and
	// after the line has a base, even far from it; saturated beyond the
	// years int64 nanoseconds span, where UnixNano is undefined.
	want := func(r time.Time) int64 {
		switch {
		case r.Year() > 2262:
			return math.MaxInt64
		case r.Year() < 1678:
			return math.MinInt64
		}
		return r.UnixNano()
	}
	for _, r := range []time.Time{time.Unix(1_000_000, 5), time.Unix(0, 0), time.Unix(-1<<40, 0), time.Unix(1<<40, 0)} {
		if got := l.UnixNano(r); got != want(r) {
			t.Errorf("before a base: UnixNano(%v) = %d, want %d", r, got, want(r))
		}
	}
	if got := l.UnixNano(t0); got != t0.UnixNano() {
		t.Errorf("the first monotonic reading: %d, want its UnixNano %d", got, t0.UnixNano())
	}
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		t1, _ := StepWall(t0.Add(3*time.Second), step)
		if got, want := l.UnixNano(t1), t0.UnixNano()+int64(3*time.Second); got != want {
			t.Errorf("3 s later after a step of %v: %d, want %d", step, got, want)
		}
	}
	for _, r := range []time.Time{time.Unix(1_000_000, 5), t0.Round(0).Add(time.Hour), time.Unix(-1<<40, 0), time.Unix(1<<40, 0),
		time.Unix(0, math.MaxInt64), time.Unix(0, math.MinInt64)} {
		if got := l.UnixNano(r); got != want(r) {
			t.Errorf("after a base: UnixNano(%v) = %d, want %d", r, got, want(r))
		}
	}
	// A monotonic reading beyond the span saturates too.
	if got := l.UnixNano(t0.Add(250 * 365 * 24 * time.Hour)); got != math.MaxInt64 {
		t.Errorf("250 years after the base: %d, want it saturated", got)
	}
}
