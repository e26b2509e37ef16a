package kvevents

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeBatch checks that DecodeBatch never panics, returns events only
// on success, respects the documented limits, and that a decoded batch
// re-encodes to one that decodes to the same events.
func FuzzDecodeBatch(f *testing.F) {
	seeds := []any{
		[]any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU"}}, 0},
		[]any{1.0, []any{[]any{"BlockRemoved", []any{[]byte("abc")}, "GPU"}, []any{"AllBlocksCleared"}}},
		map[string]any{"ts": 1.0, "events": []any{map[string]any{"type": "BlockStored", "block_hashes": []any{-1}, "extra_keys": []any{[]any{"a"}}}}},
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
		for i := range b.Events {
			x, y := b.Events[i], again.Events[i]
			if x.Kind != y.Kind || len(x.BlockHashes) != len(y.BlockHashes) || len(x.TokenIDs) != len(y.TokenIDs) ||
				x.HasParent != y.HasParent || x.Parent != y.Parent || x.LoRA != y.LoRA || x.Group != y.Group {
				t.Fatalf("event %d: %+v re-encoded as %+v", i, x, y)
			}
		}
	})
}
