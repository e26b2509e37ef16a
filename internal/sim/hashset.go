package sim

// hashSet is a set of chained block hashes, such as [InfiniteCacheHitRate]
// keeps of every block a workload names: an open-addressing table with
// linear probing, one 8-byte slot per hash, a slot holding 0 being empty
// and the hash 0 kept apart. A large workload names tens of millions of
// blocks, far more than the processor's caches hold, so a caller reads the
// slots of a batch of hashes first (warm), so that their cache misses
// overlap, before adding them one by one. The zero hashSet is empty.
type hashSet struct {
	slots  []uint64 // len is 0 or a power of two
	n      int      // the hashes in slots
	zero   bool     // the set holds 0
	warmed uint64   // keeps the reads of warm
}

// setHome returns the slot where h's probe starts, for a table of mask+1
// slots; the multiply spreads runs of similar hashes.
func setHome(h, mask uint64) uint64 {
	h *= 0x9e3779b97f4a7c15
	return (h ^ h>>32) & mask
}

// warm reads the home slot of each of hs, each read independent of the
// others, so that the processor fetches them from memory in parallel
// before the adds of the same hashes.
func (s *hashSet) warm(hs []uint64) {
	if len(s.slots) == 0 {
		return
	}
	mask := uint64(len(s.slots) - 1)
	var acc uint64
	for _, h := range hs {
		acc += s.slots[setHome(h, mask)]
	}
	s.warmed += acc
}

// add adds h to the set and reports whether it was not there.
func (s *hashSet) add(h uint64) bool {
	if h == 0 {
		added := !s.zero
		s.zero = true
		return added
	}
	if (s.n+1)*4 > len(s.slots)*3 {
		s.grow()
	}
	mask := uint64(len(s.slots) - 1)
	for i := setHome(h, mask); ; i = (i + 1) & mask {
		switch s.slots[i] {
		case 0:
			s.slots[i] = h
			s.n++
			return true
		case h:
			return false
		}
	}
}

// grow doubles the table (to 1024 slots at first) and reinserts every
// hash.
func (s *hashSet) grow() {
	old := s.slots
	s.slots = make([]uint64, max(1024, 2*len(old)))
	s.n = 0
	for _, h := range old {
		if h != 0 {
			s.add(h)
		}
	}
}
