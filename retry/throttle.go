package retry

import (
	"math"
	"sync/atomic"
)

// The values of [DefaultThrottleConfig]. gRPC has no defaults; these are
// the values of its service-config examples.
const (
	DefaultMaxTokens  = 10
	DefaultTokenRatio = 0.1
)

// ThrottleConfig configures a [Throttle]. Both fields are required, as in
// gRPC's retryThrottling policy; start from [DefaultThrottleConfig].
type ThrottleConfig struct {
	// MaxTokens is the bucket size, in (0, 1000].
	MaxTokens float64
	// TokenRatio is the tokens a success earns back, in (0, MaxTokens],
	// with a precision of 0.001.
	TokenRatio float64
}

// DefaultThrottleConfig returns a bucket of 10 tokens that a success refills
// by 0.1 of a token.
func DefaultThrottleConfig() ThrottleConfig {
	return ThrottleConfig{MaxTokens: DefaultMaxTokens, TokenRatio: DefaultTokenRatio}
}

// Throttle is gRPC's client-side retry throttle: the bucket starts full at
// MaxTokens, each failed attempt takes one token, each success puts back
// TokenRatio (never above MaxTokens), and retries are allowed only while more
// than MaxTokens/2 tokens remain. Create one with [NewThrottle]; the zero
// value is not usable. It is safe for concurrent use, takes no locks, and does
// not allocate. Tokens are kept in thousandths.
type Throttle struct {
	max   int64    // milli-tokens
	ratio int64    // milli-tokens per success
	_     [48]byte // tokens on a cache line of its own: every call writes it
	// tokens is the bucket's level in milli-tokens.
	tokens atomic.Int64
	_      [56]byte
}

// NewThrottle returns a throttle configured by cfg, with a full bucket. It
// rejects missing values and values out of range with an error wrapping
// [ErrInvalidConfig].
func NewThrottle(cfg ThrottleConfig) (*Throttle, error) {
	if cfg.MaxTokens == 0 || cfg.TokenRatio == 0 {
		return nil, invalidf("throttle MaxTokens and TokenRatio are required (DefaultThrottleConfig sets %v and %v)",
			DefaultMaxTokens, DefaultTokenRatio)
	}
	if !(cfg.MaxTokens > 0 && cfg.MaxTokens <= 1000) {
		return nil, invalidf("throttle MaxTokens %v must be in (0, 1000]", cfg.MaxTokens)
	}
	if !(cfg.TokenRatio > 0 && cfg.TokenRatio <= cfg.MaxTokens) {
		return nil, invalidf("throttle TokenRatio %v must be in (0, MaxTokens]", cfg.TokenRatio)
	}
	t := &Throttle{
		max:   int64(math.Round(cfg.MaxTokens * 1000)),
		ratio: int64(math.Round(cfg.TokenRatio * 1000)),
	}
	if t.ratio == 0 || t.max == 0 {
		return nil, invalidf("throttle values below the precision of 0.001")
	}
	t.tokens.Store(t.max)
	return t, nil
}

// Tokens returns the tokens in the bucket.
func (t *Throttle) Tokens() float64 { return float64(t.tokens.Load()) / 1000 }

// Start implements [Budget]; it does nothing, since a Throttle counts
// attempts' outcomes, not requests.
func (t *Throttle) Start() {}

// Withdraw reports whether a retry may be sent: more than MaxTokens/2 tokens
// remain. It takes no token and changes nothing; the retry's outcome, passed
// to Finish, does. It implements [Budget].
func (t *Throttle) Withdraw() bool { return 2*t.tokens.Load() > t.max }

// Finish records the outcome of an attempt, a first attempt or a retry
// alike: Succeeded puts back TokenRatio tokens (never above MaxTokens),
// Failed takes one token (never below zero), and Abandoned changes nothing.
// It implements [Budget].
func (t *Throttle) Finish(_ bool, o Outcome) {
	var delta int64
	switch o {
	case Succeeded:
		delta = t.ratio
	case Failed:
		delta = -1000
	default:
		return
	}
	for {
		old := t.tokens.Load()
		n := min(max(old+delta, 0), t.max)
		if n == old || t.tokens.CompareAndSwap(old, n) {
			return
		}
	}
}
