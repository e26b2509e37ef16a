package prefix

import "math/bits"

// holderTable maps holder keys to holder entries: an open-addressing hash
// table with linear probing and backward-shift deletion, split into
// tableShards independently sized shards. It replaces a Go map on the
// matching path because a lookup is then a multiply and, usually, a single
// cache line, and growing one shard rehashes only that shard, so no write
// stalls on rehashing the whole index.
//
// A slot whose bits are zero is empty; callers never store an entry with
// zero bits (put with zero bits deletes). The zero holderTable is empty and
// ready to use. It is not safe for concurrent writes; Index.mu guards it.
type holderTable struct {
	seed   uint64 // mixed into every key, so that layouts are unpredictable
	n      int
	shards [tableShards]shard
}

const (
	tableShardBits = 8
	tableShards    = 1 << tableShardBits
	minShardSlots  = 8
)

type shard struct {
	slots []holderSlot // len is 0 or a power of two
	n     int
	shift uint8 // 64 - log2(len(slots)): see home
}

type holderSlot struct {
	key uint64
	holder
}

// spread maps a key to its shard (top bits) and home slot (low bits). The
// multiply-xorshift rounds make every output bit depend on every key bit.
func (t *holderTable) spread(key uint64) uint64 { return spreadKey(t.seed, key) }

// spreadKey is spread for the tables of seed. The tables of an index share
// their seed, so that Index.Match spreads a key once for all of them.
func spreadKey(seed, key uint64) uint64 {
	x := (key ^ seed) * prime2
	x ^= x >> 32
	x *= prime3
	x ^= x >> 29
	return x
}

// home returns the home slot of a spread key in shard s: the bits below
// the shard's, from the top. Taking them from the top keeps the order of
// the homes when a shard doubles (home h becomes 2h or 2h+1), so resize
// writes the new table front to back instead of at random.
func (s *shard) home(x uint64) uint64 {
	return (x << tableShardBits) >> s.shift
}

// get returns the entry for key, or the zero holder.
func (t *holderTable) get(key uint64) holder { return t.lookup(key, t.spread(key)) }

// lookup is get of a key whose spread is x.
func (t *holderTable) lookup(key, x uint64) holder {
	s := &t.shards[x>>(64-tableShardBits)]
	if len(s.slots) == 0 {
		return holder{}
	}
	mask := uint64(len(s.slots) - 1)
	for i := s.home(x); ; i = (i + 1) & mask {
		sl := &s.slots[i]
		if sl.bits == 0 {
			return holder{}
		}
		if sl.key == key {
			return sl.holder
		}
	}
}

// warm reads the home slot of each key, each read independent of the
// others, so that the processor fetches them from memory in parallel; see
// lru.LRU.Warm.
func (t *holderTable) warm(keys []uint64) uint64 {
	var acc uint64
	for _, k := range keys {
		x := spreadKey(t.seed, k)
		s := &t.shards[x>>(64-tableShardBits)]
		if len(s.slots) != 0 {
			acc += s.slots[s.home(x)].key
		}
	}
	return acc
}

// homeKey returns the key in the home slot of the spread key x, or 0: a
// read of the memory a lookup of x starts with, for Index.Match to issue
// ahead as warm does.
func (t *holderTable) homeKey(x uint64) uint64 {
	s := &t.shards[x>>(64-tableShardBits)]
	if len(s.slots) == 0 {
		return 0
	}
	return s.slots[s.home(x)].key
}

// put stores hd under key, deleting key when hd.bits is zero.
func (t *holderTable) put(key uint64, hd holder) {
	if hd.bits == 0 {
		t.del(key)
		return
	}
	x := t.spread(key)
	s := &t.shards[x>>(64-tableShardBits)]
	if (s.n+1)*4 > len(s.slots)*3 { // keep the load at most 3/4
		t.resize(s, max(2*len(s.slots), minShardSlots))
	}
	mask := uint64(len(s.slots) - 1)
	for i := s.home(x); ; i = (i + 1) & mask {
		sl := &s.slots[i]
		if sl.bits == 0 {
			*sl = holderSlot{key, hd}
			s.n++
			t.n++
			return
		}
		if sl.key == key {
			sl.holder = hd
			return
		}
	}
}

// del removes key, shifting later entries of its probe run back so that no
// tombstones are left.
func (t *holderTable) del(key uint64) {
	x := t.spread(key)
	s := &t.shards[x>>(64-tableShardBits)]
	if len(s.slots) == 0 {
		return
	}
	mask := uint64(len(s.slots) - 1)
	i := s.home(x)
	for {
		sl := &s.slots[i]
		if sl.bits == 0 {
			return // absent
		}
		if sl.key == key {
			break
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; s.slots[j].bits != 0; j = (j + 1) & mask {
		home := s.home(t.spread(s.slots[j].key))
		// The entry at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if (j-home)&mask < (j-i)&mask {
			continue
		}
		s.slots[i] = s.slots[j]
		i = j
	}
	s.slots[i] = holderSlot{}
	s.n--
	t.n--
	if len(s.slots) > minShardSlots && s.n*8 < len(s.slots) {
		t.resize(s, len(s.slots)/2)
	}
}

// inPlaceSlots is the largest shard that keeps its memory. Small shards
// are the ones that cross the grow and shrink bounds back and forth: with a
// few entries a shard, the random spread of keys over shards moves some
// shard across them every few records, and allocating on each crossing
// would put the allocator on the matching path of small indexes. Kept, a
// small shard allocates only when it reaches a size it never had; the
// memory kept is at most 1.5 KB a shard, 384 KB a table (an index has one
// per group of 64 endpoints).
const inPlaceSlots = 64

// resize rehashes shard s into size slots. A shard of up to inPlaceSlots
// slots shrinks by reslicing and grows back into the same memory.
func (t *holderTable) resize(s *shard, size int) {
	old := s.slots
	if len(old) <= inPlaceSlots && size <= inPlaceSlots && cap(old) >= size {
		var tmp [inPlaceSlots]holderSlot
		old = tmp[:copy(tmp[:], old)]
		s.slots = s.slots[:size]
		clear(s.slots)
	} else {
		s.slots = make([]holderSlot, size)
	}
	s.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	mask := uint64(size - 1)
	for _, sl := range old {
		if sl.bits == 0 {
			continue
		}
		i := s.home(t.spread(sl.key))
		for s.slots[i].bits != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = sl
	}
}

// len returns the number of entries.
func (t *holderTable) len() int { return t.n }

// all calls f for every entry, in no particular order.
func (t *holderTable) all(f func(key uint64, hd holder)) {
	for i := range t.shards {
		for _, sl := range t.shards[i].slots {
			if sl.bits != 0 {
				f(sl.key, sl.holder)
			}
		}
	}
}
