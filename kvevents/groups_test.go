package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// groupsRig is an Applier following endpoint "e", salted with model "m",
// and a way to send it batches one after the other.
type groupsRig struct {
	t    *testing.T
	idx  *prefix.Index
	h    *prefix.Hasher
	ap   *Applier
	salt prefix.Salt
	seq  int64
}

func newGroupsRig(t *testing.T) *groupsRig {
	idx, h := newTestIndex(t)
	ap, err := NewApplier(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	s := prefix.Salt{Model: "m"}
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e": s}))
	return &groupsRig{t: t, idx: idx, h: h, ap: ap, salt: s}
}

// send applies a batch of events, each an ordered map or a positional
// array as vLLM encodes them.
func (g *groupsRig) send(events ...any) {
	g.t.Helper()
	g.ap.Apply("e", g.seq, pack(g.t, []any{float64(g.seq), events, 0}))
	g.seq++
	st, _ := g.ap.Stats("e")
	require.Equal(g.t, int64(0), st.Malformed)
}

func (g *groupsRig) match(hs []uint64) int { return g.idx.MatchLen("e", hs, time.Now()) }

func (g *groupsRig) stats() Stats { st, _ := g.ap.Stats("e"); return st }

// engineHashes returns the engine's hashes of router hashes hs, as the
// wire carries them.
func engineHashes(hs []uint64) []any {
	out := make([]any, len(hs))
	for i, h := range hs {
		out[i] = engineHash(h)
	}
	return out
}

func tokenList(toks []uint32) []any {
	out := make([]any, len(toks))
	for i, v := range toks {
		out[i] = v
	}
	return out
}

// groupStored is a BlockStored of vLLM since PR 42892 (a map) of the
// blocks of toks, whose router hashes are hs, in KV-cache group group of
// kind kind; kind "" and group -1 leave the fields out.
func groupStored(hs []uint64, toks []uint32, group int, kind string) ordered {
	e := ordered{{"type", "BlockStored"}, {"block_hashes", engineHashes(hs)}, {"parent_block_hash", nil},
		{"token_ids", tokenList(toks)}, {"block_size", testBlock}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}}
	if group >= 0 {
		e = append(e, kv{"group_idx", group})
	}
	if kind != "" {
		e = append(e, kv{"kv_cache_spec_kind", kind})
	}
	return e
}

// groupRemoved is vLLM's BlockRemoved of router hashes hs in group group
// (-1 leaves group_idx out), which carries no kind.
func groupRemoved(group int, hs ...uint64) ordered {
	e := ordered{{"type", "BlockRemoved"}, {"block_hashes", engineHashes(hs)}, {"medium", "GPU"}}
	if group >= 0 {
		e = append(e, kv{"group_idx", group})
	}
	return e
}

// TestHybridGroupsIndexFullAttention follows a model mixing attention
// types, whose KV-cache groups store and evict the same blocks under the
// same hashes, as vLLM's hybrid KV-cache manager does: only the
// full-attention groups are indexed, whichever their number, their type
// learned from BlockStored for the BlockRemoved that do not carry it; a
// sliding window's eviction of a prompt's first blocks leaves them
// indexed.
func TestHybridGroupsIndexFullAttention(t *testing.T) {
	for _, full := range []string{"full_attention", "mla_attention", "sink_full_attention"} {
		t.Run(full, func(t *testing.T) {
			g := newGroupsRig(t)
			toks := prompt(1, 3)
			hs := g.h.HashTokens(g.salt, toks)
			// Group 0 is the sliding window's, as in Gemma 3 or GPT-OSS
			// whose first layer is a sliding-window one; group 2 Mamba's.
			g.send(groupStored(hs, toks, 0, "sliding_window"), groupStored(hs, toks, 1, full), groupStored(hs, toks, 2, "mamba"))
			assert.Equal(t, 3, g.match(hs))
			assert.Equal(t, int64(3), g.stats().Stored, "stored once, by the full-attention group")
			// The window slides past the first block: the sliding-window
			// and Mamba groups evict it, the full-attention group keeps it.
			g.send(groupRemoved(0, hs[0]), groupRemoved(2, hs[0]))
			assert.Equal(t, 3, g.match(hs), "another group's eviction removed a full-attention block")
			g.send(groupRemoved(1, hs[2]))
			assert.Equal(t, 2, g.match(hs))
		})
	}
}

// TestHybridGroupsPositional checks the same with vLLM's positional
// events between PR 40984 and PR 42892, kv_cache_spec_kind at index 10.
func TestHybridGroupsPositional(t *testing.T) {
	g := newGroupsRig(t)
	toks := prompt(1, 2)
	hs := g.h.HashTokens(g.salt, toks)
	stored := func(group int, kind string) []any {
		return []any{"BlockStored", engineHashes(hs), nil, tokenList(toks), testBlock, nil, "GPU", nil, nil, group, kind, 128}
	}
	g.send(stored(0, "sliding_window"), stored(1, "full_attention"))
	assert.Equal(t, 2, g.match(hs))
	g.send([]any{"BlockRemoved", engineHashes(hs[1:]), "GPU", 0})
	assert.Equal(t, 2, g.match(hs), "the sliding window's eviction removed a full-attention block")
	g.send([]any{"BlockRemoved", engineHashes(hs[1:]), "GPU", 1})
	assert.Equal(t, 1, g.match(hs))
}

// TestGroupsWithoutKind checks the events of engines that tell no group
// type: without group_idx (SGLang, vLLM before PR 37688) every event is
// indexed; with group_idx alone (vLLM between PR 37688 and PR 40984),
// group 0 is, as Dynamo does.
func TestGroupsWithoutKind(t *testing.T) {
	g := newGroupsRig(t)
	a, b := prompt(1, 2), prompt(100, 2)
	ha, hb := g.h.HashTokens(g.salt, a), g.h.HashTokens(g.salt, b)
	g.send(groupStored(ha, a, -1, ""), groupStored(hb, b, 1, ""))
	assert.Equal(t, 2, g.match(ha))
	assert.Equal(t, 0, g.match(hb), "group 1 of unknown type indexed")
	g.send(groupStored(hb, b, 0, ""))
	assert.Equal(t, 2, g.match(hb))
	g.send(groupRemoved(1, hb[1]))
	assert.Equal(t, 2, g.match(hb), "group 1 of unknown type removed a block")
	g.send(groupRemoved(-1, hb[1]), groupRemoved(0, ha[1]))
	assert.Equal(t, 1, g.match(hb))
	assert.Equal(t, 1, g.match(ha))
}

// TestSeveralFullAttentionGroups checks a model with two full-attention
// groups (layers split into groups of equal page size): vLLM finds a
// block cached only if every full-attention group holds it
// (HybridKVCacheCoordinator), so the block is indexed once and removed
// as soon as either group evicts it.
func TestSeveralFullAttentionGroups(t *testing.T) {
	g := newGroupsRig(t)
	toks := prompt(1, 2)
	hs := g.h.HashTokens(g.salt, toks)
	g.send(groupStored(hs, toks, 0, "full_attention"), groupStored(hs, toks, 1, "full_attention"), groupStored(hs, toks, 2, "sliding_window"))
	assert.Equal(t, 2, g.match(hs))
	g.send(groupRemoved(1, hs[1]))
	assert.Equal(t, 1, g.match(hs))
	// A cleared engine may come back with another layout: what was learned
	// of its groups is forgotten, and group 0 of unknown type indexed.
	g.send(ordered{{"type", "AllBlocksCleared"}})
	g.send(groupStored(hs, toks, 2, ""), groupStored(hs, toks, 0, ""))
	assert.Equal(t, 2, g.match(hs))
	g.send(groupRemoved(2, hs[1]))
	assert.Equal(t, 2, g.match(hs))
}

func TestDecodeGroups(t *testing.T) {
	var b Batch
	require.NoError(t, DecodeBatch(&b, pack(t, []any{1.0, []any{
		[]any{"BlockStored", []any{1}, nil, []any{1, 2}, 2, nil, "GPU", nil, nil, 3, "sliding_window", 128},
		ordered{{"type", "BlockStored"}, {"block_hashes", []any{2}}, {"group_idx", 1}, {"kv_cache_spec_kind", "mamba"}},
		ordered{{"type", "BlockRemoved"}, {"block_hashes", []any{2}}, {"group_idx", 4}, {"kv_cache_spec_kind", nil}},
	}, 0})))
	require.Len(t, b.Events, 3)
	assert.Equal(t, 3, b.Events[0].Group)
	assert.Equal(t, "sliding_window", b.Events[0].GroupKind)
	assert.Equal(t, 1, b.Events[1].Group)
	assert.Equal(t, "mamba", b.Events[1].GroupKind)
	assert.Equal(t, 4, b.Events[2].Group)
	assert.Equal(t, "", b.Events[2].GroupKind)

	for name, e := range map[string]any{
		"negative group":     ordered{{"type", "BlockStored"}, {"group_idx", -1}},
		"kind not a string":  ordered{{"type", "BlockStored"}, {"kv_cache_spec_kind", 3}},
		"positional kind":    []any{"BlockStored", []any{1}, nil, []any{1, 2}, 2, nil, "GPU", nil, nil, 0, []any{}},
		"negative removed":   []any{"BlockRemoved", []any{1}, "GPU", -2},
		"version not an int": ordered{{"type", "BlockStored"}, {"event_version", "2"}},
	} {
		assert.ErrorIs(t, DecodeBatch(&b, pack(t, []any{1.0, []any{e}})), ErrMalformed, name)
	}
}
