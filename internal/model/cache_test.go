package model

import (
	"slices"
	"testing"
)

func TestKVPoolLRU(t *testing.T) {
	p := newKVPool(10)
	// A sequence allocates private blocks, then publishes them as entries.
	if !p.alloc(4) {
		t.Fatal("alloc 4 of 10 failed")
	}
	a := p.insert(1, 4)
	if !p.alloc(4) {
		t.Fatal("alloc 4 of 6 failed")
	}
	b := p.insert(2, 4)
	if p.used != 8 {
		t.Fatalf("used %d, want 8", p.used)
	}
	p.unref(a)
	p.unref(b)
	if p.evictable != 8 || p.used != 0 {
		t.Fatalf("evictable %d used %d, want 8 0", p.evictable, p.used)
	}
	// Allocating 6 must evict the oldest entry (a) only.
	if !p.alloc(6) {
		t.Fatal("alloc 6 with 2 free and 8 evictable failed")
	}
	if p.lookup(1) != 0 || p.lookup(2) == 0 {
		t.Errorf("entries after eviction: 1=%v 2=%v, want 1 evicted, 2 kept", p.lookup(1), p.lookup(2))
	}
	p.acquire(p.lookup(2))
	if p.alloc(1) {
		t.Error("alloc beyond capacity succeeded")
	}
	if p.used != 10 || p.evictable != 0 {
		t.Errorf("used %d evictable %d, want 10 0", p.used, p.evictable)
	}
}

// TestKVPoolEvictSeveral checks that an allocation evicting several entries
// evicts the least recently used first, as many as it needs and no more,
// reports them in that order, and that the entry evicted last is reused
// first.
func TestKVPoolEvictSeveral(t *testing.T) {
	p := newKVPool(10)
	var removed []uint64
	p.onEvent = func(h uint64, stored bool) {
		if !stored {
			removed = append(removed, h)
		}
	}
	var ents []int32
	for h := uint64(1); h <= 5; h++ {
		if !p.alloc(2) {
			t.Fatalf("alloc 2 for entry %d failed", h)
		}
		ents = append(ents, p.insert(h, 2))
	}
	for _, i := range []int{1, 0, 2, 3, 4} { // 2 is the least recently used
		p.unref(ents[i])
	}
	if !p.alloc(5) {
		t.Fatal("alloc 5 with 10 evictable failed")
	}
	if want := []uint64{2, 1, 3}; !slices.Equal(removed, want) {
		t.Errorf("evicted %v, want %v", removed, want)
	}
	if p.used != 5 || p.evictable != 4 {
		t.Errorf("used %d evictable %d, want 5 4", p.used, p.evictable)
	}
	for h, want := range map[uint64]bool{1: false, 2: false, 3: false, 4: true, 5: true} {
		if got := p.lookup(h) != 0; got != want {
			t.Errorf("entry %d cached: %v, want %v", h, got, want)
		}
	}
	if got := p.insert(6, 2); got != ents[2] {
		t.Errorf("insert reused entry %d, want %d, the last evicted", got, ents[2])
	}
}
