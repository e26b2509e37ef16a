package sim

import (
	"math/rand/v2"
	"testing"
)

// TestHashSet adds random hashes, 0 among them and many added twice, to a
// hashSet as it grows, and checks each add against a map.
func TestHashSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s hashSet
	want := map[uint64]bool{}
	for i := range 20000 {
		h := rng.Uint64N(8000) // small values: many repeats
		switch i % 3 {
		case 1:
			h = rng.Uint64() // spread over the whole range
		case 2:
			h <<= 40 // differ only in high bits
		}
		s.warm([]uint64{h})
		if got := s.add(h); got != !want[h] {
			t.Fatalf("add %d (%d hashes added): %v, want %v", h, len(want), got, !want[h])
		}
		want[h] = true
	}
	if !want[0] {
		t.Fatal("the test never added 0")
	}
	if s.n+1 != len(want) || s.n*4 > len(s.slots)*3 {
		t.Fatalf("%d hashes in %d slots, plus 0: %v; want %d, the slots at most three quarters full", s.n, len(s.slots), s.zero, len(want))
	}
}
