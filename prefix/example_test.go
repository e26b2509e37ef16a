package prefix_test

import (
	"fmt"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// A router hashes each prompt, asks the index where its head is cached,
// and records its decision so that the next prompt sharing the head goes to
// the same endpoint.
func Example() {
	h, err := prefix.NewHasher(prefix.HasherConfig{}) // 16 tokens a block
	if err != nil {
		panic(err)
	}
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: h.BlockTokens()})
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	salt := prefix.Salt{Model: "llama-3-8b", Tenant: "acme"}

	// A 64-token system prompt followed by two different questions.
	system := make([]uint32, 64)
	for i := range system {
		system[i] = uint32(1000 + i)
	}
	first := append(append([]uint32{}, system...), make([]uint32, 40)...)
	second := append(append([]uint32{}, system...), 7, 8, 9)

	// The first request went to 10.0.0.1.
	blocks := h.HashTokens(salt, first)
	fmt.Println("first prompt:", len(first), "tokens,", len(blocks), "full blocks")
	if err := idx.Record("10.0.0.1:8000", blocks, now); err != nil {
		panic(err)
	}

	// The second shares the 4 blocks of the system prompt.
	for _, m := range idx.Match(h.HashTokens(salt, second), now.Add(time.Second), nil) {
		fmt.Printf("%s holds %d blocks (%d tokens)\n", m.Endpoint, m.Blocks, m.Blocks*h.BlockTokens())
	}

	// Another tenant with the same prompt matches nothing.
	other := prefix.Salt{Model: "llama-3-8b", Tenant: "globex"}
	fmt.Println("other tenant matches:", len(idx.Match(h.HashTokens(other, second), now, nil)))

	// After the TTL the decision no longer counts.
	fmt.Println("after TTL:", idx.MatchLen("10.0.0.1:8000", blocks, now.Add(prefix.DefaultTTL)))
	// Output:
	// first prompt: 104 tokens, 6 full blocks
	// 10.0.0.1:8000 holds 4 blocks (64 tokens)
	// other tenant matches: 0
	// after TTL: 0
}

// Engine KV events feed the index precisely; their block size must match
// the index's.
func ExampleIndex_Stored() {
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
	if err != nil {
		panic(err)
	}
	// The caller has translated the engine's block hashes into the
	// router's chained hashes (see Index.Stored).
	blocks := []uint64{0x11, 0x22, 0x33}
	if err := idx.Stored("10.0.0.2:8000", 16, blocks...); err != nil {
		panic(err)
	}
	fmt.Println(idx.MatchLen("10.0.0.2:8000", blocks, time.Now()))

	err = idx.Stored("10.0.0.2:8000", 32, blocks...)
	fmt.Println(err)

	if err := idx.Removed("10.0.0.2:8000", 16, 0x22); err != nil {
		panic(err)
	}
	fmt.Println(idx.MatchLen("10.0.0.2:8000", blocks, time.Now()))
	// Output:
	// 3
	// prefix: block size mismatch: event block size 32, index block size 16
	// 1
}
