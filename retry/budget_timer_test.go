package retry

import (
	"runtime"
	"testing"
	"time"
	"weak"
)

// TestSlotTimerFollowsTime checks that on the system clock the timer moves
// the budget to each new slot and never ahead of the time.
func TestSlotTimerFollowsTime(t *testing.T) {
	b, err := NewPercentBudget(PercentConfig{TTL: 100 * time.Millisecond, PercentCanRetry: 1})
	if err != nil {
		t.Fatal(err)
	}
	width := time.Duration(b.width)
	deadline := time.Now().Add(10 * time.Second)
	for b.cur.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("slot %d after 10s of %v slots", b.cur.Load(), width)
		}
		before := b.cur.Load()
		if now := uint64(time.Since(b.start) / width); before > now {
			t.Fatalf("slot %d ahead of the time's slot %d", before, now)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSlotTimerStopsWhenUnreachable checks that the timer does not keep a
// dropped budget alive.
func TestSlotTimerStopsWhenUnreachable(t *testing.T) {
	b, err := NewPercentBudget(PercentConfig{TTL: 100 * time.Millisecond, PercentCanRetry: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Let the timer fire first, so that a callback keeping the budget
	// would have done so.
	deadline := time.Now().Add(10 * time.Second)
	for b.cur.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the slot timer did not fire in 10s")
		}
		time.Sleep(time.Millisecond)
	}
	wp := weak.Make(b)
	b = nil
	deadline = time.Now().Add(10 * time.Second)
	for wp.Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("budget still reachable 10s after it was dropped")
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
	if b.manual {
		t.Fatal("a budget on the system clock reads the clock on each call")
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
