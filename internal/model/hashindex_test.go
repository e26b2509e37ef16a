package model

import (
	"math/rand/v2"
	"testing"
)

// TestHashIndexMatchesMap runs random puts, deletes and gets on a hashIndex
// and a map side by side. Hashes are drawn from a small set, so that probe
// runs grow long, wrap around the table's end and are cut by deletions.
func TestHashIndexMatchesMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 0))
		var ix hashIndex
		ref := map[uint64]int32{}
		keys := make([]uint64, 1+rng.IntN(300))
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		keys[0] = 0 // the zero hash is a hash like any other
		for op := range 20000 {
			h := keys[rng.IntN(len(keys))]
			switch rng.IntN(3) {
			case 0:
				v := 1 + rng.Int32N(1000)
				ix.put(h, v)
				ref[h] = v
			case 1:
				ix.del(h)
				delete(ref, h)
			}
			if got, want := ix.get(h), ref[h]; got != want {
				t.Fatalf("seed %d op %d: get(%x) = %d, want %d", seed, op, h, got, want)
			}
			if ix.n != len(ref) {
				t.Fatalf("seed %d op %d: %d entries, want %d", seed, op, ix.n, len(ref))
			}
		}
		for _, h := range keys {
			if got, want := ix.get(h), ref[h]; got != want {
				t.Fatalf("seed %d: get(%x) = %d at the end, want %d", seed, h, got, want)
			}
		}
		seen := map[uint64]bool{}
		ix.all(func(h uint64) bool {
			if _, ok := ref[h]; !ok || seen[h] {
				t.Fatalf("seed %d: all yields %x, not held once", seed, h)
			}
			seen[h] = true
			return true
		})
		if len(seen) != len(ref) {
			t.Fatalf("seed %d: all yields %d hashes, want %d", seed, len(seen), len(ref))
		}
	}
}

// TestHashIndexLoad checks that the table stays at most three quarters full.
func TestHashIndexLoad(t *testing.T) {
	var ix hashIndex
	for i := range 10000 {
		ix.put(uint64(i)*0x10001, int32(i+1))
		if ix.n*4 > len(ix.slots)*3 {
			t.Fatalf("%d entries in %d slots", ix.n, len(ix.slots))
		}
	}
	if len(ix.slots) != 16384 {
		t.Errorf("10,000 entries in %d slots, want 16384", len(ix.slots))
	}
}
