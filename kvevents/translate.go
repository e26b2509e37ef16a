package kvevents

import (
	"math/bits"
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
	salt   prefix.Salt // the endpoint's, without Adapter and Namespace
	root   uint64      // hasher.Root(salt), the root of blocks without adapter or cache salt
	// hashes maps engine block hash to what is known of the block for the
	// blocks the endpoint holds, bounded by max; a block whose parent fell
	// out of it is not indexed, and a block that falls out of it leaves the
	// index, whose BlockRemoved could no longer be applied.
	hashes *simplelru.LRU[uint64, block]
	// copies counts the copies of a block a KV-cache group holds beyond
	// its first (see [translator.stored]), at most max entries, each for a
	// block in hashes.
	copies  map[copyKey]uint32
	max     int
	buf     []uint64
	evicted []uint64 // router hashes of the blocks hashes let go
	// groups holds the attention type of each KV-cache group learned from
	// the endpoint's BlockStored events (true for full attention), for the
	// BlockRemoved events, which do not carry it; at most maxGroups.
	groups map[int]bool
	stats  *counters
}

// maxGroups bounds the KV-cache groups a translator learns the type of:
// models have a handful.
const maxGroups = 64

// block is what a translator knows of a block the endpoint holds.
type block struct {
	router uint64 // the router's hash of the block
	// groups has bit g set when full-attention KV-cache group g (below
	// 64) holds a copy of the block.
	groups uint64
	// depth is the block's position in its chain, from 1 for the block
	// after the root: at most the hasher's MaxBlocks, as the router hashes
	// no prompt further.
	depth int
}

// copyKey names a block (by engine hash) in a KV-cache group.
type copyKey struct {
	hash  uint64
	group int
}

// groupBit returns the bit of KV-cache group g in [block].groups, 0 for a
// group beyond them, whose copies are not counted.
func groupBit(g int) uint64 {
	if g < 0 || g >= 64 {
		return 0
	}
	return 1 << g
}

func newTranslator(key string, idx *prefix.Index, h *prefix.Hasher, salt prefix.Salt, maxBlocks int, st *counters) *translator {
	m, _ := simplelru.NewLRU[uint64, block](maxBlocks, nil) // maxBlocks > 0
	salt.Adapter, salt.Namespace = "", ""
	return &translator{key: key, idx: idx, hasher: h, salt: salt, root: h.Root(salt), hashes: m, max: maxBlocks, stats: st}
}

// fullAttention reports whether a KV-cache group of vLLM's
// kv_cache_spec_kind kind (KVCacheSpecKind in
// vllm/v1/kv_cache_interface.py) holds every block of a prompt's prefix,
// as the router's index does: full attention, with MLA or attention
// sinks. Sliding-window and chunked-local groups drop the blocks before
// their window, Mamba groups keep states, not blocks. Dynamo's router
// keeps the same three (ai-dynamo/dynamo#8751: the ZMQ event filter of
// lib/kv-router), as does llm-d's (isPrefixIndexableSpecKind in
// llm-d/llm-d-router pkg/kvevents/pool.go, August 2026).
func fullAttention(kind string) bool {
	switch kind {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// indexed reports whether an event describes blocks the index tracks: in
// the engine's own GPU memory, of a full-attention KV-cache group.
//
// A model mixing attention types (sliding window or Mamba layers with
// full attention) has several KV-cache groups, each storing and evicting
// the prompt's blocks under the same block hashes (vLLM's group_idx);
// only the full-attention ones hold a whole prefix. vLLM tells each
// group's type on its BlockStored events (kv_cache_spec_kind, since
// vllm-project/vllm#40984), not on BlockRemoved: the type of each group
// is learned from the former for the latter. Before that, and for a
// group whose type is not known, only group 0 (or no group, as SGLang
// sends) is indexed, as Dynamo does. Blocks stored by several
// full-attention groups are indexed once, and removed as soon as one of
// the groups evicts them, since the engine then no longer finds them all.
func (t *translator) indexed(e *Event) bool {
	full, known := t.groups[e.Group]
	if e.GroupKind != "" {
		full, known = fullAttention(e.GroupKind), true
		if _, ok := t.groups[e.Group]; ok || len(t.groups) < maxGroups {
			if t.groups == nil {
				t.groups = make(map[int]bool)
			}
			t.groups[e.Group] = full
		}
	}
	if !known {
		full = e.Group == 0
	}
	return full && !e.remote && (e.Medium == "" || strings.EqualFold(e.Medium, "GPU"))
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

// stored indexes the blocks of a BlockStored.
//
// vLLM does not deduplicate cached blocks: two requests that compute the
// same blocks before either is cached (a prompt sent twice at once) each
// cache a copy under the same hash and KV-cache group, a BlockStored for
// each, and each copy's eviction sends a BlockRemoved
// (BlockHashToBlockMap and BlockPool._maybe_evict_cached_block in
// vllm/v1/core/block_pool.py). The blocks stay cached until the last copy
// goes, so the copies of a block are counted per group, and a
// BlockRemoved takes one away; Dynamo's router counts them too
// (ai-dynamo/dynamo#8012, EventDedupFilter). When the count cannot be
// kept (more than max blocks with copies), the first BlockRemoved removes
// the block: a missing block costs a cache hit, a wrong one would send
// requests to the wrong replica.
func (t *translator) stored(e *Event) {
	n := len(e.BlockHashes)
	if !t.indexed(e) || n == 0 {
		return
	}
	if e.Salted || e.newer || e.BlockSize != t.hasher.BlockTokens() || len(e.TokenIDs) != n*e.BlockSize {
		if e.BlockSize != t.hasher.BlockTokens() {
			t.stats.mismatched.Add(int64(n))
		}
		t.stats.skipped.Add(int64(n))
		return
	}
	root, depth := t.root, 0 // depth: the parent's
	if e.HasParent {
		p, ok := t.hashes.Get(e.Parent)
		if !ok {
			t.stats.skipped.Add(int64(n))
			return
		}
		root, depth = p.router, p.depth
	} else if e.LoRA != "" || e.CacheSalt != "" {
		s := t.salt
		s.Adapter, s.Namespace = e.LoRA, e.CacheSalt
		root = t.hasher.Root(s)
	}
	// The router hashes no prompt beyond the hasher's MaxBlocks: blocks
	// deeper in their chain, in this event or continuing an earlier one,
	// are never matched, so they take no room in the map or the index.
	if room := max(t.hasher.MaxBlocks()-depth, 0); room < n {
		t.stats.skipped.Add(int64(n - room))
		if n = room; n == 0 {
			return
		}
	}
	t.buf = t.hasher.AppendTokens(t.buf[:0], root, e.TokenIDs[:n*e.BlockSize])
	t.evicted = t.evicted[:0]
	bit := groupBit(e.Group)
	for i, h := range e.BlockHashes[:n] {
		b, ok := t.hashes.Peek(h)
		switch {
		case ok && b.router != t.buf[i]:
			// The engine stored blocks of one hash under two router
			// hashes: SGLang leaves the LoRA adapter out of its hashes
			// (sgl-project/sglang#39991). Only the last is tracked, so the
			// first leaves the index, whose BlockRemoved could no longer
			// be told apart.
			t.evicted = append(t.evicted, b.router)
			t.forget(h, b)
			b = block{router: t.buf[i], depth: depth + i + 1}
		case ok && b.groups&bit != 0:
			// Another copy in a group that holds one.
			if k := (copyKey{h, e.Group}); t.copies[k] > 0 || len(t.copies) < t.max {
				if t.copies == nil {
					t.copies = make(map[copyKey]uint32)
				}
				t.copies[k]++
			}
		case !ok:
			if t.hashes.Len() >= t.max {
				old, ob, _ := t.hashes.RemoveOldest()
				t.evicted = append(t.evicted, ob.router)
				t.forget(old, ob)
			}
			b = block{router: t.buf[i], depth: depth + i + 1}
		}
		b.groups |= bit
		t.hashes.Add(h, b)
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
	if !t.indexed(e) {
		return
	}
	t.buf = t.buf[:0]
	for _, h := range e.BlockHashes {
		b, ok := t.hashes.Peek(h)
		if !ok {
			continue
		}
		if k := (copyKey{h, e.Group}); t.copies[k] > 0 {
			// The group still holds another copy (see [translator.stored]).
			if t.copies[k]--; t.copies[k] == 0 {
				delete(t.copies, k)
			}
			continue
		}
		t.hashes.Remove(h)
		t.forget(h, b)
		t.buf = append(t.buf, b.router)
	}
	if len(t.buf) > 0 {
		_ = t.idx.Removed(t.key, t.idx.BlockSize(), t.buf...) // the index's own block size
		t.stats.removed.Add(int64(len(t.buf)))
	}
}

// clear forgets every block of the endpoint.
func (t *translator) clear() {
	t.hashes.Purge()
	clear(t.copies)
	clear(t.groups) // a restarted engine may serve another model
	t.idx.Cleared(t.key)
	t.stats.cleared.Add(1)
}

// forget drops the copies counted of block h, b, which leaves hashes.
func (t *translator) forget(h uint64, b block) {
	if len(t.copies) == 0 {
		return
	}
	for gs := b.groups; gs != 0; gs &= gs - 1 {
		delete(t.copies, copyKey{h, bits.TrailingZeros64(gs)})
	}
}
