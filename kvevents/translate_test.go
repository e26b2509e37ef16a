package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

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

	apply(stored(hs, toks, 0, 6))
	assert.Equal(t, 6, idx.MatchLen("e", hs, time.Now()))
	assert.Equal(t, 4, tr.hashes.Len())
	apply(removed(hs[5]))
	assert.Equal(t, 5, idx.MatchLen("e", hs, time.Now()))
	apply(Event{Kind: Cleared})
	assert.Equal(t, 0, idx.Len("e"))
	assert.Equal(t, 0, tr.hashes.Len())
}
