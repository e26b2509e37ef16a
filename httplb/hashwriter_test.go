package httplb

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/llmlb/llmlb/prefix"
	"github.com/stretchr/testify/require"
)

// A text written to a hashWriter in pieces, of bytes and of slices of any
// length, hashes as the whole text does, up to the hasher's MaxBlocks.
func TestHashWriter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	text := []byte(benchText(5000))
	for _, c := range []struct{ blockBytes, maxTokens int }{
		{1, 0}, {7, 0}, {64, 0}, {partBytes, 0}, {64, 16 * 10}, {8, 16},
	} {
		t.Run(fmt.Sprintf("block=%d/max=%d", c.blockBytes, c.maxTokens), func(t *testing.T) {
			h, err := prefix.NewHasher(prefix.HasherConfig{BlockBytes: c.blockBytes, MaxTokens: c.maxTokens})
			require.NoError(t, err)
			root := h.Root(prefix.Salt{Model: "m"})
			for range 50 {
				n := r.IntN(len(text) + 1)
				var w hashWriter
				w.init(h, root, r.IntN(2*n+1))
				for rest := text[:n]; len(rest) > 0; {
					if r.IntN(4) == 0 {
						w.writeByte(rest[0])
						rest = rest[1:]
						continue
					}
					k := min(r.IntN(3*c.blockBytes+2), len(rest))
					w.write(rest[:k])
					rest = rest[k:]
				}
				want := h.AppendBytes(nil, root, text[:n])
				require.True(t, slices.Equal(want, w.hashes) && (want == nil) == (w.hashes == nil),
					"%d bytes: got %d hashes, want %d", n, len(w.hashes), len(want))
			}
		})
	}
}
