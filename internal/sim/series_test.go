package sim

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// A request of MaxOutputTokens output tokens drains for hours of simulated
// time after the last arrival; the run's memory must not grow with that
// span (one sample of the outstanding-request series every interval) or
// with the tokens.
func TestLongOutputMemoryBounded(t *testing.T) {
	reqs := []Request{
		{PromptTokens: 100, OutputTokens: MaxOutputTokens},
		{Arrival: time.Second, PromptTokens: 100, OutputTokens: 10},
	}
	cfg := Config{Replicas: 2, Engine: Engine{KVBlocks: 2 * MaxOutputTokens / DefaultBlockSize}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := Simulate(context.Background(), cfg, reqs, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if res.Completed != 2 {
		t.Fatalf("completed %d, want 2", res.Completed)
	}
	// About 1 KiB per request, scrape and sample would do; a few bytes per
	// output token would already be several MiB.
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d output tokens over %.0f simulated seconds: %d KiB allocated, %d samples",
		MaxOutputTokens, res.SpanSeconds, alloc>>10, len(res.Series))
	if alloc > 4<<20 {
		t.Errorf("allocated %d KiB, want at most 4096 KiB", alloc>>10)
	}
	if len(res.Series) > maxSamples {
		t.Errorf("%d samples, want at most %d", len(res.Series), maxSamples)
	}
	for i := 1; i < len(res.Series); i++ {
		if d := res.Series[i].At - res.Series[i-1].At; d != res.Series[1].At-res.Series[0].At {
			t.Fatalf("samples %d and %d are %v apart, samples 0 and 1 %v", i-1, i, d, res.Series[1].At-res.Series[0].At)
		}
	}
}
