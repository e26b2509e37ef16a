package prefix

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/timeline"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustIndex(t testing.TB, c IndexConfig) *Index {
	t.Helper()
	x, err := NewIndex(c)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// chainOf returns n distinct block hashes starting at base.
func chainOf(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base*1_000_003 + uint64(i) + 1
	}
	return out
}

func TestNewIndexValidation(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	if x.BlockSize() != DefaultBlockTokens {
		t.Fatalf("default BlockSize %d", x.BlockSize())
	}
	if err := x.Record("a", nil, t0); err != nil {
		t.Fatal(err)
	}
	if x.Capacity("a") != DefaultCapacity {
		t.Fatalf("default capacity %d", x.Capacity("a"))
	}
	cases := []IndexConfig{
		{BlockSize: -1},
		{BlockSize: maxBlockTokens + 1},
		{Capacity: -1},
		{Capacity: MaxCapacity + 1},
		{TTL: -time.Second},
		{MaxEndpoints: -1},
		{MaxEndpoints: DefaultMaxEndpoints + 1},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%+v", c), func(t *testing.T) {
			if _, err := NewIndex(c); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestMatchLongestPrefixStopsAtFirstMiss(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	p := chainOf(1, 8)
	must(t, x.Stored("full", 16, p...))
	must(t, x.Stored("head3", 16, p[:3]...))
	must(t, x.Stored("hole", 16, p[0], p[1], p[3], p[4], p[5])) // misses block 2
	must(t, x.Stored("nohead", 16, p[1:]...))                   // misses block 0
	must(t, x.Stored("other", 16, chainOf(2, 8)...))
	got := x.Match(p, t0, nil)
	want := map[string]int{"full": 8, "head3": 3, "hole": 2}
	if m := asMap(t, got); !maps.Equal(m, want) {
		t.Fatalf("Match = %v, want %v", got, want)
	}
	if got[0].Endpoint != "full" {
		t.Fatalf("longest match not first: %v", got)
	}
	for key, n := range map[string]int{"full": 8, "head3": 3, "hole": 2, "nohead": 0, "other": 0, "unknown": 0} {
		if got := x.MatchLen(key, p, t0); got != n {
			t.Errorf("MatchLen(%s) = %d, want %d", key, got, n)
		}
	}
	// A prompt longer than anything held stops where the holders stop.
	long := append(append([]uint64{}, p...), 99, 100)
	if m := asMap(t, x.Match(long, t0, nil)); m["full"] != 8 {
		t.Fatalf("long prompt: %v", m)
	}
	if got := x.Match(nil, t0, nil); len(got) != 0 {
		t.Fatalf("empty prompt matched %v", got)
	}
	// dst is appended to, not overwritten.
	dst := []Match{{Endpoint: "keep", Blocks: 1}}
	if got := x.Match(p, t0, dst); len(got) != 4 || got[0].Endpoint != "keep" {
		t.Fatalf("Match did not append to dst: %v", got)
	}
}

func TestTTL(t *testing.T) {
	ttl := time.Minute
	x := mustIndex(t, IndexConfig{TTL: ttl})
	p := chainOf(1, 6)
	must(t, x.Record("a", p, t0))
	must(t, x.Record("a", p[:2], t0.Add(30*time.Second))) // refreshes the head only
	must(t, x.Record("b", p[:4], t0))
	must(t, x.Stored("c", 16, p[:3]...))
	must(t, x.Record("c", p, t0)) // events never expire; Record extends beyond
	cases := []struct {
		at   time.Duration
		want map[string]int
	}{
		{0, map[string]int{"a": 6, "b": 4, "c": 6}},
		{ttl - time.Nanosecond, map[string]int{"a": 6, "b": 4, "c": 6}},
		{ttl, map[string]int{"a": 2, "c": 3}},
		{ttl + 30*time.Second - time.Nanosecond, map[string]int{"a": 2, "c": 3}},
		{ttl + 30*time.Second, map[string]int{"c": 3}},
		{24 * time.Hour, map[string]int{"c": 3}},
	}
	for _, tc := range cases {
		now := t0.Add(tc.at)
		if got := asMap(t, x.Match(p, now, nil)); !maps.Equal(got, tc.want) {
			t.Errorf("at +%v: Match = %v, want %v", tc.at, got, tc.want)
		}
		for key, n := range tc.want {
			if got := x.MatchLen(key, p, now); got != n {
				t.Errorf("at +%v: MatchLen(%s) = %d, want %d", tc.at, key, got, n)
			}
		}
	}
	// Expired blocks are still held (lazily expired) and count toward Len.
	if x.Len("b") != 4 {
		t.Fatalf("Len(b) = %d, want 4", x.Len("b"))
	}
	// Recording again revives them.
	late := t0.Add(time.Hour)
	must(t, x.Record("b", p[:4], late))
	if got := x.MatchLen("b", p, late); got != 4 {
		t.Fatalf("re-recorded: MatchLen = %d, want 4", got)
	}
}

// TestTTLSlack checks that a Record soon after the previous one refreshes
// recency but keeps the earlier expiry, and that a later one extends it.
func TestTTLSlack(t *testing.T) {
	ttl := 64 * time.Second // slack TTL/64 = 1s
	x := mustIndex(t, IndexConfig{TTL: ttl, Capacity: 2})
	p := chainOf(1, 1)
	must(t, x.Record("a", p, t0))
	must(t, x.Record("a", chainOf(2, 1), t0))
	must(t, x.Record("a", p, t0.Add(time.Second))) // within slack: recency only
	must(t, x.Record("a", chainOf(3, 1), t0.Add(time.Second)))
	if x.MatchLen("a", p, t0) != 1 {
		t.Fatal("the re-recorded block was evicted: recency not refreshed")
	}
	if x.MatchLen("a", p, t0.Add(ttl)) != 0 {
		t.Fatal("a Record within the slack extended the expiry")
	}
	must(t, x.Record("a", p, t0.Add(time.Second+time.Nanosecond))) // beyond the slack
	if x.MatchLen("a", p, t0.Add(ttl)) != 1 || x.MatchLen("a", p, t0.Add(ttl+time.Second+time.Nanosecond)) != 0 {
		t.Fatal("a Record beyond the slack did not extend the expiry to its time plus TTL")
	}
}

// TestTTLSharedBlock exercises the per-block expiry summary: a block held
// by several endpoints, some expired, is matched only by the live ones,
// before and after a write refreshes the summary.
func TestTTLSharedBlock(t *testing.T) {
	x := mustIndex(t, IndexConfig{TTL: time.Minute})
	p := chainOf(3, 3)
	for i := 0; i < 5; i++ {
		must(t, x.Record(epName(i), p, t0.Add(time.Duration(i)*20*time.Second)))
	}
	now := t0.Add(time.Minute + 30*time.Second) // ep0 and ep1 expired
	want := map[string]int{"ep2": 3, "ep3": 3, "ep4": 3}
	if got := asMap(t, x.Match(p, now, nil)); !maps.Equal(got, want) {
		t.Fatalf("before refresh: %v, want %v", got, want)
	}
	must(t, x.Record("ep4", p, now)) // refreshes the summary
	if got := asMap(t, x.Match(p, now, nil)); !maps.Equal(got, want) {
		t.Fatalf("after refresh: %v, want %v", got, want)
	}
	must(t, x.Record("ep0", p[:1], now)) // ep0 revives its head only
	want["ep0"] = 1
	if got := asMap(t, x.Match(p, now, nil)); !maps.Equal(got, want) {
		t.Fatalf("after revival: %v, want %v", got, want)
	}
	checkInvariants(t, x)
}

func TestHeadEvictedLast(t *testing.T) {
	x := mustIndex(t, IndexConfig{Capacity: 4})
	p := chainOf(1, 4)
	must(t, x.Record("a", p, t0))
	must(t, x.Record("a", chainOf(2, 1), t0)) // evicts one block: the tail
	if got := x.MatchLen("a", p, t0); got != 3 {
		t.Fatalf("after one eviction MatchLen = %d, want 3 (tail evicted first)", got)
	}
	must(t, x.Record("a", chainOf(3, 2), t0))
	if got := x.MatchLen("a", p, t0); got != 1 {
		t.Fatalf("after three evictions MatchLen = %d, want 1", got)
	}
	// A prefix longer than the capacity keeps its head.
	y := mustIndex(t, IndexConfig{Capacity: 3})
	long := chainOf(4, 10)
	must(t, y.Stored("a", 16, long...))
	if got, n := y.MatchLen("a", long, t0), y.Len("a"); got != 3 || n != 3 {
		t.Fatalf("long prefix: MatchLen %d Len %d, want 3 and 3", got, n)
	}
}

func TestSetCapacity(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	p := chainOf(1, 10)
	must(t, x.Record("a", p, t0))
	must(t, x.SetCapacity("a", 4))
	if x.Len("a") != 4 || x.Capacity("a") != 4 || x.MatchLen("a", p, t0) != 4 {
		t.Fatalf("shrink: Len %d Capacity %d MatchLen %d", x.Len("a"), x.Capacity("a"), x.MatchLen("a", p, t0))
	}
	must(t, x.SetCapacity("new", 7)) // adds the endpoint
	if x.Capacity("new") != 7 {
		t.Fatalf("Capacity(new) = %d", x.Capacity("new"))
	}
	for _, bad := range []int{0, -1, MaxCapacity + 1} {
		if err := x.SetCapacity("a", bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("SetCapacity(%d): %v, want ErrInvalidArgument", bad, err)
		}
	}
	if x.Capacity("unknown") != 0 || x.Len("unknown") != 0 {
		t.Fatal("unknown endpoint has a capacity or blocks")
	}
	checkInvariants(t, x)
}

func TestBlockSizeMismatch(t *testing.T) {
	x := mustIndex(t, IndexConfig{BlockSize: 16})
	p := chainOf(1, 4)
	for _, bs := range []int{0, 32, -16} {
		if err := x.Stored("a", bs, p...); !errors.Is(err, ErrBlockSizeMismatch) {
			t.Fatalf("Stored block size %d: %v, want ErrBlockSizeMismatch", bs, err)
		}
	}
	if x.Len("a") != 0 || x.Capacity("a") != 0 {
		t.Fatal("a mismatched Stored changed the index")
	}
	must(t, x.Stored("a", 16, p...))
	if err := x.Removed("a", 32, p...); !errors.Is(err, ErrBlockSizeMismatch) {
		t.Fatalf("Removed: %v, want ErrBlockSizeMismatch", err)
	}
	if x.MatchLen("a", p, t0) != 4 {
		t.Fatal("a mismatched Removed changed the index")
	}
	must(t, x.Removed("a", 16, p[2]))
	if x.MatchLen("a", p, t0) != 2 {
		t.Fatal("Removed did not remove")
	}
	must(t, x.Removed("unknown", 16, p...))
}

func TestClearedAndRemoveEndpoint(t *testing.T) {
	x := mustIndex(t, IndexConfig{MaxEndpoints: 2})
	p := chainOf(1, 4)
	must(t, x.Stored("a", 16, p...))
	must(t, x.SetCapacity("a", 100))
	must(t, x.Record("b", p, t0))
	if err := x.Record("c", p, t0); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("third endpoint: %v, want ErrTooManyEndpoints", err)
	}
	x.Cleared("a")
	if x.Len("a") != 0 || x.Capacity("a") != 100 {
		t.Fatalf("Cleared: Len %d Capacity %d, want 0 and 100", x.Len("a"), x.Capacity("a"))
	}
	if got := asMap(t, x.Match(p, t0, nil)); !maps.Equal(got, map[string]int{"b": 4}) {
		t.Fatalf("after Cleared: %v", got)
	}
	x.Cleared("unknown")
	x.RemoveEndpoint("b")
	x.RemoveEndpoint("unknown")
	if got := x.Match(p, t0, nil); len(got) != 0 {
		t.Fatalf("after RemoveEndpoint: %v", got)
	}
	must(t, x.Record("c", p, t0)) // room again
	if x.MatchLen("c", p, t0) != 4 || x.Capacity("b") != 0 {
		t.Fatal("slot not reused cleanly")
	}
	if err := x.Record("", p, t0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty key: %v, want ErrInvalidArgument", err)
	}
	checkInvariants(t, x)
	x.mu.RLock()
	defer x.mu.RUnlock()
	if n := holderEntries(x); n != 4 {
		t.Fatalf("holder map has %d entries, want 4 (only c's blocks)", n)
	}
}

// TestManyEndpoints spans several 64-endpoint groups: endpoint i holds the
// first i%40 blocks of a shared prompt.
func TestManyEndpoints(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	p := chainOf(1, 40)
	want := map[string]int{}
	for i := 0; i < 300; i++ {
		must(t, x.Record(epName(i), p[:i%40], t0))
		if i%40 > 0 {
			want[epName(i)] = i % 40
		}
	}
	for i := 0; i < 300; i += 7 { // holes in the slot table
		x.RemoveEndpoint(epName(i))
		delete(want, epName(i))
	}
	if got := asMap(t, x.Match(p, t0, nil)); !maps.Equal(got, want) {
		t.Fatalf("Match over %d endpoints: got %d matches, want %d", len(want), len(got), len(want))
	}
	checkInvariants(t, x)
}

// TestGroupsNeverShareAHolderEntry stores, on an endpoint of the second
// group of 64, hashes chosen to collide with another group's block under a
// keying that mixes the group into the hash: each group's holders must
// stay its own, whatever hashes callers pass.
func TestGroupsNeverShareAHolderEntry(t *testing.T) {
	const ttl = time.Minute
	x := mustIndex(t, IndexConfig{TTL: ttl})
	for i := 0; i < 66; i++ {
		must(t, x.SetCapacity(epName(i), 8))
	}
	const h1 = 0x1234_5678_9abc_def0
	for w := uint64(1); w < 4; w++ {
		must(t, x.Stored(epName(65), x.BlockSize(), h1^w*0x9e3779b97f4a7c15, h1+w*0x9e3779b97f4a7c15))
	}
	must(t, x.Record(epName(0), []uint64{h1}, t0))
	if got, want := asMap(t, x.Match([]uint64{h1}, t0, nil)), map[string]int{epName(0): 1}; !maps.Equal(got, want) {
		t.Fatalf("Match = %v, want %v", got, want)
	}
	checkInvariants(t, x)
	x.RemoveEndpoint(epName(1))
	// A record after the first expired refreshes the holder entry.
	must(t, x.Record(epName(2), []uint64{h1}, t0.Add(2*ttl)))
	if got, want := asMap(t, x.Match([]uint64{h1}, t0.Add(2*ttl), nil)), map[string]int{epName(2): 1}; !maps.Equal(got, want) {
		t.Fatalf("Match after expiry = %v, want %v", got, want)
	}
	checkInvariants(t, x)
}

func TestTenantsNeverMatchEachOther(t *testing.T) {
	h := mustHasher(t, HasherConfig{})
	x := mustIndex(t, IndexConfig{BlockSize: h.BlockTokens()})
	prompt := seq(512, 1)
	alice := h.HashTokens(Salt{Model: "m", Tenant: "alice"}, prompt)
	bob := h.HashTokens(Salt{Model: "m", Tenant: "bob"}, prompt)
	must(t, x.Record("ep", alice, t0))
	if got := x.Match(bob, t0, nil); len(got) != 0 {
		t.Fatalf("bob matched alice's blocks: %v", got)
	}
	if got := x.MatchLen("ep", alice, t0); got != len(alice) {
		t.Fatalf("alice matched %d of %d", got, len(alice))
	}
	sh := mustHasher(t, HasherConfig{ShareAcrossTenants: true})
	must(t, x.Record("ep", sh.HashTokens(Salt{Model: "m", Tenant: "alice"}, prompt), t0))
	if got := x.MatchLen("ep", sh.HashTokens(Salt{Model: "m", Tenant: "bob"}, prompt), t0); got != len(alice) {
		t.Fatalf("shared tenants matched %d of %d", got, len(alice))
	}
}

// TestCapacityUnderDistinctBlocks feeds 10M distinct blocks (1M with
// -short, 2M under the race detector, which makes it ten times slower and
// has nothing to find in one goroutine) and checks that no endpoint ever
// holds more than its capacity and that the holder map stays bounded.
func TestCapacityUnderDistinctBlocks(t *testing.T) {
	total := 10_000_000
	switch {
	case testing.Short():
		total = 1_000_000
	case raceEnabled:
		total = 2_000_000
	}
	const capacity = 1000
	x := mustIndex(t, IndexConfig{Capacity: capacity})
	eps := []string{"a", "b", "c", "d"}
	batch := make([]uint64, 500)
	next := uint64(0)
	for n := 0; n < total; n += len(batch) {
		for i := range batch {
			next++
			batch[i] = next * 0x9e3779b97f4a7c15
		}
		ep := eps[(n/len(batch))%len(eps)]
		if n%3 == 0 {
			must(t, x.Stored(ep, 16, batch...))
		} else {
			must(t, x.Record(ep, batch, t0))
		}
		if got := x.Len(ep); got > capacity {
			t.Fatalf("after %d blocks: Len(%s) = %d > capacity %d", n, ep, got, capacity)
		}
	}
	x.mu.RLock()
	held := holderEntries(x)
	x.mu.RUnlock()
	if held > len(eps)*capacity {
		t.Fatalf("holder map has %d entries > %d", held, len(eps)*capacity)
	}
	checkInvariants(t, x)
}

func TestConcurrentUse(t *testing.T) {
	x := mustIndex(t, IndexConfig{Capacity: 64, MaxEndpoints: 100})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Match
			for i := 0; i < 2000; i++ {
				p := chainOf(uint64(i%13), 1+i%20)
				ep := epName((g*31 + i) % 90)
				now := t0.Add(time.Duration(i) * time.Millisecond)
				switch i % 6 {
				case 0, 1:
					_ = x.Record(ep, p, now)
				case 2:
					_ = x.Stored(ep, 16, p...)
				case 3:
					_ = x.Removed(ep, 16, p[len(p)/2:]...)
				case 4:
					dst = x.Match(p, now, dst[:0])
					_ = x.MatchLen(ep, p, now)
				case 5:
					if i%60 == 5 {
						x.RemoveEndpoint(ep)
					} else {
						_ = x.SetCapacity(ep, 1+i%100)
					}
				}
			}
		}()
	}
	wg.Wait()
	checkInvariants(t, x)
}

func TestMatchAllocs(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	p := chainOf(1, 64)
	for i := 0; i < 64; i++ {
		must(t, x.Record(epName(i), p[:1+i], t0))
	}
	dst := make([]Match, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		dst = x.Match(p, t0, dst[:0])
	}); n != 0 {
		t.Fatalf("Match with room in dst: %v allocs, want 0", n)
	}
	if len(dst) != 64 || dst[0].Blocks != 64 || dst[63].Blocks != 1 {
		t.Fatalf("unexpected matches: first %v last %v", dst[0], dst[len(dst)-1])
	}
}

// TestMatchReadAhead checks Match on an index large enough for it to read
// blocks ahead (see matchAheadEntries) against MatchLen, endpoint by
// endpoint: prompts whose matches end on either side of the bounds of the
// windows read ahead, in three groups of endpoints, with blocks recorded,
// reported by events and expired. Then it checks that such a Match does
// not allocate when dst has room.
func TestMatchReadAhead(t *testing.T) {
	const endpoints = 150
	x := mustIndex(t, IndexConfig{MaxEndpoints: endpoints})
	names := epNames(endpoints)
	a := chainOf(1, 100)
	b := append(slices.Clone(a[:30]), chainOf(2, 70)...) // shares a's first 30 blocks
	prompts := [][]uint64{a, b, a[:9], a[:1]}
	ends := []int{0, 1, 2, 8, 9, 10, 24, 25, 26, 40, 41, 42, 56, 57, 99, 100}
	r := rand.New(rand.NewPCG(5, 6))
	held := func() []uint64 {
		p := prompts[r.IntN(2)]
		return p[:ends[r.IntN(len(ends))]]
	}
	// A third of the endpoints recorded blocks a TTL before the others:
	// those that are not recorded again expire between the records and
	// the matches.
	early, now := t0.Add(time.Second-DefaultTTL), t0.Add(2*time.Second)
	for i, ep := range names {
		if i%3 == 0 {
			must(t, x.Record(ep, held(), early))
		}
	}
	per := matchAheadEntries/endpoints + 1
	for i, ep := range names {
		must(t, x.Record(ep, chainOf(uint64(1000+i), per), t0)) // filler
		switch i % 4 {
		case 0, 1:
			must(t, x.Record(ep, held(), t0))
		case 2:
			must(t, x.Stored(ep, DefaultBlockTokens, held()...))
		}
	}
	if entries := x.holders.len(); entries < x.aheadEntries {
		t.Fatalf("%d holder entries, fewer than the %d that make Match read ahead", entries, x.aheadEntries)
	}
	for _, p := range append(prompts, a[:2], a[:25], a[:26], a[:57], b[:31]) {
		want := map[string]int{}
		for _, ep := range names {
			if n := x.MatchLen(ep, p, now); n > 0 {
				want[ep] = n
			}
		}
		if got := asMap(t, x.Match(p, now, nil)); !maps.Equal(got, want) {
			t.Fatalf("Match of %d blocks = %v, want %v", len(p), got, want)
		}
	}
	if raceEnabled {
		return // allocation counts are meaningless under the race detector
	}
	dst := make([]Match, 0, endpoints)
	if n := testing.AllocsPerRun(20, func() {
		dst = x.Match(a, now, dst[:0])
	}); n != 0 {
		t.Fatalf("Match with room in dst: %v allocs, want 0", n)
	}
}

// TestRecordAllocs checks that recording new blocks on an endpoint at its
// capacity, each evicting an old one, allocates nothing, and neither do the
// KV events that store and remove blocks. (The capacity is large enough
// that the holder table's shards, about 128 entries each, stay within the
// bounds that resize them.)
func TestRecordAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // as testing.AllocsPerRun
	// The small capacities leave 2 and 8 holder entries a shard, so that
	// shards keep crossing the bounds that grow and shrink them; 8192
	// leaves 128.
	for _, capacity := range []int{128, 512, 8192} {
		x := mustIndex(t, IndexConfig{Capacity: capacity})
		names := epNames(4)
		prompt := make([]uint64, 64)
		i := 0
		step := func() {
			i++
			for j := range prompt {
				prompt[j] = uint64(i)<<20 | uint64(j)
			}
			must(t, x.Record(names[i%4], prompt, t0.Add(time.Duration(i)*time.Millisecond)))
			must(t, x.Stored(names[(i+1)%4], 16, prompt[:8]...))
			must(t, x.Removed(names[(i+1)%4], 16, prompt[:4]...))
		}
		// Every endpoint full, twice over, and a few thousand records:
		// a shard still allocates when it reaches a size it never had,
		// which becomes rare once each has seen its usual peaks.
		for range max(4*2*capacity/len(prompt), 5000) {
			step()
		}
		// Counted over all 200 steps, not per step as AllocsPerRun
		// does, which truncates up to 199 allocations to 0.
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for range 200 {
			step()
		}
		runtime.ReadMemStats(&m1)
		if n := m1.Mallocs - m0.Mallocs; n > 10 {
			t.Fatalf("capacity %d: 200 Records, Storeds and Removeds at capacity allocated %d times, want at most 10", capacity, n)
		}
		for _, name := range names {
			if got := x.Len(name); got > capacity || got < capacity-len(prompt) {
				t.Fatalf("%s holds %d blocks, want about its capacity %d", name, got, capacity)
			}
		}
		if got := x.MatchLen(names[i%4], prompt, t0.Add(time.Duration(i)*time.Millisecond)); got != len(prompt) {
			t.Fatalf("the last prompt recorded matches %d blocks, want %d", got, len(prompt))
		}
		checkInvariants(t, x)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestEventsOnly(t *testing.T) {
	if mustIndex(t, IndexConfig{}).EventsOnly() {
		t.Fatal("the zero IndexConfig is events-only")
	}
	x := mustIndex(t, IndexConfig{BlockSize: 16, EventsOnly: true})
	if !x.EventsOnly() {
		t.Fatal("EventsOnly() = false for an events-only index")
	}
	p := chainOf(7, 6)
	must(t, x.Record("a", p, t0))
	if n := x.MatchLen("a", p, t0); n != 0 {
		t.Fatalf("events-only index matched %d recorded blocks, want 0", n)
	}
	if err := x.Record("", p, t0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Record with an empty key: %v, want ErrInvalidArgument", err)
	}
	must(t, x.Stored("a", 16, p[:4]...))
	must(t, x.Record("a", p, t0)) // must not extend what the events said
	if n := x.MatchLen("a", p, t0.Add(time.Hour)); n != 4 {
		t.Fatalf("matched %d blocks after Stored of 4, want 4", n)
	}
	must(t, x.Removed("a", 16, p[1]))
	if n := x.MatchLen("a", p, t0); n != 1 {
		t.Fatalf("matched %d blocks after Removed of the second, want 1", n)
	}
}

// TestRecordAgain checks that recording blocks an endpoint already holds
// at the front of its LRU (which Record skips) behaves exactly as touching
// them would: a prompt recorded again after another one becomes the most
// recently used again, and an expiry past its slack is extended.
func TestRecordAgain(t *testing.T) {
	x := mustIndex(t, IndexConfig{Capacity: 4})
	a, b, c := chainOf(1, 2), chainOf(2, 2), chainOf(3, 2)
	must(t, x.Record("e", a, t0))
	must(t, x.Record("e", a, t0)) // nothing changed since: skipped
	must(t, x.Record("e", b, t0))
	must(t, x.Record("e", a, t0)) // b came in between: a is the most recent again
	must(t, x.Record("e", c, t0)) // evicts the two least recent blocks: b's
	if got := x.MatchLen("e", a, t0); got != 2 {
		t.Fatalf("a recorded again after b: MatchLen %d, want 2", got)
	}
	if got := x.MatchLen("e", b, t0); got != 0 {
		t.Fatalf("b, the least recently recorded: MatchLen %d, want 0", got)
	}
	// An engine event in between changes the endpoint's blocks: recording
	// a again restores them.
	must(t, x.Record("e", a, t0))
	must(t, x.Removed("e", 16, a[0]))
	must(t, x.Record("e", a, t0))
	if got := x.MatchLen("e", a, t0); got != 2 {
		t.Fatalf("a recorded again after its head was removed: MatchLen %d, want 2", got)
	}
	checkInvariants(t, x)

	y := mustIndex(t, IndexConfig{TTL: time.Minute})
	must(t, y.Record("e", a, t0))
	must(t, y.Record("e", a, t0.Add(30*time.Second))) // past the slack: extends the expiry
	if got := y.MatchLen("e", a, t0.Add(80*time.Second)); got != 2 {
		t.Fatalf("recorded again at 30 s with a 1 min TTL: MatchLen at 80 s = %d, want 2", got)
	}
	if got := y.MatchLen("e", a, t0.Add(91*time.Second)); got != 0 {
		t.Fatalf("MatchLen at 91 s = %d, want 0 (expired)", got)
	}
	checkInvariants(t, y)
}

// TestTTLWallClockStep checks that recorded blocks expire on the monotonic
// clock when the times carry it: a step of the wall clock neither expires
// them at once nor keeps them past their TTL.
func TestTTLWallClockStep(t *testing.T) {
	clock, ok := timeline.NewTestClock()
	if !ok {
		t.Skip("time.Time is not laid out as timeline.StepWall expects")
	}
	x := mustIndex(t, IndexConfig{TTL: time.Minute})
	p := chainOf(1, 4)
	must(t, x.Record("a", p, clock.Now()))
	clock.StepWall(time.Hour)
	clock.Advance(30 * time.Second)
	if got := x.MatchLen("a", p, clock.Now()); got != 4 {
		t.Errorf("30 s after recording, the wall clock stepped an hour ahead: MatchLen = %d, want 4", got)
	}
	clock.StepWall(-2 * time.Hour)
	clock.Advance(30 * time.Second)
	if got := x.MatchLen("a", p, clock.Now()); got != 0 {
		t.Errorf("60 s after recording, the wall clock stepped back: MatchLen = %d, want 0 (expired)", got)
	}
}

// TestEventsOutlastEveryTime checks that blocks reported by engine events
// match at every time, the largest one included, and that a Record or
// Match at that time leaves them matching afterwards.
func TestEventsOutlastEveryTime(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	p := chainOf(1, 4)
	must(t, x.Stored("a", 16, p...))
	end := time.Unix(0, math.MaxInt64)
	if got := asMap(t, x.Match(p, end, nil)); !maps.Equal(got, map[string]int{"a": 4}) {
		t.Errorf("Match at %v = %v, want a: 4", end, got)
	}
	must(t, x.Record("b", p, end)) // refreshes the holder entries at that time
	for _, now := range []time.Time{t0, end} {
		if got := asMap(t, x.Match(p, now, nil)); got["a"] != 4 {
			t.Errorf("after a Record at %v: Match at %v = %v, want a: 4", end, now, got)
		}
		if got := x.MatchLen("a", p, now); got != 4 {
			t.Errorf("after a Record at %v: MatchLen(a) at %v = %d, want 4", end, now, got)
		}
	}
	checkInvariants(t, x)
}

// TestRecordDropsExpiredBlocks checks that an endpoint's blocks follow what
// was recorded within the TTL: records after the TTL drop the expired
// blocks, a bounded number per call, while blocks reported by events and
// blocks still within the TTL stay.
func TestRecordDropsExpiredBlocks(t *testing.T) {
	ttl := time.Minute
	x := mustIndex(t, IndexConfig{TTL: ttl, Capacity: 10000})
	old := chainOf(1, 1000)
	must(t, x.Record("a", old, t0))
	must(t, x.Stored("a", x.BlockSize(), chainOf(9, 3)...))
	if got := x.Len("a"); got != 1003 {
		t.Fatalf("Len = %d, want 1003", got)
	}
	fresh := chainOf(2, 4)
	at := t0.Add(ttl)
	must(t, x.Record("a", fresh, at))
	// One record drops at most its own blocks plus expiredBatch.
	if got, want := x.Len("a"), 1003-(4+expiredBatch)+4; got != want {
		t.Fatalf("after one record past the TTL: Len = %d, want %d", got, want)
	}
	for i := range 100 {
		must(t, x.Record("a", chainOf(uint64(1000+i), 4), at))
	}
	// Every expired block is gone; the 3 stored ones, now at the least
	// recently used end, never expire.
	if got, want := x.Len("a"), 3+101*4; got != want {
		t.Fatalf("after 101 records past the TTL: Len = %d, want %d", got, want)
	}
	if x.MatchLen("a", chainOf(9, 3), at) != 3 || x.MatchLen("a", fresh, at) != 4 {
		t.Fatal("a stored or unexpired block was dropped")
	}
	checkInvariants(t, x)
}

// TestRecordAgainCraftedPrompt checks that a Record is skipped only for the
// blocks the endpoint's previous Record gave it, not for other blocks
// crafted to share their fingerprint. The pairs below differ in their first
// two hashes by constants that cancel in an unkeyed multiply-xorshift
// fingerprint (and in one keyed only by its starting value) whatever the
// hashes, so that a client choosing its prompt could make the index skip
// recording it where it was sent.
func TestRecordAgainCraftedPrompt(t *testing.T) {
	for i := range uint64(8) {
		x := mustIndex(t, IndexConfig{})
		a := chainOf(1+i, 2+int(i))
		b := append([]uint64{}, a...)
		b[0] ^= 1 << 63
		b[1] ^= 1<<63 | 1<<34
		must(t, x.Record("e", a, t0))
		must(t, x.Record("e", b, t0))
		if got := x.MatchLen("e", b, t0); got != len(b) {
			t.Fatalf("pair %d: the second prompt recorded matches %d blocks, want %d", i, got, len(b))
		}
		if got := x.MatchLen("e", a, t0); got != len(a) {
			t.Fatalf("pair %d: the first prompt matches %d blocks, want %d", i, got, len(a))
		}
		// The same prompt recorded again is still skipped, from its
		// second repeat on: the first marks its blocks (see Unrecord).
		must(t, x.Record("e", b, t0))
		gen := x.endpoints["e"].gen
		must(t, x.Record("e", b, t0))
		if x.endpoints["e"].gen != gen {
			t.Fatalf("pair %d: the second prompt recorded again was not skipped", i)
		}
		checkInvariants(t, x)
	}
}

// TestReadAheadKeepsResults applies the same random records, engine events
// and matches to an index that reads ahead as a large one does and to one
// that never does, with prompts long enough that a Record drops its expired
// blocks in several chunks and endpoints at their capacity evict, and
// checks that both hold the same blocks, in the same order and with the
// same expiries, and match alike.
func TestReadAheadKeepsResults(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	cfg := IndexConfig{Capacity: 300, TTL: time.Second, MaxEndpoints: 140}
	ahead, plain := mustIndex(t, cfg), mustIndex(t, cfg)
	ahead.aheadEntries, plain.aheadEntries = 0, math.MaxInt
	names := epNames(140)
	now := t0
	for op := range 4000 {
		now = now.Add(time.Duration(r.IntN(120)) * time.Millisecond)
		// Most operations on a few endpoints, so that each holds blocks
		// that expire while it is recorded again; the others spread the
		// holders over three groups of 64.
		ep := names[r.IntN(4)*64/4]
		if r.IntN(3) == 0 {
			ep = names[r.IntN(len(names))]
		}
		blocks := chainOf(uint64(r.IntN(40)), 1+r.IntN(150))
		switch r.IntN(5) {
		case 0, 1, 2:
			must(t, ahead.Record(ep, blocks, now))
			must(t, plain.Record(ep, blocks, now))
		case 3:
			to := r.IntN(len(blocks))
			must(t, ahead.Stored(ep, DefaultBlockTokens, blocks[:to]...))
			must(t, plain.Stored(ep, DefaultBlockTokens, blocks[:to]...))
		case 4:
			from := r.IntN(len(blocks))
			must(t, ahead.Removed(ep, DefaultBlockTokens, blocks[from:]...))
			must(t, plain.Removed(ep, DefaultBlockTokens, blocks[from:]...))
		}
		if got, want := ahead.Match(blocks, now, nil), plain.Match(blocks, now, nil); !maps.Equal(asMap(t, got), asMap(t, want)) {
			t.Fatalf("op %d: Match = %v, without reading ahead %v", op, got, want)
		}
		if op%100 != 0 {
			continue
		}
		for _, ep := range names {
			a, p := ahead.endpoints[ep], plain.endpoints[ep]
			if (a == nil) != (p == nil) {
				t.Fatalf("op %d: endpoint %s tracked %v, without reading ahead %v", op, ep, a != nil, p != nil)
			}
			if a == nil {
				continue
			}
			ka, kp := a.lru.Keys(), p.lru.Keys()
			if !slices.Equal(ka, kp) {
				t.Fatalf("op %d: endpoint %s holds %d blocks, without reading ahead %d (or others)", op, ep, len(ka), len(kp))
			}
			for _, h := range ka {
				va, _ := a.lru.Peek(h)
				vp, _ := p.lru.Peek(h)
				if va != vp {
					t.Fatalf("op %d: endpoint %s block %x expires at %d, without reading ahead %d", op, ep, h, va, vp)
				}
			}
		}
	}
	checkInvariants(t, ahead)
}
