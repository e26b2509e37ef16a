package llmlb

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/timeline"
)

// newMonoClock returns a clock whose readings carry the monotonic clock and
// whose wall clock can be stepped, or skips t.
func newMonoClock(t *testing.T) *timeline.TestClock {
	c, ok := timeline.NewTestClock()
	if !ok {
		t.Skip("time.Time is not laid out as timeline.StepWall expects")
	}
	return c
}

// TestWallClockSteps checks that a step of the wall clock, with readings
// that carry the monotonic clock, changes no interval the balancer
// measures.
func TestWallClockSteps(t *testing.T) {
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		t.Run("step "+step.String(), func(t *testing.T) {
			clock := newMonoClock(t)
			var (
				mu                    sync.Mutex
				ages                  []time.Duration
				firstToken, doneAfter time.Duration
			)
			obs := &Observer{
				Pick: func(pi PickInfo) {
					mu.Lock()
					ages = append(ages, pi.SignalAge)
					mu.Unlock()
				},
				FirstToken: func(fi FirstTokenInfo) { firstToken = fi.Latency },
				Done:       func(di DoneInfo) { doneAfter = di.Latency },
			}
			sig := &fakeSignal{}
			b := mustNew(t, LeastOutstanding(), WithClock(clock), WithObserver(obs), WithSignal(sig, 5*time.Second))
			mustUpdate(t, b, eps(1))
			sig.Set("ep0", Load{At: clock.Now(), Running: 1})

			p, err := b.Pick(context.Background(), &Request{PromptTokens: 100})
			if err != nil {
				t.Fatal(err)
			}
			clock.StepWall(step)
			clock.Advance(100 * time.Millisecond)
			p.FirstToken()
			clock.Advance(time.Second)
			p.Done(nil)
			if firstToken != 100*time.Millisecond {
				t.Errorf("first token latency %v, want 100ms", firstToken)
			}
			if doneAfter != 1100*time.Millisecond {
				t.Errorf("done latency %v, want 1.1s", doneAfter)
			}

			// The observation taken before the step is 1.1 s old, not
			// an hour old or an hour ahead: it is still used.
			p, err = b.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			p.Done(nil)
			mu.Lock()
			defer mu.Unlock()
			if want := []time.Duration{0, 1100 * time.Millisecond}; len(ages) != 2 || ages[0] != want[0] || ages[1] != want[1] {
				t.Errorf("signal ages %v, want %v", ages, want)
			}
		})
	}
}

// TestWallClockStepSlowStart checks that slow start ramps on the monotonic
// clock: a step of the wall clock neither ends nor restarts it.
func TestWallClockStepSlowStart(t *testing.T) {
	clock := newMonoClock(t)
	var weights []float64
	pol := &probe{pick: "ep0"}
	b := mustNew(t, pol, WithClock(clock), WithSlowStart(SlowStart{Window: time.Minute}))
	mustUpdate(t, b, eps(1))
	mustUpdate(t, b, eps(2)) // ep1 joins and starts slowly
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		clock.StepWall(step)
		clock.Advance(20 * time.Second)
		p, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(nil)
		weights = append(weights, pol.weights["ep1"])
	}
	if len(weights) != 2 || math.Abs(weights[0]-1.0/3) > 1e-9 || math.Abs(weights[1]-2.0/3) > 1e-9 {
		t.Errorf("ep1's weights 20 s and 40 s into a 1 min linear slow start: %v, want [1/3 2/3]", weights)
	}
}
