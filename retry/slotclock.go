package retry

import (
	"sync/atomic"
	"time"
	"weak"
)

// slotClock is the current slot number of a budget on the system clock,
// advanced by a timer at each slot boundary so that the budget's calls read
// one word instead of the clock. The timer holds it only weakly: once its
// budget is unreachable it is collected and the timer stops re-arming.
type slotClock struct {
	cur   atomic.Uint64
	start time.Time // with a monotonic reading
	width time.Duration
	_     [24]byte // a cache line of its own: read on every call
}

// newSlotClock returns a slot clock whose slot 0 begins at start.
func newSlotClock(start time.Time, width time.Duration) *slotClock {
	c := &slotClock{start: start, width: width}
	c.advance(weak.Make(c))
	return c
}

// load returns the current slot number. It never runs ahead of the time: a
// slot starts when its timer fires, at its boundary or up to the timer's
// delay after it.
func (c *slotClock) load() uint64 { return c.cur.Load() }

// advance stores the slot number of the current time and arms a timer for
// the next boundary.
func (c *slotClock) advance(wp weak.Pointer[slotClock]) {
	e := uint64(max(time.Since(c.start), 0) / c.width)
	if e > c.cur.Load() {
		c.cur.Store(e) // only this method writes, one call at a time
	}
	next := time.Until(c.start.Add(time.Duration(e+1) * c.width))
	time.AfterFunc(next, func() {
		if c := wp.Value(); c != nil {
			c.advance(wp)
		}
	})
}
