package prefix

import (
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fuzzChains are the prompts of the index fuzz test: chains that share heads
// of various lengths, so that matches stop at different blocks.
var fuzzChains = func() [][]uint64 {
	chains := make([][]uint64, 5)
	next := uint64(1)
	fresh := func() uint64 { next++; return next * 0x1000193 }
	for c := range chains {
		for j := 0; j < 10; j++ {
			// Chain c shares its first c blocks with chain 0.
			if c > 0 && j < c {
				chains[c] = append(chains[c], chains[0][j])
			} else {
				chains[c] = append(chains[c], fresh())
			}
		}
	}
	// Chain 0 with each hash XOR an odd multiple of a constant: caller
	// hashes (Stored takes any uint64) that a keying mixing the group
	// into the hash would confuse with chain 0's in another group.
	var mixed []uint64
	for j, h := range chains[0] {
		mixed = append(mixed, h^uint64(1+j%2)*0x9e3779b97f4a7c15)
	}
	chains = append(chains, mixed)
	// Chain 0 with its first two hashes changed by constants that cancel
	// in an unkeyed multiply-xorshift fingerprint, whatever the hashes:
	// recorded after chain 0, it must not be taken for chain 0 recorded
	// again.
	crafted := slices.Clone(chains[0])
	crafted[0] ^= 1 << 63
	crafted[1] ^= 1<<63 | 1<<34
	chains = append(chains, crafted)
	return chains
}()

// FuzzIndex applies a sequence of operations decoded from the input to an
// Index and to the reference model and compares every observable result.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{0, 1, 0, 5, 6, 0, 0, 9})
	f.Add([]byte{0, 1, 1, 9, 1, 2, 3, 7, 6, 0, 1, 9, 5, 3, 0, 0, 6, 1, 0, 9})
	f.Add([]byte{1, 1, 2, 8, 7, 0, 0, 0, 2, 1, 2, 3, 6, 0, 2, 9, 3, 1, 0, 0, 6, 0, 2, 9, 4, 1, 0, 0})
	seed := make([]byte, 600)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range seed {
		seed[i] = byte(r.Uint32())
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		runOps(t, data, false, len(data)%2 == 1)
	})
}

// FuzzIndexEventsOnly is FuzzIndex on an events-only index: records add
// endpoints but never blocks.
func FuzzIndexEventsOnly(f *testing.F) {
	f.Add([]byte{0, 1, 0, 5, 2, 1, 0, 9, 6, 0, 0, 9})
	f.Add([]byte{2, 1, 2, 8, 0, 1, 2, 8, 3, 1, 2, 9, 6, 1, 2, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		runOps(t, data, true, len(data)%2 == 1)
	})
}

// runOps applies the operations decoded from data to an index and to the
// model. With ahead set, the index's matches read blocks ahead, as those of
// an index larger than the caches do, however few blocks it holds.
func runOps(t *testing.T, data []byte, eventsOnly, ahead bool) {
	// TTL/64 is 10ms, one time step: records one step apart exercise the
	// update slack, and matches land exactly on expiry instants.
	cfg := IndexConfig{BlockSize: 16, Capacity: 6, TTL: 640 * time.Millisecond, MaxEndpoints: 70, EventsOnly: eventsOnly}
	x, err := NewIndex(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ahead {
		x.aheadEntries = 0
	}
	m := newModel(cfg)
	now := time.Unix(1_000_000, 0)
	var dst []Match
	for len(data) >= 4 {
		op, a, b, c := data[0], int(data[1]), int(data[2]), int(data[3])
		data = data[4:]
		ep := epName(a % 74)
		blocks := fuzzChains[b%len(fuzzChains)][:c%11]
		bs := 16
		if c%7 == 0 {
			bs = 32
		}
		// A few records and matches are at the zero time, a clock not set.
		at := now
		if c >= 250 {
			at = time.Time{}
		}
		switch op % 10 {
		case 0, 1:
			err := x.Record(ep, blocks, at)
			if ok := m.record(ep, blocks, modelNano(at)); ok != (err == nil) {
				t.Fatalf("Record(%s) at %v = %v, model ok %v", ep, at, err, ok)
			}
			if err != nil && !errors.Is(err, ErrTooManyEndpoints) && !(at.IsZero() && errors.Is(err, ErrInvalidArgument)) {
				t.Fatalf("Record at %v: unexpected error %v", at, err)
			}
		case 2:
			err := x.Stored(ep, bs, blocks...)
			if ok := m.stored(ep, bs, blocks); ok != (err == nil) {
				t.Fatalf("Stored(%s, %d) = %v, model ok %v", ep, bs, err, ok)
			}
			if bs != 16 && !errors.Is(err, ErrBlockSizeMismatch) {
				t.Fatalf("Stored with block size %d: error %v", bs, err)
			}
		case 3:
			// Remove a few blocks from the middle and the tail.
			rm := blocks[len(blocks)/2:]
			err := x.Removed(ep, bs, rm...)
			if ok := m.removed(ep, bs, rm); ok != (err == nil) {
				t.Fatalf("Removed(%s, %d) = %v, model ok %v", ep, bs, err, ok)
			}
		case 4:
			x.Cleared(ep)
			if e := m.eps[ep]; e != nil {
				e.list = nil
			}
		case 5:
			x.RemoveEndpoint(ep)
			delete(m.eps, ep)
		case 6:
			got := asMap(t, x.Match(blocks, at, dst[:0]))
			want := m.match(blocks, modelNano(at))
			if !maps.Equal(got, want) {
				t.Fatalf("Match(chain %d[:%d]) at %v = %v, want %v", b%len(fuzzChains), len(blocks), at, got, want)
			}
			if got, want := x.MatchLen(ep, blocks, at), m.matchLen(ep, blocks, modelNano(at)); got != want {
				t.Fatalf("MatchLen(%s) at %v = %d, want %d", ep, at, got, want)
			}
		case 7:
			capacity := 1 + c%9
			err := x.SetCapacity(ep, capacity)
			if ok := m.setCapacity(ep, capacity); ok != (err == nil) {
				t.Fatalf("SetCapacity(%s, %d) = %v, model ok %v", ep, capacity, err, ok)
			}
		case 8:
			now = now.Add(time.Duration(b%8) * 10 * time.Millisecond)
		case 9:
			// Undo a Record at this time: of a chain's blocks from the
			// middle on, as a policy passes those it did not match.
			un := blocks[len(blocks)/3:]
			err := x.Unrecord(ep, un, at)
			if ok := m.unrecord(ep, un, modelNano(at)); ok != (err == nil) {
				t.Fatalf("Unrecord(%s) at %v = %v, model ok %v", ep, at, err, ok)
			}
		}
		for key, e := range m.eps {
			if got := x.Len(key); got != len(e.list) {
				t.Fatalf("Len(%s) = %d, want %d", key, got, len(e.list))
			}
		}
		checkInvariants(t, x)
		checkModel(t, x, m)
		checkListed(t, x, now.UnixNano())
	}
	// A final full comparison for every chain prefix.
	for _, ch := range fuzzChains {
		got := asMap(t, x.Match(ch, now, nil))
		if want := m.match(ch, now.UnixNano()); !maps.Equal(got, want) {
			t.Fatalf("final Match = %v, want %v (endpoints %v)", got, want, slices.Collect(maps.Keys(m.eps)))
		}
	}
}

// TestIndexRandomOps runs the fuzz body on seeded random inputs so that the
// comparison with the model runs in every test run, two runs in three with
// matches reading ahead.
func TestIndexRandomOps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 120; i++ {
		data := make([]byte, 4*(50+r.IntN(400)))
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		runOps(t, data, i%4 == 3, i%3 != 0)
	}
}

// FuzzHasher checks the chain properties on arbitrary tokens and text.
func FuzzHasher(f *testing.F) {
	f.Add([]byte("hello, world: a prompt that is longer than one block of sixty-four bytes, surely"), uint8(4), uint16(3))
	f.Add([]byte{}, uint8(0), uint16(0))
	f.Add(make([]byte, 300), uint8(1), uint16(299))
	f.Fuzz(func(t *testing.T, text []byte, bt uint8, cut uint16) {
		h, err := NewHasher(HasherConfig{BlockTokens: 1 + int(bt%32), BlockBytes: 1 + int(bt%64), MaxTokens: 40 * (1 + int(bt%32))})
		if err != nil {
			t.Fatal(err)
		}
		tokens := make([]uint32, len(text))
		for i, c := range text {
			tokens[i] = uint32(c) * 2654435761
		}
		root := h.Root(Salt{Model: "m"})
		checkChain(t, h.BlockTokens(), h.MaxBlocks(), len(tokens), func(n int) []uint64 {
			return h.AppendTokens(nil, root, tokens[:n])
		})
		checkChain(t, h.BlockBytes(), h.MaxBlocks(), len(text), func(n int) []uint64 {
			return h.AppendBytes(nil, root, text[:n])
		})
		if got, want := h.AppendString(nil, root, string(text)), h.AppendBytes(nil, root, text); !slices.Equal(got, want) {
			t.Fatalf("AppendString != AppendBytes")
		}
		checkContinuation(t, h.BlockTokens(), h.AppendTokens(nil, root, tokens), func(dst []uint64, from uint64, k int) []uint64 {
			return h.AppendTokens(dst, from, tokens[k:])
		})
		checkContinuation(t, h.BlockBytes(), h.AppendBytes(nil, root, text), func(dst []uint64, from uint64, k int) []uint64 {
			return h.AppendBytes(dst, from, text[k:])
		})
		if littleEndian {
			bt := h.BlockTokens()
			n := min(len(tokens)/bt, h.MaxBlocks())
			if got, want := appendTokensEncoded(nil, root, tokens[:n*bt], bt), h.AppendTokens(nil, root, tokens); !slices.Equal(got, want) {
				t.Fatalf("portable token encoding: %x, in place %x", got, want)
			}
		}
		// Changing one token changes its block's hash and every later one,
		// and no earlier one.
		if len(tokens) > 0 {
			k := int(cut) % len(tokens)
			before := h.AppendTokens(nil, root, tokens)
			tokens[k] ^= 1
			after := h.AppendTokens(nil, root, tokens)
			checkDivergence(t, before, after, k/h.BlockTokens())
		}
	})
}

// checkChain verifies that hashing a prefix of n elements yields exactly
// min(n/block, maxBlocks) hashes, and that they are the leading hashes of
// the whole input.
func checkChain(t *testing.T, block, maxBlocks, total int, hash func(n int) []uint64) {
	t.Helper()
	full := hash(total)
	if want := min(total/block, maxBlocks); len(full) != want {
		t.Fatalf("%d elements, block %d, max %d: %d hashes, want %d", total, block, maxBlocks, len(full), want)
	}
	for _, n := range []int{0, 1, block - 1, block, block + 1, total / 2, total - 1} {
		if n < 0 || n > total {
			continue
		}
		part := hash(n)
		if want := min(n/block, maxBlocks); len(part) != want {
			t.Fatalf("prefix of %d: %d hashes, want %d", n, len(part), want)
		}
		if !slices.Equal(part, full[:len(part)]) {
			t.Fatalf("prefix of %d elements does not give the leading hashes", n)
		}
	}
}

// checkContinuation verifies that continuing full's chain from its hash k
// (the root when k is 0) over the input after block k, appended to a
// non-empty dst, keeps dst and gives the rest of full: hashing a prompt
// in whole blocks, piece by piece, gives the hashes of hashing it whole.
func checkContinuation(t *testing.T, block int, full []uint64, cont func(dst []uint64, from uint64, k int) []uint64) {
	t.Helper()
	for _, k := range []int{1, len(full) / 2, len(full) - 1} {
		if k < 1 || k >= len(full) {
			continue
		}
		dst := []uint64{7, 8}
		got := cont(dst, full[k-1], k*block)
		if len(got) < 2 || got[0] != 7 || got[1] != 8 {
			t.Fatalf("continued after block %d: dst not kept: %x", k, got)
		}
		got = got[2:]
		if len(got) < len(full)-k || !slices.Equal(got[:len(full)-k], full[k:]) {
			t.Fatalf("continued after block %d of %d: %x, want %x first", k, len(full), got, full[k:])
		}
	}
}

// checkDivergence verifies that two chains agree before block k and differ
// at every block from k on.
func checkDivergence(t *testing.T, a, b []uint64, k int) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("lengths %d != %d", len(a), len(b))
	}
	for i := range a {
		if i < k && a[i] != b[i] {
			t.Fatalf("block %d before the change at block %d differs", i, k)
		}
		if i >= k && a[i] == b[i] {
			t.Fatalf("block %d at or after the change at block %d is equal", i, k)
		}
	}
}

// FuzzRoot checks that distinct salts give distinct roots (the encoding is
// unambiguous), and that the tenant counts exactly when isolation is on.
func FuzzRoot(f *testing.F) {
	f.Add("m", "a", "n", "low", "t", "m", "a", "n", "low", "u")
	f.Add("ab", "", "", "", "", "a", "b", "", "", "")
	f.Add("", "", "", "", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, m1, a1, n1, r1, t1, m2, a2, n2, r2, t2 string) {
		iso := mustHasher(t, HasherConfig{})
		shared := mustHasher(t, HasherConfig{ShareAcrossTenants: true})
		s1 := Salt{Model: m1, Adapter: a1, Namespace: n1, ReasoningEffort: r1, Tenant: t1}
		s2 := Salt{Model: m2, Adapter: a2, Namespace: n2, ReasoningEffort: r2, Tenant: t2}
		if (iso.Root(s1) == iso.Root(s2)) != (s1 == s2) {
			t.Fatalf("isolated roots: equal %v for salts %+v and %+v", iso.Root(s1) == iso.Root(s2), s1, s2)
		}
		s1.Tenant, s2.Tenant = "", ""
		if (shared.Root(Salt{Model: m1, Adapter: a1, Namespace: n1, ReasoningEffort: r1, Tenant: t1}) ==
			shared.Root(Salt{Model: m2, Adapter: a2, Namespace: n2, ReasoningEffort: r2, Tenant: t2})) != (s1 == s2) {
			t.Fatalf("shared roots must ignore only the tenant: %+v vs %+v", s1, s2)
		}
	})
}

// TestIndexHostileOps compares the index with the reference model under
// inputs runOps does not produce (Unrecord among its operations): block
// lists with repeated hashes, hashes
// 0 and all ones and hashes that cancel the holder table's seed, capacities
// from 1 to MaxCapacity, TTLs from 1 ns to the largest, times up to the
// largest, and up to five groups of endpoints removed and added again.
func TestIndexHostileOps(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	ttls := []time.Duration{time.Nanosecond, 64 * time.Nanosecond, 640 * time.Millisecond, math.MaxInt64}
	for seed := range uint64(seeds) {
		r := rand.New(rand.NewPCG(seed, 99))
		ttl := ttls[r.IntN(len(ttls))]
		cfg := IndexConfig{BlockSize: 16, Capacity: 1 + r.IntN(12), TTL: ttl, MaxEndpoints: 1 + r.IntN(300)}
		x, err := NewIndex(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := newModel(cfg)
		pool := []uint64{0, math.MaxUint64, 1, 2, 3, 0x9e3779b97f4a7c15, x.holders.seed, ^x.holders.seed, 5, 6}
		blocks := func() []uint64 {
			b := make([]uint64, r.IntN(9))
			for i := range b {
				b[i] = pool[r.IntN(len(pool))]
			}
			return b
		}
		now := int64(1_000_000 * time.Second)
		if r.IntN(4) == 0 {
			now = math.MaxInt64 - int64(r.IntN(3))*int64(ttl/64+1)
		}
		for op := range 300 {
			ep := epName(r.IntN(cfg.MaxEndpoints + 3))
			bl := blocks()
			at := time.Unix(0, now)
			switch r.IntN(11) {
			case 0, 1:
				err := x.Record(ep, bl, at)
				if ok := m.record(ep, bl, now); ok != (err == nil) {
					t.Fatalf("seed %d op %d: Record(%s) = %v, model ok %v", seed, op, ep, err, ok)
				}
			case 2:
				err := x.Stored(ep, 16, bl...)
				if ok := m.stored(ep, 16, bl); ok != (err == nil) {
					t.Fatalf("seed %d op %d: Stored(%s) = %v, model ok %v", seed, op, ep, err, ok)
				}
			case 3:
				must(t, x.Removed(ep, 16, bl...))
				m.removed(ep, 16, bl)
			case 4:
				x.Cleared(ep)
				if e := m.eps[ep]; e != nil {
					e.list = nil
				}
			case 5:
				x.RemoveEndpoint(ep)
				delete(m.eps, ep)
			case 6:
				got := asMap(t, x.Match(bl, at, nil))
				if want := m.match(bl, now); !maps.Equal(got, want) {
					t.Fatalf("seed %d op %d: Match(%x) at %d = %v, want %v", seed, op, bl, now, got, want)
				}
				if got, want := x.MatchLen(ep, bl, at), m.matchLen(ep, bl, now); got != want {
					t.Fatalf("seed %d op %d: MatchLen(%s, %x) = %d, want %d", seed, op, ep, bl, got, want)
				}
			case 7:
				c := 1 + r.IntN(6)
				if r.IntN(10) == 0 {
					c = MaxCapacity
				}
				err := x.SetCapacity(ep, c)
				if ok := m.setCapacity(ep, c); ok != (err == nil) {
					t.Fatalf("seed %d op %d: SetCapacity(%s, %d) = %v, model ok %v", seed, op, ep, c, err, ok)
				}
			case 8, 9:
				if step := int64(r.IntN(3)) * int64(ttl/64+1); now <= math.MaxInt64-step {
					now += step
				}
			case 10:
				err := x.Unrecord(ep, bl, at)
				if ok := m.unrecord(ep, bl, now); ok != (err == nil) {
					t.Fatalf("seed %d op %d: Unrecord(%s) = %v, model ok %v", seed, op, ep, err, ok)
				}
			}
			for key, e := range m.eps {
				if got := x.Len(key); got != len(e.list) {
					t.Fatalf("seed %d op %d: Len(%s) = %d, want %d", seed, op, key, got, len(e.list))
				}
			}
			checkInvariants(t, x)
			checkModel(t, x, m)
			checkListed(t, x, min(now, math.MaxInt64-1))
		}
	}
}
