package llmlb

import (
	"context"
	"strconv"
	"testing"
)

// benchPolicies are the policies of this package measured by BenchmarkPick;
// each entry builds a fresh policy.
var benchPolicies = []struct {
	name string
	new  func() Policy
}{
	{"round-robin", RoundRobin},
	{"random", Random},
	{"p2c", func() Policy { return P2C(nil) }},
	{"least-outstanding", LeastOutstanding},
	{"least-tokens", LeastTokens},
	{"least-kv", LeastKV},
	{"weighted-least-request", func() Policy { p, _ := WeightedLeastRequest(1); return p }},
}

// BenchmarkPick measures one Pick plus Done per iteration.
func BenchmarkPick(b *testing.B) {
	ctx := context.Background()
	for _, pol := range benchPolicies {
		for _, n := range []int{8, 64, 512} {
			b.Run("policy="+pol.name+"/endpoints="+strconv.Itoa(n), func(b *testing.B) {
				bal, err := New(pol.new())
				if err != nil {
					b.Fatal(err)
				}
				if err := bal.Update(eps(n)); err != nil {
					b.Fatal(err)
				}
				req := &Request{PromptTokens: 1000, MaxTokens: 256}
				b.ReportAllocs()
				for b.Loop() {
					p, err := bal.Pick(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(nil)
				}
			})
		}
	}
}

// BenchmarkPickParallel measures Pick plus Done from GOMAXPROCS goroutines
// on one balancer; compare -cpu 1 and -cpu 2.
func BenchmarkPickParallel(b *testing.B) {
	ctx := context.Background()
	for _, pol := range benchPolicies[:4] {
		b.Run("policy="+pol.name+"/endpoints=64", func(b *testing.B) {
			bal, _ := New(pol.new())
			_ = bal.Update(eps(64))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := &Request{PromptTokens: 1000, MaxTokens: 256}
				for pb.Next() {
					p, err := bal.Pick(ctx, req)
					if err != nil {
						b.Error(err)
						return
					}
					p.Done(nil)
				}
			})
		})
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	ctx := context.Background()
	for _, pol := range benchPolicies {
		if pol.name == "weighted-least-request" {
			continue // allocates its credit slice once per membership
		}
		bal, _ := New(pol.new())
		_ = bal.Update(eps(64))
		req := &Request{PromptTokens: 1000, MaxTokens: 256, Exclude: []string{"ep3"}}
		allocs := testing.AllocsPerRun(1000, func() {
			p, err := bal.Pick(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			p.FirstToken()
			p.Done(nil)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per Pick+FirstToken+Done, want 0", pol.name, allocs)
		}
	}
}
