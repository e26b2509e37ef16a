package share

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startServerMaxPayload runs a NATS server whose max_payload is maxPayload
// bytes.
func startServerMaxPayload(t *testing.T, maxPayload int32) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: maxPayload})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second))
	return ns
}

// A batch larger than its receivers take is published in parts that each
// fit, so that every peer sees the whole of this replica's work, rather
// than nothing: over NATS's max_payload the publish failed, and over the 8
// MiB every receiver decodes at most, every receiver refused it unseen by
// the sender.
func TestLargeBatchIsPublishedInParts(t *testing.T) {
	cases := []struct {
		name       string
		maxPayload int32
		endpoints  int
		keyBytes   int
	}{
		{"over max_payload", 16 << 10, 200, 500},
		{"over 8 MiB", 32 << 20, 8400, maxKeyBytes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := startServerMaxPayload(t, c.maxPayload)
			// Batches of megabytes are slow to apply under the race
			// detector: a's are spaced, and b keeps them long.
			a, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "a", MaxEndpoints: c.endpoints, Interval: 300 * time.Millisecond, TTL: time.Minute, Logger: quiet})
			require.NoError(t, err)
			b, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "b", MaxEndpoints: c.endpoints, TTL: time.Minute, Logger: quiet})
			require.NoError(t, err)
			keys := make([]string, c.endpoints)
			for i := range keys {
				keys[i] = fmt.Sprintf("%0*d", c.keyBytes, i)
				a.Observer(nil).Pick(pickInfo(keys[i], 100, 10))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 2)
			go func() { done <- a.Run(ctx) }()
			go func() { done <- b.Run(ctx) }()
			defer func() { cancel(); <-done; <-done }()
			require.Eventually(t, func() bool {
				for i := 0; i < len(keys); i += max(1, len(keys)/100) {
					if l, ok := b.Load(keys[i]); !ok || l.Waiting != 1 {
						return false
					}
				}
				l, ok := b.Load(keys[len(keys)-1])
				return ok && l.Waiting == 1
			}, 20*time.Second, 50*time.Millisecond, "b sees a's request at the endpoints")
			for _, k := range keys {
				l, ok := b.Load(k)
				require.True(t, ok)
				require.Equal(t, 1, l.Waiting, "at %.8q...", k)
			}
			assert.Zero(t, a.Stats().Unpublished, "%+v", a.Stats())
			assert.Zero(t, a.Stats().Dropped)
			assert.Zero(t, b.Stats().Rejected)
			assert.Equal(t, 1, a.Stats().Peers, "a ignores the parts of its own batches")
		})
	}
}

// When a batch needs fewer parts than the one before, the parts not
// needed any more are published empty: the work they described stops
// counting at once, not after the TTL, and an endpoint that moved to
// another part is not counted twice meanwhile.
func TestVanishedPartStopsCountingAtOnce(t *testing.T) {
	ns := startServerMaxPayload(t, 16<<10)
	// A short signal age: the endpoints of finished requests leave the
	// batches soon after.
	a, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "a", MaxSignalAge: 50 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	b, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "b", TTL: time.Hour, Logger: quiet})
	require.NoError(t, err)
	var keys []string
	picked := time.Now()
	for i := range 100 {
		keys = append(keys, fmt.Sprintf("%0500d", i))
		a.Observer(nil).Pick(pickInfo(keys[i], 100, 10))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	go func() { done <- a.Run(ctx) }()
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done; <-done }()
	require.Eventually(t, func() bool {
		b.peers.mu.RLock()
		defer b.peers.mu.RUnlock()
		return len(b.peers.list) >= 3
	}, 10*time.Second, 10*time.Millisecond, "a batch of several parts")
	for _, k := range keys[:80] {
		a.Observer(nil).Done(llmlb.DoneInfo{Endpoint: key(k), Latency: time.Since(picked)})
	}
	waiting := func(k string) int { l, _ := b.Load(k); return l.Waiting }
	require.Eventually(t, func() bool {
		a.batchMu.Lock()
		defer a.batchMu.Unlock()
		return a.parts == 1
	}, 10*time.Second, time.Millisecond, "the finished requests' endpoints left the batch")
	require.Eventually(t, func() bool {
		for i, k := range keys {
			if w := waiting(k); (i < 80 && w != 0) || (i >= 80 && w != 1) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the work left counted once")
}

// A replica's ID may not look like a part's: its peers would take it for
// a part of another replica's batches.
func TestPartIDs(t *testing.T) {
	assert.Equal(t, "a", baseID(partID("a", 7)))
	assert.Equal(t, "a/part7/part1", partID("a/part7", 1))
	for _, id := range []string{"a", "a/part", "a/part0", "a/part01", "a/partx", "a/part12345"} {
		assert.Equal(t, id, baseID(id))
	}
	_, err := New(Config{ID: "a/part2"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(Config{ID: strings.Repeat("a", 128)})
	assert.NoError(t, err)
}

// A batch built by AppendBatch past the 8 MiB every peer takes keeps the
// endpoints that fit, rather than be refused whole, and counts the work
// left out in Stats.Dropped.
func TestAppendBatchFitsPeers(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock, MaxEndpoints: 9000})
	b := offline(t, Config{ID: "b", Clock: clock, MaxEndpoints: 9000})
	keys := make([]string, 9000)
	for i := range keys {
		keys[i] = fmt.Sprintf("%0*d", maxKeyBytes, i)
		a.Observer(nil).Pick(pickInfo(keys[i], 100, 10))
	}
	clock.Set(at(50))
	batch := a.AppendBatch(nil)
	assert.LessOrEqual(t, len(batch), maxMessageBytes)
	require.NoError(t, b.Receive(batch))
	seen := 0
	for _, k := range keys {
		if l, ok := b.Load(k); ok && l.Waiting == 1 {
			seen++
		}
	}
	assert.Greater(t, seen, 7000, "most endpoints fit")
	assert.Equal(t, uint64(len(keys)-seen), a.Stats().Dropped, "the others' requests are counted as dropped")
}

// The parts of a batch count as their sender, one peer, against MaxPeers
// and in Stats.Peers: a replica whose batches go in parts does not push
// the other replicas out of a receiver's MaxPeers.
func TestPartsCountAsOnePeer(t *testing.T) {
	ns := startServerMaxPayload(t, 16<<10)
	a, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "a", Logger: quiet})
	require.NoError(t, err)
	c, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "c", Logger: quiet})
	require.NoError(t, err)
	b, err := New(Config{Conn: connect(t, ns.ClientURL()), ID: "b", MaxPeers: 2, TTL: time.Minute, Logger: quiet})
	require.NoError(t, err)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("%0500d", i)
		a.Observer(nil).Pick(pickInfo(keys[i], 100, 10))
	}
	c.Observer(nil).Pick(pickInfo("c's", 100, 10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 3)
	for _, g := range []*Group{a, b, c} {
		go func() { done <- g.Run(ctx) }()
	}
	defer func() { cancel(); <-done; <-done; <-done }()
	require.Eventually(t, func() bool {
		a.batchMu.Lock()
		defer a.batchMu.Unlock()
		return a.parts >= 3
	}, 10*time.Second, 10*time.Millisecond, "a's batch goes in parts")
	waiting := func(k string) int { l, _ := b.Load(k); return l.Waiting }
	require.Eventually(t, func() bool {
		for _, k := range keys {
			if waiting(k) != 1 {
				return false
			}
		}
		return waiting("c's") == 1
	}, 10*time.Second, 10*time.Millisecond, "b sees the work of a, in parts, and of c")
	assert.Equal(t, 2, b.Stats().Peers)
	assert.Zero(t, b.Stats().Rejected)
}

// partMsg returns the encoding of part k of the batches of sender id: one
// request waiting at the endpoint "<id> <k>".
func partMsg(id string, k int, seq uint64) []byte {
	return appendMessage(nil, &message{id: partID(id, k), inc: 1, seq: seq, width: int64(100 * time.Millisecond), horizon: 10,
		eps: []epSnap{{key: fmt.Sprintf("%s %d", id, k), buckets: []bucket{{out: 1, queued: 1, tokens: 10, prefill: 5}}}}})
}

// A peer's parts are bounded, in number and in bytes, as the batches of a
// peer in one message are: the parts beyond are refused, the parts kept
// still count, and the other peers still join up to MaxPeers. Once its
// parts expire, the peer's room is free again.
func TestPartsOfOnePeerAreBounded(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	b := offline(t, Config{ID: "b", Clock: clock, MaxPeers: 2})
	for k := range maxParts {
		require.NoError(t, b.Receive(partMsg("a", k, 1)), "part %d", k)
	}
	assert.ErrorIs(t, b.Receive(partMsg("a", maxParts, 1)), ErrRefused, "a part beyond maxParts")
	require.NoError(t, b.Receive(partMsg("c", 0, 1)), "another peer joins")
	assert.ErrorIs(t, b.Receive(partMsg("d", 0, 1)), ErrRefused, "a peer beyond MaxPeers")
	assert.Equal(t, 2, b.Stats().Peers)
	for _, k := range []string{"a 0", fmt.Sprintf("a %d", maxParts-1), "c 0"} {
		l, _ := b.Load(k)
		assert.Equal(t, 1, l.Waiting, "at %s", k)
	}

	// Bytes: three parts fit, a fourth does not, nor does a kept part
	// replaced by a larger one.
	clock.Advance(time.Hour)
	b.expire()
	require.Zero(t, b.Stats().Peers)
	size := len(partMsg("a", 1, 2))
	b.peers.maxBytes = 3 * size
	for k := 1; k <= 3; k++ {
		require.NoError(t, b.Receive(partMsg("a", k, 2)), "part %d", k)
	}
	assert.ErrorIs(t, b.Receive(partMsg("a", 4, 2)), ErrRefused, "a part beyond the bytes of a peer")
	big := appendMessage(nil, &message{id: partID("a", 1), inc: 1, seq: 3, width: int64(100 * time.Millisecond), horizon: 10,
		eps: []epSnap{{key: "a 1"}, {key: "a 1 more"}}})
	require.Greater(t, len(big), size)
	assert.ErrorIs(t, b.Receive(big), ErrRefused, "a part grown beyond the bytes of a peer")
	require.NoError(t, b.Receive(partMsg("a", 1, 4)), "a part of the same size")
	l, _ := b.Load("a 1")
	assert.Equal(t, 1, l.Waiting)
}

// A batch is cut in no more parts, and no more bytes in all, than its
// receivers keep of one peer: the endpoints beyond are left out and
// reported, rather than published for every receiver to refuse.
func TestSplitKeepsToWhatPeersKeep(t *testing.T) {
	m := &message{id: "a", width: int64(100 * time.Millisecond), horizon: 10}
	for i := range 400 {
		m.eps = append(m.eps, epSnap{key: fmt.Sprintf("%0500d", i), buckets: []bucket{{out: 1, queued: 1, tokens: 10, prefill: 5}}})
	}
	whole := len(appendMessage(nil, m))
	cases := []struct {
		name            string
		limit, maxBytes int
		parts           int
	}{
		{"parts", 1 << 10, maxSenderBytes, maxParts},
		{"bytes", 4 << 10, whole / 2, -1},
		{"both fit", 16 << 10, maxSenderBytes, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			parts, _, tooLarge := split(m, c.limit, c.maxBytes, nil)
			total, eps := 0, 0
			for k := range parts {
				p := parts[k]
				p.id, p.seq = partID(m.id, k), ^uint64(0)
				n := len(appendMessage(nil, &p))
				assert.LessOrEqual(t, n, c.limit)
				total += n
				eps += len(p.eps)
			}
			assert.LessOrEqual(t, len(parts), maxParts)
			assert.LessOrEqual(t, total, c.maxBytes)
			if c.parts > 0 {
				assert.Equal(t, c.parts, len(parts))
			}
			if c.name == "both fit" {
				assert.Equal(t, len(m.eps), eps)
				assert.Empty(t, tooLarge)
				return
			}
			assert.Less(t, eps, len(m.eps), "endpoints left out")
			assert.Greater(t, eps, 0)
			assert.NotEmpty(t, tooLarge)
		})
	}
}
