package share

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadsPolicy picks the first candidate and keeps the load estimate of
// each candidate it was offered.
type loadsPolicy struct{ loads map[string]llmlb.EndpointLoad }

func (p *loadsPolicy) Choose(c *llmlb.Candidates) int {
	for i := range c.Len() {
		p.loads[c.Key(i)] = c.Load(i)
	}
	return 0
}

// A request of this replica that the engine's observation counted and that
// finished since comes off the estimate once: the balancer takes its own
// finished requests off the observation itself, so the Group's Load takes
// off only the peers'.
func TestOwnFinishedRequestCountsOnce(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	// Buckets of 10 ms: the requests picked before the observation are
	// told from those after it.
	a := offline(t, Config{ID: "a", Clock: clock, Interval: 10 * time.Millisecond})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig, Interval: 10 * time.Millisecond, TTL: time.Hour})
	policy := &loadsPolicy{loads: map[string]llmlb.EndpointLoad{}}
	bal, err := llmlb.New(policy, llmlb.WithClock(clock), llmlb.WithSignal(b, 0), llmlb.WithObserver(b.Observer(nil)))
	require.NoError(t, err)
	require.NoError(t, bal.Update([]llmlb.Endpoint{key("e1")}))

	// The peer and this replica each send two requests to e1.
	for range 2 {
		a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	}
	var held []llmlb.Pick
	for range 2 {
		p, err := bal.Pick(context.Background(), &llmlb.Request{PromptTokens: 100, OutputTokens: 10})
		require.NoError(t, err)
		held = append(held, p)
	}
	clock.Advance(50 * time.Millisecond)
	transfer(a, b)
	// The engine then reports all four running.
	clock.Advance(50 * time.Millisecond)
	sig.Set("e1", llmlb.Load{At: clock.Now(), Running: 4, KVUsage: 0.5})
	_, err = bal.Pick(context.Background(), nil) // reads the observation
	require.NoError(t, err)
	require.Equal(t, int64(4), policy.loads["e1"].Requests)

	// One of this replica's requests finishes: three are left.
	clock.Advance(50 * time.Millisecond)
	held[0].Done(nil)
	transfer(a, b)
	_, err = bal.Pick(context.Background(), nil)
	require.NoError(t, err)
	assert.Equal(t, int64(3)+1, policy.loads["e1"].Requests, "the three left and the previous probe pick")
}

// A peer's request that never reached the engine (its Done says
// llmlb.ErrNotSent) was not in the engine's observation: it leaves the
// peer's requests in flight without being taken off the observation as a
// finished one.
func TestNotSentRequestIsNotTakenOffTheObservation(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	for range 2 {
		a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	}
	// One of the two reached the engine, which reports it waiting; the
	// other's connection is refused after the observation.
	sig.Set("e1", llmlb.Load{At: at(500), Waiting: 1, KVUsage: math.NaN()})
	clock.Set(at(700))
	a.Observer(nil).Done(llmlb.DoneInfo{Endpoint: key("e1"), Latency: 700 * time.Millisecond,
		Err: fmt.Errorf("dial tcp: connection refused: %w", llmlb.ErrNotSent)})
	clock.Set(at(850))
	transfer(a, b)
	l, _ := b.Load("e1")
	assert.Equal(t, 1, l.Waiting, "the request the engine holds")
	assert.Equal(t, 1, l.PeerWaiting)

	// A request that did reach the engine and failed there is gone from
	// it, and taken off.
	clock.Set(at(900))
	a.Observer(nil).Done(llmlb.DoneInfo{Endpoint: key("e1"), Latency: 900 * time.Millisecond, Err: errors.New("HTTP 500")})
	transfer(a, b)
	l, _ = b.Load("e1")
	assert.Equal(t, 0, l.Waiting)
}
