package retry

import (
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [AdmissionConfig].
const (
	DefaultMaxSessions         = 10000
	DefaultAdmissionRetryAfter = time.Second
)

// AdmissionConfig configures an [Admission]. The zero value admits
// everything (no caps) but still bounds the sessions tracked.
type AdmissionConfig struct {
	// MaxInFlight caps the requests admitted and not released, over all
	// sessions; 0 means no cap.
	MaxInFlight int
	// MaxPerSession caps the requests in flight of one session (an agent's
	// fan-out); 0 means no cap.
	MaxPerSession int
	// MaxSessions caps the sessions with requests in flight; a request of a
	// new session beyond it is refused. 0 means [DefaultMaxSessions].
	MaxSessions int
	// RetryAfter is the wait suggested to refused callers; 0 means
	// [DefaultAdmissionRetryAfter].
	RetryAfter time.Duration
}

// Admission caps concurrency so that a gateway fails fast with a 429
// instead of queueing forever: a global in-flight cap and a per-session cap.
// A refused Acquire returns an [*OverloadError] (errors.Is [ErrOverloaded])
// carrying the suggested Retry-After.
//
// Only sessions with requests in flight are tracked, in a map whose size is
// capped by MaxSessions. This is the bounded table a per-session cap needs,
// and it is never wrong: an idle session's count is zero, so forgetting it
// loses nothing, while a least-recently-used cache could evict a session
// whose requests are still in flight and so reset its count and break its
// cap. When MaxSessions sessions are active, a new session is refused rather
// than an active one forgotten.
//
// Admission is safe for concurrent use; it starts no goroutines.
type Admission struct {
	maxInFlight int64
	perSession  int
	maxSessions int
	retryAfter  time.Duration

	inflight atomic.Int64
	mu       sync.Mutex     // protects sessions
	sessions map[string]int // requests in flight per active session
}

// NewAdmission returns an admission controller configured by cfg. It rejects
// negative values with an error wrapping [ErrInvalidConfig].
func NewAdmission(cfg AdmissionConfig) (*Admission, error) {
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = DefaultAdmissionRetryAfter
	}
	switch {
	case cfg.MaxInFlight < 0:
		return nil, invalidf("admission MaxInFlight %d is negative", cfg.MaxInFlight)
	case cfg.MaxPerSession < 0:
		return nil, invalidf("admission MaxPerSession %d is negative", cfg.MaxPerSession)
	case cfg.MaxSessions < 0:
		return nil, invalidf("admission MaxSessions %d is negative", cfg.MaxSessions)
	case cfg.RetryAfter < 0:
		return nil, invalidf("admission RetryAfter %v is negative", cfg.RetryAfter)
	}
	return &Admission{
		maxInFlight: int64(cfg.MaxInFlight),
		perSession:  cfg.MaxPerSession,
		maxSessions: cfg.MaxSessions,
		retryAfter:  cfg.RetryAfter,
		sessions:    make(map[string]int),
	}, nil
}

// Acquire admits one request of session ("" for none) or refuses it with an
// [*OverloadError]. On success the caller must call release when the request
// ends; calls after the first are no-ops.
func (a *Admission) Acquire(session string) (release func(), err error) {
	if a.maxInFlight > 0 {
		if a.inflight.Add(1) > a.maxInFlight {
			a.inflight.Add(-1)
			return nil, &OverloadError{Scope: "global", RetryAfter: a.retryAfter}
		}
	} else {
		a.inflight.Add(1)
	}
	if session != "" {
		if err := a.enter(session); err != nil {
			a.inflight.Add(-1)
			return nil, err
		}
	}
	var once atomic.Bool
	return func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		if session != "" {
			a.leave(session)
		}
		a.inflight.Add(-1)
	}, nil
}

func (a *Admission) enter(session string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.sessions[session]
	switch {
	case !ok && len(a.sessions) >= a.maxSessions:
		return &OverloadError{Scope: "sessions", RetryAfter: a.retryAfter}
	case a.perSession > 0 && n >= a.perSession:
		return &OverloadError{Scope: "session", RetryAfter: a.retryAfter}
	}
	a.sessions[session] = n + 1
	return nil
}

func (a *Admission) leave(session string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.sessions[session]; n > 1 {
		a.sessions[session] = n - 1
	} else {
		delete(a.sessions, session)
	}
}

// InFlight returns the requests admitted and not released.
func (a *Admission) InFlight() int { return int(a.inflight.Load()) }

// Sessions returns the number of sessions with requests in flight.
func (a *Admission) Sessions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sessions)
}
