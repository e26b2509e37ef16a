package retry

import (
	"math"
	"sync/atomic"
)

// Envoy's retry budget defaults, the values of [DefaultConcurrentConfig].
const (
	DefaultBudgetPercent       = 20
	DefaultMinRetryConcurrency = 3
)

// ConcurrentConfig configures a [ConcurrentBudget]. As with the other
// budgets there are no hidden defaults: zero fields mean zero, so the zero
// value allows no retries at all. Start from [DefaultConcurrentConfig] for
// Envoy's budget.
type ConcurrentConfig struct {
	// BudgetPercent is the share of active attempts that may be retries, in
	// percent, in [0, 100], with a precision of 0.1. 0 means only
	// MinRetryConcurrency retries may be active.
	BudgetPercent float64
	// MinRetryConcurrency is the number of retries always allowed to be
	// active, even with no other traffic. It must not be negative.
	MinRetryConcurrency int
}

// DefaultConcurrentConfig returns Envoy's default budget: retries may be 20%
// of the active attempts, and at least 3 retries may always be active.
func DefaultConcurrentConfig() ConcurrentConfig {
	return ConcurrentConfig{BudgetPercent: DefaultBudgetPercent, MinRetryConcurrency: DefaultMinRetryConcurrency}
}

// ConcurrentBudget is Envoy's concurrent retry budget: a retry may start
// while the active retries are fewer than max(MinRetryConcurrency,
// BudgetPercent% of the active attempts), retries included. It bounds how
// many retries are in flight at once rather than how many are sent over time.
// Create one with [NewConcurrentBudget]; the zero value is not usable. It is
// safe for concurrent use, takes no locks, and does not allocate.
type ConcurrentBudget struct {
	permille int64 // budget in thousandths of the active attempts
	min      int64
	// testHook, if not nil, is called by Withdraw between reading state
	// and acting on it. Tests use it to interleave calls deterministically.
	testHook func()
	_        [40]byte // state on a cache line of its own: every call writes it
	// state packs the retries in flight (high 32 bits) and the attempts in
	// flight, retries included (low 32 bits), so that Start is one atomic
	// add, and Withdraw and Finish one compare-and-swap each (repeated if
	// another call changed state meanwhile).
	state atomic.Int64
	_     [56]byte
}

const (
	oneActive = 1
	oneRetry  = 1<<32 | oneActive
	lowMask   = 1<<32 - 1
)

// NewConcurrentBudget returns a budget configured by cfg. It rejects values
// out of range with an error wrapping [ErrInvalidConfig].
func NewConcurrentBudget(cfg ConcurrentConfig) (*ConcurrentBudget, error) {
	if !(cfg.BudgetPercent >= 0 && cfg.BudgetPercent <= 100) {
		return nil, invalidf("concurrent budget BudgetPercent %v must be in [0, 100]", cfg.BudgetPercent)
	}
	permille := int64(math.Round(cfg.BudgetPercent * 10))
	if permille == 0 && cfg.BudgetPercent != 0 {
		return nil, invalidf("concurrent budget BudgetPercent %v is below the precision of 0.1", cfg.BudgetPercent)
	}
	if cfg.MinRetryConcurrency < 0 {
		return nil, invalidf("concurrent budget MinRetryConcurrency %d is negative", cfg.MinRetryConcurrency)
	}
	return &ConcurrentBudget{permille: permille, min: int64(cfg.MinRetryConcurrency)}, nil
}

// Active returns the attempts and the retries in flight.
func (b *ConcurrentBudget) Active() (attempts, retries int64) {
	s := b.state.Load()
	return s & lowMask, s >> 32
}

// Start implements [Budget]: a first attempt becomes active.
func (b *ConcurrentBudget) Start() { b.state.Add(oneActive) }

// Withdraw implements [Budget]: it reports whether a retry may start and, if
// so, counts it as active until Finish.
//
// A refused retry never shows in the counts, even briefly, so it cannot
// cause another to be refused.
func (b *ConcurrentBudget) Withdraw() bool {
	for {
		s := b.state.Load()
		if b.testHook != nil {
			b.testHook()
		}
		r, a := s>>32+1, s&lowMask // r: the active retries with this one; a: the active attempts before it
		if r > b.min && r*1000 > a*b.permille {
			return false
		}
		if b.state.CompareAndSwap(s, s+oneRetry) {
			return true
		}
	}
}

// Finish implements [Budget]: the attempt stops being active. Calls must
// match Start and granted Withdraw calls one to one; one that matches no
// active attempt of its kind is ignored, so that it cannot corrupt the
// counts.
func (b *ConcurrentBudget) Finish(retry bool, _ Outcome) {
	d := int64(oneActive)
	if retry {
		d = oneRetry
	}
	for {
		s := b.state.Load()
		r, a := s>>32, s&lowMask
		if retry && r == 0 || !retry && a <= r {
			return // no such attempt is active
		}
		if b.state.CompareAndSwap(s, s-d) {
			return
		}
	}
}
