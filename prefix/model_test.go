package prefix

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"testing"
	"time"
)

// model is a plain reference implementation of Index: per endpoint, a slice
// ordered from least to most recently used.
type model struct {
	blockSize  int
	defCap     int
	ttl        int64
	maxEPs     int
	eventsOnly bool
	eps        map[string]*modelEndpoint
}

type modelEndpoint struct {
	capacity int
	list     []modelEntry // least recently used first
}

type modelEntry struct {
	h   uint64
	exp int64
	// marked: touched again since exp was set, keeping it (see Unrecord).
	marked bool
}

func newModel(c IndexConfig) *model {
	return &model{blockSize: c.BlockSize, defCap: c.Capacity, ttl: int64(c.TTL), maxEPs: c.MaxEndpoints, eventsOnly: c.EventsOnly, eps: map[string]*modelEndpoint{}}
}

func (m *model) endpoint(key string) *modelEndpoint {
	if e := m.eps[key]; e != nil {
		return e
	}
	if key == "" || len(m.eps) >= m.maxEPs {
		return nil
	}
	e := &modelEndpoint{capacity: m.defCap}
	m.eps[key] = e
	return e
}

func (e *modelEndpoint) touch(blocks []uint64, exp, slack, now int64) {
	n := min(len(blocks), e.capacity)
	for i := n - 1; i >= 0; i-- {
		h := blocks[i]
		v := exp
		if j := e.find(h); j >= 0 {
			marked := false
			if old := e.list[j].exp; old >= exp-slack && old > now {
				v, marked = old, true
			}
			e.list = slices.Delete(e.list, j, j+1)
			e.list = append(e.list, modelEntry{h, v, marked})
			continue
		}
		e.list = append(e.list, modelEntry{h: h, exp: v})
		if len(e.list) > e.capacity {
			e.list = e.list[1:]
		}
	}
}

func (e *modelEndpoint) find(h uint64) int {
	return slices.IndexFunc(e.list, func(x modelEntry) bool { return x.h == h })
}

// record is Index.Record at t, math.MinInt64 standing for a time the index
// cannot place (see modelNano).
func (m *model) record(key string, blocks []uint64, t int64) bool {
	if t == math.MinInt64 {
		return false
	}
	e := m.endpoint(key)
	if e == nil {
		return false
	}
	if !m.eventsOnly {
		t = min(t, math.MaxInt64-1) // blocks from events outlast every time
		exp := m.expiry(t)
		if n := min(len(blocks), e.capacity); n > 0 {
			// Expired blocks go from the least recently used end first,
			// at most n+expiredBatch of them.
			for k := n + expiredBatch; k > 0 && len(e.list) > 0 && e.list[0].exp <= t; k-- {
				e.list = e.list[1:]
			}
		}
		e.touch(blocks, exp, m.ttl/64, t)
	}
	return true
}

// expiry is the expiry a Record at t gives, with t as for record.
func (m *model) expiry(t int64) int64 {
	t = min(t, math.MaxInt64-1) // blocks from events outlast every time
	exp := t + m.ttl
	if exp < t {
		exp = math.MaxInt64 - 1
	}
	return exp
}

// unrecord is Index.Unrecord: it removes the blocks still unmarked with
// the expiry a Record at t gave them.
func (m *model) unrecord(key string, blocks []uint64, t int64) bool {
	if t == math.MinInt64 {
		return false
	}
	if e := m.eps[key]; e != nil {
		exp := m.expiry(t)
		for _, h := range blocks {
			if j := e.find(h); j >= 0 && e.list[j].exp == exp && !e.list[j].marked {
				e.list = slices.Delete(e.list, j, j+1)
			}
		}
	}
	return true
}

func (m *model) stored(key string, blockSize int, blocks []uint64) bool {
	if blockSize != m.blockSize {
		return false
	}
	e := m.endpoint(key)
	if e == nil {
		return false
	}
	e.touch(blocks, math.MaxInt64, 0, math.MinInt64)
	return true
}

func (m *model) removed(key string, blockSize int, blocks []uint64) bool {
	if blockSize != m.blockSize {
		return false
	}
	if e := m.eps[key]; e != nil {
		for _, h := range blocks {
			if j := e.find(h); j >= 0 {
				e.list = slices.Delete(e.list, j, j+1)
			}
		}
	}
	return true
}

func (m *model) setCapacity(key string, c int) bool {
	e := m.endpoint(key)
	if e == nil {
		return false
	}
	if len(e.list) > c {
		e.list = e.list[len(e.list)-c:]
	}
	e.capacity = c
	return true
}

func (m *model) matchLen(key string, blocks []uint64, t int64) int {
	e := m.eps[key]
	if e == nil {
		return 0
	}
	t = min(t, math.MaxInt64-1)
	if t == math.MinInt64 { // later than every expiry
		t = math.MaxInt64 - 1
	}
	for i, h := range blocks {
		j := e.find(h)
		if j < 0 || e.list[j].exp <= t {
			return i
		}
	}
	return len(blocks)
}

func (m *model) match(blocks []uint64, t int64) map[string]int {
	out := map[string]int{}
	for key := range m.eps {
		if n := m.matchLen(key, blocks, t); n > 0 {
			out[key] = n
		}
	}
	return out
}

// checkInvariants verifies that the holder map agrees with the endpoints'
// LRUs (it may omit expired copies, never include absent ones) and that no
// endpoint exceeds its capacity.
func checkInvariants(t testing.TB, x *Index) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	pairs := 0
	held := map[[3]uint64]bool{} // (group, block, bit) of every LRU entry
	for key, e := range x.endpoints {
		if x.slots[e.slot] != e {
			t.Fatalf("endpoint %q: slot %d holds another endpoint", key, e.slot)
		}
		if x.occupied[e.slot/64]&(1<<(e.slot%64)) == 0 {
			t.Fatalf("endpoint %q: slot %d not marked occupied", key, e.slot)
		}
		if e.lru.Len() > e.capacity {
			t.Fatalf("endpoint %q: %d blocks exceed capacity %d", key, e.lru.Len(), e.capacity)
		}
		for _, h := range e.lru.Keys() {
			w := e.slot / 64
			held[[3]uint64{uint64(w), h, uint64(e.slot % 64)}] = true
			exp, _ := e.lru.Peek(h)
			if x.holders.get(h, w).bits&(1<<(e.slot%64)) == 0 && exp == never {
				t.Fatalf("endpoint %q holds %x from an event but the holder map does not say so", key, h)
			}
		}
		pairs += e.lru.Len()
	}
	bitsSet := 0
	x.holders.all(func(h uint64, w int, hd holder) {
		if hd.bits == 0 {
			t.Fatalf("empty holder entry kept")
		}
		for b := hd.bits; b != 0; b &= b - 1 {
			if !held[[3]uint64{uint64(w), h, uint64(bits.TrailingZeros64(b))}] {
				t.Fatalf("holder entry %x of group %d names an endpoint that does not hold the block", h, w)
			}
		}
		bitsSet += bits.OnesCount64(hd.bits)
	})
	if bitsSet > pairs {
		t.Fatalf("holder map has %d (block, endpoint) pairs, LRUs only %d", bitsSet, pairs)
	}
	n := 0
	for _, occ := range x.occupied {
		n += bits.OnesCount64(occ)
	}
	if n != len(x.endpoints) {
		t.Fatalf("%d slots occupied, %d endpoints", n, len(x.endpoints))
	}
}

// holderEntries returns the number of holder entries of every group. x.mu
// must be held.
func holderEntries(x *Index) int { return x.holders.len() }

// asMap turns Match results into a map, failing on duplicates, zero counts
// or a wrong order.
func asMap(t testing.TB, ms []Match) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i, m := range ms {
		if _, dup := out[m.Endpoint]; dup {
			t.Fatalf("endpoint %q matched twice", m.Endpoint)
		}
		if m.Blocks < 1 {
			t.Fatalf("endpoint %q matched %d blocks", m.Endpoint, m.Blocks)
		}
		if i > 0 && ms[i-1].Blocks < m.Blocks {
			t.Fatalf("matches not in decreasing order: %v", ms)
		}
		out[m.Endpoint] = m.Blocks
	}
	return out
}

// modelNano returns t in Unix nanoseconds for the model, math.MinInt64 for
// the zero time.Time, whose UnixNano is undefined.
func modelNano(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	return t.UnixNano()
}

func epName(i int) string { return fmt.Sprintf("ep%d", i) }

// epNames returns epName(0) to epName(n-1).
func epNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = epName(i)
	}
	return names
}

// checkModel verifies that the index holds exactly the model's state: the
// same endpoints with the same capacities, and for each the same blocks
// in the same recency order with the same expiries. Matches compare only
// what the LRUs yield for a prompt; this compares what later evictions
// and expiries will act on.
func checkModel(t testing.TB, x *Index, m *model) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	if len(x.endpoints) != len(m.eps) {
		t.Fatalf("index has %d endpoints, model %d", len(x.endpoints), len(m.eps))
	}
	for key, me := range m.eps {
		e := x.endpoints[key]
		if e == nil {
			t.Fatalf("endpoint %q in the model, not in the index", key)
		}
		if e.capacity != me.capacity {
			t.Fatalf("endpoint %q: capacity %d, model %d", key, e.capacity, me.capacity)
		}
		keys := e.lru.Keys()
		if len(keys) != len(me.list) {
			t.Fatalf("endpoint %q: %d blocks, model %d", key, len(keys), len(me.list))
		}
		for i, h := range keys {
			exp, marked, _ := e.lru.PeekMarked(h)
			if want := me.list[i]; h != want.h || exp != want.exp || marked != want.marked {
				t.Fatalf("endpoint %q: block %d (least recently used first) is %x expiring at %d marked %v, model %x at %d marked %v",
					key, i, h, exp, marked, want.h, want.exp, want.marked)
			}
		}
	}
}

// checkListed verifies that the holder table lists every endpoint for every
// block it holds unexpired after now, the latest time passed to the index:
// the table may omit only copies found expired (see holder), and Match
// finds blocks only through it.
func checkListed(t testing.TB, x *Index, now int64) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	for key, e := range x.endpoints {
		w, bit := e.slot/64, uint64(1)<<(e.slot%64)
		for _, h := range e.lru.Keys() {
			if exp, _ := e.lru.Peek(h); exp > now && x.holders.get(h, w).bits&bit == 0 {
				t.Fatalf("endpoint %q holds %x until %d, after %d, but the holder table does not list it", key, h, exp, now)
			}
		}
	}
}
