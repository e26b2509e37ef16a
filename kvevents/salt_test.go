package kvevents

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// saltedStored is a map-encoded BlockStored of the blocks [from, to) of
// toks, whose router hashes are hs, with more fields.
func saltedStored(hs []uint64, toks []uint32, from, to int, more ...kv) ordered {
	var parent any
	if from > 0 {
		parent = engineHash(hs[from-1])
	}
	e := ordered{{"type", "BlockStored"}, {"block_hashes", engineHashes(hs[from:to])}, {"parent_block_hash", parent},
		{"token_ids", tokenList(toks[from*testBlock : to*testBlock])}, {"block_size", testBlock}, {"lora_id", nil}, {"medium", "GPU"}}
	return append(e, more...)
}

// TestCacheSaltIndexed checks that blocks an engine stored under a cache
// salt are indexed under the router's salt of that Namespace, so that
// they match the prompts hashed with the same cache salt and no other;
// the salt comes as vLLM sends it (in the first block's extra_keys, bare
// or typed, after the LoRA name) or as SGLang does (its cache_salt field,
// or, positional, a metadata map where vLLM has lora_name), and the
// blocks that continue a salted chain are indexed after it.
func TestCacheSaltIndexed(t *testing.T) {
	toks := prompt(1, 3)
	cases := []struct {
		name  string
		lora  string
		first any // the BlockStored of blocks 0 and 1
		next  any // the BlockStored of block 2, with block 1 its parent
	}{{
		name: "vLLM extra_keys",
		first: saltedStored(make([]uint64, 3), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{[]any{"tenant"}, nil}}),
		next: saltedStored(make([]uint64, 3), toks, 2, 3, kv{"lora_name", nil}, kv{"extra_keys", []any{nil}}),
	}, {
		name: "vLLM extra_keys with an adapter",
		lora: "ad",
		first: saltedStored(make([]uint64, 3), toks, 0, 2, kv{"lora_name", "ad"},
			kv{"extra_keys", []any{[]any{"ad", "tenant"}, []any{"ad"}}}),
		next: saltedStored(make([]uint64, 3), toks, 2, 3, kv{"lora_name", "ad"}, kv{"extra_keys", []any{[]any{"ad"}}}),
	}, {
		name: "vLLM extra_keys with an adapter named as the salt",
		lora: "tenant",
		first: saltedStored(make([]uint64, 3), toks, 0, 2, kv{"lora_name", "tenant"},
			kv{"extra_keys", []any{[]any{"tenant", "tenant"}, []any{"tenant"}}}),
		next: saltedStored(make([]uint64, 3), toks, 2, 3, kv{"lora_name", "tenant"}, kv{"extra_keys", []any{[]any{"tenant"}}}),
	}, {
		name: "typed extra keys",
		lora: "ad",
		first: saltedStored(make([]uint64, 3), toks, 0, 2, kv{"lora_name", "ad"}, kv{"event_version", 1},
			kv{"extra_keys", []any{[]any{lora("ad"), salt("tenant")}, []any{lora("ad")}}}),
		next: saltedStored(make([]uint64, 3), toks, 2, 3, kv{"lora_name", "ad"}, kv{"extra_keys", []any{[]any{lora("ad")}}}),
	}, {
		name:  "SGLang cache_salt",
		first: saltedStored(make([]uint64, 3), toks, 0, 2, kv{"cache_salt", "tenant"}, kv{"session_id", "s1"}),
		next:  saltedStored(make([]uint64, 3), toks, 2, 3, kv{"cache_salt", "tenant"}, kv{"session_id", "s1"}),
	}, {
		name: "SGLang positional metadata",
		first: []any{"BlockStored", nil, nil, tokenList(toks[:2*testBlock]), testBlock, nil, "GPU",
			map[string]any{"cache_salt": "tenant", "session_id": "s1"}},
		next: []any{"BlockStored", nil, nil, tokenList(toks[2*testBlock:]), testBlock, nil, "GPU",
			map[string]any{"cache_salt": "tenant"}},
	}, {
		// The layout KV-aware routers read by position: the salt tagged
		// in extra_keys of every salted event, and in the metadata after
		// ownership.
		name: "SGLang positional, the routers' layout",
		first: []any{"BlockStored", nil, nil, tokenList(toks[:2*testBlock]), testBlock, nil, "GPU", nil,
			[]any{[]any{"dynamo-cache-salt:tenant"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "tenant"}},
		next: []any{"BlockStored", nil, nil, tokenList(toks[2*testBlock:]), testBlock, nil, "GPU", nil,
			[]any{[]any{"dynamo-cache-salt:tenant"}}, nil, nil, nil, nil, nil, map[string]any{"cache_salt": "tenant"}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGroupsRig(t)
			salted := prefix.Salt{Model: "m", Adapter: c.lora, Namespace: "tenant"}
			hs := g.h.HashTokens(salted, toks)
			fix := func(e any, from, to int) any {
				// The hashes depend on the salt: fill them in.
				var parent any
				if from > 0 {
					parent = engineHash(hs[from-1])
				}
				switch e := e.(type) {
				case ordered:
					e = append(ordered(nil), e...)
					e[1].v, e[2].v = engineHashes(hs[from:to]), parent
					return e
				case []any:
					e = append([]any(nil), e...)
					e[1], e[2] = engineHashes(hs[from:to]), parent
					return e
				}
				panic("event type")
			}
			g.send(fix(c.first, 0, 2))
			g.send(fix(c.next, 2, 3))
			assert.Equal(t, 3, g.match(hs), "prompts of the same salt")
			assert.Equal(t, int64(0), g.stats().Skipped)
			for _, other := range []prefix.Salt{
				{Model: "m", Adapter: c.lora},
				{Model: "m", Adapter: c.lora, Namespace: "other"},
			} {
				assert.Equal(t, 0, g.match(g.h.HashTokens(other, toks)), "prompts salted %+v", other)
			}
		})
	}
}

// TestUnplacedKeysNotIndexed checks that blocks whose hashes mix in keys
// the router's salt cannot hold are not indexed, and are counted.
func TestUnplacedKeysNotIndexed(t *testing.T) {
	toks := prompt(1, 2)
	cases := map[string]ordered{
		"multimodal input": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{[]any{[]any{"img-1", 0}}, nil}}),
		"salt and multimodal input": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{[]any{[]any{"img-1", 0}, "tenant"}, nil}}),
		"prompt embeddings": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{[]any{[]byte{1, 2}}, nil}}),
		"salt past the first block": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{nil, []any{"tenant"}}}),
		"two salts": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{[]any{"tenant", "other"}, nil}}),
		"an adapter not the event's": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", "ad"},
			kv{"extra_keys", []any{[]any{"other"}, []any{"other"}}}),
		"SGLang salt and another in extra_keys": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"cache_salt", "tenant"},
			kv{"extra_keys", []any{[]any{"other"}, nil}}),
		"SGLang salt and another tagged in extra_keys": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"cache_salt", "tenant"},
			kv{"extra_keys", []any{[]any{"dynamo-cache-salt:other"}, nil}}),
		"SGLang salt not a string": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"cache_salt", 7}),
		"SGLang metadata key unknown": saltedStored(make([]uint64, 2), toks, 0, 2,
			kv{"metadata", map[string]any{"cache_salt": "tenant", "namespace": "x"}}),
		"typed legacy key": saltedStored(make([]uint64, 2), toks, 0, 2, kv{"lora_name", nil},
			kv{"extra_keys", []any{[]any{ordered{{"type", "legacy"}, {"value", "tenant"}}}, nil}}),
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			g := newGroupsRig(t)
			for _, s := range []prefix.Salt{g.salt, {Model: "m", Namespace: "tenant"}} {
				// Whatever the salt the event is hashed under, no block is
				// indexed.
				e := append(ordered(nil), e...)
				e[1].v = engineHashes(g.h.HashTokens(s, toks))
				g.send(e)
				assert.Equal(t, 0, g.idx.Len("e"))
			}
			assert.Equal(t, int64(4), g.stats().Skipped)
		})
	}
}

// TestSaltWithParent checks that a vLLM salt on a block that has a parent,
// which vLLM never sends (it salts a request's first block), leaves the
// blocks unindexed, while SGLang's cache_salt on a chain's later blocks
// continues the chain.
func TestSaltWithParent(t *testing.T) {
	var b Batch
	require.NoError(t, DecodeBatch(&b, pack(t, []any{1.0, []any{
		ordered{{"type", "BlockStored"}, {"block_hashes", []any{2}}, {"parent_block_hash", 1}, {"token_ids", []any{1, 2}},
			{"block_size", 2}, {"lora_name", nil}, {"extra_keys", []any{[]any{"tenant"}}}},
		ordered{{"type", "BlockStored"}, {"block_hashes", []any{2}}, {"parent_block_hash", 1}, {"token_ids", []any{1, 2}},
			{"block_size", 2}, {"cache_salt", "tenant"}},
	}, 0})))
	require.Len(t, b.Events, 2)
	assert.True(t, b.Events[0].Salted)
	assert.Equal(t, "", b.Events[0].CacheSalt)
	assert.False(t, b.Events[1].Salted)
	assert.Equal(t, "", b.Events[1].CacheSalt, "the parent carries the salt")
}

// TestSGLangMetadata checks SGLang's positional metadata: session_id is
// not hashed, so metadata holding only it leaves the blocks unsalted.
func TestSGLangMetadata(t *testing.T) {
	var b Batch
	require.NoError(t, DecodeBatch(&b, pack(t, []any{1.0, []any{
		[]any{"BlockStored", []any{1}, nil, []any{1, 2}, 2, nil, "GPU", map[string]any{"session_id": "s1"}},
		[]any{"BlockStored", []any{1}, nil, []any{1, 2}, 2, nil, "GPU", map[string]any{"cache_salt": nil}},
		[]any{"BlockStored", []any{1}, nil, []any{1, 2}, 2, nil, "GPU", map[string]any{}},
	}, 0})))
	require.Len(t, b.Events, 3)
	for i, e := range b.Events {
		assert.False(t, e.Salted, "event %d", i)
		assert.Equal(t, "", e.CacheSalt, "event %d", i)
	}
}

// TestExtraKeysAfterMedium checks a positional BlockStored whose index 7,
// where vLLM has lora_name, holds an array: extra_keys appended after
// medium, as sgl-project/sglang#27735 proposes for SGLang. The batch
// decodes, with the salt it carries.
func TestExtraKeysAfterMedium(t *testing.T) {
	var b Batch
	require.NoError(t, DecodeBatch(&b, pack(t, []any{1.0, []any{
		[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU", []any{[]any{"tenant"}, nil}},
	}, 0})))
	require.Len(t, b.Events, 1)
	assert.Equal(t, "tenant", b.Events[0].CacheSalt)
	assert.Equal(t, "", b.Events[0].LoRA)
	assert.False(t, b.Events[0].Salted)
}

// TestNewerEventVersion checks a BlockStored of an event_version newer
// than this package knows: its fields may mean what it does not know, so
// its blocks are not indexed, and it is counted, while the rest of its
// batch, a BlockRemoved of the same version included, is applied.
func TestNewerEventVersion(t *testing.T) {
	g := newGroupsRig(t)
	a, b := prompt(1, 2), prompt(100, 2)
	ha, hb := g.h.HashTokens(g.salt, a), g.h.HashTokens(g.salt, b)
	g.send(saltedStored(ha, a, 0, 2, kv{"lora_name", nil}, kv{"event_version", 2}),
		saltedStored(hb, b, 0, 2, kv{"lora_name", nil}, kv{"event_version", 1}))
	assert.Equal(t, 0, g.match(ha))
	assert.Equal(t, 2, g.match(hb))
	st := g.stats()
	assert.Equal(t, int64(1), st.Unknown)
	assert.Equal(t, int64(2), st.Skipped)
	g.send(ordered{{"type", "BlockRemoved"}, {"block_hashes", engineHashes(hb[1:])}, {"event_version", 2}})
	assert.Equal(t, 1, g.match(hb))
	assert.Equal(t, int64(1), g.stats().Unknown)

	// A forwarding subscriber counts it as it forwards its batch.
	sub, err := NewSubscriber(Config{Forward: func(string, int64, []byte) {}})
	require.NoError(t, err)
	w := sub.newWorker("e", Endpoint{PubAddr: "tcp://127.0.0.1:1"})
	w.apply(0, pack(t, []any{1.0, []any{saltedStored(ha, a, 0, 2, kv{"event_version", 3})}, 0}))
	assert.Equal(t, int64(1), w.stats.snapshot().Unknown)
}

// TestSameEngineHashTwoChains checks an engine that reports blocks of
// different router hashes under one engine hash: SGLang leaves the LoRA
// adapter out of its hashes (sgl-project/sglang#39991), so a base model's
// blocks and an adapter's of the same tokens share them. The block first
// stored leaves the index, whose removal could no longer be told apart,
// so no block stays indexed after the engine evicts it.
func TestSameEngineHashTwoChains(t *testing.T) {
	g := newGroupsRig(t)
	toks := prompt(1, 2)
	base := g.h.HashTokens(g.salt, toks)
	adapter := g.h.HashTokens(prefix.Salt{Model: "m", Adapter: "7"}, toks)
	stored := func(loraID any) []any {
		return []any{"BlockStored", engineHashes(base), nil, tokenList(toks), testBlock, loraID, "GPU"}
	}
	g.send(stored(nil))
	assert.Equal(t, 2, g.match(base))
	g.send(stored(7))
	assert.Equal(t, 2, g.match(adapter))
	assert.Equal(t, 0, g.match(base), "a block the index can no longer remove stayed")
	g.send([]any{"BlockRemoved", engineHashes(base), "GPU"})
	assert.Equal(t, 0, g.idx.Len("e"))
}
