package httplb

import (
	"slices"

	"github.com/llmlb/llmlb/prefix"
)

// A hashWriter computes the byte-mode prefix hashes of a text as it is
// written, without keeping the text: full blocks are hashed where they lie,
// in the body, and only a partial block is copied, into part, until it
// fills. The hashes equal those of the whole text, as [prefix.Hasher]
// continues a chain from its last hash. It handles blocks of up to
// partBytes bytes.
type hashWriter struct {
	h      *prefix.Hasher
	last   uint64   // the last hash, or the root
	hashes []uint64 // nil until the first full block
	max    int      // the hasher's MaxBlocks
	bb     int      // the hasher's BlockBytes
	size   int      // the expected number of blocks, to size hashes
	n      int      // bytes in part
	part   [partBytes]byte
}

// partBytes is the largest block a hashWriter handles.
const partBytes = 512

// init starts w on the chain from root, for a text of about size bytes.
// The block size of h must be at most partBytes.
func (w *hashWriter) init(h *prefix.Hasher, root uint64, size int) {
	w.h, w.last, w.max, w.bb = h, root, h.MaxBlocks(), h.BlockBytes()
	w.size = size/w.bb + 1
}

func (w *hashWriter) write(p []byte) {
	if len(w.hashes) == w.max {
		return // beyond the hashed head
	}
	if w.n > 0 {
		c := copy(w.part[w.n:w.bb], p)
		w.n += c
		p = p[c:]
		if w.n < w.bb {
			return
		}
		w.hash(w.part[:w.bb])
		w.n = 0
	}
	full := len(p) - len(p)%w.bb
	w.hash(p[:full])
	w.n = copy(w.part[:w.bb], p[full:])
}

func (w *hashWriter) writeByte(c byte) {
	if len(w.hashes) == w.max {
		return
	}
	w.part[w.n] = c
	if w.n++; w.n == w.bb {
		w.hash(w.part[:w.bb])
		w.n = 0
	}
}

// hash hashes the full blocks of b, up to the hashed head.
func (w *hashWriter) hash(b []byte) {
	b = b[:min(len(b), (w.max-len(w.hashes))*w.bb)]
	if len(b) < w.bb {
		return
	}
	if w.hashes == nil {
		w.hashes = make([]uint64, 0, min(max(w.size, len(b)/w.bb), w.max))
	}
	w.hashes = slices.Grow(w.hashes, len(b)/w.bb)
	w.hashes = w.h.AppendBytes(w.hashes, w.last, b)
	w.last = w.hashes[len(w.hashes)-1]
}
