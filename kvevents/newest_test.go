package kvevents

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmlb/llmlb/prefix"
)

// kv is one entry of an ordered map, for encoding events whose key order
// matters.
type kv struct {
	k string
	v any
}

// ordered is a MessagePack map that keeps its keys in order, as msgspec
// writes a struct: the "type" tag first, then the fields in declaration
// order.
type ordered []kv

func (m ordered) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, e := range m {
		if err := enc.EncodeString(e.k); err != nil {
			return err
		}
		if err := enc.Encode(e.v); err != nil {
			return err
		}
	}
	return nil
}

// newestStored is a BlockStored as the newest vLLM sends it: a map, the
// tag first, fields omitted when at their defaults, with the fields that
// vLLM added in 2026 (event_version, typed extra_keys, group_idx,
// kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership,
// session_id) following the older ones.
func newestStored(hashes []any, parent any, tokens []any, loraName any, more ...kv) ordered {
	return append(ordered{
		{"type", "BlockStored"},
		{"block_hashes", hashes},
		{"parent_block_hash", parent},
		{"token_ids", tokens},
		{"block_size", 2},
		{"lora_id", nil},
		{"medium", "GPU"},
		{"lora_name", loraName},
	}, more...)
}

// lora, salt and mm are typed extra keys (vLLM's LoRAKey, CacheSaltKey and
// MultiModalKey: tagged maps).
func lora(name string) ordered { return ordered{{"type", "lora"}, {"name", name}} }
func salt(s string) ordered    { return ordered{{"type", "cache_salt"}, {"salt", s}} }
func mm(h string) ordered {
	return ordered{{"type", "mm"}, {"modality", "image"}, {"hash", h}, {"block_offset", 0}}
}

func TestDecodeNewestVLLM(t *testing.T) {
	toks := []any{1, 2}
	cases := []struct {
		name   string
		event  ordered
		salted bool
		lora   string
		salt   string
		remote bool
		group  int
	}{{
		name:  "new fields at their defaults omitted",
		event: newestStored([]any{1}, nil, toks, nil),
	}, {
		name: "every new field",
		event: newestStored([]any{1}, nil, toks, nil,
			kv{"event_version", 2}, kv{"extra_keys", []any{nil}}, kv{"group_idx", 0},
			kv{"kv_cache_spec_kind", "full_attention"}, kv{"kv_cache_spec_sliding_window", nil},
			kv{"locality", "LOCAL"}, kv{"ownership", nil}, kv{"session_id", "req-1"}, kv{"future", map[string]any{"x": []any{1}}}),
	}, {
		name:   "typed LoRA key only",
		event:  newestStored([]any{1}, nil, toks, "ad", kv{"extra_keys", []any{[]any{lora("ad")}}}),
		lora:   "ad",
		salted: false,
	}, {
		name:   "typed LoRA key of another adapter",
		event:  newestStored([]any{1}, nil, toks, "ad", kv{"extra_keys", []any{[]any{lora("other")}}}),
		lora:   "ad",
		salted: true,
	}, {
		name:  "typed LoRA key and cache salt",
		event: newestStored([]any{1}, nil, toks, "ad", kv{"extra_keys", []any{[]any{lora("ad"), salt("s")}}}),
		lora:  "ad",
		salt:  "s",
	}, {
		name:  "typed cache salt",
		event: newestStored([]any{1}, nil, toks, nil, kv{"extra_keys", []any{[]any{salt("s")}}}),
		salt:  "s",
	}, {
		name:   "typed multimodal key",
		event:  newestStored([]any{1}, nil, toks, nil, kv{"extra_keys", []any{[]any{mm("h")}}}),
		salted: true,
	}, {
		name:   "legacy key",
		event:  newestStored([]any{1}, nil, toks, nil, kv{"extra_keys", []any{[]any{ordered{{"type", "legacy"}, {"value", "ad"}}}}}),
		salted: true,
	}, {
		name:   "remote blocks",
		event:  newestStored([]any{1}, nil, toks, nil, kv{"locality", "REMOTE"}, kv{"ownership", "kvcr"}),
		remote: true,
	}, {
		name:  "sliding-window group",
		event: newestStored([]any{1}, nil, toks, nil, kv{"group_idx", 1}, kv{"kv_cache_spec_kind", "sliding_window"}, kv{"kv_cache_spec_sliding_window", 128}),
		group: 1,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b Batch
			// The newest vLLM: the batch positional, its events maps.
			require.NoError(t, DecodeBatch(&b, pack(t, []any{1.0, []any{c.event}, 0})))
			require.Len(t, b.Events, 1)
			e := b.Events[0]
			assert.Equal(t, Stored, e.Kind)
			assert.Equal(t, []uint64{1}, e.BlockHashes)
			assert.Equal(t, []uint32{1, 2}, e.TokenIDs)
			assert.Equal(t, c.salted, e.Salted, "Salted")
			assert.Equal(t, c.lora, e.LoRA)
			assert.Equal(t, c.salt, e.CacheSalt)
			assert.Equal(t, c.remote, e.remote, "remote")
			assert.Equal(t, c.group, e.Group)
		})
	}
}

// TestDecodeUnknownEventKeepsBatch checks that an event of a class this
// package does not know is dropped whatever its fields hold, wherever its
// tag is, and the batch's other events are kept; a known event with a bad
// field still fails the batch.
func TestDecodeUnknownEventKeepsBatch(t *testing.T) {
	bad := []kv{{"block_size", -1}, {"token_ids", "not a list"}, {"parent_block_hash", map[string]any{"a": 1}}, {"block_hashes", []any{[]any{1}}}}
	removed := ordered{{"type", "BlockRemoved"}, {"block_hashes", []any{9}}, {"medium", "GPU"}}
	for _, f := range bad {
		t.Run(f.k, func(t *testing.T) {
			for _, unknown := range []ordered{
				{{"type", "BlockMigrated"}, f},
				{f, {"type", "BlockMigrated"}},
				{f}, // no tag at all
			} {
				var b Batch
				require.NoError(t, DecodeBatch(&b, pack(t, []any{1.0, []any{unknown, removed}, 0})))
				require.Len(t, b.Events, 1)
				assert.Equal(t, Removed, b.Events[0].Kind)
				assert.Equal(t, []uint64{9}, b.Events[0].BlockHashes)
			}
			for _, known := range []ordered{
				{{"type", "BlockStored"}, f},
				{f, {"type", "BlockStored"}},
			} {
				var b Batch
				require.ErrorIs(t, DecodeBatch(&b, pack(t, []any{1.0, []any{known, removed}, 0})), ErrMalformed)
				assert.Empty(t, b.Events)
			}
		})
	}
}

// TestRemoteBlocksNotIndexed checks that blocks an engine reports REMOTE
// (vLLM's locality) are neither indexed nor removed from the index: they
// are not in the engine's own memory.
func TestRemoteBlocksNotIndexed(t *testing.T) {
	idx, h := newTestIndex(t)
	s := prefix.Salt{Model: "m"}
	ap, err := NewApplier(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e": s}))
	toks := prompt(1, 2)
	hs := h.HashTokens(s, toks)
	ids := make([]any, len(toks))
	for i, v := range toks {
		ids[i] = v
	}
	event := func(typ string, locality any, hashes ...uint64) ordered {
		hh := make([]any, len(hashes))
		for i, x := range hashes {
			hh[i] = engineHash(x)
		}
		if typ == "BlockRemoved" {
			return ordered{{"type", typ}, {"block_hashes", hh}, {"medium", "GPU"}, {"locality", locality}}
		}
		return ordered{{"type", typ}, {"block_hashes", hh}, {"parent_block_hash", nil}, {"token_ids", ids},
			{"block_size", testBlock}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"locality", locality}}
	}
	ap.Apply("e", 0, pack(t, []any{1.0, []any{event("BlockStored", "REMOTE", hs...)}, 0}))
	assert.Equal(t, 0, idx.Len("e"), "remote blocks indexed")
	ap.Apply("e", 1, pack(t, []any{1.0, []any{event("BlockStored", "LOCAL", hs...)}, 0}))
	assert.Equal(t, 2, idx.MatchLen("e", hs, time.Now()))
	ap.Apply("e", 2, pack(t, []any{1.0, []any{event("BlockRemoved", "REMOTE", hs[1])}, 0}))
	assert.Equal(t, 2, idx.MatchLen("e", hs, time.Now()), "a remote copy's removal removed the local block")
	ap.Apply("e", 3, pack(t, []any{1.0, []any{event("BlockRemoved", nil, hs[1])}, 0}))
	assert.Equal(t, 1, idx.MatchLen("e", hs, time.Now()))
	st, _ := ap.Stats("e")
	assert.Equal(t, int64(0), st.Malformed)
}

// TestReplayWithTopic follows an engine whose replay socket sends each
// batch as [topic, seq, payload] and ends with ["", -1, ""], as vLLM's
// ZmqEventPublisher does since 2026, and checks that the batches missed
// before the subscription are replayed and indexed.
func TestReplayWithTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	idx, h := newTestIndex(t)
	s := prefix.Salt{Model: "m"}
	toks := prompt(1, 3)
	hs := h.HashTokens(s, toks)
	batches := [][]byte{
		AppendBatch(nil, &Batch{Events: []Event{stored(hs, toks, 0, 2)}}),
		AppendBatch(nil, &Batch{Events: []Event{stored(hs, toks, 2, 3)}}),
	}
	topic := []byte("kv-events")
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quiet))
	defer pub.Close()
	require.NoError(t, pub.Listen(pubAddr))
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(quiet))
	defer router.Close()
	require.NoError(t, router.Listen(replayAddr))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Batch 0 is published before the subscription; every batch after it
	// repeats batch 1's event, which is idempotent, under a new number.
	var published atomic.Int64
	published.Store(1)
	batch := func(seq int64) []byte { return batches[min(seq, 1)] }
	requests := make(chan int64, 8)
	wg.Go(func() {
		for {
			msg, err := router.Recv()
			if err != nil {
				return
			}
			f := msg.Frames
			if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
				continue
			}
			from := int64(binary.BigEndian.Uint64(f[2]))
			requests <- from
			for seq := from; seq < published.Load(); seq++ {
				_ = router.Send(zmq4.NewMsgFrom(f[0], nil, topic, binary.BigEndian.AppendUint64(nil, uint64(seq)), batch(seq)))
			}
			end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
			_ = router.Send(zmq4.NewMsgFrom(f[0], nil, nil, end, nil))
		}
	})

	var (
		mu   sync.Mutex // protects errs
		errs []error
	)
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		OnError: func(_ string, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events", Salt: s}}))
	subCtx, stopSub := context.WithCancel(ctx)
	wg.Go(func() { _ = sub.Run(subCtx) })
	defer stopSub()
	// Batches are published live, each under the next number (a number
	// received twice would mean the engine restarted), until the
	// subscription has joined; batch 0, published before it, and those
	// published before the first it received, must come from the replay.
	require.Eventually(t, func() bool {
		seq := published.Add(1) - 1
		_ = pub.Send(zmq4.NewMsgFrom(topic, binary.BigEndian.AppendUint64(nil, uint64(seq)), batch(seq)))
		st, _ := sub.Stats("e")
		return st.Batches >= 2
	}, waitFor, 20*time.Millisecond)
	st, _ := sub.Stats("e")
	assert.GreaterOrEqual(t, st.Replayed, int64(1))
	assert.GreaterOrEqual(t, st.Seq, int64(1))
	assert.Equal(t, int64(0), st.Malformed)
	assert.Equal(t, 3, idx.MatchLen("e", hs, time.Now()))
	assert.Equal(t, int64(0), <-requests)
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, errs)
}

// TestUnknownEventsCounted checks that each event of a class this package
// does not know, or of no class, counts in Stats.Unknown once, and that
// the rest of its batch is applied; a batch that fails to decode counts
// none of its events.
func TestUnknownEventsCounted(t *testing.T) {
	idx, h := newTestIndex(t)
	s := prefix.Salt{Model: "m"}
	ap, err := NewApplier(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e": s}))
	toks := prompt(1, 2)
	hs := h.HashTokens(s, toks)
	ids := make([]any, len(toks))
	for i, v := range toks {
		ids[i] = v
	}
	stored := ordered{{"type", "BlockStored"}, {"block_hashes", []any{engineHash(hs[0]), engineHash(hs[1])}},
		{"parent_block_hash", nil}, {"token_ids", ids}, {"block_size", testBlock}}
	removed := ordered{{"type", "BlockRemoved"}, {"block_hashes", []any{engineHash(hs[1])}}}
	migrated := ordered{{"type", "BlockMigrated"}, {"block_hashes", []any{engineHash(hs[0])}}}
	untyped := ordered{{"block_hashes", []any{engineHash(hs[0])}}}
	positional := []any{"BlockMigrated", []any{engineHash(hs[0])}, "CPU"}

	ap.Apply("e", 0, pack(t, []any{1.0, []any{migrated, stored, positional, untyped}, 0}))
	st, _ := ap.Stats("e")
	assert.Equal(t, int64(3), st.Unknown)
	assert.Equal(t, int64(2), st.Stored)
	assert.Equal(t, 2, idx.MatchLen("e", hs, time.Now()), "the known events were not applied")

	ap.Apply("e", 1, pack(t, []any{2.0, []any{removed, migrated}, 0}))
	st, _ = ap.Stats("e")
	assert.Equal(t, int64(4), st.Unknown)
	assert.Equal(t, 1, idx.MatchLen("e", hs, time.Now()), "the removal was not applied")

	bad := ordered{{"type", "BlockStored"}, {"block_size", -1}}
	ap.Apply("e", 2, pack(t, []any{3.0, []any{migrated, bad}, 0}))
	ap.Apply("e", 3, pack(t, []any{4.0, []any{stored}, 0}))
	st, _ = ap.Stats("e")
	assert.Equal(t, int64(1), st.Malformed)
	assert.Equal(t, int64(4), st.Unknown, "a malformed batch's unknown events were counted")

	// A forwarding subscriber counts them as it forwards their batch.
	sub, err := NewSubscriber(Config{Forward: func(string, int64, []byte) {}})
	require.NoError(t, err)
	w := sub.newWorker("e", Endpoint{PubAddr: "tcp://127.0.0.1:1"})
	w.apply(0, pack(t, []any{1.0, []any{migrated, stored, positional}, 0}))
	fst := w.stats.snapshot()
	assert.Equal(t, int64(2), fst.Unknown)
	assert.Equal(t, int64(1), fst.Batches)
}
