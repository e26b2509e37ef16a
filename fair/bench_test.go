package fair

import (
	"context"
	"runtime"
	"strconv"
	"testing"
)

// BenchmarkAdmitDone measures one admission and its release: uncontended
// (the capacity is never used up, nothing waits) and contended (parallel
// callers against a cap of half the processors, so that about half of them
// wait and are woken by releases), over a few principals and classes.
func BenchmarkAdmitDone(b *testing.B) {
	b.Run("contention=none", func(b *testing.B) {
		q, err := New(Config{MaxInFlight: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			tk, err := q.Admit(ctx, Request{Principal: "tenant", PromptTokens: 500})
			if err != nil {
				b.Fatal(err)
			}
			tk.Charge(1)
			tk.Done()
		}
	})
	for _, principals := range []int{4, 256} {
		b.Run("contention=parallel/principals="+strconv.Itoa(principals), func(b *testing.B) {
			q, err := New(Config{MaxInFlight: max(runtime.GOMAXPROCS(0)/2, 1), MaxWaiting: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			names := make([]string, principals)
			for i := range names {
				names[i] = "tenant-" + strconv.Itoa(i)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					tk, err := q.Admit(ctx, Request{Principal: names[i%principals], Class: Class(i%3 - 1), PromptTokens: 500})
					if err != nil {
						b.Error(err)
						return
					}
					tk.Charge(1)
					tk.Done()
				}
			})
		})
	}
}

// Admitting and releasing without contention allocates only the ticket.
func TestAdmitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	q, _ := newTestQueue(t, Config{MaxInFlight: 10})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		tk, _ := q.Admit(ctx, Request{Principal: "p", PromptTokens: 10})
		tk.Charge(3)
		tk.Done()
	})
	if allocs > 1 {
		t.Fatalf("%v allocations per admission, want 1 (the ticket)", allocs)
	}
}
