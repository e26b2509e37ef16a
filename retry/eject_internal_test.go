package retry

import "testing"

// setLimit sets the most endpoints e tracks that are not ejected.
func setLimit(e *Ejector, n int) {
	e.mu.Lock()
	e.limit = n
	e.mu.Unlock()
}

// checkEjector fails t unless e's entries are each either in the ring of
// endpoints not ejected, at most e.limit of them, or in the heap of ejected
// ones, with consistent indexes and the heap ordered.
func checkEjector(t testing.TB, e *Ejector) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	ring := 0
	for st := e.lru.next; st != &e.lru; st = st.next {
		ring++
		if st.next.prev != st {
			t.Fatalf("ring broken at %s", st.key)
		}
		if e.eps[st.key] != st || !st.until.IsZero() || !st.coolUntil.IsZero() {
			t.Fatalf("%s in the ring: tracked %v, until %v", st.key, e.eps[st.key] == st, st.until)
		}
	}
	if ring != e.live || e.live > e.limit {
		t.Fatalf("ring of %d, live %d, limit %d", ring, e.live, e.limit)
	}
	for i, st := range e.out {
		if st.idx != i || e.eps[st.key] != st || st.until.IsZero() {
			t.Fatalf("heap entry %d (%s): idx %d, tracked %v, until %v", i, st.key, st.idx, e.eps[st.key] == st, st.until)
		}
		if !st.coolUntil.IsZero() && (st.cooling || !st.coolUntil.After(st.until)) {
			t.Fatalf("%s: a cooldown to %v follows an ejection to %v, cooling %v", st.key, st.coolUntil, st.until, st.cooling)
		}
		if i > 0 && st.until.Before(e.out[(i-1)/2].until) {
			t.Fatalf("heap out of order at %d", i)
		}
	}
	cooling := 0
	for _, st := range e.out {
		if st.cooling {
			cooling++
		}
	}
	if cooling != e.cooling {
		t.Fatalf("%d entries cooling, count %d", cooling, e.cooling)
	}
	if len(e.eps) != ring+len(e.out) {
		t.Fatalf("%d tracked, %d in the ring, %d ejected", len(e.eps), ring, len(e.out))
	}
}
