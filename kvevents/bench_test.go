package kvevents

import (
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// BenchmarkIngest measures a subscription's work per block, without the
// network: decoding vLLM batches, translating the engine's hashes into the
// router's and applying them to the index. Each batch stores a 16-block
// prompt (block size 16) continuing the previous one's chain and removes
// the blocks stored 64 batches earlier, as an engine at steady state does.
// The target is a million blocks per second per core.
func BenchmarkIngest(b *testing.B) {
	const (
		block  = 16
		blocks = 16 // per batch
		batch  = 256
	)
	h, _ := prefix.NewHasher(prefix.HasherConfig{BlockTokens: block})
	idx, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: block, EventsOnly: true})
	var st counters
	tr := newTranslator("e", idx, h, prefix.Salt{Model: "m"}, DefaultMaxBlocks, &st)
	// Precompute batch payloads: prompt p continues prompt p-1.
	payloads := make([][]byte, batch)
	tokens := make([]uint32, blocks*block)
	for p := range payloads {
		for i := range tokens {
			tokens[i] = uint32(p*len(tokens) + i)
		}
		ev := Event{Kind: Stored, BlockSize: block, Medium: "GPU", TokenIDs: tokens}
		for i := range blocks {
			ev.BlockHashes = append(ev.BlockHashes, uint64(p*blocks+i+1))
		}
		if p > 0 {
			ev.Parent, ev.HasParent = uint64(p*blocks), true
		}
		events := []Event{ev}
		if p >= 64 {
			rm := Event{Kind: Removed, Medium: "GPU"}
			for i := range blocks {
				rm.BlockHashes = append(rm.BlockHashes, uint64((p-64)*blocks+i+1))
			}
			events = append(events, rm)
		}
		payloads[p] = AppendBatch(nil, &Batch{TS: 1, Events: events, DPRank: 0})
	}
	var bt Batch
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p := i % batch
		if p == 0 {
			tr.clear() // the chain starts again at prompt 0
		}
		if err := DecodeBatch(&bt, payloads[p]); err != nil {
			b.Fatal(err)
		}
		tr.apply(&bt)
	}
	b.StopTimer()
	if st.skipped.Load() != 0 {
		b.Fatalf("%d blocks skipped", st.skipped.Load())
	}
	b.ReportMetric(float64(st.stored.Load())/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(st.stored.Load()), "ns/block")
}
