package signals

import (
	"fmt"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// TestRecordIntoEvictedEntry evicts an endpoint's entry between the
// lookup of a record and its update: the record must be made again in a
// new entry rather than lost with the evicted one.
func TestRecordIntoEvictedEntry(t *testing.T) {
	var s Store
	t0 := time.Unix(1000, 0)
	if err := s.Record("a", llmlb.Load{At: t0, Running: 1}); err != nil {
		t.Fatal(err)
	}
	evicted := false
	testHookUpdate = func(s *Store, key string) {
		if evicted {
			return
		}
		evicted = true
		s.mu.Lock()
		defer s.mu.Unlock()
		e := s.entry(key)
		e.gone.Store(goneEvicted)
		s.removeLocked(e)
	}
	defer func() { testHookUpdate = nil }()
	if err := s.Record("a", llmlb.Load{At: t0.Add(time.Second), Running: 2}); err != nil {
		t.Fatal(err)
	}
	if !evicted {
		t.Fatal("the hook did not run")
	}
	l, ok := s.Load("a")
	if !ok || l.Running != 2 {
		t.Fatalf("after a record into an entry evicted meanwhile: Load = %+v, %v; want Running 2", l, ok)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d, want 1", s.Len())
	}
}

// TestEvictionPassesMarks: an endpoint recorded again after it was added,
// then gone, is evicted before 2*MaxKeys further endpoints are added (the
// hand clears its mark on the way), and evictions reuse the slots they
// free, so the ring never outgrows MaxKeys.
func TestEvictionPassesMarks(t *testing.T) {
	const maxKeys = 8
	s, err := NewStore(StoreConfig{MaxKeys: maxKeys})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	rec := func(key string, i int) {
		t.Helper()
		if err := s.Record(key, llmlb.Load{At: t0.Add(time.Duration(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range maxKeys {
		rec(fmt.Sprint("old-", i), i)
	}
	rec("old-3", maxKeys)
	rec("old-3", maxKeys+1)
	for i := range 2 * maxKeys {
		rec(fmt.Sprint("new-", i), 2*maxKeys+i)
		if len(s.ring) > maxKeys {
			t.Fatalf("after %d endpoints added to the full store, the ring has %d slots, more than MaxKeys %d", i+1, len(s.ring), maxKeys)
		}
	}
	if _, ok := s.Load("old-3"); ok {
		t.Fatalf("old-3, recorded twice and then gone, still held after %d endpoints added", 2*maxKeys)
	}
}
