package share

import (
	"math"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A boundary of a peer's ring without a finished count had none finished:
// the counts on either side of it are not interpolated across it. Else a
// request that finished long before the observation, and another picked
// long after it, take a request the engine still runs off its count, and a
// busy endpoint looks idle.
func TestLoadFinishedCountsAreNotBridgedAcrossGaps(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	obs := a.Observer(nil)
	run := func(pick, done int) {
		clock.Set(at(pick))
		obs.Pick(pickInfo("e1", 10, 10))
		obs.FirstToken(llmlb.FirstTokenInfo{Endpoint: key("e1")})
		clock.Set(at(done))
		obs.Done(llmlb.DoneInfo{Endpoint: key("e1"), Latency: time.Duration(done-pick) * time.Millisecond, Streamed: true})
	}
	run(50, 150)  // in flight at the boundary of 100 ms only
	run(850, 950) // in flight at the boundary of 900 ms only
	clock.Set(at(1050))
	transfer(a, b)

	// At 520 ms the engine runs one request; none of a's was in flight
	// then.
	sig.Set("e1", llmlb.Load{At: at(520), Running: 1, KVUsage: math.NaN()})
	l, ok := b.Load("e1")
	assert.True(t, ok)
	assert.Equal(t, 1, l.Running, "nothing in flight at 520 ms has finished since")
}

// A batch built on a bucket boundary (as on simulated time) keeps its
// newest finished count.
func TestLoadFinishedCountOfABatchOnABoundary(t *testing.T) {
	clock := &fakeClock{t: at(850)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	obs := a.Observer(nil)
	obs.Pick(pickInfo("e1", 10, 10))
	obs.FirstToken(llmlb.FirstTokenInfo{Endpoint: key("e1")})
	clock.Set(at(950))
	obs.Done(llmlb.DoneInfo{Endpoint: key("e1"), Latency: 100 * time.Millisecond, Streamed: true})
	clock.Set(at(1000)) // phase 0
	transfer(a, b)

	// The engine saw a's request at 890 ms; it has finished since.
	sig.Set("e1", llmlb.Load{At: at(890), Running: 1, KVUsage: math.NaN()})
	l, ok := b.Load("e1")
	assert.True(t, ok)
	assert.Equal(t, 0, l.Running, "a's request finished after the observation")
}

// FuzzReceiveLoad checks that whatever a peer sends, a Group that accepts
// it answers Load with counts that are not negative, a KV usage within
// [0, 1] (or NaN when unknown), and finished counts interpolated between
// points in increasing time.
func FuzzReceiveLoad(f *testing.F) {
	f.Add(appendMessage(nil, sampleMessage()), int64(0), int64(50))
	f.Add(version1Message(), int64(-3000), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, obsMs, nowMs int64) {
		obsMs %= 1 << 40
		nowMs %= 1 << 40
		clock := &fakeClock{t: at(0)}
		sig := &signalMap{}
		g := offline(t, Config{ID: "self", Clock: clock, Signal: sig})
		if g.Receive(b) != nil {
			return
		}
		for _, pr := range g.peers.list {
			for k, ew := range pr.eps {
				var pts []finPoint
				pr.finPoints(pr.fin[ew.f:ew.f+ew.nf], pr.seen, func(p finPoint) bool { pts = append(pts, p); return true })
				for i := 1; i < len(pts); i++ {
					if pts[i].at <= pts[i-1].at {
						t.Fatalf("endpoint %q: finished points not increasing: %v", k, pts)
					}
				}
			}
		}
		clock.Set(at(int(nowMs)))
		m, err := decode(b)
		require.NoError(t, err)
		for _, e := range m.eps {
			sig.Set(e.key, llmlb.Load{At: at(int(obsMs)), Running: 3, Waiting: 2, KVUsage: 0.5, KVBlocks: 10, BlockSize: 16})
			l, _ := g.Load(e.key)
			if l.Running < 0 || l.Waiting < 0 || l.PeerWaiting < 0 || l.PeerPrefillTokens < 0 {
				t.Fatalf("negative load %+v", l)
			}
			if !math.IsNaN(l.KVUsage) && (l.KVUsage < 0 || l.KVUsage > 1) {
				t.Fatalf("KV usage %v", l.KVUsage)
			}
		}
	})
}
