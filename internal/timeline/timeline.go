// Package timeline places clock readings on a line of Unix nanoseconds that
// follows the monotonic clock, so that intervals measured on it survive a
// step of the wall clock.
package timeline

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Line is a time line. Its zero value is ready to use; it is safe for
// concurrent use.
type Line struct {
	base atomic.Pointer[base] // the first reading with a monotonic reading
}

type base struct {
	at   time.Time
	unix int64 // at.UnixNano()
}

// UnixNano returns t in Unix nanoseconds on the line. A reading that carries
// the monotonic clock, as time.Now's do, is placed at its monotonic distance
// from the first such reading the line saw, so that a step of the wall clock
// (an NTP correction, a virtual machine resumed) stretches or reverses no
// interval between such readings. Any other reading (a fake clock's, a
// timestamp parsed from elsewhere) is its UnixNano.
func (l *Line) UnixNano(t time.Time) int64 {
	b := l.base.Load()
	if b == nil {
		if t == t.Round(0) { // Round(0) strips the monotonic reading
			return unixNano(t)
		}
		l.base.CompareAndSwap(nil, &base{at: t, unix: unixNano(t)})
		b = l.base.Load()
	}
	// Sub measures on the monotonic clock when t carries it, else on the
	// wall clock, where the result is t.UnixNano() unless saturated.
	d := t.Sub(b.at)
	if d == math.MaxInt64 || d == math.MinInt64 {
		return unixNano(t)
	}
	if sum := b.unix + int64(d); (sum > b.unix) == (d > 0) {
		return sum
	}
	if d > 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}

// unixEpoch is the Unix epoch, without a monotonic reading.
var unixEpoch = time.Unix(0, 0)

// unixNano is t.UnixNano, saturated outside the years 1678 to 2262 that
// int64 nanoseconds span, where UnixNano's result is undefined.
func unixNano(t time.Time) int64 {
	if s := t.Unix(); s > -9e9 && s < 9e9 { // within the range, with room
		return t.UnixNano()
	}
	return int64(t.Sub(unixEpoch)) // saturates
}

// StepWall returns t with its wall clock moved by d (whole seconds) and its
// monotonic reading unchanged: what time.Now returns after the system clock
// was stepped. It is for tests. It reports false when t carries no
// monotonic reading or time.Time is not laid out as it expects (a flag bit,
// 33 bits of seconds and 30 of nanoseconds in its first word, the monotonic
// reading in its second).
func StepWall(t time.Time, d time.Duration) (time.Time, bool) {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	const hasMonotonic = 1 << 63
	if unsafe.Sizeof(t) != unsafe.Sizeof(layout{}) || d%time.Second != 0 {
		return t, false
	}
	u := t
	p := (*layout)(unsafe.Pointer(&u))
	if p.wall&hasMonotonic == 0 {
		return t, false
	}
	secs := int64(d / time.Second)
	p.wall += uint64(secs) << 30
	if u.Sub(t) != 0 || u.Unix()-t.Unix() != secs || u.Nanosecond() != t.Nanosecond() {
		return t, false
	}
	return u, true
}

// TestClock is a settable clock for tests whose readings carry a monotonic
// reading, as time.Now's do, and whose wall clock can be stepped apart from
// it. It is safe for concurrent use.
type TestClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewTestClock returns a TestClock reading time.Now, or false if StepWall
// cannot step its readings (see StepWall).
func NewTestClock() (*TestClock, bool) {
	now := time.Now()
	if _, ok := StepWall(now, time.Hour); !ok {
		return nil, false
	}
	return &TestClock{t: now}, true
}

// Now returns the clock's reading.
func (c *TestClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock, wall and monotonic, by d.
func (c *TestClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// StepWall moves the wall clock by d (whole seconds), as an NTP correction
// does, and leaves the monotonic clock where it is.
func (c *TestClock) StepWall(d time.Duration) {
	c.mu.Lock()
	c.t, _ = StepWall(c.t, d)
	c.mu.Unlock()
}
