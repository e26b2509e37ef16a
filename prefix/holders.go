package prefix

import "math/bits"

// holderTable maps (block hash, group) pairs to holder entries: an
// open-addressing hash table with linear probing and backward-shift
// deletion, split into tableShards independently sized shards. It replaces
// a Go map on the matching path because a lookup is then a multiply and,
// usually, a single cache line, and growing one shard rehashes only that
// shard, so no write stalls on rehashing the whole index.
//
// An entry's home slot depends on its block hash alone, not on its group,
// so the entries of one block in every group of 64 endpoints lie in one
// probe run: Index.Match reads the cache line or two where it starts once
// for every group, instead of a table of each group. Entries are told
// apart by the full hash and the group, so no caller-chosen hash can reach
// another block's or another group's entry.
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

// groupBits is the number of low bits of a slot's meta that hold its
// group: enough for every group of the largest index.
const groupBits = 6

// groupMask selects the group bits of a slot's meta.
const groupMask = 1<<groupBits - 1

// The groups of the largest index fit in groupBits (a negative constant
// does not convert to uint).
const _ = uint(1<<groupBits - maxGroups)

type shard struct {
	slots []holderSlot // len is 0 or a power of two
	n     int
	shift uint8 // 64 - log2(len(slots)): see home
}

// holderSlot is one entry of a holderTable, 24 bytes.
type holderSlot struct {
	key  uint64
	bits uint64 // holder.bits; 0 when the slot is empty
	// meta is the entry's group in its low groupBits bits and the
	// holder's minExp, rounded down to a multiple of 1<<groupBits
	// nanoseconds, above them. Rounded down, minExp is still at most every
	// holder's expiry, which is all that the index asks of it: a block
	// whose minExp is up to 63 ns too early has its holders' own expiries
	// checked, and the result is the same.
	meta int64
}

// makeSlot returns the slot of the entry hd of block key in group w.
func makeSlot(key uint64, w int, hd holder) holderSlot {
	return holderSlot{key: key, bits: hd.bits, meta: hd.minExp&^groupMask | int64(w)}
}

// group returns the group of the slot's entry.
func (sl *holderSlot) group() int { return int(sl.meta & groupMask) }

// minExp returns the slot's minExp, rounded down (see meta).
func (sl *holderSlot) minExp() int64 { return sl.meta &^ groupMask }

// holder returns the slot's entry.
func (sl *holderSlot) holder() holder { return holder{bits: sl.bits, minExp: sl.minExp()} }

// spread maps a key to its shard (top bits) and home slot (low bits). The
// multiply-xorshift rounds make every output bit depend on every key bit.
func (t *holderTable) spread(key uint64) uint64 { return spreadKey(t.seed, key) }

// spreadKey is spread for the table of seed.
func spreadKey(seed, key uint64) uint64 {
	x := (key ^ seed) * prime2
	x ^= x >> 32
	x *= prime3
	x ^= x >> 29
	return x
}

// shard returns the shard of the spread key x.
func (t *holderTable) shard(x uint64) *shard { return &t.shards[x>>(64-tableShardBits)] }

// home returns the home slot of a spread key in shard s: the bits below
// the shard's, from the top. Taking them from the top keeps the order of
// the homes when a shard doubles (home h becomes 2h or 2h+1), so resize
// writes the new table front to back instead of at random.
func (s *shard) home(x uint64) uint64 {
	return (x << tableShardBits) >> s.shift
}

// find returns the position in shard s of the entry of key in group w,
// whose spread is x, and true; or, if there is none, the empty slot that
// ends its probe run and false. s must have slots.
func (s *shard) find(key uint64, w int, x uint64) (uint64, bool) {
	mask := uint64(len(s.slots) - 1)
	for i := s.home(x); ; i = (i + 1) & mask {
		sl := &s.slots[i]
		if sl.bits == 0 {
			return i, false
		}
		if sl.key == key && sl.group() == w {
			return i, true
		}
	}
}

// get returns the entry of key in group w, or the zero holder.
func (t *holderTable) get(key uint64, w int) holder {
	return t.lookup(key, t.spread(key), w).holder()
}

// noSlot is the empty slot that lookup returns from an empty shard. It is
// never written.
var noSlot holderSlot

// lookup returns the slot of the entry of key, whose spread is x, in group
// w, or an empty slot (all zero: the zero holder) if there is none. It is
// find written out small enough to be inlined into Index.Match's walks.
func (t *holderTable) lookup(key, x uint64, w int) *holderSlot {
	s := &t.shards[x>>(64-tableShardBits)]
	if len(s.slots) == 0 {
		return &noSlot
	}
	mask := uint64(len(s.slots) - 1)
	for i := s.home(x); ; i = (i + 1) & mask {
		if sl := &s.slots[i]; sl.bits == 0 || sl.key == key && sl.meta&groupMask == int64(w) {
			return sl
		}
	}
}

// warm reads the memory a lookup of each key starts with (see homeKey),
// each key's reads independent of the others', so that the processor
// fetches them from memory in parallel; see lru.LRU.Warm. It returns a
// value computed from the reads, for the caller to keep.
func (t *holderTable) warm(keys []uint64) uint64 {
	var acc uint64
	for _, k := range keys {
		acc += t.homeKey(spreadKey(t.seed, k))
	}
	return acc
}

// homeKey returns a value computed from the home slot of the spread key x
// and the slot two after it, or 0 if its shard is empty. The two reads are
// 64 bytes apart, so they fetch the home slot's cache line and the next
// one, where a lookup finds its entry, or the empty slot that ends its
// probe run, when it is not in the first.
func (t *holderTable) homeKey(x uint64) uint64 {
	s := t.shard(x)
	if len(s.slots) == 0 {
		return 0
	}
	i := s.home(x)
	return s.slots[i].key + uint64(s.slots[(i+2)&uint64(len(s.slots)-1)].meta)
}

// put stores hd as the entry of key in group w, deleting it when hd.bits
// is zero.
func (t *holderTable) put(key uint64, w int, hd holder) {
	if hd.bits == 0 {
		t.del(key, w)
		return
	}
	x := t.spread(key)
	s := t.shard(x)
	if (s.n+1)*4 > len(s.slots)*3 { // keep the load at most 3/4
		t.resize(s, max(2*len(s.slots), minShardSlots))
	}
	i, ok := s.find(key, w, x)
	s.slots[i] = makeSlot(key, w, hd)
	if !ok {
		s.n++
		t.n++
	}
}

// del removes the entry of key in group w.
func (t *holderTable) del(key uint64, w int) { t.clear(key, w, ^uint64(0)) }

// clear removes the endpoints of set from the entry of key in group w,
// deleting the entry when no holder is left.
func (t *holderTable) clear(key uint64, w int, set uint64) {
	x := t.spread(key)
	s := t.shard(x)
	if len(s.slots) == 0 {
		return
	}
	i, ok := s.find(key, w, x)
	if !ok {
		return
	}
	if sl := &s.slots[i]; sl.bits&^set != 0 {
		sl.bits &^= set
		return
	}
	// Shift later entries of the probe run back into the hole, so that no
	// tombstones are left.
	mask := uint64(len(s.slots) - 1)
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
// memory kept is at most 1.5 KB a shard, 384 KB a table.
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
func (t *holderTable) all(f func(key uint64, w int, hd holder)) {
	for i := range t.shards {
		for _, sl := range t.shards[i].slots {
			if sl.bits != 0 {
				f(sl.key, sl.group(), sl.holder())
			}
		}
	}
}
