package share

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A peer that restarts under the same ID (a pod of a StatefulSet) starts
// a new incarnation: the parts of its old incarnation's batches stop
// counting as soon as the new one is heard, even if its batches now fit
// fewer parts, rather than count the requests of the dead process until
// they expire.
func TestRestartedPeerDropsItsOldParts(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	b := offline(t, Config{ID: "b", Clock: clock, TTL: time.Hour})
	// send delivers to b the batch of a process of peer "a" (incarnation
	// inc) with one request at each of eps, as part k of its batches.
	send := func(inc uint64, seq uint64, k int, eps ...string) {
		t.Helper()
		src := offline(t, Config{ID: "src", Clock: clock})
		for _, ep := range eps {
			src.Observer(nil).Pick(pickInfo(ep, 100, 10))
		}
		var m message
		src.local.snapshot(&m, clock.Now().UnixNano())
		m.id, m.inc, m.seq = partID("a", k), inc, seq
		require.NoError(t, b.Receive(appendMessage(nil, &m)))
	}
	waiting := func(ep string) int { l, _ := b.Load(ep); return l.Waiting }

	// The old process publishes its batch in two parts.
	send(1, 1, 0, "e1")
	send(1, 2, 1, "e2")
	require.Equal(t, 1, waiting("e1"))
	require.Equal(t, 1, waiting("e2"))
	require.Equal(t, 1, b.Stats().Peers)

	// It restarts: the new process has a request at e2, in one part.
	clock.Advance(10 * time.Millisecond)
	send(2, 1, 0, "e2")
	assert.Equal(t, 0, waiting("e1"), "the old process's request")
	assert.Equal(t, 1, waiting("e2"), "the new process's request, counted once")
	assert.Equal(t, 1, b.Stats().Peers)
	b.peers.mu.RLock()
	defer b.peers.mu.RUnlock()
	assert.Len(t, b.peers.list, 1)
	snd := b.peers.senders["a"]
	require.NotNil(t, snd)
	assert.Equal(t, 1, snd.parts, "the new process's part alone")
	assert.Equal(t, b.peers.list[0].size, snd.bytes)
}

// A batch in parts puts each endpoint in the same part from one batch to
// the next while the endpoints do not change: a peer that has applied the
// first parts of a batch and not yet the others would otherwise count an
// endpoint that moved to an earlier part twice, and one that moved to a
// later part not at all.
func TestPartsKeepTheirEndpoints(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock, MaxEndpoints: 200})
	for i := range 200 {
		a.Observer(nil).Pick(pickInfo(fmt.Sprintf("%0500d", i), 100, 10))
	}
	partKeys := func() [][]string {
		var m message
		a.local.snapshot(&m, clock.Now().UnixNano())
		m.id, m.inc = "a", 1
		parts, dropped, tooLarge := split(&m, 16<<10, maxSenderBytes, nil)
		require.Zero(t, dropped)
		require.Empty(t, tooLarge)
		out := make([][]string, len(parts))
		for k, p := range parts {
			for _, e := range p.eps {
				out[k] = append(out[k], e.key)
			}
		}
		return out
	}
	first := partKeys()
	require.Greater(t, len(first), 2)
	for range 5 {
		assert.Equal(t, first, partKeys())
	}
}
