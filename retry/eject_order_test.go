package retry

import (
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// stallClock is a fakeClock whose next reading, once armed, stalls after
// the time is read until released: the goroutine reading it holds a time
// older than the clock's while other goroutines go on.
type stallClock struct {
	*fakeClock
	mu      sync.Mutex // protects armed
	armed   bool
	read    chan struct{} // receives when the armed reading is taken
	release chan struct{} // closed to let it return
}

func newStallClock() *stallClock {
	return &stallClock{fakeClock: newFakeClock(), read: make(chan struct{}), release: make(chan struct{})}
}

func (c *stallClock) Now() time.Time {
	now := c.fakeClock.Now()
	c.mu.Lock()
	armed := c.armed
	c.armed = false
	c.mu.Unlock()
	if armed {
		c.read <- struct{}{}
		<-c.release
	}
	return now
}

// stalled runs f in a goroutine whose first clock reading stalls, advances
// the clock by d, runs then, and only then lets f go on with its reading,
// now d old; it returns when f has.
func (c *stallClock) stalled(f func(), d time.Duration, then func()) {
	c.mu.Lock()
	c.armed = true
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-c.read
	c.Advance(d)
	then()
	close(c.release)
	<-done
}

// Of two concurrent quota reports for one endpoint, the one that read the
// clock last sets its headroom, even if the other one takes the lock
// after it.
func TestEjectorQuotaOutOfOrder(t *testing.T) {
	clk := newStallClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk})
	quota := func(remaining string) http.Header {
		return http.Header{"X-Ratelimit-Limit-Requests": {"100"}, "X-Ratelimit-Remaining-Requests": {remaining}, "X-Ratelimit-Reset-Requests": {"60s"}}
	}
	clk.stalled(func() { e.ReportQuota("a", quota("20")) }, 10*time.Second, func() {
		e.ReportQuota("a", quota("80"))
	})
	if h, ok := e.Headroom("a"); !ok || h != 0.8 {
		t.Fatalf("headroom %v, %v after the older report took the lock last; want 0.8, the newer one's", h, ok)
	}
	checkEjector(t, e)
}

// A report that takes the lock after one of a later time applies at that
// later time: the ejection it causes lasts its whole time, rather than
// ending already due.
func TestEjectorReportOutOfOrder(t *testing.T) {
	clk := newStallClock()
	b := newBalancer(t, "a", "b")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1, BaseEjectionTime: 30 * time.Second})
	clk.stalled(func() { e.Report("a", &StatusError{Code: 500}) }, 30*time.Second, e.Sweep)
	if got := e.Ejected(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Ejected() = %v right after the failure applied; want [a]", got)
	}
	if n, next := e.Out(); n != 1 || next != 30*time.Second {
		t.Fatalf("Out() = %d, %v; want 1, 30s", n, next)
	}
	checkEjector(t, e)
}

// A clock that read once far ahead and came back (an injected clock
// without monotonic readings) does not hold the ejections and cooldowns
// after it, nor those set at that reading, beyond their bounds from the
// time it came back to: a reading more than maxReorder older than the
// latest applied is a clock gone back, not a report that took the lock
// late.
func TestEjectorClockStepsBack(t *testing.T) {
	clk := newFakeClock()
	t0 := clk.Now()
	b := newBalancer(t, "a", "b", "c", "d")
	e, _ := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1, BaseEjectionTime: 30 * time.Second,
		MaxEjectionPercent: 100, MaxCooldown: time.Minute})
	quota := func(remaining string) http.Header {
		return http.Header{"X-Ratelimit-Limit-Requests": {"100"}, "X-Ratelimit-Remaining-Requests": {remaining}, "X-Ratelimit-Reset-Requests": {"60s"}}
	}
	// One reading a day ahead: an ejection, a cooldown and a quota
	// report at that time.
	clk.Advance(24 * time.Hour)
	e.Report("b", &StatusError{Code: 500})
	e.Report("c", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"60"}}})
	e.ReportQuota("d", quota("10"))
	if n, _ := e.Out(); n != 2 {
		t.Fatalf("Out() = %d after an ejection and a cooldown; want 2", n)
	}
	// Back to the right time: an ejection after it lasts its 30 s.
	clk.Advance(-24 * time.Hour)
	e.Report("a", &StatusError{Code: 500})
	e.ReportQuota("d", quota("90"))
	if h, ok := e.Headroom("d"); !ok || h != 0.9 {
		t.Fatalf("headroom %v, %v after the clock came back; want 0.9, the report since", h, ok)
	}
	clk.Advance(31 * time.Second)
	e.Sweep()
	if got := e.Ejected(); slices.Contains(got, "a") {
		t.Fatalf("Ejected() = %v 31 s after a was ejected for 30 s", got)
	}
	// Those set at the reading ahead end within their bounds from the
	// time the clock came back to, not a day later.
	clk.Advance(t0.Add(DefaultMaxEjectionTime + time.Second).Sub(clk.Now()))
	e.Sweep()
	if got := e.Ejected(); len(got) != 0 {
		t.Fatalf("Ejected() = %v past MaxEjectionTime and MaxCooldown from the step back; want none", got)
	}
	checkEjector(t, e)
}
