package kvevents

import (
	"encoding/binary"
	"math"
	"runtime"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestDecodeBatch(t *testing.T) {
	digest := []byte("0123456789abcdef0123456789abcdef")
	cases := []struct {
		name    string
		payload any
		want    Batch
	}{{
		name:    "vLLM 0.9 positional, no medium",
		payload: []any{1.5, []any{[]any{"BlockStored", []any{uint64(1), uint64(2)}, nil, []any{1, 2, 3, 4}, 2, nil}}},
		want:    Batch{TS: 1.5, DPRank: -1, Events: []Event{{Kind: Stored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2}}},
	}, {
		name:    "negative integer hashes and a parent",
		payload: []any{1.0, []any{[]any{"BlockStored", []any{int64(-5)}, int64(-7), []any{9, 9}, 2, 3, "GPU"}}, 0},
		want:    Batch{TS: 1, DPRank: 0, Events: []Event{{Kind: Stored, BlockHashes: []uint64{^uint64(4)}, Parent: ^uint64(6), HasParent: true, TokenIDs: []uint32{9, 9}, BlockSize: 2, LoRA: "3", Medium: "GPU"}}},
	}, {
		name: "later fields, unknown trailing ones and unknown events",
		payload: []any{2, []any{
			[]any{"BlockStored", []any{digest}, nil, []any{1, 2}, 2, 7, "GPU", "ad", []any{[]any{"ad"}}, 0, "full_attention", 1024, nil, nil, nil, map[string]any{"future": []any{1}}},
			[]any{"Renamed", 1, 2},
			[]any{"BlockRemoved", []any{3}, "CPU", 1, nil, nil, nil, nil, "x"},
			[]any{"AllBlocksCleared", nil},
		}, 3, "extra"},
		want: Batch{TS: 2, DPRank: 3, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{xxhash.Sum64(digest)}, TokenIDs: []uint32{1, 2}, BlockSize: 2, LoRA: "ad", Medium: "GPU", GroupKind: "full_attention"},
			{Kind: Removed, BlockHashes: []uint64{3}, Medium: "CPU", Group: 1},
			{Kind: Cleared},
		}},
	}, {
		name: "map-encoded events and batch",
		payload: map[string]any{"ts": 3.0, "attn_dp_rank": 1, "events": []any{
			map[string]any{"block_hashes": []any{5}, "type": "BlockStored", "parent_block_hash": 4, "token_ids": []any{1}, "block_size": 1, "lora_name": nil, "extra_keys": []any{[]any{"salt"}}},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{5}, "medium": nil},
			map[string]any{"type": "Unknown", "block_hashes": []any{6}},
		}},
		want: Batch{TS: 3, DPRank: 1, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{5}, Parent: 4, HasParent: true, TokenIDs: []uint32{1}, BlockSize: 1, Salted: true},
			{Kind: Removed, BlockHashes: []uint64{5}},
		}},
	}, {
		// SGLang's radix cache with EAGLE speculative decoding keys pages by
		// bigrams, and publishes them as pairs of token IDs: no router
		// hashes them, so the event keeps no tokens and is not indexed,
		// and the rest of the batch is applied.
		name: "SGLang bigram pages",
		payload: []any{4.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{7}, "parent_block_hash": nil, "token_ids": []any{[]any{1, 2}, []any{2, 3}}, "block_size": 2, "lora_id": nil, "medium": "GPU"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{6}, "medium": "GPU"},
		}, 0},
		want: Batch{TS: 4, DPRank: 0, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{7}, BlockSize: 2, Medium: "GPU"},
			{Kind: Removed, BlockHashes: []uint64{6}, Medium: "GPU"},
		}},
	}, {
		// SGLang sends a request's cache_salt with each block it stores
		// (sgl-project/sglang#37482): the engine's hashes mix it in, and
		// the blocks are indexed under it.
		name: "SGLang cache_salt",
		payload: []any{5.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{8}, "parent_block_hash": nil, "token_ids": []any{1, 2}, "block_size": 2, "lora_id": nil, "medium": "GPU", "cache_salt": "tenant-a", "session_id": "s1"},
			map[string]any{"type": "BlockStored", "block_hashes": []any{9}, "parent_block_hash": nil, "token_ids": []any{1, 2}, "block_size": 2, "lora_id": nil, "medium": "GPU", "cache_salt": nil},
		}, 0},
		want: Batch{TS: 5, DPRank: 0, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{8}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", CacheSalt: "tenant-a"},
			{Kind: Stored, BlockHashes: []uint64{9}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"},
		}},
	}, {
		// SGLang's positional BlockStoredWithMetadata puts {"cache_salt":
		// ...} where vLLM has lora_name (sgl-project/sglang#30827).
		name: "SGLang positional metadata",
		payload: []any{6.0, []any{
			[]any{"BlockStored", []any{10}, nil, []any{1, 2}, 2, nil, "GPU", map[string]any{"cache_salt": "tenant-a"}},
		}, 0},
		want: Batch{TS: 6, DPRank: 0, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{10}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", CacheSalt: "tenant-a"},
		}},
	}, {
		// SGLang's positional events in the layout KV-aware routers read
		// by position (TestBlockStoredWireFormat in SGLang's
		// test/registered/unit/disaggregation/test_kv_events.py):
		// BlockStored's 13 fields, the cache salt tagged
		// "dynamo-cache-salt:" in extra_keys and, salted, the metadata
		// 14th; BlockRemoved's 7; AllBlocksCleared's ownership.
		name: "SGLang positional, the routers' layout",
		payload: []any{10.0, []any{
			[]any{"BlockStored", []any{123}, nil, []any{1, 2}, 2, nil, "GPU", nil, []any{[]any{"dynamo-cache-salt:tenant-a"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "tenant-a"}},
			[]any{"BlockStored", []any{124}, 123, []any{3, 4}, 2, nil, "GPU", nil, []any{[]any{"dynamo-cache-salt:tenant-a"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "tenant-a"}},
			[]any{"BlockStored", []any{125}, nil, []any{5, 6}, 2, nil, "GPU", nil, nil, nil, nil, nil, nil, nil},
			[]any{"BlockRemoved", []any{123}, "GPU", nil, nil, nil, nil, nil},
			[]any{"AllBlocksCleared", nil},
		}, 0},
		want: Batch{TS: 10, DPRank: 0, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{123}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", CacheSalt: "tenant-a"},
			{Kind: Stored, BlockHashes: []uint64{124}, Parent: 123, HasParent: true, TokenIDs: []uint32{3, 4}, BlockSize: 2, Medium: "GPU"},
			{Kind: Stored, BlockHashes: []uint64{125}, TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: "GPU"},
			{Kind: Removed, BlockHashes: []uint64{123}, Medium: "GPU"},
			{Kind: Cleared},
		}},
	}, {
		// The same layout's locality: REMOTE, or a value not known, is not
		// the engine's own memory.
		name: "positional locality",
		payload: []any{11.0, []any{
			[]any{"BlockStored", []any{1}, nil, []any{1, 2}, 2, nil, "GPU", nil, nil, 0, "full_attention", nil, "REMOTE", "kvcr"},
			[]any{"BlockStored", []any{2}, nil, []any{1, 2}, 2, nil, "GPU", nil, nil, 0, "full_attention", nil, "LOCAL", nil},
			[]any{"BlockRemoved", []any{1}, "GPU", 0, nil, nil, "REMOTE", "kvcr"},
			[]any{"BlockRemoved", []any{2}, "GPU", 0, "full_attention", nil, 7},
		}, 0},
		want: Batch{TS: 11, DPRank: 0, Events: []Event{
			{Kind: Stored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", GroupKind: "full_attention", remote: true},
			{Kind: Stored, BlockHashes: []uint64{2}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU", GroupKind: "full_attention"},
			{Kind: Removed, BlockHashes: []uint64{1}, Medium: "GPU", remote: true},
			{Kind: Removed, BlockHashes: []uint64{2}, Medium: "GPU", GroupKind: "full_attention", remote: true},
		}},
	}, {
		name:    "rank -1 means none",
		payload: []any{7.0, []any{}, -1},
		want:    Batch{TS: 7, DPRank: -1},
	}, {
		name:    "rank nil means none",
		payload: map[string]any{"ts": 8.0, "events": nil, "data_parallel_rank": nil},
		want:    Batch{TS: 8, DPRank: -1},
	}, {
		name:    "largest rank",
		payload: []any{9.0, []any{}, int64(math.MaxInt32)},
		want:    Batch{TS: 9, DPRank: math.MaxInt32},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b Batch
			require.NoError(t, DecodeBatch(&b, pack(t, c.payload)))
			assertBatch(t, c.want, b)
		})
	}
}

func assertBatch(t *testing.T, want, got Batch) {
	t.Helper()
	assert.Equal(t, want.TS, got.TS)
	assert.Equal(t, want.DPRank, got.DPRank)
	require.Len(t, got.Events, len(want.Events))
	for i := range want.Events {
		w, g := want.Events[i], got.Events[i]
		if len(w.BlockHashes) == 0 && len(g.BlockHashes) == 0 {
			w.BlockHashes, g.BlockHashes = nil, nil
		}
		if len(w.TokenIDs) == 0 && len(g.TokenIDs) == 0 {
			w.TokenIDs, g.TokenIDs = nil, nil
		}
		assert.Equal(t, w, g, "event %d", i)
	}
}

func TestDecodeBatchRejects(t *testing.T) {
	cases := map[string][]byte{
		"empty":             nil,
		"not a batch":       pack(t, "BlockStored"),
		"short batch":       pack(t, []any{1.0}),
		"truncated":         pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2}}}})[:8],
		"trailing bytes":    append(pack(t, []any{1.0, []any{}}), 0),
		"negative token":    pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}),
		"huge token":        pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 40}, 1}}}),
		"string hashes":     pack(t, []any{1.0, []any{[]any{"BlockRemoved", "abc"}}}),
		"float hash":        pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}),
		"empty event":       pack(t, []any{1.0, []any{[]any{}}}),
		"array32 too long":  {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"deep nesting":      append(append([]byte{0x93, 0x01, 0x90}, bytesOf(0x91, 100)...), 0xc0),
		"negative rank":     pack(t, []any{1.0, []any{[]any{"AllBlocksCleared"}}, -2}),
		"negative rank map": pack(t, map[string]any{"ts": 1.0, "events": []any{}, "data_parallel_rank": int64(math.MinInt64)}),
		"huge rank":         pack(t, []any{1.0, []any{}, uint64(1) << 40}),
		"string rank":       pack(t, map[string]any{"ts": 1.0, "events": []any{}, "attn_dp_rank": "0"}),
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			b := Batch{Events: []Event{{Kind: Stored}}}
			err := DecodeBatch(&b, p)
			assert.ErrorIs(t, err, ErrMalformed)
			assert.Empty(t, b.Events)
		})
	}
}

func bytesOf(c byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// TestAppendBatchRoundTrip checks that AppendBatch writes what DecodeBatch
// reads, and vLLM's positional layout byte for byte.
func TestAppendBatchRoundTrip(t *testing.T) {
	in := Batch{TS: 12.25, DPRank: 0, Events: []Event{
		{Kind: Stored, BlockHashes: []uint64{1 << 63, 2}, Parent: 9, HasParent: true, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		{Kind: Stored, BlockHashes: []uint64{3}, TokenIDs: []uint32{5, 6}, BlockSize: 2, LoRA: "ad", Medium: "GPU", Group: 2},
		{Kind: Removed, BlockHashes: []uint64{2}, Medium: "GPU"},
		{Kind: Cleared},
	}}
	p := AppendBatch(nil, &in)
	var out Batch
	require.NoError(t, DecodeBatch(&out, p))
	assertBatch(t, in, out)

	want := pack(t, []any{12.25, []any{
		[]any{"BlockStored", []any{uint64(1) << 63, 2}, 9, []any{1, 2, 3, 4}, 2, nil, "GPU"},
		[]any{"BlockStored", []any{3}, nil, []any{5, 6}, 2, nil, "GPU", "ad", nil, 2},
		[]any{"BlockRemoved", []any{2}, "GPU"},
		[]any{"AllBlocksCleared"},
	}, 0})
	assert.Equal(t, want, p)
}

func TestDecodeBatchAllocs(t *testing.T) {
	p := AppendBatch(nil, &Batch{TS: 1, Events: []Event{
		{Kind: Stored, BlockHashes: []uint64{1, 2}, TokenIDs: make([]uint32, 32), BlockSize: 16},
		{Kind: Removed, BlockHashes: []uint64{1}},
		// As the newest vLLM sends every event of a hybrid model.
		{Kind: Stored, BlockHashes: []uint64{3}, TokenIDs: make([]uint32, 16), BlockSize: 16, Medium: "GPU", Group: 1, GroupKind: "full_attention"},
		{Kind: Removed, BlockHashes: []uint64{3}, Medium: "GPU", Group: 1},
	}})
	var b Batch
	require.NoError(t, DecodeBatch(&b, p))
	allocs := testing.AllocsPerRun(100, func() { _ = DecodeBatch(&b, p) })
	assert.Zero(t, allocs, "decoding into a used Batch allocates")
}

// oneByteHashes returns a payload of events BlockRemoved events of perEvent
// hashes each, every hash a 1-byte integer: the payload that holds the most
// hashes per byte.
func oneByteHashes(events, perEvent int) []byte {
	p := []byte{0x92, 0x00, 0xdd} // [ts 0, events as an array32]
	p = binary.BigEndian.AppendUint32(p, uint32(events))
	for range events {
		p = append(p, 0x92, 0xac) // ["BlockRemoved", hashes]
		p = append(p, "BlockRemoved"...)
		p = append(p, 0xdd)
		p = binary.BigEndian.AppendUint32(p, uint32(perEvent))
		p = append(p, make([]byte, perEvent)...)
	}
	return p
}

// TestDecodeBatchMemory checks the bound the package documents on the
// memory of a decoded batch against the payload that costs the most, and
// that a Batch reused for an endpoint's stream gives back the storage of a
// large batch once a small one follows.
func TestDecodeBatchMemory(t *testing.T) {
	p := oneByteHashes(64, MaxBlocksPerEvent) // 4 MiB, 4M hashes
	var before, after, kept runtime.MemStats
	var b Batch
	runtime.GC()
	runtime.ReadMemStats(&before)
	require.NoError(t, DecodeBatch(&b, p))
	runtime.ReadMemStats(&after)
	runtime.GC()
	runtime.ReadMemStats(&kept)
	require.Len(t, b.Events, 64)
	allocated := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(p))
	held := float64(int64(kept.HeapAlloc)-int64(before.HeapAlloc)) / float64(len(p))
	t.Logf("payload %d bytes: allocated %.1fx, held %.1fx", len(p), allocated, held)
	assert.Less(t, allocated, 24.0, "decoding allocated %.1f times the payload", allocated)
	assert.Less(t, held, 10.0, "the decoded batch holds %.1f times the payload", held)
	runtime.KeepAlive(&b)

	small := AppendBatch(nil, &Batch{Events: []Event{removed(1, 2, 3)}})
	require.NoError(t, DecodeBatch(&b, small))
	assert.LessOrEqual(t, cap(b.hashes)*8, shrinkBytes, "a small batch keeps the hash storage of a large one")
	assert.Len(t, b.Events, 1)
	for i, e := range b.Events[len(b.Events):cap(b.Events)] {
		if e.BlockHashes != nil {
			t.Fatalf("event %d past the batch's keeps the hash storage of a large batch", len(b.Events)+i)
		}
	}
}

// TestDecodeBatchMemoryEvents checks the documented bound against the
// payload that holds the most events per byte: the shortest event of a
// known class, ["BlockStored"] (13 bytes), as many as a batch may hold.
// Decoding reserves their storage at once instead of growing it by
// append, which allocated some 90 times the payload.
func TestDecodeBatchMemoryEvents(t *testing.T) {
	for _, tag := range []string{"BlockStored", "BlockRemoved", "AllBlocksCleared"} {
		p := []byte{0x92, 0x00, 0xdd} // [ts 0, events as an array32]
		p = binary.BigEndian.AppendUint32(p, MaxEventsPerBatch)
		for range MaxEventsPerBatch {
			p = append(p, 0x91, 0xa0|byte(len(tag)))
			p = append(p, tag...)
		}
		var before, after, kept runtime.MemStats
		var b Batch
		runtime.GC()
		runtime.ReadMemStats(&before)
		require.NoError(t, DecodeBatch(&b, p))
		runtime.ReadMemStats(&after)
		runtime.GC()
		runtime.ReadMemStats(&kept)
		require.Len(t, b.Events, MaxEventsPerBatch)
		allocated := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(p))
		held := float64(int64(kept.HeapAlloc)-int64(before.HeapAlloc)) / float64(len(p))
		t.Logf("%s: payload %d bytes: allocated %.1fx, held %.1fx", tag, len(p), allocated, held)
		assert.Less(t, allocated, 17.0, "%s: decoding allocated %.1f times the payload", tag, allocated)
		assert.Less(t, held, 16.0, "%s: the decoded batch holds %.1f times the payload", tag, held)
		runtime.KeepAlive(&b)
	}
}

// AppendBatch writes a rank DecodeBatch would refuse as none, so that what
// a Publisher sends always decodes.
func TestAppendBatchRankOutOfRange(t *testing.T) {
	huge := int64(math.MaxInt32) + 1
	for _, rank := range []int{-2, math.MinInt, int(huge)} {
		var b Batch
		require.NoError(t, DecodeBatch(&b, AppendBatch(nil, &Batch{TS: 1, DPRank: rank})), "rank %d", rank)
		assert.Equal(t, -1, b.DPRank, "rank %d", rank)
	}
}
