package retry

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Defaults of [AdmissionConfig].
const (
	DefaultMaxSessions         = 10000
	DefaultAdmissionRetryAfter = time.Second
)

// AdmissionConfig configures an [Admission]. The zero value admits
// everything (no caps) and tracks no sessions.
type AdmissionConfig struct {
	// MaxInFlight caps the requests admitted and not released, over all
	// sessions; 0 means no cap.
	MaxInFlight int
	// MaxPerSession caps the requests in flight of one session (an agent's
	// fan-out); 0 means no cap. A session is the key the caller admits a
	// request under (httplb's is the request's affinity key), which a
	// client usually chooses: it bounds a client that keeps its session,
	// as an agent does, not one that sends each request under a new key,
	// which only MaxInFlight bounds. To bound each client, admit through a
	// fair.Queue, whose principal is the tenant or the client's address
	// (see fair.Config.MaxWaitingPerPrincipal).
	MaxPerSession int
	// MaxSessions caps the sessions tracked for MaxPerSession (none are
	// tracked without it); beyond it, the session whose last request was
	// admitted longest ago is forgotten. 0 means [DefaultMaxSessions].
	MaxSessions int
	// RetryAfter is the wait suggested to refused callers; 0 means
	// [DefaultAdmissionRetryAfter].
	RetryAfter time.Duration
	// Observer, if set, is told of every refusal.
	Observer *Observer
}

// Admission caps concurrency so that a gateway fails fast with a 429
// instead of queueing forever: a global in-flight cap and a per-session cap.
// A refused Acquire returns an [*OverloadError] (errors.Is [ErrOverloaded])
// carrying the suggested Retry-After.
//
// With a per-session cap, sessions with requests in flight are tracked in a
// least-recently-used cache of MaxSessions entries (golang-lru's
// simplelru), and a session leaves it when its last request is released,
// so memory stays bounded however many session keys callers invent, and a
// new session is never refused for want of room. If more than MaxSessions
// sessions are active at once, the one whose last request was admitted
// longest ago is forgotten: its requests in flight still release correctly,
// but its next requests are counted afresh, so its cap may be exceeded by
// those still in flight. Size MaxSessions above the sessions you expect to
// be active together.
//
// Admission is safe for concurrent use; it starts no goroutines.
type Admission struct {
	maxInFlight int64
	perSession  int
	retryAfter  time.Duration
	obs         *Observer

	inflight atomic.Int64
	mu       sync.Mutex                            // protects sessions and the counts in it
	sessions *simplelru.LRU[string, *sessionCount] // active sessions

	// testHook, if not nil, is called by take between reading the
	// in-flight count and acting on it. Tests use it to interleave
	// admissions deterministically.
	testHook func()
}

// sessionCount is the number of a session's requests in flight. A released
// request decrements the count it incremented even after its session was
// forgotten.
type sessionCount struct{ n int }

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
	sessions, err := simplelru.NewLRU[string, *sessionCount](cfg.MaxSessions, nil)
	if err != nil {
		return nil, invalidf("admission MaxSessions %d: %v", cfg.MaxSessions, err)
	}
	return &Admission{
		maxInFlight: int64(cfg.MaxInFlight),
		perSession:  cfg.MaxPerSession,
		retryAfter:  cfg.RetryAfter,
		obs:         cfg.Observer,
		sessions:    sessions,
	}, nil
}

// Acquire admits one request of session ("" for none) or refuses it with an
// [*OverloadError]. On success the caller must call release when the request
// ends; calls after the first are no-ops.
//
// A request is refused only if, at one instant, MaxInFlight requests are
// admitted and not released, or MaxPerSession of its session are: a request
// being refused never holds a slot, even briefly, so it cannot cause another
// to be refused.
func (a *Admission) Acquire(session string) (release func(), err error) {
	var count *sessionCount
	if session == "" || a.perSession <= 0 {
		// Without a per-session cap, sessions are not tracked: the global
		// count alone, without the lock.
		if !a.take() {
			return nil, a.refuse("global")
		}
	} else {
		c, scope := a.enter(session)
		if c == nil {
			return nil, a.refuse(scope)
		}
		count = c
	}
	var once atomic.Bool
	return func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		if count != nil {
			a.leave(session, count)
		} else {
			a.inflight.Add(-1)
		}
	}, nil
}

// refuse returns the refusal of the given scope and tells the observer.
func (a *Admission) refuse(scope string) *OverloadError {
	oe := &OverloadError{Scope: scope, RetryAfter: a.retryAfter}
	a.obs.reject(oe)
	return oe
}

// take counts one more request in flight and reports true, or reports false
// if MaxInFlight are in flight. It increments the count only when it is
// below the cap, so that a refusal never shows in the count.
func (a *Admission) take() bool {
	if a.maxInFlight <= 0 {
		a.inflight.Add(1)
		return true
	}
	for {
		n := a.inflight.Load()
		if a.testHook != nil {
			a.testHook()
		}
		if n >= a.maxInFlight {
			return false
		}
		if a.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// enter admits one request of session, with a per-session cap, counting it
// in flight globally and in its session, and returns its session's count;
// or it returns nil and the scope of the refusal. A global refusal takes
// precedence. The session is checked before the global count is taken,
// both under mu, so that a request refused for its session never holds a
// global slot.
func (a *Admission) enter(session string) (*sessionCount, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.sessions.Peek(session)
	if ok && c.n >= a.perSession {
		if a.maxInFlight > 0 && a.inflight.Load() >= a.maxInFlight {
			return nil, "global"
		}
		return nil, "session"
	}
	if !a.take() {
		return nil, "global"
	}
	if ok {
		a.sessions.Get(session) // the most recently admitted
	} else {
		c = &sessionCount{}
		a.sessions.Add(session, c) // may forget the least recently admitted
	}
	c.n++
	return c, ""
}

// leave releases one request of session whose count is c, in its session
// and globally. Both change under mu, so that enter sees them consistent.
func (a *Admission) leave(session string, c *sessionCount) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c.n--
	if c.n == 0 {
		// Remove the session only if it is still tracked by this count,
		// not by a fresh one started after it was forgotten.
		if cur, ok := a.sessions.Peek(session); ok && cur == c {
			a.sessions.Remove(session)
		}
	}
	a.inflight.Add(-1)
}

// InFlight returns the requests admitted and not released.
func (a *Admission) InFlight() int { return int(a.inflight.Load()) }

// Sessions returns the number of sessions tracked: those with requests in
// flight, at most MaxSessions. It is 0 without a per-session cap
// (MaxPerSession 0), which needs no sessions tracked.
func (a *Admission) Sessions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions.Len()
}
