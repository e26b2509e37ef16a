package prefix

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPrefixMatch matches a prompt of `blocks` blocks against
// `endpoints` endpoints, endpoint i holding the first (i+1)*blocks/endpoints
// blocks of the prompt. With filled=N each endpoint also holds N unrelated
// blocks, so that the index no longer fits in the CPU caches, though the
// prompt's own entries, read at every Match, stay cached; see
// BenchmarkPrefixMatchLarge for an index whose entries do not.
func BenchmarkPrefixMatch(b *testing.B) {
	for _, bc := range []struct{ blocks, endpoints, filled int }{
		{512, 64, 0},
		{512, 64, 8192},
		{512, 256, 0},
		{8192, 64, 0},
	} {
		name := fmt.Sprintf("blocks=%d/endpoints=%d", bc.blocks, bc.endpoints)
		if bc.filled > 0 {
			name += fmt.Sprintf("/filled=%d", bc.filled)
		}
		b.Run(name, func(b *testing.B) {
			x := mustIndex(b, IndexConfig{})
			prompt := chainOf(1, bc.blocks)
			for i := 0; i < bc.endpoints; i++ {
				ep := epName(i)
				if bc.filled > 0 {
					must(b, x.Record(ep, chainOf(uint64(100+i), bc.filled), t0))
				}
				must(b, x.Record(ep, prompt[:(i+1)*bc.blocks/bc.endpoints], t0))
			}
			now := t0.Add(time.Second)
			dst := make([]Match, 0, bc.endpoints)
			b.ReportAllocs()
			for b.Loop() {
				dst = x.Match(prompt, now, dst[:0])
			}
			if len(dst) != bc.endpoints || dst[0].Blocks != bc.blocks {
				b.Fatalf("unexpected result: %d matches, longest %v", len(dst), dst[0])
			}
		})
	}
}

// BenchmarkPrefixMatchParallel is BenchmarkPrefixMatch with 64 endpoints
// and 512 blocks from all goroutines at once: Match takes only the read
// lock.
func BenchmarkPrefixMatchParallel(b *testing.B) {
	x := mustIndex(b, IndexConfig{})
	prompt := chainOf(1, 512)
	for i := 0; i < 64; i++ {
		must(b, x.Record(epName(i), prompt[:(i+1)*8], t0))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]Match, 0, 64)
		for pb.Next() {
			dst = x.Match(prompt, t0, dst[:0])
		}
	})
}

// BenchmarkPrefixMatchLarge matches prompts against an index far larger
// than the processor's caches, as a router in front of hundreds of
// replicas holds: 512 endpoints (8 groups of 64), each prompt held by one
// endpoint of every group, for `matched` blocks in half of the groups and
// half as many in the others, and longer than that, so that Match walks
// matched+1 blocks and stops. The prompts are matched in turn and are too
// many to stay cached, so that the holder entries Match reads are cache
// misses, as they are at scale. Every Match takes the same branches, so
// the processor runs further ahead of the walk than in a router, whose
// matches end at varying blocks; the benchmark understates what reading
// ahead gains there.
func BenchmarkPrefixMatchLarge(b *testing.B) {
	const endpoints = 512
	for _, bc := range []struct{ matched, prompts int }{
		{8, 1 << 16},
		{32, 1 << 14},
	} {
		b.Run(fmt.Sprintf("endpoints=%d/matched=%d", endpoints, bc.matched), func(b *testing.B) {
			x := mustIndex(b, IndexConfig{Capacity: 1 << 16})
			names := epNames(endpoints)
			n := 2 * bc.matched
			prompts := make([]uint64, 0, bc.prompts*n)
			for p := range bc.prompts {
				prompt := chainOf(uint64(p+1), n)
				prompts = append(prompts, prompt...)
				for g := range endpoints / 64 {
					held := bc.matched >> (g % 2)
					must(b, x.Record(names[64*g+(7*p+g)%64], prompt[:held], t0))
				}
			}
			now := t0.Add(time.Second)
			dst := make([]Match, 0, endpoints)
			b.ReportAllocs()
			p := 0
			for b.Loop() {
				dst = x.Match(prompts[p*n:(p+1)*n], now, dst[:0])
				if p++; p == bc.prompts {
					p = 0
				}
			}
			if len(dst) != endpoints/64 || dst[0].Blocks != bc.matched || dst[len(dst)-1].Blocks != bc.matched/2 {
				b.Fatalf("unexpected result: %v", dst)
			}
		})
	}
}

// BenchmarkRecord records a 256-block prompt (4096 tokens) whose head is
// shared with earlier prompts and whose tail is new, on one of 64 endpoints
// at capacity: the steady state of a router feeding the index from its
// decisions.
func BenchmarkRecord(b *testing.B) {
	x := mustIndex(b, IndexConfig{Capacity: 4096})
	head := chainOf(1, 128)
	prompt := make([]uint64, 256)
	copy(prompt, head)
	names := epNames(64)
	b.ReportAllocs()
	b.SetBytes(int64(len(prompt)) * 16 * 4) // token bytes covered
	i := 0
	for b.Loop() {
		i++
		for j := 128; j < 256; j++ {
			prompt[j] = uint64(i)<<20 | uint64(j)
		}
		if err := x.Record(names[i%64], prompt, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStored applies a 32-block KV event on one of 64 endpoints.
func BenchmarkStored(b *testing.B) {
	x := mustIndex(b, IndexConfig{Capacity: 4096})
	blocks := make([]uint64, 32)
	names := epNames(64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		for j := range blocks {
			blocks[j] = uint64(i)<<20 | uint64(j)
		}
		if err := x.Stored(names[i%64], 16, blocks...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordRepeat records the same 256-block prompt again and again on
// one endpoint: the cost of touching blocks already held, the common case
// of a popular prefix.
func BenchmarkRecordRepeat(b *testing.B) {
	x := mustIndex(b, IndexConfig{})
	prompt := chainOf(1, 256)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := x.Record("a", prompt, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordLarge records prompts of 32 new blocks each on an index
// far larger than the processor's caches, as a router in front of hundreds
// of replicas holds: 512 endpoints, one after another, with the TTL
// holding the last 40,000 records (1.3 million blocks, over 100 MB). Each
// Record drops as many expired blocks as it adds, so that it costs what a
// router's Record costs in its steady state: every block's holder entry,
// table slot and node, and those of the blocks it drops, are likely cache
// misses.
func BenchmarkRecordLarge(b *testing.B) {
	const endpoints, blocks, live = 512, 32, 40_000
	x := mustIndex(b, IndexConfig{TTL: time.Duration(live) * time.Millisecond})
	names := epNames(endpoints)
	prompt := make([]uint64, blocks)
	i := 0
	step := func() {
		i++
		for j := range prompt {
			prompt[j] = (uint64(i)<<8 | uint64(j)) * 0x9e3779b97f4a7c15
		}
		if err := x.Record(names[(i*7)%endpoints], prompt, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
	for range 2 * live {
		step()
	}
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}

// BenchmarkStoredLarge applies one engine event storing one new block on
// each of 512 endpoints in turn, each at its capacity of 2048 blocks (a
// million blocks in all, about 100 MB of index), so that each event evicts
// the endpoint's least recently used block: the steady state of an index
// fed by the KV events of a large cluster.
func BenchmarkStoredLarge(b *testing.B) {
	const endpoints, capacity = 512, 2048
	x := mustIndex(b, IndexConfig{Capacity: capacity})
	names := epNames(endpoints)
	i := 0
	step := func() {
		i++
		if err := x.Stored(names[(i*7)%endpoints], DefaultBlockTokens, uint64(i)*0x9e3779b97f4a7c15); err != nil {
			b.Fatal(err)
		}
	}
	for range endpoints * capacity * 3 / 2 {
		step()
	}
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}

// BenchmarkRemovedLarge applies an engine event removing 8 blocks held
// across the middle of an endpoint's LRU and one storing 8 new ones, on
// each of 512 endpoints in turn, each holding about 2048 blocks (a million
// in all): the blocks removed are likely cache misses, as in an index fed
// by the KV events of a large cluster.
func BenchmarkRemovedLarge(b *testing.B) {
	const endpoints, held, batch = 512, 2048, 8
	x := mustIndex(b, IndexConfig{Capacity: 2 * held})
	names := epNames(endpoints)
	blocks := make([][]uint64, endpoints) // held by each endpoint, oldest first
	next := uint64(0)
	store := func(e int) {
		start := len(blocks[e])
		for range batch {
			next++
			blocks[e] = append(blocks[e], next*0x9e3779b97f4a7c15)
		}
		if err := x.Stored(names[e], DefaultBlockTokens, blocks[e][start:]...); err != nil {
			b.Fatal(err)
		}
	}
	for e := range endpoints {
		for range held / batch {
			store(e)
		}
	}
	i := 0
	step := func() {
		i++
		e := (i * 7) % endpoints
		held := blocks[e]
		at := (i * 13) % (len(held) - batch)
		if err := x.Removed(names[e], DefaultBlockTokens, held[at:at+batch]...); err != nil {
			b.Fatal(err)
		}
		blocks[e] = append(held[:at], held[at+batch:]...)
		store(e)
	}
	for range 4 * endpoints {
		step()
	}
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}
