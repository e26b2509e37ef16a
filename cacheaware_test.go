package llmlb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// blocks returns n chained-looking block hashes for prompt family f.
func blocks(f, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(f)<<40 | uint64(i)
	}
	return out
}

// TestDynamoWorkedExample checks Dynamo's documented example of its KV
// router's cost, logit = overlap_score_weight * prefill_blocks +
// decode_blocks with prefill_blocks the blocks not cached: three workers
// with raw prefill 10/10/10 blocks, device overlap 2/5/8 and decode blocks
// 10/5/9, at three values of the weight.
func TestDynamoWorkedExample(t *testing.T) {
	overlap := []int{2, 5, 8}
	decode := []float64{10, 5, 9}
	cases := []struct {
		weight float64
		want   []float64
		winner int // 0-based
	}{
		{1, []float64{18, 10, 11}, 1},
		{2, []float64{26, 15, 13}, 2},
		{0.5, []float64{14, 7.5, 10}, 1},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("weight=%v", tc.weight), func(t *testing.T) {
			cfg := DynamoKVCostConfig()
			cfg.OverlapScoreWeight = tc.weight
			for i := range tc.want {
				got := cfg.Cost(KVCostTerms{PrefillBlocks: 10, RequestBlocks: 10, DeviceOverlap: float64(overlap[i]), DecodeBlocks: decode[i]})
				if got != tc.want[i] {
					t.Errorf("worker %d: cost %v, want %v", i+1, got, tc.want[i])
				}
			}
			best := 0
			for i, c := range tc.want {
				if c < tc.want[best] {
					best = i
				}
			}
			if best != tc.winner {
				t.Errorf("cheapest worker %d, want %d", best+1, tc.winner+1)
			}
		})
	}
}

// TestKVCostUniqueActiveBlocks checks Dynamo's decode term on a worked
// example through the policy: a worker's active prompt blocks count once
// however many requests share them, plus the request's blocks not active
// there, and output is not counted. The request has 10 blocks (160 tokens)
// cached 2, 5 and 8 deep on three workers; ep0 has nothing active, ep1 two
// requests sharing the request's first 5 blocks (5 unique active blocks,
// not 10), ep2 one request of 6 unrelated blocks and a long output:
//
//	ep0: prefill 10-2 = 8, decode 0+10 = 10, cost 18
//	ep1: prefill 10-5 = 5, decode 5+5  = 10, cost 15
//	ep2: prefill 10-8 = 2, decode 6+10 = 16, cost 18
//
// Counting ep1's shared blocks twice would make its cost 20 and lose it the
// pick; counting ep2's output tokens would raise its cost further.
func TestKVCostUniqueActiveBlocks(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
	prompt := blocks(1, 10)
	for i, n := range []int{2, 5, 8} {
		if err := ix.Stored("ep"+string(rune('0'+i)), 16, prompt[:n]...); err != nil {
			t.Fatal(err)
		}
	}
	active, err := NewActiveBlocks(16)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DynamoKVCostConfig()
	cfg.Index, cfg.Active = ix, active
	pol, err := KVCost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(3))
	shared := Request{PromptTokens: 80, Prefix: prompt[:5]}
	other := Request{PromptTokens: 96, OutputTokens: 4096, Prefix: blocks(2, 6)}
	var held []Pick
	for _, h := range []struct {
		key string
		r   Request
	}{{"ep1", shared}, {"ep1", shared}, {"ep2", other}} {
		held = append(held, holdOn(t, b, h.key, 1, h.r)...)
		active.add(h.key, &h.r)
	}
	for _, h := range held {
		h.FirstToken()
	}
	req := Request{PromptTokens: 160, OutputTokens: 1, Prefix: prompt}
	for key, want := range map[string][2]int{"ep0": {0, 10}, "ep1": {5, 5}, "ep2": {6, 10}} {
		if a, n := active.Potential(key, &req); a != want[0] || n != want[1] {
			t.Errorf("%s: active %d, added %d; want %d and %d", key, a, n, want[0], want[1])
		}
	}
	for range 20 {
		pk, err := b.Pick(context.Background(), &req)
		if err != nil {
			t.Fatal(err)
		}
		if got := pk.Endpoint().Key(); got != "ep1" {
			t.Fatalf("picked %s, want ep1 (cost 15 against 18 and 18)", got)
		}
		if got := active.Blocks("ep1"); got != 10 {
			t.Fatalf("ep1 has %d active blocks after the pick, want 10", got)
		}
		pk.Done(nil)
		pk.Done(nil) // a second Done releases nothing more
		if got := active.Blocks("ep1"); got != 5 {
			t.Fatalf("ep1 has %d active blocks after Done, want the 5 of the held requests", got)
		}
	}
	for _, h := range held {
		h.Done(nil)
	}
	active.release("ep1", &shared)
	if got := active.Blocks("ep1"); got != 5 {
		t.Fatalf("ep1 has %d active blocks with one sharer left, want 5", got)
	}
	active.release("ep1", &shared)
	active.release("ep1", &shared) // released once too often: a no-op
	active.release("ep2", &other)
	for _, key := range []string{"ep0", "ep1", "ep2"} {
		if got := active.Blocks(key); got != 0 {
			t.Fatalf("%s has %d active blocks after every release, want 0", key, got)
		}
	}
}

func TestKVCostActiveBlockSizeMismatch(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
	active, _ := NewActiveBlocks(32)
	cfg := DynamoKVCostConfig()
	cfg.Index, cfg.Active = ix, active
	if _, err := KVCost(cfg); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("KVCost with 32-token active blocks on a 16-token index: %v, want ErrInvalidPolicy", err)
	}
	if _, err := NewActiveBlocks(0); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("NewActiveBlocks(0): %v, want ErrInvalidPolicy", err)
	}
}

func TestKVCostDecayAndTemperature(t *testing.T) {
	cfg := DynamoKVCostConfig()
	cfg.DecayK = 1
	terms := KVCostTerms{PrefillBlocks: 20, RequestBlocks: 10, ExcessQueuedBlocks: 10, DeviceOverlap: 8}
	// decay = 1/(1+1*10/10) = 0.5: overlap 4, prefill 16, cost 16.
	if got := cfg.Cost(terms); got != 16 {
		t.Fatalf("decayed cost %v, want 16", got)
	}
	// Temperature 0 is argmin; a large temperature samples every candidate.
	costs := []float64{5, 1, 3, 9}
	for _, tc := range []struct {
		temp    float64
		wantAll bool
	}{{0, false}, {100, true}} {
		b := mustNew(t, P2C(nil))
		mustUpdate(t, b, eps(4))
		c := candidatesPool.Get().(*Candidates)
		if err := c.init(b, b.snap.Load()); err != nil {
			t.Fatal(err)
		}
		seen := map[int]int{}
		for range 4000 {
			seen[softmin(c, costs, tc.temp)]++
		}
		c.release()
		if tc.wantAll {
			for i := range costs {
				if seen[i] < 600 {
					t.Errorf("T=%v: candidate %d sampled %d of 4000 times", tc.temp, i, seen[i])
				}
			}
		} else if seen[1] != 4000 {
			t.Errorf("T=0: %v, want always candidate 1", seen)
		}
	}
	if _, err := KVCost(KVCostConfig{OverlapScoreWeight: -1}); !errors.Is(err, ErrInvalidPolicy) {
		t.Error("negative overlap score weight accepted")
	}
	if _, err := KVCost(KVCostConfig{Temperature: math.NaN()}); !errors.Is(err, ErrInvalidPolicy) {
		t.Error("NaN temperature accepted")
	}
}

func TestPrefixAwareThresholds(t *testing.T) {
	newB := func(faithful bool) (*Balancer, *prefix.Index) {
		ix, _ := prefix.NewIndex(prefix.IndexConfig{})
		cfg := PrefixAwareConfig{Index: ix, AbsThreshold: 4, RelThreshold: 1.5, MatchThreshold: 0.3}
		var pol Policy
		var err error
		if faithful {
			pol, err = SGLangCacheAware(cfg)
		} else {
			pol, err = PrefixAware(cfg)
		}
		if err != nil {
			t.Fatal(err)
		}
		return mustNew(t, pol), ix
	}
	prompt := blocks(7, 20) // 320 tokens
	req := Request{PromptTokens: 320, Prefix: prompt}
	for _, faithful := range []bool{false, true} {
		b, ix := newB(faithful)
		mustUpdate(t, b, eps(4))
		_ = ix.Stored("ep2", 16, prompt[:15]...) // 75% cached on ep2
		pick := func() string {
			pk, err := b.Pick(context.Background(), &req)
			if err != nil {
				t.Fatal(err)
			}
			defer pk.Done(nil)
			return pk.Endpoint().Key()
		}
		if got := pick(); got != "ep2" {
			t.Fatalf("faithful=%v balanced: picked %s, want the holder ep2", faithful, got)
		}
		// ep2 busier by exactly the abs threshold: max-min = 4, not > 4:
		// still balanced, locality wins.
		held := holdOn(t, b, "ep2", 4, Request{})
		if got := pick(); got != "ep2" {
			t.Fatalf("faithful=%v at the abs threshold: picked %s, want ep2", faithful, got)
		}
		// max-min = 5 > 4 but 5 <= 0*1.5 is false... min is 0 so rel holds:
		// imbalanced now.
		held = append(held, holdOn(t, b, "ep2", 1, Request{})...)
		got := pick()
		if got == "ep2" {
			t.Fatalf("faithful=%v imbalanced: still picked the overloaded holder", faithful)
		}
		// Both abs and rel must be crossed: load everyone so that max-min > 4
		// but max <= 1.5*min.
		for _, k := range []string{"ep0", "ep1", "ep3"} {
			held = append(held, holdOn(t, b, k, 12, Request{})...)
		}
		held = append(held, holdOn(t, b, "ep2", 12, Request{})...) // ep2: 17, others 12
		// Balanced again (17 <= 1.5*12): locality decides. ep2 and the
		// endpoint that took the imbalanced pick both hold the whole prompt;
		// the improved policy takes the less loaded of them, the faithful
		// one either.
		again := pick()
		if again != got && (!faithful || again != "ep2") {
			t.Fatalf("faithful=%v abs crossed but not rel: picked %s, want locality (%s)", faithful, again, got)
		}
		for _, h := range held {
			h.Done(nil)
		}
	}
}

func TestPrefixAwareLoadAmongHolders(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, _ := PrefixAware(PrefixAwareConfig{Index: ix})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	prompt := blocks(3, 10)
	_ = ix.Stored("ep0", 16, prompt...)
	_ = ix.Stored("ep1", 16, prompt...)
	held := holdOn(t, b, "ep0", 3, Request{})
	for range 10 {
		pk, _ := b.Pick(context.Background(), &Request{PromptTokens: 160, Prefix: prompt})
		if k := pk.Endpoint().Key(); k != "ep1" {
			t.Fatalf("picked %s, want ep1, the less loaded of two holders", k)
		}
		pk.Done(nil)
	}
	for _, h := range held {
		h.Done(nil)
	}
}

func TestPrefixAwareRecordsAndForgetsRemoved(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, _ := PrefixAware(PrefixAwareConfig{Index: ix})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(3))
	prompt := blocks(9, 8)
	pk, _ := b.Pick(context.Background(), &Request{PromptTokens: 128, Prefix: prompt})
	first := pk.Endpoint().Key()
	pk.Done(nil)
	for range 10 {
		pk, _ := b.Pick(context.Background(), &Request{PromptTokens: 128, Prefix: prompt})
		if pk.Endpoint().Key() != first {
			t.Fatalf("repeated prompt went to %s, first to %s", pk.Endpoint().Key(), first)
		}
		if s := statsByKey(b)[first]; s.PrefillTokens != 0 {
			t.Fatalf("fully cached prompt charged %d prefill tokens", s.PrefillTokens)
		}
		pk.Done(nil)
	}
	var rest []Endpoint
	for _, e := range eps(3) {
		if e.Key() != first {
			rest = append(rest, e)
		}
	}
	mustUpdate(t, b, rest)
	pk, _ = b.Pick(context.Background(), &Request{PromptTokens: 128, Prefix: prompt})
	pk.Done(nil)
	if ix.Len(first) != 0 {
		t.Fatalf("removed endpoint %s still has %d indexed blocks", first, ix.Len(first))
	}
}

func TestTenantIsolationThroughPolicies(t *testing.T) {
	h, err := prefix.NewHasher(prefix.HasherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 512)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	a := h.HashTokens(prefix.Salt{Tenant: "a"}, tokens)
	bb := h.HashTokens(prefix.Salt{Tenant: "b"}, tokens)
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, _ := PrefixAware(PrefixAwareConfig{Index: ix})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	pk, _ := b.Pick(context.Background(), &Request{PromptTokens: 512, Prefix: a, Tenant: "a"})
	pk.Done(nil)
	if m := ix.Match(bb, b.clock.Now(), nil); len(m) != 0 {
		t.Fatalf("tenant b matched tenant a's blocks: %v", m)
	}
}

func TestGIEDefault(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, err := GIEDefault(GIEConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clock), WithSignal(sig, 0))
	mustUpdate(t, b, eps(3))
	prompt := blocks(5, 10)
	_ = ix.Stored("ep0", 16, prompt...)
	// ep0: full prefix (3), queue worst (0), kv 0.5 (1): 4
	// ep1: no prefix, queue best (2), kv 0.1 (1.8): 3.8
	// ep2: no prefix, queue mid (1), kv 0 (2): 3
	sig.Set("ep0", Load{At: clock.Now(), Waiting: 10, KVUsage: 0.5})
	sig.Set("ep1", Load{At: clock.Now(), Waiting: 0, KVUsage: 0.1})
	sig.Set("ep2", Load{At: clock.Now(), Waiting: 5, KVUsage: 0})
	pk, _ := b.Pick(context.Background(), &Request{PromptTokens: 160, Prefix: prompt})
	if k := pk.Endpoint().Key(); k != "ep0" {
		t.Fatalf("picked %s, want ep0 (score 4)", k)
	}
	pk.Done(nil)
	// Without the prefix ep1 wins (3.8 vs 3 vs 1).
	pk, _ = b.Pick(context.Background(), &Request{PromptTokens: 160})
	if k := pk.Endpoint().Key(); k != "ep1" {
		t.Fatalf("picked %s, want ep1", k)
	}
	pk.Done(nil)
}

func TestSegregatedPools(t *testing.T) {
	pol, err := Segregated(
		Pool{Name: "long-context", MinPromptTokens: 32000, Endpoints: []string{"ep0"}},
		Pool{Name: "long-generation", MinMaxTokens: 4000, Endpoints: []string{"ep1"}},
		Pool{Name: "general"},
	)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(5))
	rng := rand.New(rand.NewPCG(1, 1))
	for range 2000 {
		r := Request{PromptTokens: rng.IntN(64000), MaxTokens: rng.IntN(8000)}
		pk, err := b.Pick(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		k := pk.Endpoint().Key()
		switch {
		case r.PromptTokens >= 32000 && k != "ep0":
			t.Fatalf("long prompt went to %s", k)
		case r.PromptTokens < 32000 && r.MaxTokens >= 4000 && k != "ep1":
			t.Fatalf("long generation went to %s", k)
		case r.PromptTokens < 32000 && r.MaxTokens < 4000 && (k == "ep0" || k == "ep1"):
			t.Fatalf("general request went to %s", k)
		}
		pk.Done(nil)
	}
	// The long-context pool is excluded: fall back to the general pool.
	pk, err := b.Pick(context.Background(), &Request{PromptTokens: 50000, Exclude: []string{"ep0"}})
	if err != nil || pk.Endpoint().Key() == "ep0" || pk.Endpoint().Key() == "ep1" {
		t.Fatalf("fallback: %v %v", pk.Endpoint(), err)
	}
	pk.Done(nil)
	for _, bad := range [][]Pool{
		nil,
		{{Name: "a"}, {Name: "b"}},
		{{Name: "x", MinPromptTokens: 10}},
		{{Name: "y", MinPromptTokens: -1, Endpoints: []string{"a"}}},
	} {
		if _, err := Segregated(bad...); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("pools %+v accepted", bad)
		}
	}
}

// TestSingleCandidateIsRecorded checks that a cache-aware policy sees a pick
// with one candidate, whether the pool has one endpoint or the request's
// exclusions leave one (a retry on a two-replica pool): the choice is
// recorded, so a repeat of the prompt is charged only its uncached part.
func TestSingleCandidateIsRecorded(t *testing.T) {
	policies := []struct {
		name string
		new  func(ix *prefix.Index) (Policy, error)
	}{
		{"prefix-aware", func(ix *prefix.Index) (Policy, error) { return PrefixAware(PrefixAwareConfig{Index: ix}) }},
		{"sglang-cache-aware", func(ix *prefix.Index) (Policy, error) { return SGLangCacheAware(PrefixAwareConfig{Index: ix}) }},
		{"kv-cost", func(ix *prefix.Index) (Policy, error) {
			cfg := DynamoKVCostConfig()
			cfg.Index = ix
			return KVCost(cfg)
		}},
		{"gie-default", func(ix *prefix.Index) (Policy, error) { return GIEDefault(GIEConfig{Index: ix}) }},
		{"default", func(ix *prefix.Index) (Policy, error) { return Default(DefaultConfig{Index: ix}) }},
	}
	cases := []struct {
		name      string
		endpoints int
		exclude   []string
	}{
		{"one endpoint", 1, nil},
		{"exclude leaves one", 2, []string{"ep0"}},
	}
	const promptTokens, cachedBlocks = 160, 6 // 10 blocks of 16, the first 6 sent before
	prompt := blocks(7, 10)
	for _, pc := range policies {
		for _, tc := range cases {
			t.Run(pc.name+"/"+tc.name, func(t *testing.T) {
				ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
				if err != nil {
					t.Fatal(err)
				}
				pol, err := pc.new(ix)
				if err != nil {
					t.Fatal(err)
				}
				b := mustNew(t, pol)
				mustUpdate(t, b, eps(tc.endpoints))
				target := "ep" + string(rune('0'+tc.endpoints-1))
				pick := func(r Request) Pick {
					t.Helper()
					r.Exclude = tc.exclude
					pk, err := b.Pick(context.Background(), &r)
					if err != nil {
						t.Fatal(err)
					}
					if got := pk.Endpoint().Key(); got != target {
						t.Fatalf("picked %s, want %s", got, target)
					}
					return pk
				}
				// A shorter prompt of the same family goes first.
				first := pick(Request{PromptTokens: cachedBlocks * 16, Prefix: prompt[:cachedBlocks]})
				if got := statsByKey(b)[target].PrefillTokens; got != cachedBlocks*16 {
					t.Fatalf("first pick charged %d prefill tokens, want %d (nothing cached)", got, cachedBlocks*16)
				}
				first.Done(nil)
				second := pick(Request{PromptTokens: promptTokens, Prefix: prompt})
				defer second.Done(nil)
				if got, want := statsByKey(b)[target].PrefillTokens, int64(promptTokens-cachedBlocks*16); got != want {
					t.Fatalf("repeat charged %d prefill tokens, want %d (the prompt net of the %d cached blocks)", got, want, cachedBlocks)
				}
				if got := ix.Len(target); got == 0 {
					t.Fatalf("index holds nothing for %s after two picks", target)
				}
			})
		}
	}
}

// An endpoint whose last active request ends keeps its set, so that its next
// request allocates nothing, unless the set once held more than
// maxIdleActiveBlocks blocks or more than maxIdleActiveSets endpoints are
// tracked: idle memory stays bounded.
func TestActiveBlocksIdleSets(t *testing.T) {
	a, _ := NewActiveBlocks(16)
	small := Request{PromptTokens: 16 * 8, Prefix: blocks(1, 8)}
	a.add("ep", &small)
	a.release("ep", &small)
	if got := len(a.eps); got != 1 {
		t.Fatalf("%d sets after a small request ended, want the idle one kept", got)
	}
	big := Request{PromptTokens: 16 * (maxIdleActiveBlocks + 1), Prefix: blocks(2, maxIdleActiveBlocks+1)}
	a.add("ep", &big)
	a.release("ep", &big)
	if got := len(a.eps); got != 0 {
		t.Fatalf("%d sets after a request of %d blocks ended, want the grown set dropped", got, maxIdleActiveBlocks+1)
	}
	for i := range maxIdleActiveSets + 10 {
		key := "ep" + strconv.Itoa(i)
		a.add(key, &small)
		a.release(key, &small)
	}
	if got := len(a.eps); got > maxIdleActiveSets+1 {
		t.Fatalf("%d idle sets kept, want at most %d", got, maxIdleActiveSets+1)
	}
	if got := a.Blocks("ep3"); got != 0 {
		t.Fatalf("an idle endpoint reports %d active blocks", got)
	}
}

// TestKVCostTinyTemperature checks that a temperature so small that the
// softmax scale underflows chooses the cheapest endpoint, as the limit of
// small temperatures does, rather than a fixed one.
func TestKVCostTinyTemperature(t *testing.T) {
	cfg := DynamoKVCostConfig()
	cfg.Temperature = math.SmallestNonzeroFloat64
	p, err := KVCost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, p)
	mustUpdate(t, b, eps(2))
	for i := range 6 {
		// Each request adds a token of queued prefill, a sixteenth of a
		// block: the least loaded endpoint is the cheapest.
		if _, err := b.Pick(context.Background(), &Request{PromptTokens: 1}); err != nil {
			t.Fatal(err)
		}
		s := statsByKey(b)
		if d := s["ep0"].Outstanding - s["ep1"].Outstanding; d < -1 || d > 1 {
			t.Fatalf("pick %d: %d and %d outstanding, want the picks spread", i, s["ep0"].Outstanding, s["ep1"].Outstanding)
		}
	}
}

// TestIndexCapacityFollowsLastReport has picks race while the engine's
// reported KV capacity flips, then checks that once the reports settle the
// index is sized from the last one: a pick applying an older capacity after
// a newer one must not leave the index stale until the next change.
func TestIndexCapacityFollowsLastReport(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := PrefixAware(PrefixAwareConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	sig := &fakeSignal{}
	b := mustNew(t, pol, WithSignal(sig, time.Hour))
	mustUpdate(t, b, eps(1))
	key := "ep0"
	set := func(kvBlocks int) {
		sig.Set(key, Load{At: time.Now(), KVUsage: 0.1, KVBlocks: kvBlocks, BlockSize: 16})
	}
	req := &Request{PromptTokens: 64, Prefix: blocks(1, 4)}
	for round := 0; round < 200; round++ {
		var stop atomic.Bool
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					pk, err := b.Pick(context.Background(), req)
					if err != nil {
						t.Error(err)
						return
					}
					pk.Done(nil)
				}
			}()
		}
		for i := range 200 {
			set(1000 + i%2)
		}
		stop.Store(true)
		wg.Wait()
		last := 1000 + 199%2
		pk, err := b.Pick(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		if got := ix.Capacity(key); got != last {
			t.Fatalf("round %d: index capacity %d, want %d blocks from the last report", round, got, last)
		}
	}
}
