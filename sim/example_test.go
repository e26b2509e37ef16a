package sim_test

import (
	"context"
	"fmt"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// Two requests share a 512-token prompt; the second, arriving after the
// first finished, is served from the replica's prefix cache.
func ExampleSimulate() {
	prefix := make([]uint64, 8) // 8 blocks of 64 tokens
	var h uint64
	for i := range prefix {
		h = sim.ChainHash(h, uint64(i))
		prefix[i] = h
	}
	reqs := []sim.Request{
		{PromptTokens: 512, OutputTokens: 4, BlockTokens: 64, Prefix: prefix},
		{Arrival: time.Second, PromptTokens: 512, OutputTokens: 4, BlockTokens: 64, Prefix: prefix},
	}
	res, err := sim.Simulate(context.Background(), sim.Config{Replicas: 1}, reqs, "least-outstanding")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("completed %d, prefix hit rate %.4f\n", res.Completed, res.PrefixHitRate)
	fmt.Printf("TTFT cold %.1f ms, cached %.1f ms\n", res.TTFT.Max, res.TTFT.P50)
	// Output:
	// completed 2, prefix hit rate 0.4375
	// TTFT cold 24.4 ms, cached 17.5 ms
}
