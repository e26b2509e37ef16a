package llmlb

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
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
	{"peak-ewma", func() Policy { p, _ := PeakEWMA(PeakEWMAConfig{}); return p }},
}

// BenchmarkPick measures one Pick plus Done per iteration: every
// count-based policy on 8, 64 and 512 endpoints, and the prefix-aware ones on
// 64 endpoints with a 4k-token prompt.
func BenchmarkPick(b *testing.B) {
	benchCacheAware(b)
	for _, pol := range benchPolicies {
		for _, n := range []int{8, 64, 512} {
			b.Run("policy="+pol.name+"/endpoints="+strconv.Itoa(n), func(b *testing.B) {
				benchPickLoop(b, benchBalancer(b, pol.new(), n), false)
			})
		}
	}
}

// BenchmarkPickExclude measures Pick plus Done with P2C on n endpoints for
// a request that excludes all but one, as a retry that has tried every
// other endpoint, or an endpoint picker given a subset of one, asks: the
// time should grow with n, not with its square.
func BenchmarkPickExclude(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{64, 4096} {
		b.Run("endpoints="+strconv.Itoa(n), func(b *testing.B) {
			bal := benchBalancer(b, P2C(nil), n)
			exclude := make([]string, n-1)
			for i := range exclude {
				exclude[i] = "ep" + strconv.Itoa(i+1)
			}
			req := &Request{PromptTokens: 1000, Exclude: exclude}
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

// BenchmarkPickFloor measures what any Pick plus Done on 64 endpoints must
// execute, without the rest of either, beside BenchmarkPick's round robin:
//
//   - turn: the next turn and its endpoint, all that grpc-go's round_robin
//     does per pick;
//   - accounting: the turn plus the locked instructions of the accounting
//     (two compare-and-swaps to charge the endpoint's packed counts, one to
//     end the handle's generation, two adds to release the counts) on a
//     record kept across iterations;
//   - accounting+pool: the same with the record taken from and returned to
//     the record pool, as every pick does.
//
// The ratio of accounting+pool to turn bounds how close round robin can
// come to grpc-go's round_robin without giving up Stats, idempotent handles
// or pooled records.
func BenchmarkPickFloor(b *testing.B) {
	bal := benchBalancer(b, RoundRobin(), 64)
	eps := bal.snap.Load().eps
	n := uint64(len(eps))
	var turn roundRobin
	b.Run("op=turn", func(b *testing.B) {
		b.ReportAllocs()
		var sink *epState
		for b.Loop() {
			sink = eps[(turn.next.Add(1)-1)%n]
		}
		_ = sink
	})
	account := func(rec *record, st *epState) {
		d1, d2, spill := st.charge(1000, 1000, 256)
		base := rec.state.Load() &^ phaseMask
		rec.state.CompareAndSwap(base|phasePicked, base+generationStep|phasePicked)
		st.release(d1, d2, spill, false)
	}
	b.Run("op=accounting", func(b *testing.B) {
		b.ReportAllocs()
		rec := recordPool.Get().(*record)
		defer recordPool.Put(rec)
		for b.Loop() {
			account(rec, eps[(turn.next.Add(1)-1)%n])
		}
	})
	b.Run("op=accounting+pool", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec := recordPool.Get().(*record)
			account(rec, eps[(turn.next.Add(1)-1)%n])
			recordPool.Put(rec)
		}
	})
	for _, st := range eps {
		if c := st.counts(); c != (counts{}) {
			b.Fatalf("the floor left counts %+v", c)
		}
	}
}

// BenchmarkPickFloorParallel runs BenchmarkPickFloor's accounting+pool from
// GOMAXPROCS goroutines (compare -cpu 1 and -cpu 2), on endpoints drawn at
// random from 64 as a random pick does, on endpoints taken in turn from one
// shared counter as round robin does, and on one endpoint of each
// goroutine's own, which no other goroutine touches. Drawn endpoints are
// shared: with two goroutines a charge finds its endpoint's counts last
// written by the other core about half the time. The gap between drawn and
// own is what sharing the counts costs, whatever the policy; the gap
// between drawn and in turn is what the shared turn costs.
func BenchmarkPickFloorParallel(b *testing.B) {
	bal := benchBalancer(b, RoundRobin(), 64)
	eps := bal.snap.Load().eps
	var next atomic.Uint64 // hands each goroutine its own endpoint
	account := func(st *epState) {
		rec := recordPool.Get().(*record)
		d1, d2, spill := st.charge(1000, 1000, 256)
		base := rec.state.Load() &^ phaseMask
		rec.state.CompareAndSwap(base|phasePicked, base+generationStep|phasePicked)
		st.release(d1, d2, spill, false)
		recordPool.Put(rec)
	}
	b.Run("endpoints=drawn", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				account(eps[rand.Uint64N(uint64(len(eps)))])
			}
		})
	})
	b.Run("endpoints=in-turn", func(b *testing.B) {
		b.ReportAllocs()
		var turn roundRobin
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				account(eps[(turn.next.Add(1)-1)%uint64(len(eps))])
			}
		})
	})
	b.Run("endpoints=own", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			// A distinct endpoint for each of up to 64 goroutines: each
			// endpoint's counts head an object larger than a cache line.
			st := eps[(next.Add(1)-1)%uint64(len(eps))]
			for pb.Next() {
				account(st)
			}
		})
	})
	for _, st := range eps {
		if c := st.counts(); c != (counts{}) {
			b.Fatalf("the floor left counts %+v", c)
		}
	}
}

// BenchmarkPickParallel measures Pick plus Done from GOMAXPROCS goroutines
// on one balancer; compare -cpu 1 and -cpu 2.
func BenchmarkPickParallel(b *testing.B) {
	ctx := context.Background()
	for _, pol := range benchPolicies {
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

// benchBalancer returns a balancer over n endpoints choosing with p.
func benchBalancer(b *testing.B, p Policy, n int, opts ...Option) *Balancer {
	bal, err := New(p, opts...)
	if err != nil {
		b.Fatal(err)
	}
	if err := bal.Update(eps(n)); err != nil {
		b.Fatal(err)
	}
	return bal
}

// benchPickLoop picks a request of 1000 prompt tokens per iteration and
// completes it, after its first token if firstToken is set.
func benchPickLoop(b *testing.B, bal *Balancer, firstToken bool) {
	ctx := context.Background()
	req := &Request{PromptTokens: 1000, MaxTokens: 256}
	b.ReportAllocs()
	for b.Loop() {
		p, err := bal.Pick(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if firstToken {
			p.FirstToken()
		}
		p.Done(nil)
	}
}

// BenchmarkPickSignal measures Pick, FirstToken and Done with a fresh
// signal observation for every endpoint, so that each call also keeps the
// counts of this balancer's dispatches since the observation.
func BenchmarkPickSignal(b *testing.B) {
	for _, pol := range benchPolicies[2:4] {
		b.Run("policy="+pol.name+"/endpoints=64", func(b *testing.B) {
			sig := &fakeSignal{}
			for i := range 64 {
				sig.Set("ep"+strconv.Itoa(i), Load{At: time.Now(), Running: 3, Waiting: 1, KVUsage: 0.5})
			}
			benchPickLoop(b, benchBalancer(b, pol.new(), 64, WithSignal(sig, time.Hour)), true)
		})
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	ctx := context.Background()
	// With 2 endpoints the exclusion leaves one candidate, which the policy
	// still sees.
	for _, n := range []int{64, 2, 1} {
		for _, pol := range benchPolicies {
			if pol.name == "weighted-least-request" && n == 64 {
				continue // allocates its credit slice once per membership
			}
			bal, _ := New(pol.new())
			_ = bal.Update(eps(n))
			req := &Request{PromptTokens: 1000, MaxTokens: 256, Exclude: []string{"ep0"}}
			if n == 1 {
				req.Exclude = nil
			}
			allocs := testing.AllocsPerRun(1000, func() {
				p, err := bal.Pick(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				p.FirstToken()
				p.Done(nil)
			})
			if allocs != 0 {
				t.Errorf("%s on %d endpoints: %v allocs per Pick+FirstToken+Done, want 0", pol.name, n, allocs)
			}
		}
	}
}

// benchCacheAware measures Pick plus Done of the prefix-aware policies on 64
// endpoints for a 4k-token prompt (256 blocks of 16 tokens) whose first half
// is cached on 8 of them.
func benchCacheAware(b *testing.B) {
	ctx := context.Background()
	builders := []struct {
		name string
		new  func(ix, events *prefix.Index) (Policy, error)
	}{
		{"kv-cost", func(ix, _ *prefix.Index) (Policy, error) {
			cfg := DynamoKVCostConfig()
			cfg.Index = ix
			return KVCost(cfg)
		}},
		{"kv-cost-active", func(ix, _ *prefix.Index) (Policy, error) {
			cfg := DynamoKVCostConfig()
			cfg.Index = ix
			var err error
			if cfg.Active, err = NewActiveBlocks(ix.BlockSize()); err != nil {
				return nil, err
			}
			return KVCost(cfg)
		}},
		{"default", func(ix, _ *prefix.Index) (Policy, error) { return Default(DefaultConfig{Index: ix}) }},
		{"default-events", func(ix, events *prefix.Index) (Policy, error) {
			return Default(DefaultConfig{Index: ix, Events: events})
		}},
		{"prefix-aware", func(ix, _ *prefix.Index) (Policy, error) { return PrefixAware(PrefixAwareConfig{Index: ix}) }},
		{"gie-default", func(ix, _ *prefix.Index) (Policy, error) { return GIEDefault(GIEConfig{Index: ix}) }},
	}
	for _, bb := range builders {
		b.Run("policy="+bb.name+"/endpoints=64", func(b *testing.B) {
			ix, _ := prefix.NewIndex(prefix.IndexConfig{})
			events, _ := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
			pol, err := bb.new(ix, events)
			if err != nil {
				b.Fatal(err)
			}
			bal, _ := New(pol)
			members := eps(64)
			_ = bal.Update(members)
			prompt := blocks(1, 256)
			for i := 0; i < 8; i++ {
				_ = ix.Stored(members[i].Key(), 16, prompt[:128]...)
				_ = events.Stored(members[i].Key(), 16, prompt[:128]...)
			}
			req := &Request{PromptTokens: 4096, MaxTokens: 256, Prefix: prompt}
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

// decisionPromptBytes is the prompt of BenchmarkDecision and
// BenchmarkHashBytes: 16 KiB of text, 256 blocks of 64 bytes in byte mode,
// about 4096 tokens.
const decisionPromptBytes = 16 << 10

// decisionPrompt returns a prompt of decisionPromptBytes random letters.
func decisionPrompt() string {
	r := rand.New(rand.NewPCG(1, 2))
	text := make([]byte, decisionPromptBytes)
	for i := range text {
		text[i] = byte('a' + r.IntN(26))
	}
	return string(text)
}

// BenchmarkHashBytes hashes the prompt of BenchmarkDecision in byte mode:
// the part of a decision that does not depend on the endpoints.
func BenchmarkHashBytes(b *testing.B) {
	b.Run("bytes="+strconv.Itoa(decisionPromptBytes), func(b *testing.B) {
		h, err := prefix.NewHasher(prefix.HasherConfig{})
		if err != nil {
			b.Fatal(err)
		}
		prompt := decisionPrompt()
		root := h.Root(prefix.Salt{Model: "m"})
		dst := make([]uint64, 0, h.MaxBlocks())
		b.SetBytes(decisionPromptBytes)
		b.ReportAllocs()
		for b.Loop() {
			dst = h.AppendString(dst[:0], root, prompt)
		}
	})
}

// BenchmarkDecision measures one full decision of [Default] for a 16 KiB
// prompt: hashing it in byte mode, Pick (matching the prefix index, scoring
// every endpoint, recording the choice in the index) and Done. The first
// half of the prompt is cached on 8 endpoints; the chosen endpoint, which
// holds the whole prompt after the first decision, is the steady state of a
// popular prompt. Compare with BenchmarkHashBytes in the same run.
//
// With fresh=1 the second half of every prompt is new (a counter written
// into it): each decision records 128 new blocks on the chosen endpoint,
// and once the endpoints' index is at its capacity each evicts an old one,
// the steady state of a router whose prompts share only a system prompt.
func BenchmarkDecision(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run("endpoints="+strconv.Itoa(n), func(b *testing.B) {
			benchDecision(b, n, DefaultConfig{}, false, false)
		})
	}
	// Scoring the two longest-prefix holders and two random candidates
	// (DefaultConfig.Sampled), the cost of a decision no longer grows with
	// the pool.
	for _, n := range []int{8, 64, 512} {
		b.Run("sampled=2/endpoints="+strconv.Itoa(n), func(b *testing.B) {
			benchDecision(b, n, DefaultConfig{Sampled: 2}, false, false)
		})
	}
	// Beyond 64 endpoints the default samples 16; scoring every one of 512
	// (Sampled negative) costs what the pool's size costs.
	b.Run("sampled=-1/endpoints=512", func(b *testing.B) {
		benchDecision(b, 512, DefaultConfig{Sampled: -1}, false, false)
	})
	for _, n := range []int{8, 64, 512} {
		b.Run("fresh=1/endpoints="+strconv.Itoa(n), func(b *testing.B) {
			benchDecision(b, n, DefaultConfig{}, true, false)
		})
	}
	// With latency objectives every scored candidate also reads its rate of
	// prompt tokens sent.
	b.Run("objectives/endpoints=64", func(b *testing.B) {
		benchDecision(b, 64, DefaultConfig{TTFTObjective: 2 * time.Second, TPOTObjective: 50 * time.Millisecond}, false, false)
	})
}

// BenchmarkDecisionParallel is BenchmarkDecision on 64 endpoints from
// GOMAXPROCS goroutines sharing one balancer and index; compare -cpu 1 and
// -cpu 2.
func BenchmarkDecisionParallel(b *testing.B) {
	b.Run("endpoints=64", func(b *testing.B) { benchDecision(b, 64, DefaultConfig{}, false, true) })
}

func benchDecision(b *testing.B, n int, cfg DefaultConfig, fresh, parallel bool) {
	h, err := prefix.NewHasher(prefix.HasherConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: h.BlockTokens()})
	if err != nil {
		b.Fatal(err)
	}
	cfg.Index = ix
	pol, err := Default(cfg)
	if err != nil {
		b.Fatal(err)
	}
	bal := benchBalancer(b, pol, n)
	prompt := decisionPrompt()
	root := h.Root(prefix.Salt{Model: "m"})
	head := h.AppendString(nil, root, prompt[:decisionPromptBytes/2])
	for i := 0; i < 8; i++ {
		if err := ix.Stored("ep"+strconv.Itoa(i*n/8), h.BlockTokens(), head...); err != nil {
			b.Fatal(err)
		}
	}
	text, turn := []byte(prompt), uint64(0)
	decide := func(req *Request, dst []uint64) []uint64 {
		if fresh {
			turn++
			binary.LittleEndian.PutUint64(text[decisionPromptBytes/2:], turn)
			dst = h.AppendBytes(dst[:0], root, text)
		} else {
			dst = h.AppendString(dst[:0], root, prompt)
		}
		req.Prefix = dst
		p, err := bal.Pick(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		p.Done(nil)
		return dst
	}
	newReq := func() *Request {
		return &Request{PromptTokens: decisionPromptBytes / 4, MaxTokens: 256}
	}
	b.ReportAllocs()
	if !parallel {
		req, dst := newReq(), make([]uint64, 0, h.MaxBlocks())
		for b.Loop() {
			dst = decide(req, dst)
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		req, dst := newReq(), make([]uint64, 0, h.MaxBlocks())
		for pb.Next() {
			dst = decide(req, dst)
		}
	})
}

// TestDecisionDoesNotAllocate checks that a full decision of Default, in
// the steady states of BenchmarkDecision, allocates nothing: a popular
// prompt, and fresh prompts recorded into a full index.
func TestDecisionDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	h, _ := prefix.NewHasher(prefix.HasherConfig{})
	pol, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	bal, _ := New(pol)
	_ = bal.Update(eps(64))
	prompt, root := decisionPrompt(), h.Root(prefix.Salt{Model: "m"})
	req := &Request{PromptTokens: decisionPromptBytes / 4, MaxTokens: 256}
	dst := make([]uint64, 0, h.MaxBlocks())
	decide := func() {
		dst = h.AppendString(dst[:0], root, prompt)
		req.Prefix = dst
		p, err := bal.Pick(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(nil)
	}
	decide() // sizes the scratch space and records the prompt
	if allocs := testing.AllocsPerRun(200, decide); allocs != 0 {
		t.Errorf("%v allocs per decision, want 0", allocs)
	}

	// Fresh prompts, as BenchmarkDecision's fresh=1, on an index at its
	// capacity: every decision records 128 new blocks and evicts as many.
	// (The capacity keeps the index's holder table, about 32 entries a
	// shard, within the bounds that resize its shards.)
	const capacity = 8192
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: h.BlockTokens(), Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	if pol, err = Default(DefaultConfig{Index: ix}); err != nil {
		t.Fatal(err)
	}
	bal, _ = New(pol)
	_ = bal.Update(eps(64))
	text, turn := []byte(prompt), uint64(0)
	decide = func() {
		turn++
		binary.LittleEndian.PutUint64(text[decisionPromptBytes/2:], turn)
		dst = h.AppendBytes(dst[:0], root, text)
		req.Prefix = dst
		p, err := bal.Pick(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(nil)
	}
	// The shared first half draws every prompt to one endpoint; fill its
	// index twice over.
	for range 2 * capacity / 128 {
		decide()
	}
	if allocs := testing.AllocsPerRun(200, decide); allocs != 0 {
		t.Errorf("%v allocs per decision with a fresh prompt, want 0", allocs)
	}
	most := 0
	for i := range 64 {
		most = max(most, ix.Len("ep"+strconv.Itoa(i)))
	}
	if most != capacity {
		t.Errorf("the fullest endpoint indexes %d blocks, want its capacity %d", most, capacity)
	}
}
