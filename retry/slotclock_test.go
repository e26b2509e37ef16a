package retry

import (
	"runtime"
	"testing"
	"time"
	"weak"
)

// TestSlotClockFollowsTime checks that the timer-kept slot advances with the
// monotonic clock and never runs ahead of it.
func TestSlotClockFollowsTime(t *testing.T) {
	const width = 5 * time.Millisecond
	start := time.Now()
	c := newSlotClock(start, width)
	deadline := time.Now().Add(10 * time.Second)
	for c.load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("slot %d after 10s of %v slots", c.load(), width)
		}
		before := c.load()
		if now := uint64(time.Since(start) / width); before > now {
			t.Fatalf("slot %d ahead of the time's slot %d", before, now)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSlotClockStopsWhenUnreachable checks that the timer does not keep a
// dropped clock (and so its budget) alive.
func TestSlotClockStopsWhenUnreachable(t *testing.T) {
	wp := weak.Make(newSlotClock(time.Now(), 10*time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for wp.Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("slot clock still reachable 10s after it was dropped")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

// TestPercentBudgetSystemClock runs a budget on the system clock: deposits
// count at once and expire after about a TTL.
func TestPercentBudgetSystemClock(t *testing.T) {
	const ttl = 200 * time.Millisecond
	b, err := NewPercentBudget(PercentConfig{TTL: ttl, PercentCanRetry: 1})
	if err != nil {
		t.Fatal(err)
	}
	if b.ticker == nil {
		t.Fatal("a budget on the system clock has no slot timer")
	}
	for range 5 {
		b.Start()
	}
	// Unless a slot boundary passes meanwhile, the deposits count in full;
	// a deposit lives at least 0.9 TTL, far longer than this loop.
	granted := 0
	for b.Withdraw() {
		granted++
	}
	if granted != 5 {
		t.Fatalf("granted %d retries for 5 requests at 100%%, want 5", granted)
	}
	for range 5 {
		b.Start()
	}
	if got := b.Available(); got > 5 {
		t.Fatalf("Available() = %d, want at most 5", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Available() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("deposits still available 10s after they were made (TTL %v)", ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
