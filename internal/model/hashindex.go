package model

// hashIndex maps the chained hash of a cached block to its entry in a
// kvPool: an open-addressing table with linear probing, holding no
// pointers. Entry 0 is the pool's sentinel, never a cached block, so a slot
// whose entry is 0 is empty. Deletion shifts the following slots of the
// probe run back, so no tombstones accumulate however many blocks are
// evicted. The zero hashIndex is empty.
type hashIndex struct {
	slots []hashSlot // len is 0 or a power of two
	n     int
}

type hashSlot struct {
	hash uint64
	ent  int32
}

// home returns the slot where h's probe starts, for a table of mask+1
// slots. The hashes are the chained hashes of prompt blocks, but the
// multiply keeps a run of similar ones from clustering all the same.
func home(h, mask uint64) uint64 {
	h *= 0x9e3779b97f4a7c15
	return (h ^ h>>32) & mask
}

// warm reads the home slot of each of hs, each read independent of the
// others, so that the processor fetches them from memory in parallel
// before gets of the same hashes; it returns a value of the reads for the
// caller to keep.
func (t *hashIndex) warm(hs []uint64) uint64 {
	if len(t.slots) == 0 {
		return 0
	}
	mask := uint64(len(t.slots) - 1)
	var acc uint64
	for _, h := range hs {
		acc += t.slots[home(h, mask)].hash
	}
	return acc
}

// warmOne is warm for one hash.
func (t *hashIndex) warmOne(h uint64) uint64 {
	if len(t.slots) == 0 {
		return 0
	}
	return t.slots[home(h, uint64(len(t.slots)-1))].hash
}

// get returns the entry of h, or 0.
func (t *hashIndex) get(h uint64) int32 {
	if len(t.slots) == 0 {
		return 0
	}
	mask := uint64(len(t.slots) - 1)
	for i := home(h, mask); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ent == 0 {
			return 0
		}
		if s.hash == h {
			return s.ent
		}
	}
}

// put sets the entry of h to ent, which is not 0.
func (t *hashIndex) put(h uint64, ent int32) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	for i := home(h, mask); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ent == 0 {
			*s = hashSlot{hash: h, ent: ent}
			t.n++
			return
		}
		if s.hash == h {
			s.ent = ent
			return
		}
	}
}

// del removes h, if present.
func (t *hashIndex) del(h uint64) {
	if len(t.slots) == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	i := home(h, mask)
	for {
		s := &t.slots[i]
		if s.ent == 0 {
			return
		}
		if s.hash == h {
			break
		}
		i = (i + 1) & mask
	}
	// Move back every later slot of the run whose home is not in the
	// cyclic range (i, j]: its probe passed through i.
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &t.slots[j]
		if s.ent == 0 {
			break
		}
		if k := home(s.hash, mask); (j-k)&mask >= (j-i)&mask {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = hashSlot{}
	t.n--
}

// grow doubles the table (to 16 slots at first) and reinserts every entry.
func (t *hashIndex) grow() {
	old := t.slots
	t.slots = make([]hashSlot, max(16, 2*len(old)))
	t.n = 0
	for _, s := range old {
		if s.ent != 0 {
			t.put(s.hash, s.ent)
		}
	}
}

// all calls yield with every hash held, in slot order, until it returns
// false.
func (t *hashIndex) all(yield func(uint64) bool) {
	for _, s := range t.slots {
		if s.ent != 0 && !yield(s.hash) {
			return
		}
	}
}
