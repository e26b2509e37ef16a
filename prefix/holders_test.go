package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestHolderTable compares the table with a Go map under random puts,
// clears and deletes, with keys crowded into few slots so that probe runs
// wrap and backward-shift deletion is exercised, and each key held in
// several groups, whose entries share its probe run.
func TestHolderTable(t *testing.T) {
	type gk struct {
		key uint64
		w   int
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, keys := range []int{10, 300, 5000, 100_000} {
		tab := holderTable{seed: r.Uint64()}
		ref := map[gk]holder{}
		for i := 0; i < 200_000; i++ {
			k := gk{uint64(r.IntN(keys)) * 0x100000001b3, r.IntN(maxGroups)}
			if r.IntN(2) == 0 {
				k.w = r.IntN(3) // a few groups often, so that a key's entries share its run
			}
			switch r.IntN(4) {
			case 0, 1:
				hd := holder{bits: r.Uint64() | 1, minExp: r.Int64()}
				tab.put(k.key, k.w, hd)
				// The table keeps minExp rounded down to a multiple of 64.
				hd.minExp &^= groupMask
				ref[k] = hd
			case 2:
				set := r.Uint64()
				tab.clear(k.key, k.w, set)
				if hd, ok := ref[k]; ok {
					if hd.bits &^= set; hd.bits == 0 {
						delete(ref, k)
					} else {
						ref[k] = hd
					}
				}
			case 3:
				tab.del(k.key, k.w)
				delete(ref, k)
			}
			if i%1000 == 0 || keys == 10 {
				if tab.len() != len(ref) {
					t.Fatalf("keys=%d op %d: len %d, want %d", keys, i, tab.len(), len(ref))
				}
				for rk, want := range ref {
					if got := tab.get(rk.key, rk.w); got != want {
						t.Fatalf("keys=%d op %d: get(%x, %d) = %v, want %v", keys, i, rk.key, rk.w, got, want)
					}
				}
			}
			if got, want := tab.get(k.key, k.w), ref[k]; got != want {
				t.Fatalf("keys=%d op %d: get(%x, %d) = %v, want %v", keys, i, k.key, k.w, got, want)
			}
		}
		n := 0
		tab.all(func(k uint64, w int, hd holder) {
			n++
			if ref[gk{k, w}] != hd {
				t.Fatalf("all: %x, %d = %v, want %v", k, w, hd, ref[gk{k, w}])
			}
		})
		if n != len(ref) {
			t.Fatalf("all visited %d, want %d", n, len(ref))
		}
		// Deleting everything shrinks every shard back, through every
		// size, without losing an entry on the way.
		for k, want := range ref {
			if got := tab.get(k.key, k.w); got != want {
				t.Fatalf("keys=%d deleting: get(%x, %d) = %v, want %v", keys, k.key, k.w, got, want)
			}
			tab.del(k.key, k.w)
		}
		for i := range tab.shards {
			if s := &tab.shards[i]; s.n != 0 || len(s.slots) > minShardSlots {
				t.Fatalf("shard %d not shrunk: n %d slots %d", i, s.n, len(s.slots))
			}
		}
	}
}
