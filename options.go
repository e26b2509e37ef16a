package llmlb

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults for the options of [New].
const (
	// DefaultDecodeAllowance is the decode work, in tokens, charged for a
	// request whose output length is unknown (OutputTokens and MaxTokens are
	// 0). A known MaxTokens caps it.
	DefaultDecodeAllowance = 256
	// DefaultMaxSignalAge is how old an observation may be before it is
	// ignored and the endpoint falls back to this balancer's own counts.
	DefaultMaxSignalAge = 10 * time.Second
)

// Clock tells the time. The balancer reads it only when a signal, slow start
// or a speed estimate needs it, from concurrent picks; the other packages of
// the module that read time (signals, retry, fair, spill, share, httplb,
// grpclb) take the same Clock, and tests and simulators pass a fake one. Now
// must be safe for concurrent use. The balancer measures intervals between
// readings that carry the monotonic clock (as time.Now's do) on it, so a
// step of the wall clock changes none of them; other readings are taken as
// they are. Of those, one more than a second behind a time the balancer
// stamped at an earlier reading is a clock that went back: what decays from
// that time (a latency average, the confidence in a speed, the flow of
// prompt tokens priced with objectives) decays from the later reading, and
// an adapter routed at it counts as held nowhere, rather than until the
// clock catches up.
type Clock interface {
	Now() time.Time
}

// An Option configures a [Balancer] in [New]. Options are values: one may be
// passed to several calls of New, concurrently.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	clock        Clock
	src          rand.Source
	signal       Signal
	maxSignalAge time.Duration
	allowance    int
	slow         SlowStart
	observer     *Observer
	outputs      *outputPredictor
}

// WithClock sets the clock; the default is the system clock. The simulator
// and tests pass a fake one.
func WithClock(c Clock) Option {
	return optionFunc(func(cfg *config) error {
		if c == nil {
			return fmt.Errorf("%w: WithClock(nil)", ErrInvalidOption)
		}
		cfg.clock = c
		return nil
	})
}

// WithRand sets the source of randomness for sampling and tie-breaking. The
// balancer serializes access to it, so it need not be safe for concurrent
// use. The default is math/rand/v2's lock-free global generator; pass a
// seeded source (rand.NewPCG(1, 2)) for deterministic picks.
func WithRand(src rand.Source) Option {
	return optionFunc(func(cfg *config) error {
		if src == nil {
			return fmt.Errorf("%w: WithRand(nil)", ErrInvalidOption)
		}
		cfg.src = src
		return nil
	})
}

// WithSignal sets the engine signal used to score endpoints. The estimate of
// an endpoint's load is the signal's observation plus this balancer's own
// dispatches to it made after the observation was first seen and still
// outstanding, so a dispatch the observation may include is never counted
// twice and a stale observation never makes an endpoint look idle. This
// balancer's requests the observation counted (picked no later than it)
// that finished since no longer count: with one router the estimated
// requests are then exact, however old the observation, and with several an
// endpoint observed just now does not look busier, against one observed
// long ago, by the requests this balancer saw finish in between. An
// observation older than maxAge (0 means [DefaultMaxSignalAge]), or stamped
// more than maxAge ahead of the clock (taken before the clock stepped
// back), or one with invalid values (negative counts, KV usage outside [0, 1]), is ignored and
// the endpoint is scored on this balancer's own counts.
func WithSignal(s Signal, maxAge time.Duration) Option {
	return optionFunc(func(cfg *config) error {
		if s == nil {
			return fmt.Errorf("%w: WithSignal(nil)", ErrInvalidOption)
		}
		if maxAge < 0 {
			return fmt.Errorf("%w: WithSignal max age %v is negative", ErrInvalidOption, maxAge)
		}
		if maxAge == 0 {
			maxAge = DefaultMaxSignalAge
		}
		cfg.signal, cfg.maxSignalAge = s, maxAge
		return nil
	})
}

// WithDecodeAllowance sets the decode work in tokens charged to a request
// whose OutputTokens is 0. MaxTokens, when set, caps it. The default is
// [DefaultDecodeAllowance].
func WithDecodeAllowance(tokens int) Option {
	return optionFunc(func(cfg *config) error {
		if tokens < 0 || tokens > maxTokens {
			return fmt.Errorf("%w: decode allowance %d out of range", ErrInvalidOption, tokens)
		}
		cfg.allowance = tokens
		return nil
	})
}

// SlowStart ramps traffic into an endpoint that joined the balancer after its
// first membership, or that was marked healthy again, following Envoy's slow
// start: during Window after the endpoint's start its effective weight is
//
//	weight * max(MinWeightPercent/100, (max(elapsed, 1ms)/Window)^(1/Aggression))
//
// The zero value disables slow start.
type SlowStart struct {
	// Window is how long the ramp lasts; 0 disables slow start.
	Window time.Duration
	// Aggression shapes the ramp: 1 is linear, larger ramps faster early.
	// 0 means 1.
	Aggression float64
	// MinWeightPercent is the floor of the ramp, in percent of the full
	// weight, at least 1e-6. 0 means 10.
	MinWeightPercent float64
}

// minSlowStartPercent is the least [SlowStart].MinWeightPercent. Below it
// the effective weight of an endpoint at the floor is so small that the
// score of a loaded one, divided by it, overflows to +Inf: such endpoints
// would tie however loaded, and with a floor that underflows to 0 even an
// idle one would.
const minSlowStartPercent = 1e-6

// WithSlowStart enables slow start; see [SlowStart].
func WithSlowStart(s SlowStart) Option {
	return optionFunc(func(cfg *config) error {
		if s.Window < 0 {
			return fmt.Errorf("%w: slow start window %v is negative", ErrInvalidOption, s.Window)
		}
		if s.Aggression == 0 {
			s.Aggression = 1
		}
		if s.MinWeightPercent == 0 {
			s.MinWeightPercent = 10
		}
		if !(s.Aggression > 0) || math.IsInf(s.Aggression, 0) {
			return fmt.Errorf("%w: slow start aggression %v must be positive and finite", ErrInvalidOption, s.Aggression)
		}
		if !(s.MinWeightPercent >= minSlowStartPercent && s.MinWeightPercent <= 100) {
			return fmt.Errorf("%w: slow start min weight percent %v out of range [%g, 100]", ErrInvalidOption, s.MinWeightPercent, minSlowStartPercent)
		}
		cfg.slow = s
		return nil
	})
}

// factor is the slow-start multiplier of an endpoint started elapsed ago.
func (s *SlowStart) factor(elapsed time.Duration) float64 {
	if s.Window <= 0 || elapsed >= s.Window {
		return 1
	}
	elapsed = max(elapsed, time.Millisecond)
	f := float64(elapsed) / float64(s.Window)
	if s.Aggression != 1 {
		f = math.Pow(f, 1/s.Aggression)
	}
	return max(f, s.MinWeightPercent/100)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
