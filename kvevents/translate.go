package kvevents

import (
	"strings"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/llmlb/llmlb/prefix"
)

// translator applies one endpoint's events to the index, translating the
// engine's block hashes into the router's chained hashes. It is owned by
// one goroutine.
type translator struct {
	key    string
	idx    *prefix.Index
	hasher *prefix.Hasher
	salt   prefix.Salt
	root   uint64 // hasher.Root(salt), the root of blocks without adapter
	// hashes maps engine block hash to router block hash for the blocks
	// the endpoint holds, bounded by max; a block whose parent fell out of
	// it is not indexed, and a block that falls out of it leaves the
	// index, whose BlockRemoved could no longer be applied.
	hashes  *simplelru.LRU[uint64, uint64]
	max     int
	buf     []uint64
	evicted []uint64 // router hashes of the blocks hashes let go
	stats   *counters
}

func newTranslator(key string, idx *prefix.Index, h *prefix.Hasher, salt prefix.Salt, maxBlocks int, st *counters) *translator {
	m, _ := simplelru.NewLRU[uint64, uint64](maxBlocks, nil) // maxBlocks > 0
	return &translator{key: key, idx: idx, hasher: h, salt: salt, root: h.Root(salt), hashes: m, max: maxBlocks, stats: st}
}

// indexed reports whether events about medium, group and locality describe
// the blocks the index tracks: the engine's own GPU memory, of the first
// KV-cache group.
func indexed(e *Event) bool {
	return e.Group == 0 && !e.remote && (e.Medium == "" || strings.EqualFold(e.Medium, "GPU"))
}

// apply applies the events of b in order.
func (t *translator) apply(b *Batch) {
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case Stored:
			t.stored(e)
		case Removed:
			t.removed(e)
		case Cleared:
			t.clear()
		}
	}
	t.stats.unknown.Add(int64(b.unknown))
	t.stats.batches.Add(1)
}

func (t *translator) stored(e *Event) {
	n := len(e.BlockHashes)
	if n == 0 || !indexed(e) {
		return
	}
	if e.Salted || e.BlockSize != t.hasher.BlockTokens() || len(e.TokenIDs) != n*e.BlockSize {
		if e.BlockSize != t.hasher.BlockTokens() {
			t.stats.mismatched.Add(int64(n))
		}
		t.stats.skipped.Add(int64(n))
		return
	}
	root := t.root
	if e.HasParent {
		r, ok := t.hashes.Get(e.Parent)
		if !ok {
			t.stats.skipped.Add(int64(n))
			return
		}
		root = r
	} else if e.LoRA != t.salt.Adapter {
		s := t.salt
		s.Adapter = e.LoRA
		root = t.hasher.Root(s)
	}
	t.buf = t.hasher.AppendTokens(t.buf[:0], root, e.TokenIDs)
	// The hasher caps a chain continued from root at its MaxBlocks; blocks
	// beyond that are never matched, so they need no index entry.
	n = min(n, len(t.buf))
	t.evicted = t.evicted[:0]
	for i, h := range e.BlockHashes[:n] {
		if t.hashes.Len() >= t.max && !t.hashes.Contains(h) {
			_, r, _ := t.hashes.RemoveOldest()
			t.evicted = append(t.evicted, r)
		}
		t.hashes.Add(h, t.buf[i])
	}
	err := t.idx.Stored(t.key, e.BlockSize, t.buf[:n]...)
	if len(t.evicted) > 0 {
		// After storing: the event's own first blocks may be among them.
		_ = t.idx.Removed(t.key, t.idx.BlockSize(), t.evicted...)
		t.stats.removed.Add(int64(len(t.evicted)))
	}
	if err != nil {
		t.stats.skipped.Add(int64(n))
		return
	}
	t.stats.stored.Add(int64(n))
}

func (t *translator) removed(e *Event) {
	if !indexed(e) {
		return
	}
	t.buf = t.buf[:0]
	for _, h := range e.BlockHashes {
		if r, ok := t.hashes.Peek(h); ok {
			t.hashes.Remove(h)
			t.buf = append(t.buf, r)
		}
	}
	if len(t.buf) > 0 {
		_ = t.idx.Removed(t.key, t.idx.BlockSize(), t.buf...) // the index's own block size
		t.stats.removed.Add(int64(len(t.buf)))
	}
}

// clear forgets every block of the endpoint.
func (t *translator) clear() {
	t.hashes.Purge()
	t.idx.Cleared(t.key)
	t.stats.cleared.Add(1)
}
