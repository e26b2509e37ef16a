package kvevents

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

const (
	waitFor = 10 * time.Second
	tick    = 5 * time.Millisecond
)

// TestSubscriberFollowsPublisher runs this package's Publisher and
// Subscriber on loopback: blocks stored arrive in the index under the
// router's hashes, a batch missed on the live stream is recovered by replay,
// and a publisher restart (sequence numbers back to 0) clears the endpoint.
func TestSubscriberFollowsPublisher(t *testing.T) {
	idx, h := newTestIndex(t)
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	salt := prefix.Salt{Model: "m"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	startPublisher := publisherStarter(ctx, t, &wg, pubAddr, replayAddr)
	p, stopPub := startPublisher()

	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events", Salt: salt}}))
	wg.Go(func() { _ = sub.Run(ctx) })
	stats := func() Stats { s, _ := sub.Stats("e1"); return s }
	// Publish empty batches until one arrives: the subscription may take
	// effect after the connection.
	require.Eventually(t, func() bool {
		p.Publish(&Batch{DPRank: 0})
		return stats().Batches > 0
	}, waitFor, 20*time.Millisecond)
	// Both run now: a second call of either Run is refused at once.
	require.ErrorIs(t, sub.Run(ctx), ErrRunning)
	require.ErrorIs(t, p.Run(ctx), ErrRunning)

	a := prompt(1, 3)
	ha := h.HashTokens(salt, a)
	p.Publish(&Batch{TS: 1, DPRank: 0, Events: []Event{stored(ha, a, 0, 2)}})
	p.Publish(&Batch{TS: 2, DPRank: 0, Events: []Event{stored(ha, a, 2, 3)}})
	require.Eventually(t, func() bool { return idx.MatchLen("e1", ha, time.Now()) == 3 }, waitFor, tick)

	// A batch lost on the live stream is replayed.
	before := stats()
	b := prompt(100, 2)
	hb := h.HashTokens(salt, b)
	p.publish(&Batch{TS: 3, DPRank: 0, Events: []Event{removed(ha[2])}}, false)
	p.Publish(&Batch{TS: 4, DPRank: 0, Events: []Event{stored(hb, b, 0, 2)}})
	require.Eventually(t, func() bool {
		return idx.MatchLen("e1", ha, time.Now()) == 2 && idx.MatchLen("e1", hb, time.Now()) == 2
	}, waitFor, tick)
	st := stats()
	assert.Equal(t, before.Gaps+1, st.Gaps)
	assert.Equal(t, before.Replayed+1, st.Replayed)
	assert.Equal(t, before.Resets, st.Resets)
	resets := st.Resets

	// The engine restarts: sequence numbers start again at 0.
	stopPub()
	p, stopPub = startPublisher()
	defer stopPub()
	c := prompt(200, 1)
	hc := h.HashTokens(salt, c)
	require.Eventually(t, func() bool {
		p.Publish(&Batch{TS: 5, DPRank: 0, Events: []Event{stored(hc, c, 0, 1)}})
		return idx.MatchLen("e1", hc, time.Now()) == 1
	}, waitFor, 20*time.Millisecond)
	assert.Equal(t, 0, idx.MatchLen("e1", ha, time.Now()), "%+v", stats())
	assert.Equal(t, 0, idx.MatchLen("e1", hb, time.Now()))
	assert.Greater(t, stats().Resets, resets)

	// Removing the endpoint stops its subscription and drops its blocks.
	require.NoError(t, sub.SetEndpoints(nil))
	require.Eventually(t, func() bool { _, ok := sub.Stats("e1"); return !ok && idx.Len("e1") == 0 }, waitFor, tick)
}

// TestSetEndpointsAddresses checks that SetEndpoints refuses an address no
// connection attempt could use, and changes nothing then.
func TestSetEndpointsAddresses(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
	require.NoError(t, err)
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: ix.BlockSize()})
	require.NoError(t, err)
	sub, err := NewSubscriber(Config{Index: ix, Hasher: h})
	require.NoError(t, err)
	for _, ok := range []Endpoint{
		{PubAddr: "tcp://10.0.0.7:5557", ReplayAddr: "tcp://10.0.0.7:5558"},
		{PubAddr: "tcp://[::1]:5557"},
		{PubAddr: "tcp://engine-0.engines:5557"},
		{PubAddr: "ipc:///tmp/kv.sock"},
		{PubAddr: "inproc://kv"},
	} {
		assert.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e": ok}), "%+v", ok)
	}
	for _, bad := range []Endpoint{
		{PubAddr: "10.0.0.7:5557"},
		{PubAddr: "bogus://x"},
		{PubAddr: "tcp://"},
		{PubAddr: "tcp://10.0.0.7"},
		{PubAddr: "tcp://10.0.0.7:port"},
		{PubAddr: "tcp://10.0.0.7:0"},
		{PubAddr: "tcp://10.0.0.7:70000"},
		{PubAddr: "tcp://*:5557"},
		{PubAddr: "tcp://:5557"},
		{PubAddr: "tcp://10.0.0.7:5557", ReplayAddr: "udp://10.0.0.7:5558"},
	} {
		err := sub.SetEndpoints(map[string]Endpoint{"e": bad})
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", bad)
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	assert.Equal(t, "inproc://kv", sub.want["e"].PubAddr, "a refused call changed the endpoints")
}

// TestRestartWithoutReplay checks that a new connection to an engine
// without a replay socket clears the endpoint's blocks, even when its first
// batch follows the last one applied: the engine may have restarted while
// the subscriber was away and published as many batches since as it had
// before, and nothing could tell.
func TestRestartWithoutReplay(t *testing.T) {
	idx, h := newTestIndex(t)
	pubAddr := freeAddr(t)
	salt := prefix.Salt{Model: "m"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	startPublisher := publisherStarter(ctx, t, &wg, pubAddr, "")
	p, stopPub := startPublisher()

	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: time.Second, MaxBackoff: time.Second})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, Topic: "kv-events", Salt: salt}}))
	wg.Go(func() { _ = sub.Run(ctx) })
	stats := func() Stats { s, _ := sub.Stats("e1"); return s }
	require.Eventually(t, func() bool {
		p.Publish(&Batch{})
		return stats().Batches > 0
	}, waitFor, 20*time.Millisecond)
	a := prompt(1, 2)
	ha := h.HashTokens(salt, a)
	p.Publish(&Batch{Events: []Event{stored(ha, a, 0, 2)}})
	require.Eventually(t, func() bool { return idx.MatchLen("e1", ha, time.Now()) == 2 }, waitFor, tick)
	last := stats().Seq

	// The engine restarts, its cache empty, and publishes batches 0 to
	// last while the subscriber reconnects: its next batch is last+1.
	stopPub()
	p, stopPub = startPublisher()
	defer stopPub()
	require.Eventually(t, func() bool { return !stats().Connected }, waitFor, tick)
	for range last + 1 {
		p.Publish(&Batch{})
	}
	require.Eventually(t, func() bool { return stats().Connected }, waitFor, tick)
	// The subscription reaches the engine soon after the connection: a
	// batch published before is lost, and the next one, a gap, would
	// clear the endpoint anyway.
	time.Sleep(200 * time.Millisecond)
	b := prompt(100, 1)
	hb := h.HashTokens(salt, b)
	require.Eventually(t, func() bool {
		p.Publish(&Batch{Events: []Event{stored(hb, b, 0, 1)}})
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(tick) {
			if idx.MatchLen("e1", hb, time.Now()) == 1 {
				return true
			}
		}
		return false
	}, waitFor, tick)
	assert.Zero(t, idx.MatchLen("e1", ha, time.Now()), "the blocks of the engine's previous process are still indexed: %+v", stats())
}

// TestNegativeSequenceNumber checks that a batch whose sequence number is
// beyond the largest int64 (negative as one) is malformed, not a restart:
// it is counted, the endpoint is cleared, and it is neither applied nor
// forwarded, as Forward takes a negative sequence number only for a clear.
func TestNegativeSequenceNumber(t *testing.T) {
	pubAddr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	p, _ := publisherStarter(ctx, t, &wg, pubAddr, "")()

	var mu sync.Mutex
	var calls []int64 // the sequence numbers forwarded with a payload
	sub, err := NewSubscriber(Config{MinBackoff: time.Second, MaxBackoff: time.Second, Forward: func(_ string, seq int64, payload []byte) {
		if payload != nil {
			mu.Lock()
			calls = append(calls, seq)
			mu.Unlock()
		}
	}})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, Topic: "kv-events"}}))
	wg.Go(func() { _ = sub.Run(ctx) })
	stats := func() Stats { s, _ := sub.Stats("e1"); return s }
	require.Eventually(t, func() bool {
		p.Publish(&Batch{})
		return stats().Batches > 0
	}, waitFor, 20*time.Millisecond)
	p.mu.Lock()
	next := p.seq
	p.seq = -2
	p.mu.Unlock()
	p.Publish(&Batch{TS: 1})
	p.mu.Lock()
	p.seq = next
	p.mu.Unlock()
	p.Publish(&Batch{TS: 2})
	require.Eventually(t, func() bool { return stats().Seq == next }, waitFor, tick)
	mu.Lock()
	defer mu.Unlock()
	for _, seq := range calls {
		assert.GreaterOrEqual(t, seq, int64(0), "forwarded %v", calls)
	}
	st := stats()
	assert.Equal(t, int64(1), st.Malformed, "%+v", st)
}
