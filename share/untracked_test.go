package share

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/require"
)

// TestUntrackedPicksReleaseNothing runs random sequences of picks, first
// tokens and completions over more endpoints than MaxEndpoints, with
// batches in between that free the table's entries: the work recorded at
// each endpoint is always exactly that of the requests in flight whose pick
// was recorded (Stats.Dropped did not count it), never negative, and none
// once every request is done. A request whose pick was dropped must release
// nothing, even when an entry for its endpoint was made since for another.
func TestUntrackedPicksReleaseNothing(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			checkUntrackedPicks(t, seed)
		})
	}
}

// inflight is a request of checkUntrackedPicks.
type inflight struct {
	key               string
	picked            time.Time
	tracked, streamed bool
}

func checkUntrackedPicks(t *testing.T, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 1))
	clock := &fakeClock{t: at(0)}
	g := offline(t, Config{ID: "a", Clock: clock, MaxEndpoints: 2})
	obs := g.Observer(nil)
	keys := []string{"e0", "e1", "e2", "e3"}
	var reqs []*inflight
	check := func(step int) {
		t.Helper()
		var all int64
		for _, k := range keys {
			var streaming, queued int64
			for _, r := range reqs {
				if r.key == k && r.tracked {
					if r.streamed {
						streaming++
					} else {
						queued++
					}
				}
			}
			all += streaming + queued
			s, q, tokens := g.local.totals(k)
			require.Equal(t, [2]int64{streaming, queued}, [2]int64{s, q}, "step %d: streaming and queued at %s", step, k)
			require.GreaterOrEqual(t, tokens, int64(0), "step %d: tokens at %s", step, k)
			if streaming+queued == 0 {
				require.Zero(t, tokens, "step %d: tokens at %s without requests", step, k)
			}
		}
		g.local.mu.Lock()
		out := g.local.out
		g.local.mu.Unlock()
		require.Equal(t, all, out, "step %d: requests in flight", step)
	}
	for step := range 300 {
		clock.Advance(time.Duration(rnd.IntN(30)) * time.Millisecond)
		switch op := rnd.IntN(10); {
		case op < 4:
			k := keys[rnd.IntN(len(keys))]
			dropped := g.Stats().Dropped
			obs.Pick(pickInfo(k, 1+rnd.IntN(200), 1+rnd.IntN(50)))
			reqs = append(reqs, &inflight{key: k, picked: clock.Now(), tracked: g.Stats().Dropped == dropped})
		case op < 6 && len(reqs) > 0:
			r := reqs[rnd.IntN(len(reqs))]
			if !r.streamed {
				r.streamed = true
				obs.FirstToken(llmlb.FirstTokenInfo{Endpoint: key(r.key), Latency: clock.Now().Sub(r.picked)})
			}
		case op < 9 && len(reqs) > 0:
			i := rnd.IntN(len(reqs))
			r := reqs[i]
			reqs = append(reqs[:i], reqs[i+1:]...)
			obs.Done(llmlb.DoneInfo{Endpoint: key(r.key), Latency: clock.Now().Sub(r.picked), Streamed: r.streamed})
		default:
			g.AppendBatch(nil) // drops the entries of endpoints without work
		}
		check(step)
	}
	for len(reqs) > 0 {
		r := reqs[0]
		reqs = reqs[1:]
		obs.Done(llmlb.DoneInfo{Endpoint: key(r.key), Latency: clock.Now().Sub(r.picked), Streamed: r.streamed})
		check(-1)
	}
	// Once their finished counts are past the horizon, no entry is left.
	clock.Advance(time.Duration(g.local.width) * time.Duration(g.local.horizon+1))
	g.AppendBatch(nil)
	g.local.mu.Lock()
	defer g.local.mu.Unlock()
	require.Empty(t, g.local.eps)
	require.Empty(t, g.local.untracked)
	require.Zero(t, g.local.out)
}
