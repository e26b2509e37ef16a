package retry

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/llmlb/llmlb"
)

// Defaults of [EjectorConfig], from Envoy's outlier detection.
const (
	DefaultConsecutiveFailures = 5
	DefaultBaseEjectionTime    = 30 * time.Second
	DefaultMaxEjectionTime     = 300 * time.Second
	DefaultMaxEjectionPercent  = 10
)

// maxTracked bounds the endpoints an [Ejector] keeps state for.
const maxTracked = 10000

// Health is where an [Ejector] marks endpoints; [*llmlb.Balancer] implements
// it.
type Health interface {
	SetHealthy(key string, healthy bool) error
	Stats() []llmlb.EndpointStats
}

// EjectorConfig configures an [Ejector]. The zero value is Envoy's default
// outlier detection: eject after 5 consecutive failures for 30 s times the
// number of ejections, at most 300 s, and never more than 10% of the
// endpoints (though always at least one).
type EjectorConfig struct {
	// ConsecutiveFailures ejects an endpoint; 0 means
	// [DefaultConsecutiveFailures].
	ConsecutiveFailures int
	// BaseEjectionTime is multiplied by the times the endpoint was ejected;
	// 0 means [DefaultBaseEjectionTime].
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection, and is how long an endpoint must
	// stay healthy for its ejection count to reset; 0 means
	// [DefaultMaxEjectionTime]. It must not be below BaseEjectionTime.
	MaxEjectionTime time.Duration
	// MaxEjectionPercent bounds the share of endpoints ejected at once, in
	// (0, 100]; one endpoint may always be ejected. 0 means
	// [DefaultMaxEjectionPercent].
	MaxEjectionPercent float64
	// Classify maps an attempt's error to Succeeded (resets the count),
	// Failed (counts) or Abandoned (ignored); nil means [HealthOutcome].
	Classify func(err error) Outcome
	// Clock tells the time; nil means the system clock.
	Clock Clock
}

// Ejector is outlier detection per endpoint: an endpoint with
// ConsecutiveFailures failures in a row is marked unhealthy in the balancer
// for BaseEjectionTime times the number of times it was ejected (capped at
// MaxEjectionTime), then marked healthy again, which starts the balancer's
// slow start. It is then half-open: its first success closes it, its first
// failure ejects it again, for longer. Overload answers do not count: busy is
// not unhealthy. Create one with [NewEjector]; report outcomes with Report
// (a [Loop] does it when the Ejector is its Reporter). Ejections end lazily,
// on the next Report or Sweep after their time; call [Ejector.Run] to end
// them when no traffic arrives. It starts no goroutines and is safe for
// concurrent use; state is kept only for endpoints that are failing,
// ejected, or recently ejected, and for at most 10,000 of them.
type Ejector struct {
	h         Health
	threshold int
	base, max time.Duration
	percent   float64
	classify  func(error) Outcome
	clock     Clock

	mu      sync.Mutex // protects the fields below
	eps     map[string]*epHealth
	ejected int
	next    time.Time // earliest end of an ejection; zero = none
}

type epHealth struct {
	consecutive int
	ejections   int       // times ejected, for the ejection time
	until       time.Time // end of the current ejection; zero = not ejected
	halfOpen    bool      // restored, no outcome seen since
	restored    time.Time // when the last ejection ended
}

// NewEjector returns an ejector that marks endpoints in h (usually an
// [*llmlb.Balancer]) and is configured by cfg. It rejects a nil h and
// values out of range with an error wrapping [ErrInvalidConfig].
func NewEjector(h Health, cfg EjectorConfig) (*Ejector, error) {
	if h == nil {
		return nil, invalidf("ejector has a nil Health")
	}
	if cfg.ConsecutiveFailures == 0 {
		cfg.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if cfg.BaseEjectionTime == 0 {
		cfg.BaseEjectionTime = DefaultBaseEjectionTime
	}
	if cfg.MaxEjectionTime == 0 {
		cfg.MaxEjectionTime = max(DefaultMaxEjectionTime, cfg.BaseEjectionTime)
	}
	if cfg.MaxEjectionPercent == 0 {
		cfg.MaxEjectionPercent = DefaultMaxEjectionPercent
	}
	switch {
	case cfg.ConsecutiveFailures < 0:
		return nil, invalidf("ejector ConsecutiveFailures %d is negative", cfg.ConsecutiveFailures)
	case cfg.BaseEjectionTime < 0:
		return nil, invalidf("ejector BaseEjectionTime %v is negative", cfg.BaseEjectionTime)
	case cfg.MaxEjectionTime < cfg.BaseEjectionTime:
		return nil, invalidf("ejector MaxEjectionTime %v is below BaseEjectionTime %v", cfg.MaxEjectionTime, cfg.BaseEjectionTime)
	case !(cfg.MaxEjectionPercent > 0 && cfg.MaxEjectionPercent <= 100):
		return nil, invalidf("ejector MaxEjectionPercent %v must be in (0, 100]", cfg.MaxEjectionPercent)
	}
	e := &Ejector{
		h:         h,
		threshold: cfg.ConsecutiveFailures,
		base:      cfg.BaseEjectionTime,
		max:       cfg.MaxEjectionTime,
		percent:   cfg.MaxEjectionPercent,
		classify:  cfg.Classify,
		clock:     clockOr(cfg.Clock),
		eps:       make(map[string]*epHealth),
	}
	if e.classify == nil {
		e.classify = HealthOutcome
	}
	return e, nil
}

// HealthOutcome is the default classification of an attempt's error for
// outlier detection. nil and HTTP statuses below 500 (the endpoint answered)
// are Succeeded. Overload answers are Abandoned: HTTP 429, HTTP 503 and gRPC
// UNAVAILABLE with a pushback header read by [FromHeader] (Retry-After,
// grpc-retry-pushback-ms, rate-limit resets), gRPC RESOURCE_EXHAUSTED, and
// [*OverloadError]; so are context errors and errors wrapping [ErrExhausted]
// (a lower layer gave up, which says nothing of this endpoint). Other HTTP
// 5xx, gRPC UNAVAILABLE, INTERNAL and UNKNOWN, and errors without a status
// (transport failures) are Failed; other gRPC codes are Succeeded.
func HealthOutcome(err error) Outcome {
	if err == nil {
		return Succeeded
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrExhausted) || errors.Is(err, ErrOverloaded) {
		return Abandoned
	}
	var se *StatusError
	if !errors.As(err, &se) {
		return Failed
	}
	if se.GRPC {
		switch se.Code {
		case GRPCResourceExhausted:
			return Abandoned
		case GRPCUnavailable, 13, 2: // UNAVAILABLE, INTERNAL, UNKNOWN
			if hasPushback(se.Header) {
				return Abandoned
			}
			return Failed
		}
		return Succeeded
	}
	switch {
	case se.Code == 429, se.Code == 503 && hasPushback(se.Header):
		return Abandoned
	case se.Code >= 500:
		return Failed
	}
	return Succeeded
}

// Report records how an attempt on the endpoint with key ended. Reports for
// an ejected endpoint (requests sent before its ejection) are ignored.
func (e *Ejector) Report(key string, err error) {
	o := e.classify(err)
	if o == Abandoned {
		e.Sweep()
		return
	}
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sweep(now)
	st := e.eps[key]
	if st == nil {
		if o == Succeeded || len(e.eps) >= maxTracked {
			return
		}
		st = new(epHealth)
		e.eps[key] = st
	}
	if !st.until.IsZero() {
		return
	}
	if o == Succeeded {
		st.consecutive, st.halfOpen = 0, false
		if st.ejections > 0 && now.Sub(st.restored) >= e.max {
			st.ejections = 0
		}
		if st.ejections == 0 {
			delete(e.eps, key)
		}
		return
	}
	st.consecutive++
	if st.halfOpen || st.consecutive >= e.threshold {
		e.eject(key, st, now)
	}
}

// eject ejects the endpoint if the ejection cap allows. e.mu is held.
func (e *Ejector) eject(key string, st *epHealth, now time.Time) {
	allowed := max(1, int(e.percent*float64(len(e.h.Stats()))/100))
	if e.ejected >= allowed {
		return
	}
	if err := e.h.SetHealthy(key, false); err != nil {
		delete(e.eps, key) // not a member
		return
	}
	st.ejections++
	d := e.max
	if st.ejections <= int(e.max/max(e.base, 1)) {
		d = e.base * time.Duration(st.ejections)
	}
	st.until = now.Add(d)
	st.consecutive, st.halfOpen = 0, false
	e.ejected++
	if e.next.IsZero() || st.until.Before(e.next) {
		e.next = st.until
	}
}

// Sweep ends the ejections whose time has passed, marking their endpoints
// healthy again. Report calls it; call it (or Run) when traffic may stop.
func (e *Ejector) Sweep() {
	now := e.clock.Now()
	e.mu.Lock()
	e.sweep(now)
	e.mu.Unlock()
}

// sweep is Sweep with e.mu held.
func (e *Ejector) sweep(now time.Time) {
	if e.next.IsZero() || now.Before(e.next) {
		return
	}
	e.next = time.Time{}
	for key, st := range e.eps {
		if st.until.IsZero() {
			continue
		}
		if now.Before(st.until) {
			if e.next.IsZero() || st.until.Before(e.next) {
				e.next = st.until
			}
			continue
		}
		st.until, st.halfOpen, st.restored = time.Time{}, true, now
		e.ejected--
		if err := e.h.SetHealthy(key, true); err != nil {
			delete(e.eps, key) // no longer a member
		}
	}
}

// Run calls Sweep every interval (1 s if interval is not positive) until
// ctx ends, and returns ctx's error.
func (e *Ejector) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			e.Sweep()
		}
	}
}

// Ejected returns the keys of the endpoints ejected now, sorted.
func (e *Ejector) Ejected() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var keys []string
	for key, st := range e.eps {
		if !st.until.IsZero() {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	return keys
}

// hasPushback reports whether h carries any header [FromHeader] reads.
func hasPushback(h http.Header) bool {
	for _, name := range [...]string{HeaderGRPCPushback, HeaderRetryAfter, HeaderRateLimitReset,
		HeaderXRateLimitReset, HeaderResetRequests, HeaderResetTokens} {
		if h.Get(name) != "" {
			return true
		}
	}
	return false
}
