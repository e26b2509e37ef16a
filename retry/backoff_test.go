package retry

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestFullJitter(t *testing.T) {
	j, err := NewFullJitter(BackoffConfig{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond, Rand: rand.NewPCG(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 70; n++ {
		ceil := 100 * time.Millisecond
		if n < 5 {
			ceil = min(ceil, 10*time.Millisecond<<max(n-1, 0))
		}
		var maxSeen time.Duration
		for i := 0; i < 500; i++ {
			d := j.Backoff(n, 0)
			if d < 0 || d >= ceil {
				t.Fatalf("retry %d: %v outside [0, %v)", n, d, ceil)
			}
			maxSeen = max(maxSeen, d)
		}
		if maxSeen < ceil*8/10 {
			t.Fatalf("retry %d: max %v of 500 draws, far below the ceiling %v", n, maxSeen, ceil)
		}
	}
	// Deterministic for a seed.
	a, _ := NewFullJitter(BackoffConfig{Rand: rand.NewPCG(5, 6)})
	b, _ := NewFullJitter(BackoffConfig{Rand: rand.NewPCG(5, 6)})
	for n := 1; n < 20; n++ {
		if x, y := a.Backoff(n, 0), b.Backoff(n, 0); x != y {
			t.Fatalf("same seed, retry %d: %v != %v", n, x, y)
		}
	}
}

func TestDecorrelatedJitter(t *testing.T) {
	base, cp := 25*time.Millisecond, 250*time.Millisecond
	j, err := NewDecorrelatedJitter(BackoffConfig{Rand: rand.NewPCG(3, 4)})
	if err != nil {
		t.Fatal(err)
	}
	prev := time.Duration(0)
	for i := 0; i < 2000; i++ {
		d := j.Backoff(i+1, prev)
		hi := 3 * max(prev, base)
		if d < base || d > min(cp, hi) {
			t.Fatalf("draw %d: %v outside [%v, min(%v, %v)]", i, d, base, cp, hi)
		}
		prev = d
	}
	// A huge previous wait is capped, not overflowed.
	if d := j.Backoff(1, time.Duration(1<<62)); d < base || d > cp {
		t.Fatalf("huge prev: %v", d)
	}
}

func TestBackoffBadConfig(t *testing.T) {
	for _, cfg := range []BackoffConfig{
		{Base: -time.Millisecond},
		{Base: time.Second, Cap: time.Millisecond},
		{Base: 1 << 62},
	} {
		if _, err := NewFullJitter(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewFullJitter(%+v) = %v", cfg, err)
		}
		if _, err := NewDecorrelatedJitter(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewDecorrelatedJitter(%+v) = %v", cfg, err)
		}
	}
	j, err := NewFullJitter(BackoffConfig{})
	if err != nil || j.j.base != DefaultBackoffBase || j.j.cap != 10*DefaultBackoffBase {
		t.Fatalf("defaults: %+v, %v", j, err)
	}
}
