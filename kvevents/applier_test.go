package kvevents

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// An Applier applies batches in sequence order and drops an endpoint's
// blocks on a gap, a sequence that goes back, a clear or a malformed batch;
// endpoints it does not follow are ignored.
func TestApplierSequence(t *testing.T) {
	idx, h := newTestIndex(t)
	var errs []error
	ap, err := NewApplier(Config{Index: idx, Hasher: h, OnError: func(key string, err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	salt := prefix.Salt{Model: "m"}
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
	a, b := prompt(1, 2), prompt(50, 2)
	ha, hb := h.HashTokens(salt, a), h.HashTokens(salt, b)
	batch := func(events ...Event) []byte { return AppendBatch(nil, &Batch{Events: events}) }
	now := time.Now()

	ap.Apply("e1", 7, batch(stored(ha, a, 0, 2)))
	assert.Equal(t, 2, idx.MatchLen("e1", ha, now), "an applier starts at any sequence number")
	ap.Apply("e2", 8, batch(stored(hb, b, 0, 2)))
	assert.Equal(t, 0, idx.Len("e2"), "an endpoint not followed is ignored")

	ap.Apply("e1", 8, batch(stored(hb, b, 0, 2)))
	assert.Equal(t, 2, idx.MatchLen("e1", ha, now))
	assert.Equal(t, 2, idx.MatchLen("e1", hb, now))

	ap.Apply("e1", 10, batch(stored(hb, b, 0, 1)))
	assert.Equal(t, 0, idx.MatchLen("e1", ha, now), "a gap drops what was known")
	assert.Equal(t, 1, idx.MatchLen("e1", hb, now), "and the batch after it is applied")
	st, _ := ap.Stats("e1")
	assert.Equal(t, int64(1), st.Gaps)
	assert.Equal(t, int64(10), st.Seq)

	ap.Apply("e1", 0, batch(stored(ha, a, 0, 1)))
	assert.Equal(t, 0, idx.MatchLen("e1", hb, now), "the engine restarted")
	assert.Equal(t, 1, idx.MatchLen("e1", ha, now))

	ap.Apply("e1", 5, nil)
	assert.Equal(t, 0, idx.Len("e1"), "a clear")

	ap.Apply("e1", 0, batch(stored(ha, a, 0, 2)))
	ap.Apply("e1", 1, []byte{0xc1})
	assert.Equal(t, 0, idx.Len("e1"), "a malformed batch")
	ap.Apply("e1", 2, batch(stored(ha, a, 0, 2)))
	ap.Apply("e1", -3, batch(stored(hb, b, 0, 2)))
	assert.Equal(t, 0, idx.Len("e1"), "a negative sequence number with a batch")
	st, _ = ap.Stats("e1")
	assert.Equal(t, int64(2), st.Malformed)
	require.Len(t, errs, 2)
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrMalformed)
	}

	// Clear drops every endpoint's blocks, and applying resumes after it.
	ap.Apply("e1", 3, batch(stored(ha, a, 0, 2)))
	ap.Clear()
	assert.Equal(t, 0, idx.Len("e1"))
	ap.Apply("e1", 4, batch(stored(ha, a, 0, 2)))
	assert.Equal(t, 2, idx.MatchLen("e1", ha, now))
	st, _ = ap.Stats("e1")
	assert.Equal(t, int64(1), st.Gaps, "a Clear forgets the sequence: 4 after it is no gap")

	// A changed salt or a removed endpoint drops its blocks.
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": {Model: "other"}}))
	assert.Equal(t, 0, idx.Len("e1"))
	ap.Apply("e1", 5, batch(stored(ha, a, 0, 2)))
	require.NoError(t, ap.SetEndpoints(nil))
	assert.Equal(t, 0, idx.Len("e1"))
	_, ok := ap.Stats("e1")
	assert.False(t, ok)
	assert.ErrorIs(t, ap.SetEndpoints(map[string]prefix.Salt{"": {}}), ErrInvalidConfig)
}

// A sequence that goes back from the largest number is an engine restart,
// not a gap: last+1 would overflow.
func TestApplierRestartAfterLargestSeq(t *testing.T) {
	idx, h := newTestIndex(t)
	ap, err := NewApplier(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	salt := prefix.Salt{Model: "m"}
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
	a := prompt(1, 2)
	p := AppendBatch(nil, &Batch{Events: []Event{stored(h.HashTokens(salt, a), a, 0, 2)}})
	ap.Apply("e1", math.MaxInt64, p)
	ap.Apply("e1", 0, p)
	st, _ := ap.Stats("e1")
	assert.Zero(t, st.Gaps, "a restart counted as a gap")
	assert.Equal(t, int64(1), st.Resets)
	assert.Equal(t, int64(0), st.Seq)
	assert.Equal(t, 2, idx.MatchLen("e1", h.HashTokens(salt, a), time.Now()))
}

func TestApplierConfigErrors(t *testing.T) {
	idx, h := newTestIndex(t)
	other, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: 2 * testBlock})
	require.NoError(t, err)
	for _, cfg := range []Config{
		{},
		{Index: idx},
		{Index: idx, Hasher: other},
		{Index: idx, Hasher: h, MaxBlocks: -1},
	} {
		_, err := NewApplier(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
	fwd := func(string, int64, []byte) {}
	for _, cfg := range []Config{
		{Forward: fwd, Index: idx},
		{Forward: fwd, Hasher: h},
		{Forward: fwd, MaxBlocks: 10},
		{Forward: fwd, MinBackoff: -1},
	} {
		_, err := NewSubscriber(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
}

// A Subscriber that forwards to an Applier keeps its index in step with
// the engine as one with an index does: batches in order, a batch missed
// live replayed, an engine restart and the end of Run forwarded as clears.
func TestForwardToApplier(t *testing.T) {
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	salt := prefix.Salt{Model: "m"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	startPublisher := publisherStarter(ctx, t, &wg, pubAddr, replayAddr)
	p, stopPub := startPublisher()

	idx, h := newTestIndex(t)
	ap, err := NewApplier(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
	sub, err := NewSubscriber(Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Forward: ap.Apply})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events"}}))
	subCtx, stopSub := context.WithCancel(ctx)
	subDone := make(chan struct{})
	wg.Go(func() { defer close(subDone); _ = sub.Run(subCtx) })

	// Publish empty batches until one is applied.
	require.Eventually(t, func() bool {
		p.Publish(&Batch{DPRank: 0})
		st, _ := ap.Stats("e1")
		return st.Batches > 0
	}, waitFor, 20*time.Millisecond)
	matches := func(hashes []uint64, n int) func() bool {
		return func() bool { return idx.MatchLen("e1", hashes, time.Now()) == n }
	}

	a := prompt(1, 3)
	ha := h.HashTokens(salt, a)
	p.Publish(&Batch{TS: 1, Events: []Event{stored(ha, a, 0, 2)}})
	p.Publish(&Batch{TS: 2, Events: []Event{stored(ha, a, 2, 3)}})
	require.Eventually(t, matches(ha, 3), waitFor, tick)

	// A batch the subscriber misses live is replayed from the engine, and
	// the applier sees an unbroken sequence.
	b := prompt(100, 2)
	hb := h.HashTokens(salt, b)
	before, _ := sub.Stats("e1")
	p.publish(&Batch{TS: 3, Events: []Event{removed(ha[2])}}, false)
	p.Publish(&Batch{TS: 4, Events: []Event{stored(hb, b, 0, 2)}})
	require.Eventually(t, func() bool { return matches(ha, 2)() && matches(hb, 2)() }, waitFor, tick)
	st, _ := sub.Stats("e1")
	assert.Equal(t, before.Replayed+1, st.Replayed)
	assert.Zero(t, st.Stored, "a forwarding subscriber indexes nothing")
	as, _ := ap.Stats("e1")
	assert.Zero(t, as.Gaps)
	assert.Zero(t, as.Resets)
	assert.Equal(t, int64(5), as.Stored)

	// The engine restarts: the applier drops what it knew.
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

	// The subscriber stops: nothing keeps the index current, and its last
	// forward clears the endpoint.
	stopSub()
	<-subDone
	assert.Equal(t, 0, idx.Len("e1"))
}

// OnError runs outside the Applier's lock, as it does for a Subscriber: it
// may read the Applier's Stats.
func TestApplierOnErrorMayCallStats(t *testing.T) {
	idx, h := newTestIndex(t)
	var ap *Applier
	var got Stats
	ap, err := NewApplier(Config{Index: idx, Hasher: h, OnError: func(key string, err error) { got, _ = ap.Stats(key) }})
	require.NoError(t, err)
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": {Model: "m"}}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		ap.Apply("e1", 0, []byte{0xc1})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Apply did not return: OnError called with the Applier's lock held")
	}
	assert.Equal(t, int64(1), got.Malformed)
}

// TestApplierMemoryAcrossEndpoints checks that the storage of a large
// batch is not kept once per endpoint: an Applier that received one large
// batch for each of many endpoints holds the decoded storage of a few at
// most.
func TestApplierMemoryAcrossEndpoints(t *testing.T) {
	idx, h := newTestIndex(t)
	ap, err := NewApplier(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	const endpoints = 16
	eps := make(map[string]prefix.Salt, endpoints)
	for i := range endpoints {
		eps[fmt.Sprint("e", i)] = prefix.Salt{Model: "m"}
	}
	require.NoError(t, ap.SetEndpoints(eps))
	p := oneByteHashes(16, MaxBlocksPerEvent) // 1 MiB, decoded to 8 MiB of hashes
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for key := range eps {
		ap.Apply(key, 0, p)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d endpoints after a batch of %d bytes each: %d MiB held", endpoints, len(p), held>>20)
	assert.Less(t, held, int64(4*8*len(p)), "the decoded storage of a large batch is kept for every endpoint")
	runtime.KeepAlive(ap)
}
