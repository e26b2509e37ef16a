package kvevents

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// restartRig drives one worker directly, batch by batch, as its session
// would: connect starts a new connection, send receives a batch on it.
type restartRig struct {
	t    *testing.T
	ctx  context.Context
	idx  *prefix.Index
	h    *prefix.Hasher
	salt prefix.Salt
	w    *worker
}

func newRestartRig(t *testing.T, ep Endpoint) *restartRig {
	idx, h := newTestIndex(t)
	ep.Salt = prefix.Salt{Model: "m"}
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, ReplayTimeout: waitFor})
	require.NoError(t, err)
	r := &restartRig{t: t, ctx: context.Background(), idx: idx, h: h, salt: ep.Salt, w: sub.newWorker("e", ep)}
	r.connect()
	return r
}

func (r *restartRig) connect() { r.w.live = -1 }

// send receives batch seq, storing blocks of tokens from base, with the
// topic frame topic.
func (r *restartRig) send(seq int64, topic string, base uint32) []uint64 {
	toks := prompt(base, 2)
	hs := r.h.HashTokens(r.salt, toks)
	epoch, epoched := topicEpoch([]byte(topic))
	r.w.receive(r.ctx, seq, epoch, epoched, AppendBatch(nil, &Batch{Events: []Event{stored(hs, toks, 0, 2)}}))
	return hs
}

func (r *restartRig) match(hs []uint64) int { return r.idx.MatchLen("e", hs, time.Now()) }

func (r *restartRig) resets() int64 { return r.w.stats.snapshot().Resets }

// TestRestartCountsOneReset checks that an engine restart clears the
// endpoint's blocks once, counted once in Resets, when the replay after it
// fails too: there is nothing more to clear.
func TestRestartCountsOneReset(t *testing.T) {
	t.Run("sequence back, replay refused", func(t *testing.T) {
		// Nothing listens on the replay address.
		r := newRestartRig(t, Endpoint{PubAddr: "tcp://127.0.0.1:1", ReplayAddr: freeAddr(t)})
		for seq := range int64(3) {
			r.send(seq, "kv-events", uint32(100*seq))
		}
		require.Zero(t, r.resets())
		// The engine restarted: the new connection's first batch is
		// numbered 1, below the last applied; the replay of batch 0 fails.
		r.connect()
		hs := r.send(1, "kv-events", 1000)
		assert.Equal(t, int64(1), r.resets())
		assert.Equal(t, 2, r.match(hs))
		// Likewise on the same connection.
		r.send(1, "kv-events", 2000)
		assert.Equal(t, int64(2), r.resets())
	})
	t.Run("replay of another batch, then replay fails", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		replayAddr := freeAddr(t)
		router := zmq4.NewRouter(ctx, zmq4.WithLogger(quiet))
		defer router.Close()
		require.NoError(t, router.Listen(replayAddr))
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		// The first request gets another batch under the number asked
		// for (the engine restarted and reached it again), every later
		// one the end marker alone (the restarted engine has dropped its
		// first batches).
		wg.Go(func() {
			for n := 0; ; n++ {
				msg, err := router.Recv()
				if err != nil {
					return
				}
				f := msg.Frames
				if len(f) != 3 || len(f[2]) != 8 {
					continue
				}
				if n == 0 {
					_ = router.Send(zmq4.NewMsgFrom(f[0], nil, f[2], AppendBatch(nil, &Batch{TS: 99})))
				}
				_ = router.Send(zmq4.NewMsgFrom(f[0], nil, binary.BigEndian.AppendUint64(nil, ^uint64(0)), nil))
			}
		})
		r := newRestartRig(t, Endpoint{PubAddr: "tcp://127.0.0.1:1", ReplayAddr: replayAddr})
		var old []uint64
		for seq := range int64(3) {
			old = r.send(seq, "kv-events", uint32(100*seq))
		}
		r.connect()
		hs := r.send(5, "kv-events", 1000)
		assert.Equal(t, int64(1), r.resets())
		assert.Equal(t, 0, r.match(old))
		assert.Equal(t, 2, r.match(hs))
	})
}

// TestEpochChangeIsRestart checks that a batch whose topic carries another
// engine epoch than the last one applied (SGLang's
// "\x00sgl-kv-epoch=" suffix) clears the endpoint's blocks, although its
// sequence number follows; that a new connection to an engine of the same
// epoch keeps them, even without a replay socket; and that a new
// connection without an epoch still clears them.
func TestEpochChangeIsRestart(t *testing.T) {
	const (
		epochA = "kv-events\x00sgl-kv-epoch=0f3c9a"
		epochB = "kv-events\x00sgl-kv-epoch=77d2e1"
	)
	r := newRestartRig(t, Endpoint{PubAddr: "tcp://127.0.0.1:1"})
	a := r.send(0, epochA, 100)
	b := r.send(1, epochA+"\x00sgl-kv-snapshot=5e1f", 200) // a snapshot's barrier, same epoch
	r.connect()
	c := r.send(2, epochA, 300)
	assert.Equal(t, int64(0), r.resets(), "a new connection to the same engine process cleared its blocks")
	for _, hs := range [][]uint64{a, b, c} {
		assert.Equal(t, 2, r.match(hs))
	}

	// Another process, whose numbers happen to follow.
	d := r.send(3, epochB, 400)
	assert.Equal(t, int64(1), r.resets())
	assert.Equal(t, 0, r.match(a), "the blocks of the engine's previous process are still indexed")
	assert.Equal(t, 2, r.match(d))

	// A topic without an epoch: another process too.
	e := r.send(4, "kv-events", 500)
	assert.Equal(t, int64(2), r.resets())
	assert.Equal(t, 0, r.match(d))
	r.connect()
	r.send(5, "kv-events", 600)
	assert.Equal(t, int64(3), r.resets(), "a new connection without an epoch or a replay socket kept the blocks")
	assert.Equal(t, 0, r.match(e))
}

// TestSGLangEpochTopic follows a publisher that sends its topic with
// SGLang's epoch suffix: the endpoint's Topic, a prefix of it, receives
// the batches, and a new epoch on the same connection, its numbers
// following on, clears the blocks of the previous one.
func TestSGLangEpochTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	idx, h := newTestIndex(t)
	s := prefix.Salt{Model: "m"}
	pubAddr := freeAddr(t)
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quiet))
	defer pub.Close()
	require.NoError(t, pub.Listen(pubAddr))
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e": {PubAddr: pubAddr, Topic: "kv-events", Salt: s}}))
	stop := runSubscriber(t, sub)
	stats := func() Stats { st, _ := sub.Stats("e"); return st }
	seq := uint64(0)
	send := func(topic string, b *Batch) {
		_ = pub.Send(zmq4.NewMsgFrom([]byte(topic), binary.BigEndian.AppendUint64(nil, seq), AppendBatch(nil, b)))
		seq++
	}
	a, b := prompt(1, 2), prompt(100, 2)
	ha, hb := h.HashTokens(s, a), h.HashTokens(s, b)
	match := func(hs []uint64) int { return idx.MatchLen("e", hs, time.Now()) }
	require.Eventually(t, func() bool {
		send("kv-events\x00sgl-kv-epoch=first", &Batch{Events: []Event{stored(ha, a, 0, 2)}})
		return match(ha) == 2
	}, waitFor, 20*time.Millisecond)
	resets := stats().Resets
	send("kv-events\x00sgl-kv-epoch=second", &Batch{Events: []Event{stored(hb, b, 0, 2)}})
	require.Eventually(t, func() bool { return match(hb) == 2 }, waitFor, tick)
	assert.Equal(t, 0, match(ha), "the blocks of the engine's previous process are still indexed")
	assert.Equal(t, resets+1, stats().Resets)
	assert.Equal(t, int64(0), stats().Malformed)
	require.True(t, stop(), "Run did not return")
}

// TestTopicEpoch checks what topicEpoch reads of a topic frame.
func TestTopicEpoch(t *testing.T) {
	a, ok := topicEpoch([]byte("kv-events\x00sgl-kv-epoch=abc"))
	require.True(t, ok)
	b, ok := topicEpoch([]byte("\x00sgl-kv-epoch=abc\x00sgl-kv-snapshot=1"))
	require.True(t, ok)
	assert.Equal(t, a, b, "the snapshot's id or the topic changed the epoch")
	c, ok := topicEpoch([]byte("kv-events\x00sgl-kv-epoch=abd"))
	require.True(t, ok)
	assert.NotEqual(t, a, c)
	for _, topic := range []string{"", "kv-events", "kv-events\x00sgl-kv-snapshot=1", "sgl-kv-epoch=abc"} {
		_, ok := topicEpoch([]byte(topic))
		assert.False(t, ok, "%q", topic)
	}
}
