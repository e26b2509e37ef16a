package share

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/internal/timeline"
)

// TestWallClockSteps checks that a step of the wall clock, with readings
// that carry the monotonic clock as the system clock's do, changes no
// interval a Group measures: a peer that falls silent stops counting a TTL
// after its last batch, and this replica's requests keep their pick times.
func TestWallClockSteps(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		t.Run("step "+step.String(), func(t *testing.T) {
			clock, ok := timeline.NewTestClock()
			if !ok {
				t.Skip("time.Time is not laid out as timeline.StepWall expects")
			}
			a := offline(t, Config{ID: "a", Clock: clock})
			b := offline(t, Config{ID: "b", Clock: clock})
			obs := a.Observer(nil)
			for range 3 {
				obs.Pick(pickInfo("e1", 100, 10))
			}
			require.NoError(t, b.Receive(a.AppendBatch(nil)))
			clock.StepWall(step)
			clock.Advance(DefaultInterval)

			// a's requests are still in flight, and still as old.
			require.NoError(t, b.Receive(a.AppendBatch(nil)))
			l, ok := b.Load("e1")
			require.True(t, ok)
			assert.Equal(t, 3, l.Waiting)
			m, err := decode(a.AppendBatch(nil))
			require.NoError(t, err)
			require.Len(t, m.eps, 1)
			require.Len(t, m.eps[0].buckets, 1)
			assert.Equal(t, 1, m.eps[0].buckets[0].age, "the requests picked an interval ago")

			// a falls silent: its work stops counting after the TTL.
			clock.Advance(3*DefaultInterval + time.Millisecond)
			l, _ = b.Load("e1")
			assert.Equal(t, 0, l.Waiting, "a silent peer's work still counts")
			assert.Equal(t, 0, b.Stats().Peers)
		})
	}
}
