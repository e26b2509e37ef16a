package sim

import (
	"context"
	"errors"
	"iter"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// oneReplica is a cluster of one default replica.
func oneReplica(kvBlocks int) Config {
	return Config{Replicas: 1, Engine: Engine{KVBlocks: kvBlocks}}
}

func run1(t *testing.T, cfg Config, reqs []Request) *Result {
	t.Helper()
	res, err := Simulate(context.Background(), cfg, reqs, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestSingleRequestMatchesIterationFormula(t *testing.T) {
	const prompt, output, blocks = 1000, 10, 8192
	res := run1(t, oneReplica(blocks), []Request{{PromptTokens: prompt, OutputTokens: output}})
	if res.Completed != 1 {
		t.Fatalf("completed %d, want 1", res.Completed)
	}
	// Iteration 1 prefills the whole prompt and emits the first token:
	// 4.209989e-7*1000^2 + 1.518344e-2*1000 + 16.50142 = 32.1058589 ms.
	ttftMs := 32.1058589
	ttft := time.Duration(ttftMs * float64(time.Millisecond))
	if got := time.Duration(res.TTFT.P50 * float64(time.Millisecond)); absDur(got-ttft) > time.Microsecond {
		t.Errorf("TTFT %v, want %v", got, ttft)
	}
	// Each of the 9 remaining tokens takes one decode iteration whose KV
	// usage counts the blocks of prompt + tokens decoded so far + 1.
	e2e := ttft
	for k := 1; k < output; k++ {
		u := float64((prompt+k+15)/16) / blocks
		e2e += time.Duration((-25.74*u*u + 54.01*u + 5.74) * float64(time.Millisecond))
	}
	if got := time.Duration(res.E2E.P50 * float64(time.Millisecond)); absDur(got-e2e) > time.Microsecond {
		t.Errorf("E2E %v, want %v", got, e2e)
	}
	wantTPOT := (e2e - ttft) / (output - 1)
	if got := time.Duration(res.TPOT.P50 * float64(time.Millisecond)); absDur(got-wantTPOT) > time.Microsecond {
		t.Errorf("TPOT %v, want %v", got, wantTPOT)
	}
	if res.Preemptions != 0 || res.PrefixHitRate != 0 {
		t.Errorf("preemptions %d, hit rate %v; want 0, 0", res.Preemptions, res.PrefixHitRate)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func TestKVExhaustionPreempts(t *testing.T) {
	// 100 blocks hold 1600 tokens; two requests of 600 + 400 need 126.
	reqs := []Request{
		{PromptTokens: 600, OutputTokens: 400},
		{Arrival: time.Millisecond, PromptTokens: 600, OutputTokens: 400},
	}
	res := run1(t, oneReplica(100), reqs)
	if res.Preemptions == 0 {
		t.Error("no preemption, want at least one")
	}
	if res.Completed != 2 {
		t.Errorf("completed %d, want 2 (preempted requests recompute and finish)", res.Completed)
	}
}

func TestOversizedRequestIsRejected(t *testing.T) {
	reqs := []Request{{PromptTokens: 2000, OutputTokens: 10}, {PromptTokens: 100, OutputTokens: 10}}
	res := run1(t, oneReplica(100), reqs)
	if res.Rejected != 1 || res.Completed != 1 {
		t.Errorf("rejected %d, completed %d; want 1, 1", res.Rejected, res.Completed)
	}
}

func TestRepeatedPrefixServedFromCache(t *testing.T) {
	prefix := make([]uint64, 20) // 20 blocks of 16 tokens = 320 tokens
	var h uint64
	for i := range prefix {
		h = ChainHash(h, uint64(i))
		prefix[i] = h
	}
	reqs := []Request{
		{PromptTokens: 320, OutputTokens: 5, BlockTokens: 16, Prefix: prefix},
		{Arrival: time.Second, PromptTokens: 320, OutputTokens: 5, BlockTokens: 16, Prefix: prefix},
	}
	res := run1(t, oneReplica(0), reqs)
	// The second prompt reuses 19 full blocks; its last token is recomputed.
	if want := float64(19*16) / 640; res.PrefixHitRate != want {
		t.Errorf("prefix hit rate %v, want %v", res.PrefixHitRate, want)
	}
	// Its prefill is 16 tokens instead of 320.
	if got, want := res.TTFT.P50, MockerPrefillMillis(16); abs(got-want) > 1e-3 {
		t.Errorf("cached TTFT %vms, want %vms", got, want)
	}
}

// A completed request's Reply blocks stay cached, so the next turn, whose
// prompt is the first turn's prompt and reply plus a new message, reuses
// both; without Reply only the prompt's blocks are reused.
func TestReplyServedFromCache(t *testing.T) {
	chain := make([]uint64, 40)
	var h uint64
	for i := range chain {
		h = ChainHash(h, uint64(i))
		chain[i] = h
	}
	for _, tc := range []struct {
		reply bool
		want  int // blocks of the second prompt served from cache
	}{{true, 30}, {false, 20}} {
		first := Request{PromptTokens: 320, OutputTokens: 161, BlockTokens: 16, Prefix: chain[:20]}
		if tc.reply {
			first.Reply = chain[20:30] // 481 tokens: 30 full blocks
		}
		second := Request{Arrival: 10 * time.Second, PromptTokens: 640, OutputTokens: 5, BlockTokens: 16, Prefix: chain}
		res := run1(t, oneReplica(0), []Request{first, second})
		if want := float64(tc.want*16) / (320 + 640); res.PrefixHitRate != want {
			t.Errorf("reply cached %v: hit rate %v, want %v (%d blocks)", tc.reply, res.PrefixHitRate, want, tc.want)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// TestReplicaAccountingProperty runs random small workloads on cramped
// engines (tiny KV caches, budgets and batches, heavy prefix sharing) and
// checks that every request finishes or is rejected and that every KV block
// is returned (Simulate fails otherwise).
func TestReplicaAccountingProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for trial := 0; trial < 40; trial++ {
		eng := Engine{
			TokenBudget: 16 + rng.IntN(512),
			MaxRunning:  1 + rng.IntN(8),
			KVBlocks:    8 + rng.IntN(200),
		}
		heads := [][]uint64{nil}
		for g := 0; g < 3; g++ {
			var h uint64
			head := make([]uint64, 1+rng.IntN(6))
			for i := range head {
				h = ChainHash(h, uint64(g*100+i))
				head[i] = h
			}
			heads = append(heads, head)
		}
		var reqs []Request
		var at time.Duration
		for i := 0; i < 60; i++ {
			at += time.Duration(rng.IntN(50)) * time.Millisecond
			head := heads[rng.IntN(len(heads))]
			tail := 1 + rng.IntN(200)
			prefix := append([]uint64(nil), head...)
			h := uint64(0)
			if len(head) > 0 {
				h = head[len(head)-1]
			}
			for k := 0; k < (tail+15)/16; k++ {
				h = ChainHash(h, uint64(1e6+i*1000+k))
				prefix = append(prefix, h)
			}
			reqs = append(reqs, Request{
				Arrival:      at,
				PromptTokens: len(head)*16 + tail,
				OutputTokens: 1 + rng.IntN(300),
				BlockTokens:  16,
				Prefix:       prefix,
			})
		}
		cfg := Config{Replicas: 1 + rng.IntN(3), Routers: 1 + rng.IntN(2), Engine: eng, Seed: uint64(trial)}
		for _, p := range []string{"round-robin", "full-info"} {
			res, err := Simulate(context.Background(), cfg, reqs, p)
			if err != nil {
				t.Fatalf("trial %d %s (%+v): %v", trial, p, eng, err)
			}
			if res.Completed+res.Rejected != len(reqs) {
				t.Fatalf("trial %d %s: %d completed + %d rejected of %d", trial, p, res.Completed, res.Rejected, len(reqs))
			}
			if res.PrefixHitRate > InfiniteCacheHitRate(reqs) {
				t.Fatalf("trial %d %s: hit rate %.3f above the infinite-cache bound %.3f", trial, p, res.PrefixHitRate, InfiniteCacheHitRate(reqs))
			}
		}
	}
}

// A policy that subscribes to KV events sees exactly the replicas' caches:
// after a run with many evictions, its index holds every cached block of
// every replica and nothing else.
func TestKVEventsMirrorCaches(t *testing.T) {
	w := DefaultSynthetic(800, 30)
	reqs, err := w.Generate(3)
	if err != nil {
		t.Fatal(err)
	}
	const replicas, kvBlocks = 3, 2048
	distinct := map[uint64]bool{}
	for _, r := range reqs {
		for _, h := range r.Prefix {
			distinct[h] = true
		}
	}
	if blocks := len(distinct) * w.BlockTokens / DefaultBlockSize; blocks < 4*replicas*kvBlocks {
		t.Fatalf("workload has %d distinct blocks, too few to force evictions", blocks)
	}
	var ix *prefix.Index
	var run *runner
	spec := PolicySpec{Name: "probe", New: func(env *PolicyEnv) (llmlb.Policy, error) {
		var err error
		ix, err = prefix.NewIndex(prefix.IndexConfig{BlockSize: env.BlockTokens, EventsOnly: true, Capacity: 1 << 16})
		if err != nil {
			return nil, err
		}
		if err := env.SubscribeKVEvents(ix); err != nil {
			return nil, err
		}
		run = env.run
		return llmlb.Default(llmlb.DefaultConfig{Index: ix})
	}}
	cfg := Config{Replicas: replicas, Seed: 3, Engine: Engine{KVBlocks: kvBlocks}}
	if _, err := simulate(context.Background(), cfg, reqs, spec); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	for i, rep := range run.reps {
		key := replicaKey(i)
		if got, want := ix.Len(key), countSeq(rep.CachedHashes()); got != want {
			t.Errorf("%s: index holds %d blocks, cache %d", key, got, want)
		}
		for h := range rep.CachedHashes() {
			if ix.MatchLen(key, []uint64{h}, now) != 1 {
				t.Errorf("%s: cached block %x missing from the index", key, h)
				break
			}
		}
	}
	bad := &PolicyEnv{BlockTokens: 64, run: run}
	other, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
	if err := bad.SubscribeKVEvents(other); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("subscribing an index of another block size: %v, want ErrInvalidConfig", err)
	}
	if err := bad.SubscribeKVEvents(nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("subscribing a nil index: %v, want ErrInvalidConfig", err)
	}
	if err := new(PolicyEnv).SubscribeKVEvents(ix); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("subscribing outside a simulation: %v, want ErrInvalidConfig", err)
	}
}

// TestKVEventsPerChunk checks that a replica reports a prompt's blocks as
// its prefill chunks compute them, as vLLM publishes BlockStored in the
// scheduler step that filled each block, not when the whole prefill ends:
// a 20,000-token prompt takes three iterations of the default 8192-token
// budget, and the first reports its 512 full blocks before any token is out.
func TestKVEventsPerChunk(t *testing.T) {
	r, err := NewReplica(Engine{})
	if err != nil {
		t.Fatal(err)
	}
	var stored int
	r.SetKVEventHandler(func(_ uint64, ok bool) {
		if ok {
			stored++
		}
	})
	blocks := make([]uint64, 20000/16)
	var h uint64
	for i := range blocks {
		h = ChainHash(h, uint64(i))
		blocks[i] = h
	}
	s := &Sequence{PromptTokens: 20000, OutputTokens: 2, BlockTokens: 16, Prefix: blocks}
	if err := r.Submit(s); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{8192 / 16, 16384 / 16, 20000 / 16} {
		if _, ok := r.Plan(); !ok {
			t.Fatalf("iteration %d: nothing planned", i)
		}
		r.Finish()
		if stored != want {
			t.Fatalf("after iteration %d: %d blocks reported, want %d", i, stored, want)
		}
		if first := s.Generated() > 0; first != (i == 2) {
			t.Fatalf("after iteration %d: first token %v", i, first)
		}
	}
}

// countSeq returns the number of values seq yields.
func countSeq[T any](seq iter.Seq[T]) int {
	n := 0
	for range seq {
		n++
	}
	return n
}
