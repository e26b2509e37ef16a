package prefix

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPrefixMatch matches a prompt of `blocks` blocks against
// `endpoints` endpoints, endpoint i holding the first (i+1)*blocks/endpoints
// blocks of the prompt. With filled=N each endpoint also holds N unrelated
// blocks, so the index no longer fits in the CPU caches and each block's
// lookup costs a cache miss.
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
