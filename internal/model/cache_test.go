package model

import "testing"

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
