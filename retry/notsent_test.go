package retry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// hookPicker picks with Picker and then calls after, if set, with the
// number of the pick, from 1.
type hookPicker struct {
	Picker
	n     atomic.Int32
	after func(n int32)
}

func (h *hookPicker) Pick(ctx context.Context, r *llmlb.Request) (llmlb.Pick, error) {
	p, err := h.Picker.Pick(ctx, r)
	if h.after != nil {
		h.after(h.n.Add(1))
	}
	return p, err
}

// endings records the errors that picks end with.
type endings struct {
	mu   sync.Mutex
	errs []error
}

func (e *endings) done(d llmlb.DoneInfo) {
	e.mu.Lock()
	e.errs = append(e.errs, d.Err)
	e.mu.Unlock()
}

// notSent returns how many picks ended unsent.
func (e *endings) notSent() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, err := range e.errs {
		if errors.Is(err, errNotSent) {
			n++
		}
	}
	return n
}

// newObservedBalancer is newBalancer whose picks' ends are recorded in e.
func newObservedBalancer(t testing.TB, e *endings, keys ...string) *llmlb.Balancer {
	t.Helper()
	return newBalancerOpts(t, llmlb.RoundRobin(), []llmlb.Option{llmlb.WithObserver(&llmlb.Observer{Done: e.done})}, keys...)
}

// newReserveBudget returns a PercentBudget that holds reserve retries and
// gains none from requests.
func newReserveBudget(t testing.TB, reserve int) *PercentBudget {
	t.Helper()
	b, err := NewPercentBudget(PercentConfig{TTL: 10 * time.Second, MinRetriesPerSec: float64(reserve) / 10, Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// loopEvents counts what a Loop tells its Observer.
type loopEvents struct {
	retries, hedges, denied atomic.Int32
}

func (e *loopEvents) observer() *Observer {
	return &Observer{
		Retry:  func(int, error) { e.retries.Add(1) },
		Hedge:  func(int) { e.hedges.Add(1) },
		Denied: func() { e.denied.Add(1) },
	}
}

// A hedge that is not sent takes nothing from the budget and is not counted
// as a hedge: when no endpoint is left for it, when the caller leaves
// during its pick, and when an attempt commits during its pick. A pick it
// made ends as not sent.
func TestHedgeNotSentTakesNoBudget(t *testing.T) {
	cases := []struct {
		name    string
		keys    []string
		exclude []string
		during  string // what happens during the hedge's pick: "", "cancel" or "commit"
		want    error  // Do's error
		notSent int    // picks ended unsent
	}{
		{"one endpoint", []string{"a"}, nil, "", nil, 0},
		{"others excluded", []string{"a", "b"}, []string{"b"}, "", nil, 0},
		{"caller left during the pick", []string{"a", "b"}, nil, "cancel", context.Canceled, 1},
		{"committed during the pick", []string{"a", "b"}, nil, "commit", nil, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var ends endings
			b := newObservedBalancer(t, &ends, c.keys...)
			budget := newReserveBudget(t, 10)
			before := budget.Available()
			release := make(chan struct{})   // the first attempt may commit
			committed := make(chan struct{}) // it has
			p := &hookPicker{Picker: b, after: func(n int32) {
				if n != 2 { // not the hedge's
					return
				}
				if c.during == "cancel" {
					cancel()
					return
				}
				close(release)
				if c.during == "commit" {
					<-committed
				}
			}}
			var ev loopEvents
			l, err := NewLoop(p, LoopConfig{
				Budget:   budget,
				Observer: ev.observer(),
				Hedge:    HedgeConfig{Delay: time.Hour},
				After:    func(time.Duration) <-chan time.Time { return closedTime }, // hedge at once
			})
			if err != nil {
				t.Fatal(err)
			}
			var hedges atomic.Int32
			err = l.Do(ctx, &llmlb.Request{Exclude: c.exclude}, func(ctx context.Context, a *Attempt) error {
				if a.Hedge() {
					hedges.Add(1)
					<-ctx.Done()
					return ctx.Err()
				}
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				if !a.FirstToken() {
					return ctx.Err()
				}
				if c.during == "commit" {
					close(committed)
				}
				return nil
			})
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("Do = %v, want %v", err, c.want)
			}
			if n := hedges.Load(); n != 0 {
				t.Errorf("hedges sent %d, want 0", n)
			}
			if got := budget.Available(); got != before {
				t.Errorf("budget has %d retries after a hedge that was not sent, want %d", got, before)
			}
			if h, d := ev.hedges.Load(), ev.denied.Load(); h != 0 || d != 0 {
				t.Errorf("observed %d hedges and %d refused, want none", h, d)
			}
			if n := ends.notSent(); n != c.notSent {
				t.Errorf("%d picks ended unsent, want %d (picks ended with %v)", n, c.notSent, ends.errs)
			}
			assertIdle(t, b)
		})
	}
}

// closedTime is a channel that is always ready.
var closedTime = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()
