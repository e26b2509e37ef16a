package lru

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// checkLRU applies the operations encoded in ops to an LRU and to
// golang-lru's simplelru, the reference it replaces, and fails at the first
// difference: a result, the keys evicted by the operation, or the keys
// held in recency order. Each operation is two bytes: the operation and a
// key (or a capacity); keys come from a small range so that they repeat and
// collide in the table.
func checkLRU(t *testing.T, size int, ops []byte) {
	t.Helper()
	var got, want []uint64
	l := New(size, func(k uint64) { got = append(got, k) })
	ref, err := simplelru.NewLRU(size, func(k uint64, _ int64) { want = append(want, k) })
	if err != nil {
		t.Fatal(err)
	}
	// key maps a byte to one of 128 keys: half of them found to share the
	// low 8 bits of their tag, so they share a home in every table this
	// test builds and make long runs; the other half spread.
	var keys [128]uint64
	for k, n := uint64(1), 0; n < 64; k++ {
		if l.tag(k)&0xff == 0 {
			keys[n] = k
			n++
		}
	}
	for i := 64; i < 128; i++ {
		keys[i] = uint64(i) << 48
	}
	key := func(b byte) uint64 { return keys[b%128] }
	// marks are the keys GetMark marked since they were added or last
	// given a value: a key leaving the list, or Add, unmarks it.
	marks := make(map[uint64]bool)
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%9, ops[i+1]
		k := key(arg)
		got, want = got[:0], want[:0]
		switch op {
		case 0, 1: // Add, twice as often as the others
			l.Add(k, int64(i))
			ref.Add(k, int64(i))
			delete(marks, k)
		case 2:
			// GetMark, for odd args, is Get and marks the key, which
			// the model below follows.
			get := l.Get
			if arg&1 != 0 {
				get = l.GetMark
			}
			e1, ok1 := get(k)
			if ok1 && arg&1 != 0 {
				marks[k] = true
			}
			e2, ok2 := ref.Get(k)
			if e1 != e2 || ok1 != ok2 {
				t.Fatalf("op %d: Get(%x) = %d, %v; simplelru %d, %v", i/2, k, e1, ok1, e2, ok2)
			}
		case 3:
			// Warm reads ahead and changes nothing, which the checks
			// after the operation would see.
			l.Warm(keys[:int(arg)%len(keys)])
			e1, ok1 := l.Peek(k)
			e2, ok2 := ref.Peek(k)
			if e1 != e2 || ok1 != ok2 {
				t.Fatalf("op %d: Peek(%x) = %d, %v; simplelru %d, %v", i/2, k, e1, ok1, e2, ok2)
			}
		case 4:
			l.Remove(k)
			ref.Remove(k)
		case 5:
			if arg%16 == 0 {
				l.Purge()
				ref.Purge()
			}
		case 6:
			n := int(arg%40) + 1
			l.Resize(n)
			ref.Resize(n)
		case 7:
			k1, v1, ok1 := l.Oldest()
			k2, v2, ok2 := ref.GetOldest()
			if k1 != k2 || v1 != v2 || ok1 != ok2 {
				t.Fatalf("op %d: Oldest() = %x, %d, %v; simplelru %x, %d, %v", i/2, k1, v1, ok1, k2, v2, ok2)
			}
			// AppendOldest lists the oldest keys while their values
			// (the indexes of the operations that added them) are at
			// most a bound that falls among them.
			n, maxVal := int(arg%8)+1, int64(i)-int64(arg)*8
			oldest := l.AppendOldest([]uint64{7}, n, maxVal)
			refOldest := []uint64{7}
			for _, k := range ref.Keys() {
				if v, _ := ref.Peek(k); v > maxVal || len(refOldest) > n {
					break
				}
				refOldest = append(refOldest, k)
			}
			if !slices.Equal(oldest, refOldest) {
				t.Fatalf("op %d: AppendOldest(%d, %d) = %x, want %x", i/2, n, maxVal, oldest, refOldest)
			}
		case 8:
			l.RemoveOldest()
			ref.RemoveOldest()
		}
		for _, k := range got {
			delete(marks, k) // evicted or removed
		}
		slices.Sort(got) // Purge evicts in map order
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("op %d (%d, %d): evicted %x, simplelru %x", i/2, op, arg, got, want)
		}
		if k1, k2 := l.Keys(), ref.Keys(); !slices.Equal(k1, k2) {
			t.Fatalf("op %d (%d, %d): keys %x, simplelru %x", i/2, op, arg, k1, k2)
		}
		if l.Len() != ref.Len() {
			t.Fatalf("op %d: Len %d, simplelru %d", i/2, l.Len(), ref.Len())
		}
		for _, k := range ref.Keys() {
			e1, m, _ := l.PeekMarked(k)
			e2, _ := ref.Peek(k)
			if e1 != e2 {
				t.Fatalf("op %d: value of %x = %d, simplelru %d", i/2, k, e1, e2)
			}
			if m != marks[k] {
				t.Fatalf("op %d: key %x marked %v, want %v", i/2, k, m, marks[k])
			}
		}
		if l.n > 0 && 2*l.n > len(l.slots) {
			t.Fatalf("op %d: %d keys in %d slots, want at most half full", i/2, l.n, len(l.slots))
		}
		if len(l.nodes) > max(l.size, l.n)+1 && len(l.nodes) > 64 {
			t.Fatalf("op %d: %d nodes for capacity %d", i/2, len(l.nodes), l.size)
		}
	}
}

// TestLRUMatchesSimpleLRU runs random operations on LRU and on
// simplelru at several capacities.
func TestLRUMatchesSimpleLRU(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, size := range []int{1, 2, 5, 16, 40, 100} {
		for range 20 {
			ops := make([]byte, 4000)
			for i := range ops {
				ops[i] = byte(r.Uint32())
			}
			checkLRU(t, size, ops)
		}
	}
}

// FuzzLRU is TestLRUMatchesSimpleLRU on operations from the
// fuzzer.
func FuzzLRU(f *testing.F) {
	f.Add(uint8(3), []byte{0, 1, 0, 2, 0, 3, 0, 4, 2, 1, 4, 3, 6, 1, 5, 0})
	f.Fuzz(func(t *testing.T, size uint8, ops []byte) {
		checkLRU(t, int(size%64)+1, ops)
	})
}

// TestLRUDeleteShift checks backward-shift deletion on a run of keys
// with one home position that wraps around the end of the table.
func TestLRUDeleteShift(t *testing.T) {
	var evicted []uint64
	l := New(1000, func(k uint64) { evicted = append(evicted, k) })
	l.Add(1, 0) // a table of minLRUSlots slots
	mask := len(l.slots) - 1
	// Keys whose home is the last slot, so their run wraps to slot 0.
	var keys []uint64
	for k := uint64(2); len(keys) < 5; k++ {
		if int(l.tag(k))&mask == mask {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		l.Add(k, int64(k))
	}
	for _, k := range keys[:3] {
		l.Remove(k)
		for _, k2 := range keys {
			_, ok := l.Peek(k2)
			if want := !slices.Contains(evicted, k2); ok != want {
				t.Fatalf("after removing %d: Peek(%d) found %v, want %v", k, k2, ok, want)
			}
		}
	}
	if l.Len() != 3 {
		t.Fatalf("Len %d, want 3", l.Len())
	}
}
