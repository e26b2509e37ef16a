package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/prefix"
)

// TestTranslator checks the cases a translation refuses: another block
// size, an unknown parent, token IDs that do not fill the blocks; and that
// the engine-to-router map stays within MaxBlocks.
func TestTranslator(t *testing.T) {
	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	var st counters
	tr := newTranslator("e", idx, h, salt, 4, &st)
	toks := prompt(1, 6)
	hs := h.HashTokens(salt, toks)
	apply := func(events ...Event) { tr.apply(&Batch{Events: events}) }

	wrong := stored(hs, toks, 0, 2)
	wrong.BlockSize, wrong.TokenIDs = 2*testBlock, toks[:4*testBlock]
	apply(wrong)
	assert.Equal(t, int64(2), st.mismatched.Load())

	apply(stored(hs, toks, 1, 2)) // parent never stored
	short := stored(hs, toks, 0, 2)
	short.TokenIDs = short.TokenIDs[:testBlock]
	apply(short)
	assert.Equal(t, 0, idx.Len("e"))
	assert.Equal(t, int64(5), st.skipped.Load())

	apply(stored(hs, toks, 0, 4))
	assert.Equal(t, 4, idx.MatchLen("e", hs, time.Now()))
	apply(removed(hs[3]))
	assert.Equal(t, 3, idx.MatchLen("e", hs, time.Now()))
	apply(stored(hs, toks, 3, 6)) // the map lets blocks 0 and 1 go: so does the index
	assert.Equal(t, 4, tr.hashes.Len())
	assert.Equal(t, 4, idx.Len("e"))
	assert.Equal(t, 0, idx.MatchLen("e", hs, time.Now()))
	apply(Event{Kind: Cleared})
	assert.Equal(t, 0, idx.Len("e"))
	assert.Equal(t, 0, tr.hashes.Len())
}

// TestTranslatorForgetsWhatItCannotRemove checks that a block whose engine
// hash falls out of the MaxBlocks map leaves the index too: the engine's
// BlockRemoved for it could no longer be applied, and the index would claim
// a prefix the engine no longer holds.
func TestTranslatorForgetsWhatItCannotRemove(t *testing.T) {
	idx, h := newTestIndex(t)
	salt := prefix.Salt{Model: "m"}
	var st counters
	tr := newTranslator("e", idx, h, salt, 2, &st)
	toks := prompt(1, 3)
	hs := h.HashTokens(salt, toks)
	for i := range 3 {
		tr.apply(&Batch{Events: []Event{stored(hs, toks, i, i+1)}})
	}
	tr.apply(&Batch{Events: []Event{removed(hs[0])}}) // the engine evicts the head
	assert.Equal(t, 0, idx.MatchLen("e", hs, time.Now()), "the engine holds no prefix of the prompt")
	assert.LessOrEqual(t, idx.Len("e"), 2)

	// Within one event too.
	tr.apply(&Batch{Events: []Event{{Kind: Cleared}, stored(hs, toks, 0, 3)}})
	tr.apply(&Batch{Events: []Event{removed(hs[0])}})
	assert.Equal(t, 0, idx.MatchLen("e", hs, time.Now()), "the engine holds no prefix of the prompt")
}

// TestTranslatorCountsBlocksBeyondMaxBlocks checks that the blocks of an
// event beyond the hasher's MaxBlocks, which are not indexed, are counted
// as skipped: every block of a BlockStored is either stored or skipped.
func TestTranslatorCountsBlocksBeyondMaxBlocks(t *testing.T) {
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: testBlock, MaxTokens: 2 * testBlock})
	require.NoError(t, err)
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: testBlock, EventsOnly: true})
	require.NoError(t, err)
	salt := prefix.Salt{Model: "m"}
	var st counters
	tr := newTranslator("e", idx, h, salt, 16, &st)
	toks := prompt(1, 3)
	long, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: testBlock})
	require.NoError(t, err)
	hs := long.HashTokens(salt, toks)
	tr.apply(&Batch{Events: []Event{stored(hs, toks, 0, 3)}})
	assert.Equal(t, 2, idx.Len("e"))
	assert.Equal(t, int64(2), st.stored.Load())
	assert.Equal(t, int64(1), st.skipped.Load(), "the block beyond MaxBlocks")
}

// TestTranslatorLimitsChainDepth checks that blocks deeper in their chain
// than the hasher's MaxBlocks are skipped when they continue a chain
// stored by earlier events, not only within one event: no prompt the router
// hashes reaches them, so they take no room in the map or the index, and
// the blocks stored after them find no parent. A chain from a LoRA
// adapter's or cache salt's root is limited alike.
func TestTranslatorLimitsChainDepth(t *testing.T) {
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: testBlock, MaxTokens: 3 * testBlock})
	require.NoError(t, err)
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: testBlock, EventsOnly: true})
	require.NoError(t, err)
	salt := prefix.Salt{Model: "m"}
	var st counters
	tr := newTranslator("e", idx, h, salt, 16, &st)
	long, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: testBlock})
	require.NoError(t, err)
	toks := prompt(1, 6)
	hs := long.HashTokens(salt, toks)
	apply := func(events ...Event) { tr.apply(&Batch{Events: events}) }

	apply(stored(hs, toks, 0, 2)) // depths 1 and 2
	apply(stored(hs, toks, 2, 4)) // 3, then 4 beyond MaxBlocks
	apply(stored(hs, toks, 4, 5)) // its parent, at depth 4, was skipped
	apply(stored(hs, toks, 5, 6))
	assert.Equal(t, 3, idx.Len("e"))
	assert.Equal(t, 3, tr.hashes.Len())
	assert.Equal(t, int64(3), st.stored.Load())
	assert.Equal(t, int64(3), st.skipped.Load())
	assert.Equal(t, 3, idx.MatchLen("e", h.HashTokens(salt, toks), time.Now()))

	// One block at a time, as a decode extends its sequence.
	apply(Event{Kind: Cleared})
	st = counters{}
	for i := range 6 {
		apply(stored(hs, toks, i, i+1))
	}
	assert.Equal(t, 3, idx.Len("e"))
	assert.Equal(t, int64(3), st.stored.Load())
	assert.Equal(t, int64(3), st.skipped.Load())

	// From the root of a LoRA adapter.
	apply(Event{Kind: Cleared})
	st = counters{}
	ls := salt
	ls.Adapter = "lora"
	lhs := long.HashTokens(ls, toks)
	first := stored(lhs, toks, 0, 3)
	first.LoRA = "lora"
	apply(first, stored(lhs, toks, 3, 4))
	assert.Equal(t, 3, idx.Len("e"))
	assert.Equal(t, int64(1), st.skipped.Load())
	assert.Equal(t, 3, idx.MatchLen("e", h.HashTokens(ls, toks), time.Now()))
}
