package retry

import (
	"sync"
	"testing"
)

// TestConcurrentBudgetNoSpuriousRefusal interleaves two withdrawals with
// one retry allowed: A reads the counts while another retry is active; that
// retry then finishes and B asks, before A decides. B must be granted, since
// no retry is active when it asks, and A refused. Counting A's retry before
// checking it, and uncounting it on refusal, refused both.
func TestConcurrentBudgetNoSpuriousRefusal(t *testing.T) {
	b, err := NewConcurrentBudget(ConcurrentConfig{MinRetryConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Withdraw() {
		t.Fatal("the first retry was refused")
	}
	var fired, grantedB bool
	b.testHook = func() {
		if fired {
			return
		}
		fired = true
		b.Finish(true, Succeeded)
		grantedB = b.Withdraw()
	}
	grantedA := b.Withdraw()
	if !fired {
		t.Fatal("the hook was not called")
	}
	if !grantedB {
		t.Fatal("B refused with no retry active")
	}
	if grantedA {
		t.Fatal("A granted beyond MinRetryConcurrency 1")
	}
	if a, r := b.Active(); a != 1 || r != 1 {
		t.Fatalf("Active() = %d attempts, %d retries; want B's alone", a, r)
	}
	b.Finish(true, Succeeded)
	if a, r := b.Active(); a != 0 || r != 0 {
		t.Fatalf("Active() = %d attempts, %d retries at the end", a, r)
	}
}

// TestConcurrentBudgetCapHolds races withdrawals against a budget of two
// concurrent retries: the retries counted, as each withdrawer sees them,
// never exceed two, and the counts return to zero.
func TestConcurrentBudgetCapHolds(t *testing.T) {
	b, _ := NewConcurrentBudget(ConcurrentConfig{MinRetryConcurrency: 2})
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				granted := b.Withdraw()
				if _, r := b.Active(); r > 2 {
					t.Errorf("%d retries counted, cap 2", r)
					return
				}
				if granted {
					b.Finish(true, Succeeded)
				}
			}
		}()
	}
	wg.Wait()
	if a, r := b.Active(); a != 0 || r != 0 {
		t.Fatalf("Active() = %d attempts, %d retries at the end", a, r)
	}
}
