package kvevents

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/internal/natstest"
	"github.com/llmlb/llmlb/prefix"
)

// TestRelayServesFollowers runs an engine's publisher over ZMQ, a Relay
// onto a real NATS server, and two Followers, one per router: both indexes
// follow the engine, a batch the Relay missed live reaches them through the
// engine's replay, an engine restart clears them, and so does the Relay
// stopping.
func TestRelayServesFollowers(t *testing.T) {
	ns := natstest.Start(t, -1)
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	salt := prefix.Salt{Model: "m"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	startPublisher := func() (*Publisher, context.CancelFunc) {
		p, err := NewPublisher(PublisherConfig{Endpoint: pubAddr, ReplayEndpoint: replayAddr, Topic: "kv-events"})
		require.NoError(t, err)
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		wg.Go(func() { defer close(done); _ = p.Run(pctx) })
		return p, func() { pcancel(); <-done }
	}
	p, stopPub := startPublisher()

	type router struct {
		idx *prefix.Index
		f   *Follower
	}
	var routers []router
	var h *prefix.Hasher
	for range 2 {
		idx, hasher := newTestIndex(t)
		h = hasher
		f, err := NewFollower(FollowerConfig{Config: Config{Index: idx, Hasher: hasher}, Conn: natstest.Connect(t, ns.ClientURL())})
		require.NoError(t, err)
		require.NoError(t, f.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
		wg.Go(func() { _ = f.Run(ctx) })
		routers = append(routers, router{idx, f})
	}
	relay, err := NewRelay(RelayConfig{Config: Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		Conn: natstest.Connect(t, ns.ClientURL())})
	require.NoError(t, err)
	require.NoError(t, relay.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events"}}))
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	wg.Go(func() { defer close(relayDone); _ = relay.Run(relayCtx) })

	// Publish empty batches until both followers apply one.
	require.Eventually(t, func() bool {
		p.Publish(&Batch{DPRank: 0})
		for _, r := range routers {
			if st, _ := r.f.Stats("e1"); st.Batches == 0 {
				return false
			}
		}
		return true
	}, waitFor, 20*time.Millisecond)
	matches := func(hashes []uint64, n int) func() bool {
		return func() bool {
			for _, r := range routers {
				if r.idx.MatchLen("e1", hashes, time.Now()) != n {
					return false
				}
			}
			return true
		}
	}

	a := prompt(1, 3)
	ha := h.HashTokens(salt, a)
	p.Publish(&Batch{TS: 1, Events: []Event{stored(ha, a, 0, 2)}})
	p.Publish(&Batch{TS: 2, Events: []Event{stored(ha, a, 2, 3)}})
	require.Eventually(t, matches(ha, 3), waitFor, tick)

	// A batch the relay misses live is replayed from the engine, and the
	// followers see an unbroken sequence.
	b := prompt(100, 2)
	hb := h.HashTokens(salt, b)
	before, _ := relay.Stats("e1")
	p.publish(&Batch{TS: 3, Events: []Event{removed(ha[2])}}, false)
	p.Publish(&Batch{TS: 4, Events: []Event{stored(hb, b, 0, 2)}})
	require.Eventually(t, func() bool { return matches(ha, 2)() && matches(hb, 2)() }, waitFor, tick)
	st, _ := relay.Stats("e1")
	assert.Equal(t, before.Replayed+1, st.Replayed)
	for _, r := range routers {
		fs, ok := r.f.Stats("e1")
		require.True(t, ok)
		assert.Zero(t, fs.Gaps)
		assert.Zero(t, fs.Resets)
		assert.True(t, fs.Connected)
	}

	// The engine restarts: the followers drop what they knew.
	stopPub()
	p, stopPub = startPublisher()
	defer stopPub()
	c := prompt(200, 1)
	hc := h.HashTokens(salt, c)
	require.Eventually(t, func() bool {
		p.Publish(&Batch{TS: 5, Events: []Event{stored(hc, c, 0, 1)}})
		return matches(hc, 1)()
	}, waitFor, 20*time.Millisecond)
	assert.True(t, matches(ha, 0)())
	assert.True(t, matches(hb, 0)())

	// The relay stops: nothing keeps the followers current, and they
	// drop the endpoint's blocks.
	stopRelay()
	<-relayDone
	require.Eventually(t, func() bool {
		for _, r := range routers {
			if r.idx.Len("e1") != 0 {
				return false
			}
		}
		return true
	}, waitFor, tick)
	ok, failed := relay.Published()
	assert.Positive(t, ok)
	assert.Zero(t, failed)
}

// relayed returns the message a Relay would publish for key's batch seq
// (a clear for seq < 0).
func relayed(key string, seq int64, payload []byte) *nats.Msg {
	m := nats.NewMsg(DefaultRelaySubject)
	m.Header.Set(headerEndpoint, key)
	if seq < 0 {
		m.Header.Set(headerSeq, clearSeq)
	} else {
		m.Header.Set(headerSeq, strconv.FormatInt(seq, 10))
		m.Data = payload
	}
	return m
}

// A Follower applies batches in sequence order and drops an endpoint's
// blocks on a gap, a sequence that goes back, a clear or a malformed
// message; endpoints it does not follow are ignored.
func TestFollowerSequence(t *testing.T) {
	idx, h := newTestIndex(t)
	var errs []error
	f, err := NewFollower(FollowerConfig{Config: Config{Index: idx, Hasher: h, OnError: func(key string, err error) { errs = append(errs, err) }},
		Conn: new(nats.Conn)})
	require.NoError(t, err)
	salt := prefix.Salt{Model: "m"}
	require.NoError(t, f.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
	a, b := prompt(1, 2), prompt(50, 2)
	ha, hb := h.HashTokens(salt, a), h.HashTokens(salt, b)
	batch := func(events ...Event) []byte { return AppendBatch(nil, &Batch{Events: events}) }
	now := time.Now()

	f.receive(relayed("e1", 7, batch(stored(ha, a, 0, 2))))
	assert.Equal(t, 2, idx.MatchLen("e1", ha, now), "a follower starts at any sequence number")
	f.receive(relayed("e2", 8, batch(stored(hb, b, 0, 2))))
	assert.Equal(t, 0, idx.Len("e2"), "an endpoint not followed is ignored")

	f.receive(relayed("e1", 8, batch(stored(hb, b, 0, 2))))
	assert.Equal(t, 2, idx.MatchLen("e1", ha, now))
	assert.Equal(t, 2, idx.MatchLen("e1", hb, now))

	f.receive(relayed("e1", 10, batch(stored(hb, b, 0, 1))))
	assert.Equal(t, 0, idx.MatchLen("e1", ha, now), "a gap drops what was known")
	assert.Equal(t, 1, idx.MatchLen("e1", hb, now), "and the batch after it is applied")
	st, _ := f.Stats("e1")
	assert.Equal(t, int64(1), st.Gaps)
	assert.Equal(t, int64(10), st.Seq)

	f.receive(relayed("e1", 0, batch(stored(ha, a, 0, 1))))
	assert.Equal(t, 0, idx.MatchLen("e1", hb, now), "the engine restarted")
	assert.Equal(t, 1, idx.MatchLen("e1", ha, now))

	f.receive(relayed("e1", -1, nil))
	assert.Equal(t, 0, idx.Len("e1"), "a clear from the relay")

	f.receive(relayed("e1", 0, batch(stored(ha, a, 0, 2))))
	f.receive(relayed("e1", 1, []byte{0xc1}))
	assert.Equal(t, 0, idx.Len("e1"), "a malformed batch")
	bad := relayed("e1", 2, nil)
	bad.Header.Set(headerSeq, "x")
	f.receive(bad)
	st, _ = f.Stats("e1")
	assert.Equal(t, int64(2), st.Malformed)
	assert.Len(t, errs, 2)

	// A changed salt or a removed endpoint drops its blocks.
	f.receive(relayed("e1", 3, batch(stored(ha, a, 0, 2))))
	require.NoError(t, f.SetEndpoints(map[string]prefix.Salt{"e1": {Model: "other"}}))
	assert.Equal(t, 0, idx.Len("e1"))
	require.NoError(t, f.SetEndpoints(nil))
	_, ok := f.Stats("e1")
	assert.False(t, ok)
	assert.ErrorIs(t, f.SetEndpoints(map[string]prefix.Salt{"": {}}), ErrInvalidConfig)
}

func TestRelayConfigErrors(t *testing.T) {
	_, err := NewRelay(RelayConfig{})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewRelay(RelayConfig{Conn: new(nats.Conn), Config: Config{MinBackoff: -1}})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	idx, h := newTestIndex(t)
	for _, cfg := range []FollowerConfig{
		{Config: Config{Index: idx, Hasher: h}},
		{Conn: new(nats.Conn)},
		{Conn: new(nats.Conn), Config: Config{Index: idx, Hasher: h, MaxBlocks: -1}},
		{Conn: new(nats.Conn), Config: Config{Index: idx, Hasher: h}, Buffer: -1},
	} {
		_, err := NewFollower(cfg)
		assert.True(t, errors.Is(err, ErrInvalidConfig), "%+v: %v", cfg, err)
	}
}
