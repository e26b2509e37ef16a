package sim_test

import (
	"context"
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/sim"
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

// A replica driven by hand: each Plan decides an iteration, whose duration
// the caller waits for (here it only adds it up), and Finish applies it.
func ExampleReplica() {
	r, err := sim.NewReplica(sim.Engine{TokenBudget: 512})
	if err != nil {
		panic(err)
	}
	s := &sim.Sequence{PromptTokens: 1000, OutputTokens: 3}
	if err := r.Submit(s); err != nil {
		panic(err)
	}
	var elapsed time.Duration
	for {
		b, ok := r.Plan()
		if !ok {
			break
		}
		elapsed += r.Engine().IterTime(b)
		for _, q := range r.Finish() {
			fmt.Printf("token %d after %d ms (prefill %d, decode %d)\n", q.Generated(), elapsed.Milliseconds(), b.PrefillTokens, b.DecodeSeqs)
		}
	}
	fmt.Println("done:", s.Done())
	// Output:
	// token 1 after 48 ms (prefill 488, decode 0)
	// token 2 after 54 ms (prefill 0, decode 1)
	// token 3 after 60 ms (prefill 0, decode 1)
	// done: true
}
