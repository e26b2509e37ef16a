package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestHolderTable compares the table with a Go map under random puts and
// deletes, with keys crowded into few slots so that probe runs wrap and
// backward-shift deletion is exercised.
func TestHolderTable(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, keys := range []int{10, 300, 5000, 100_000} {
		tab := holderTable{seed: r.Uint64()}
		ref := map[uint64]holder{}
		for i := 0; i < 200_000; i++ {
			k := uint64(r.IntN(keys)) * 0x100000001b3
			switch r.IntN(3) {
			case 0, 1:
				hd := holder{bits: r.Uint64() | 1, minExp: r.Int64()}
				tab.put(k, hd)
				ref[k] = hd
			case 2:
				tab.del(k)
				delete(ref, k)
			}
			if i%1000 == 0 || keys == 10 {
				if tab.len() != len(ref) {
					t.Fatalf("keys=%d op %d: len %d, want %d", keys, i, tab.len(), len(ref))
				}
				for rk, want := range ref {
					if got := tab.get(rk); got != want {
						t.Fatalf("keys=%d op %d: get(%x) = %v, want %v", keys, i, rk, got, want)
					}
				}
			}
			if got, want := tab.get(k), ref[k]; got != want {
				t.Fatalf("keys=%d op %d: get(%x) = %v, want %v", keys, i, k, got, want)
			}
		}
		n := 0
		tab.all(func(k uint64, hd holder) {
			n++
			if ref[k] != hd {
				t.Fatalf("all: %x = %v, want %v", k, hd, ref[k])
			}
		})
		if n != len(ref) {
			t.Fatalf("all visited %d, want %d", n, len(ref))
		}
		// Deleting everything shrinks every shard back, through every
		// size, without losing an entry on the way.
		for k, want := range ref {
			if got := tab.get(k); got != want {
				t.Fatalf("keys=%d deleting: get(%x) = %v, want %v", keys, k, got, want)
			}
			tab.del(k)
		}
		for i := range tab.shards {
			if s := &tab.shards[i]; s.n != 0 || len(s.slots) > minShardSlots {
				t.Fatalf("shard %d not shrunk: n %d slots %d", i, s.n, len(s.slots))
			}
		}
	}
}
