package kvevents

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/llmlb/llmlb/prefix"
)

// TestDuplicateCopies follows vLLM's prefix cache holding two physical
// copies of the same blocks: it does not deduplicate cached blocks
// (BlockHashToBlockMap in vllm/v1/core/block_pool.py, NOTE #1), so two
// requests of one prompt prefilled in the same step each cache the
// prompt's blocks under the same hashes, and each BlockStored, then each
// eviction's BlockRemoved, names them. The blocks stay cached, and
// indexed, until the last copy is evicted; a request that extends the
// prompt meanwhile chains its blocks from them.
func TestDuplicateCopies(t *testing.T) {
	g := newGroupsRig(t)
	toks := prompt(1, 4)
	hs := g.h.HashTokens(g.salt, toks)
	g.send(groupStored(hs[:3], toks[:3*testBlock], 0, "full_attention"),
		groupStored(hs[:3], toks[:3*testBlock], 0, "full_attention"))
	assert.Equal(t, 3, g.match(hs))

	// The first copy is evicted, last block first, as vLLM frees a
	// request's blocks.
	g.send(groupRemoved(0, hs[2]), groupRemoved(0, hs[1]), groupRemoved(0, hs[0]))
	assert.Equal(t, 3, g.match(hs), "the second copy is still cached")

	// A third request hits the cached blocks and caches one more.
	next := groupStored(hs[3:4], toks[3*testBlock:], 0, "full_attention")
	next[2] = kv{"parent_block_hash", engineHash(hs[2])}
	g.send(next)
	assert.Equal(t, 4, g.match(hs), "chained from the blocks still cached")
	assert.Equal(t, int64(0), g.stats().Skipped)

	// The last copy goes.
	g.send(groupRemoved(0, hs[3]), groupRemoved(0, hs[2]), groupRemoved(0, hs[1], hs[0]))
	assert.Equal(t, 0, g.match(hs))
	assert.Equal(t, 0, g.idx.Len("e"))

	// Copies counted before a clear do not outlive it.
	g.send(groupStored(hs[:2], toks[:2*testBlock], 0, "full_attention"),
		groupStored(hs[:2], toks[:2*testBlock], 0, "full_attention"))
	g.send(ordered{{"type", "AllBlocksCleared"}})
	g.send(groupStored(hs[:2], toks[:2*testBlock], 0, "full_attention"))
	g.send(groupRemoved(0, hs[0]))
	assert.Equal(t, 0, g.match(hs))
}

// TestDuplicateCopiesPerGroup checks that copies are counted per KV-cache
// group, as vLLM caches them (by block hash and group): a second
// full-attention group storing a block is not a second copy, and its
// eviction there still makes the block unusable however many copies the
// other group holds.
func TestDuplicateCopiesPerGroup(t *testing.T) {
	g := newGroupsRig(t)
	toks := prompt(1, 2)
	hs := g.h.HashTokens(g.salt, toks)
	g.send(groupStored(hs, toks, 0, "full_attention"), groupStored(hs, toks, 0, "full_attention"),
		groupStored(hs, toks, 1, "full_attention"))
	g.send(groupRemoved(0, hs[1]))
	assert.Equal(t, 2, g.match(hs), "group 0 holds another copy")
	g.send(groupRemoved(1, hs[1]))
	assert.Equal(t, 1, g.match(hs), "group 1 holds none")
}

// TestDuplicateCopiesBounded checks that the copies counted stay within
// MaxBlocks entries, each for a block the translator still maps: past
// that, a block's first BlockRemoved removes it, as without counting.
func TestDuplicateCopiesBounded(t *testing.T) {
	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	var st counters
	tr := newTranslator("e", idx, h, salt, 2, &st)
	toks := prompt(1, 3)
	hs := h.HashTokens(salt, toks)
	for range 3 {
		tr.apply(&Batch{Events: []Event{stored(hs, toks, 0, 2)}})
	}
	assert.Equal(t, 2, len(tr.copies))
	assert.Equal(t, uint32(2), tr.copies[copyKey{engineHash(hs[0]), 0}])
	tr.apply(&Batch{Events: []Event{stored(hs, toks, 2, 3)}}) // the map lets block 0 go
	assert.Equal(t, 1, len(tr.copies))
	assert.Equal(t, 2, tr.hashes.Len())
	for range 3 {
		tr.apply(&Batch{Events: []Event{removed(hs[1])}})
	}
	assert.Equal(t, 0, len(tr.copies))
	assert.Equal(t, 1, tr.hashes.Len())
	tr.apply(&Batch{Events: []Event{stored(hs, toks, 2, 3), {Kind: Cleared}}})
	assert.Equal(t, 0, len(tr.copies))
}
