package signals

import (
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
