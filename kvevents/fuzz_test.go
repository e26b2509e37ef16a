package kvevents

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmlb/llmlb/prefix"
)

// FuzzDecodeBatch checks that DecodeBatch never panics, returns events only
// on success, respects the documented limits, and that a decoded batch
// re-encodes to one that decodes to the same time, rank and events (all but
// Salted, which the encoding does not carry, and the kv_cache_spec_kind of
// a BlockRemoved, which vLLM's positional one has no place for), and that
// only an event without a parent carries a cache salt.
func FuzzDecodeBatch(f *testing.F) {
	seeds := []any{
		[]any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU"}}, 0},
		[]any{1.0, []any{[]any{"BlockRemoved", []any{[]byte("abc")}, "GPU"}, []any{"AllBlocksCleared"}}},
		map[string]any{"ts": 1.0, "events": []any{map[string]any{"type": "BlockStored", "block_hashes": []any{-1}, "extra_keys": []any{[]any{"a"}}}}},
		[]any{1.0, []any{[]any{"AllBlocksCleared"}}, -5},
		map[string]any{"ts": 1.0, "events": []any{}, "data_parallel_rank": -1},
		// vLLM's 2026 events: tagged maps, tag first, with typed extra keys,
		// locality and the other fields added that year, and a class this
		// package does not know, with fields it could not read.
		[]any{1.0, []any{
			newestStored([]any{[]byte("abc")}, 7, []any{1, 2}, "ad", kv{"event_version", 1},
				kv{"extra_keys", []any{[]any{lora("ad")}, []any{lora("ad"), salt("s"), mm("h")}, nil}},
				kv{"group_idx", 0}, kv{"kv_cache_spec_kind", "full_attention"}, kv{"kv_cache_spec_sliding_window", nil},
				kv{"locality", "REMOTE"}, kv{"ownership", "kvcr"}, kv{"session_id", "r"}),
			ordered{{"type", "BlockRemoved"}, {"block_hashes", []any{1}}, {"medium", "GPU"}, {"group_idx", 1}, {"locality", "LOCAL"}},
			ordered{{"type", "BlockMigrated"}, {"block_hashes", []any{[]any{1}}}, {"block_size", -1}},
			ordered{{"block_size", -1}, {"type", "BlockMigrated"}},
		}, 0},
		map[string]any{"ts": 1.0, "events": []any{ordered{{"type", "AllBlocksCleared"}}}},
		// Hybrid models' KV-cache groups, positional (kv_cache_spec_kind at
		// index 10) and map-encoded; cache salts as vLLM and SGLang send
		// them; a newer event_version.
		[]any{1.0, []any{
			[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU", "ad", []any{[]any{"ad", "salt"}, []any{"ad"}}, 1, "sliding_window", 128},
			[]any{"BlockRemoved", []any{1}, "GPU", 1},
			[]any{"BlockStored", []any{3}, nil, []any{1, 2}, 2, nil, "GPU", map[string]any{"cache_salt": "t", "session_id": "s"}},
			[]any{"BlockStored", []any{4}, nil, []any{1, 2}, 2, nil, "GPU", []any{[]any{"t"}}},
		}, 0},
		[]any{1.0, []any{
			ordered{{"type", "BlockStored"}, {"block_hashes", []any{5}}, {"parent_block_hash", nil}, {"token_ids", []any{1, 2}},
				{"block_size", 2}, {"lora_id", 3}, {"medium", "GPU"}, {"cache_salt", "t"}, {"session_id", "s"}},
			ordered{{"type", "BlockStored"}, {"block_hashes", []any{6}}, {"parent_block_hash", 5}, {"token_ids", []any{1, 2}},
				{"block_size", 2}, {"cache_salt", "t"}, {"event_version", 2}, {"group_idx", 2}, {"kv_cache_spec_kind", "mamba"}},
			ordered{{"type", "BlockRemoved"}, {"block_hashes", []any{6}}, {"group_idx", 2}, {"kv_cache_spec_kind", "mamba"}},
		}, 0},
		// SGLang's positional events in the layout KV-aware routers read by
		// position: locality and ownership on both events, the salted
		// BlockStored's metadata after them, its salt tagged in extra_keys.
		[]any{1.0, []any{
			[]any{"BlockStored", []any{7}, nil, []any{1, 2}, 2, nil, "GPU", nil, []any{[]any{"dynamo-cache-salt:t"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "t"}},
			[]any{"BlockStored", []any{8}, 7, []any{3, 4}, 2, nil, "GPU", nil, []any{[]any{"dynamo-cache-salt:t"}}, nil, nil, nil, "LOCAL", nil, map[string]any{"cache_salt": "t"}},
			[]any{"BlockStored", []any{9}, nil, []any{1, 2}, 2, nil, "GPU", nil, nil, 0, "full_attention", nil, "REMOTE", "kvcr"},
			[]any{"BlockRemoved", []any{7}, "GPU", nil, nil, nil, nil, nil},
			[]any{"BlockRemoved", []any{9}, "GPU", 0, "full_attention", nil, "REMOTE", "kvcr"},
			[]any{"AllBlocksCleared", nil},
		}, 0},
	}
	for _, s := range seeds {
		b, err := msgpack.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var b Batch
		if err := DecodeBatch(&b, p); err != nil {
			if len(b.Events) != 0 {
				t.Fatalf("error %v with %d events", err, len(b.Events))
			}
			return
		}
		if len(b.Events) > MaxEventsPerBatch {
			t.Fatalf("%d events", len(b.Events))
		}
		for _, e := range b.Events {
			if len(e.BlockHashes) > MaxBlocksPerEvent || len(e.TokenIDs) > MaxTokensPerEvent {
				t.Fatalf("event beyond limits: %d hashes, %d tokens", len(e.BlockHashes), len(e.TokenIDs))
			}
			if e.Kind < Stored || e.Kind > Cleared {
				t.Fatalf("kind %v", e.Kind)
			}
		}
		var again Batch
		if err := DecodeBatch(&again, AppendBatch(nil, &b)); err != nil {
			t.Fatalf("re-encoded batch: %v", err)
		}
		if len(again.Events) != len(b.Events) {
			t.Fatalf("re-encoded batch has %d events, want %d", len(again.Events), len(b.Events))
		}
		if b.DPRank < -1 || b.DPRank > math.MaxInt32 {
			t.Fatalf("rank %d decoded", b.DPRank)
		}
		if again.TS != b.TS && !(math.IsNaN(again.TS) && math.IsNaN(b.TS)) || again.DPRank != b.DPRank {
			t.Fatalf("batch time %v, rank %d re-encoded as %v, %d", b.TS, b.DPRank, again.TS, again.DPRank)
		}
		for i := range b.Events {
			x, y := b.Events[i], again.Events[i]
			if x.Kind != y.Kind || !slices.Equal(x.BlockHashes, y.BlockHashes) || !slices.Equal(x.TokenIDs, y.TokenIDs) ||
				x.HasParent != y.HasParent || x.Parent != y.Parent || x.LoRA != y.LoRA || x.Group != y.Group ||
				x.BlockSize != y.BlockSize || x.Medium != y.Medium || x.CacheSalt != y.CacheSalt ||
				x.Kind == Stored && x.GroupKind != y.GroupKind {
				t.Fatalf("event %d: %+v re-encoded as %+v", i, x, y)
			}
			if x.CacheSalt != "" && x.HasParent {
				t.Fatalf("event %d: cache salt %q with a parent", i, x.CacheSalt)
			}
		}
	})
}

// FuzzApplier applies a fuzzed stream of batches to an Applier and checks
// that nothing panics, the index holds no block the Applier did not count
// as stored, a clear leaves the endpoint empty, and the counters stay
// consistent.
func FuzzApplier(f *testing.F) {
	a := prompt(1, 3)
	h0, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: testBlock})
	if err != nil {
		f.Fatal(err)
	}
	salt := prefix.Salt{Model: "m"}
	ha := h0.HashTokens(salt, a)
	ok := AppendBatch(nil, &Batch{Events: []Event{stored(ha, a, 0, 3)}})
	f.Add(int64(0), ok, int64(1), []byte{0xc1}, int64(5), ok)
	f.Add(int64(3), ok, int64(-1), ok, int64(2), []byte(nil))
	// A hybrid model's groups, and a salted chain.
	window, full := stored(ha, a, 0, 3), stored(ha, a, 0, 3)
	window.GroupKind, full.Group, full.GroupKind = "sliding_window", 1, "full_attention"
	salted := stored(h0.HashTokens(prefix.Salt{Model: "m", Namespace: "t"}, a), a, 0, 3)
	salted.CacheSalt = "t"
	hybrid := AppendBatch(nil, &Batch{Events: []Event{window, full, salted, {Kind: Removed, BlockHashes: full.BlockHashes[2:], Medium: "GPU"}}})
	f.Add(int64(0), hybrid, int64(1), ok, int64(2), hybrid)
	// Two copies of a prompt's blocks, one of them evicted.
	twice := AppendBatch(nil, &Batch{Events: []Event{stored(ha, a, 0, 3), stored(ha, a, 0, 2), removed(ha[1], ha[0])}})
	f.Add(int64(0), twice, int64(1), twice, int64(2), ok)
	// SGLang's positional events in the routers' layout: a salted chain,
	// its salt tagged in extra_keys too, and a REMOTE copy's eviction.
	hs := h0.HashTokens(prefix.Salt{Model: "m", Namespace: "t"}, a)
	layout, err := msgpack.Marshal([]any{1.0, []any{
		[]any{"BlockStored", engineHashes(hs[:2]), nil, tokenList(a[:2*testBlock]), testBlock, nil, "GPU", nil,
			[]any{[]any{"dynamo-cache-salt:t"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "t"}},
		[]any{"BlockStored", engineHashes(hs[2:]), engineHash(hs[1]), tokenList(a[2*testBlock:]), testBlock, nil, "GPU", nil,
			[]any{[]any{"dynamo-cache-salt:t"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "t"}},
		[]any{"BlockRemoved", engineHashes(hs[2:]), "GPU", nil, nil, nil, "REMOTE", nil},
	}, 0})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(int64(0), layout, int64(1), ok, int64(2), layout)
	f.Fuzz(func(t *testing.T, s1 int64, p1 []byte, s2 int64, p2 []byte, s3 int64, p3 []byte) {
		idx, h := newTestIndex(t)
		const maxBlocks = 2
		ap, err := NewApplier(Config{Index: idx, Hasher: h, MaxBlocks: maxBlocks})
		if err != nil {
			t.Fatal(err)
		}
		if err := ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}); err != nil {
			t.Fatal(err)
		}
		for _, op := range []struct {
			seq int64
			p   []byte
		}{{s1, p1}, {s2, p2}, {s3, p3}} {
			before, _ := ap.Stats("e1")
			ap.Apply("e1", op.seq, op.p)
			st, _ := ap.Stats("e1")
			if n := idx.Len("e1"); int64(n) > st.Stored {
				t.Fatalf("%d blocks indexed, %d counted stored", n, st.Stored)
			}
			if op.p == nil && idx.Len("e1") != 0 {
				t.Fatalf("%d blocks after a clear", idx.Len("e1"))
			}
			if st.Batches < before.Batches || st.Malformed < before.Malformed || st.Resets < before.Resets || st.Stored < 0 || st.Removed < 0 {
				t.Fatalf("counters went back or negative: %+v after %+v", st, before)
			}
			if op.p != nil && op.seq >= 0 && st.Seq != op.seq {
				t.Fatalf("Seq %d after batch %d", st.Seq, op.seq)
			}
			tr := ap.eps["e1"].tr
			if len(tr.copies) > maxBlocks {
				t.Fatalf("%d blocks with copies counted, beyond %d", len(tr.copies), maxBlocks)
			}
			for k := range tr.copies {
				if !tr.hashes.Contains(k.hash) {
					t.Fatalf("copies counted of block %x, which is not followed", k.hash)
				}
			}
		}
	})
}

// FuzzGuardConn checks the guard's reading of ZMTP framing over any bytes a
// peer may send, read in pieces of any size: it never panics, passes every
// byte through until it fails, and fails, or not, whatever the size of the
// pieces: the stream read a byte at a time is the reference.
func FuzzGuardConn(f *testing.F) {
	ok := append(make([]byte, greetingBytes), 0x04, 5, 5, 'R', 'E', 'A', 'D')
	ok = append(ok, flagMore, 2, 'k', 'v', flagMore, 1, 7, 0, 3, 1, 2, 3)
	f.Add(ok, uint8(3))
	f.Add(append(bytes.Clone(ok), longHeader(0, 1<<40)...), uint8(1))
	f.Add(append(bytes.Clone(ok), bytes.Repeat([]byte{flagMore, 0}, maxFrames+1)...), uint8(7))
	f.Add(append(bytes.Clone(ok), 0x04|flagLong, 0, 0, 0, 0, 0, 0, 0, 90), uint8(64))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		read := func(chunk int) (passed []byte, failed bool) {
			c := newGuardConn(&chunkConn{data: bytes.Clone(stream), chunk: chunk}, time.Minute)
			c.limit = 100 // small, so that random input reaches it
			buf := make([]byte, 256)
			for len(passed) < len(stream) {
				n, err := c.Read(buf)
				if err != nil {
					if n != 0 {
						t.Fatalf("a failed read returned %d bytes", n)
					}
					if _, err := c.Read(buf); err == nil {
						t.Fatal("a read after a failure succeeded")
					}
					return passed, true
				}
				passed = append(passed, buf[:n]...)
			}
			return passed, false
		}
		want, wantFailed := read(1)
		got, failed := read(1 + int(chunk))
		if failed != wantFailed {
			t.Fatalf("read in pieces of %d bytes: failed %v, a byte at a time: %v", 1+int(chunk), failed, wantFailed)
		}
		if !bytes.HasPrefix(stream, got) || !bytes.HasPrefix(want, got) {
			t.Fatalf("read in pieces of %d bytes, passed %d bytes not the stream's first", 1+int(chunk), len(got))
		}
		if !wantFailed && !bytes.Equal(want, stream) {
			t.Fatalf("passed %d bytes of %d without failing", len(want), len(stream))
		}
	})
}
