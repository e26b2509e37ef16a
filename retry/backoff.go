package retry

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of [BackoffConfig], from Envoy.
const (
	DefaultBackoffBase = 25 * time.Millisecond
	// The default cap is 10 times the base.
	defaultCapFactor = 10
)

// BackoffConfig configures [FullJitter] and [DecorrelatedJitter]. The zero
// value is Envoy's default: a 25 ms base and a cap of 10 times the base.
type BackoffConfig struct {
	// Base is the first back-off's scale; 0 means [DefaultBackoffBase]. It
	// must not be negative.
	Base time.Duration
	// Cap bounds every back-off; 0 means 10*Base. It must not be below Base.
	Cap time.Duration
	// Rand is the source of randomness; nil means math/rand/v2's global
	// generator. The back-off serializes its own draws, so a source used by
	// one back-off need not be safe for concurrent use; a source shared by
	// several back-offs (or with other code) must be. Pass a seeded source
	// for deterministic delays.
	Rand rand.Source
}

type jitter struct {
	base, cap time.Duration
	mu        sync.Mutex // protects rng
	rng       *rand.Rand // nil: use the global generator
}

func (j *jitter) init(cfg BackoffConfig) error {
	if cfg.Base == 0 {
		cfg.Base = DefaultBackoffBase
	}
	if cfg.Base < 0 {
		return invalidf("back-off base %v is negative", cfg.Base)
	}
	if cfg.Cap == 0 {
		if cfg.Base > (1<<63-1)/defaultCapFactor {
			return invalidf("back-off base %v is too large", cfg.Base)
		}
		cfg.Cap = defaultCapFactor * cfg.Base
	}
	if cfg.Cap < cfg.Base {
		return invalidf("back-off cap %v is below the base %v", cfg.Cap, cfg.Base)
	}
	j.base, j.cap = cfg.Base, cfg.Cap
	if cfg.Rand != nil {
		j.rng = rand.New(cfg.Rand)
	}
	return nil
}

// int64n returns a uniform number in [0, n); n > 0.
func (j *jitter) int64n(n int64) int64 {
	if j.rng == nil {
		return rand.Int64N(n)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.rng.Int64N(n)
}

// FullJitter is exponential back-off with full jitter: the n-th retry waits
// a uniform random time in [0, min(Cap, Base*2^(n-1))). It is safe for
// concurrent use. Create one with [NewFullJitter].
type FullJitter struct{ j jitter }

// NewFullJitter returns full-jitter back-off configured by cfg. It rejects a
// negative base or a cap below the base with an error wrapping
// [ErrInvalidConfig].
func NewFullJitter(cfg BackoffConfig) (*FullJitter, error) {
	f := new(FullJitter)
	if err := f.j.init(cfg); err != nil {
		return nil, err
	}
	return f, nil
}

// Backoff returns the wait before retry number n (1 for the first retry);
// prev is ignored. An n below 1 is taken as 1.
func (f *FullJitter) Backoff(n int, _ time.Duration) time.Duration {
	ceil := f.j.cap
	if shift := max(n, 1) - 1; shift < 62 && f.j.base <= f.j.cap>>shift {
		ceil = f.j.base << shift
	}
	if ceil <= 0 {
		return 0
	}
	return time.Duration(f.j.int64n(int64(ceil)))
}

// DecorrelatedJitter is decorrelated-jitter back-off: each wait is a uniform
// random time in [Base, 3*prev], capped at Cap, where prev is the previous
// wait (Base for the first retry). It spreads retries as widely as full
// jitter with fewer very short waits. It is safe for concurrent use; the
// caller carries prev. Create one with [NewDecorrelatedJitter].
type DecorrelatedJitter struct{ j jitter }

// NewDecorrelatedJitter returns decorrelated-jitter back-off configured by
// cfg. It rejects a negative base or a cap below the base with an error
// wrapping [ErrInvalidConfig].
func NewDecorrelatedJitter(cfg BackoffConfig) (*DecorrelatedJitter, error) {
	d := new(DecorrelatedJitter)
	if err := d.j.init(cfg); err != nil {
		return nil, err
	}
	return d, nil
}

// Backoff returns the wait before a retry given the previous wait prev (0
// or less for the first retry); n is ignored.
func (d *DecorrelatedJitter) Backoff(_ int, prev time.Duration) time.Duration {
	base, cp := d.j.base, d.j.cap
	prev = min(max(prev, base), cp)
	hi := time.Duration(math.MaxInt64)
	if prev <= hi/3 {
		hi = 3 * prev
	}
	// base >= 1ns, so hi-base+1 cannot overflow.
	return min(cp, base+time.Duration(d.j.int64n(int64(hi-base)+1)))
}
