package llmlb_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// conversation returns the hashed prefix blocks of a chat's text so far, as
// a gateway computes them from the request body (httplb does it for you).
func conversation(h *prefix.Hasher, turns int) (blocks []uint64, tokens int) {
	text := strings.Repeat("You are a helpful assistant for the billing team. ", 40)
	for i := range turns {
		text += fmt.Sprintf("user turn %d: why was invoice %d charged twice? ", i, 1000+i)
	}
	blocks = h.HashString(prefix.Salt{Model: "llama-3-8b"}, text)
	return blocks, len(text) / 4 // about four bytes per token
}

// Default is the recommended policy. Without engine KV events it remembers
// where it sent each prompt's blocks (the Index), so the next turn of a
// conversation goes where its history is cached, unless that replica's
// queue costs more than the cache saves.
func ExampleDefault() {
	hasher, err := prefix.NewHasher(prefix.HasherConfig{})
	if err != nil {
		panic(err)
	}
	index, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		panic(err)
	}
	policy, err := llmlb.Default(llmlb.DefaultConfig{Index: index})
	if err != nil {
		panic(err)
	}
	b, err := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(1, 2)))
	if err != nil {
		panic(err)
	}
	_ = b.Update([]llmlb.Endpoint{replica("a:8000"), replica("b:8000"), replica("c:8000"), replica("d:8000")})
	ctx := context.Background()

	var first string
	for turn := 1; turn <= 3; turn++ {
		blocks, tokens := conversation(hasher, turn)
		p, err := b.Pick(ctx, &llmlb.Request{PromptTokens: tokens, MaxTokens: 256, Prefix: blocks})
		if err != nil {
			panic(err)
		}
		if turn == 1 {
			first = p.Endpoint().Key()
		}
		fmt.Printf("turn %d on the first turn's replica: %v\n", turn, p.Endpoint().Key() == first)
		p.FirstToken()
		p.Done(nil)
	}
	// Output:
	// turn 1 on the first turn's replica: true
	// turn 2 on the first turn's replica: true
	// turn 3 on the first turn's replica: true
}

// Given the requests' latency objectives, Default also prices the decode
// stall a cache miss causes: while a replica prefills a new prompt, every
// request decoding there waits. Here replica a streams 20 answers and b has
// one long prompt queued; a 2000-token prompt that neither has cached goes
// to a unless the objectives say that stalling a's 20 answers costs more
// than waiting behind b's prefill.
func ExampleDefault_objectives() {
	for _, objectives := range []bool{false, true} {
		cfg := llmlb.DefaultConfig{}
		if objectives {
			cfg.TTFTObjective, cfg.TPOTObjective = 2*time.Second, 50*time.Millisecond
		}
		policy, err := llmlb.Default(cfg)
		if err != nil {
			panic(err)
		}
		b, err := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(1, 2)))
		if err != nil {
			panic(err)
		}
		_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b")})
		ctx := context.Background()
		var held []llmlb.Pick
		for range 20 {
			p, _ := b.Pick(ctx, &llmlb.Request{PromptTokens: 100, MaxTokens: 100, Exclude: []string{"b"}})
			p.FirstToken() // a is decoding its answer
			held = append(held, p)
		}
		p, _ := b.Pick(ctx, &llmlb.Request{PromptTokens: 3000, MaxTokens: 100, Exclude: []string{"a"}})
		held = append(held, p) // b has a long prompt to prefill
		p, err = b.Pick(ctx, &llmlb.Request{PromptTokens: 2000, MaxTokens: 256})
		if err != nil {
			panic(err)
		}
		fmt.Printf("objectives %v: %s\n", objectives, p.Endpoint().Key())
		p.Done(nil)
		for _, h := range held {
			h.Done(nil)
		}
	}
	// Output:
	// objectives false: a
	// objectives true: b
}

// ConsistentHash keeps each affinity key (a session, a user) on one replica
// while that replica's load stays within Balance times the mean.
func ExampleConsistentHash() {
	policy, err := llmlb.ConsistentHash(llmlb.HashConfig{})
	if err != nil {
		panic(err)
	}
	b, _ := llmlb.New(policy)
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})

	home := map[string]string{}
	moved := 0
	for i := range 30 {
		session := fmt.Sprintf("session-%d", i%10)
		p, _ := b.Pick(context.Background(), &llmlb.Request{AffinityKey: session})
		if h, ok := home[session]; ok && h != p.Endpoint().Key() {
			moved++
		}
		home[session] = p.Endpoint().Key()
		p.Done(nil)
	}
	fmt.Println("sessions that moved:", moved)
	// Output: sessions that moved: 0
}

// PrefixHash is SGLang's prefix_hash: the first PrefixTokens of the prompt
// pick the replica on a ring, so prompts with one system prompt meet on one
// replica, unless it carries more than LoadFactor times its share.
func ExamplePrefixHash() {
	hasher, _ := prefix.NewHasher(prefix.HasherConfig{})
	policy, err := llmlb.PrefixHash(llmlb.PrefixHashConfig{})
	if err != nil {
		panic(err)
	}
	b, _ := llmlb.New(policy)
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})

	seen := map[string]bool{}
	for turn := 1; turn <= 4; turn++ {
		blocks, tokens := conversation(hasher, turn)
		p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: tokens, Prefix: blocks})
		seen[p.Endpoint().Key()] = true
		p.Done(nil)
	}
	fmt.Println("replicas used:", len(seen))
	// Output: replicas used: 1
}

// SGLangCacheAware reproduces SGLang's cache_aware policy: the replica with
// the longest cached prefix takes the request if the match is long enough
// and the pool is balanced; otherwise the least-loaded replica does.
// PrefixAware is the same rule with this package's defaults.
func ExampleSGLangCacheAware() {
	hasher, _ := prefix.NewHasher(prefix.HasherConfig{})
	index, _ := prefix.NewIndex(prefix.IndexConfig{})
	policy, err := llmlb.SGLangCacheAware(llmlb.PrefixAwareConfig{Index: index})
	if err != nil {
		panic(err)
	}
	b, _ := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(3, 4)))
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})

	blocks, tokens := conversation(hasher, 1)
	first, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: tokens, Prefix: blocks})
	first.Done(nil)
	blocks, tokens = conversation(hasher, 2)
	next, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: tokens, Prefix: blocks})
	next.Done(nil)
	fmt.Println(first.Endpoint().Key() == next.Endpoint().Key())
	// Output: true
}

// KVCost is NVIDIA Dynamo's KV router cost: blocks to prefill, weighted,
// plus blocks being decoded, with Dynamo's defaults from
// DynamoKVCostConfig.
func ExampleKVCost() {
	hasher, _ := prefix.NewHasher(prefix.HasherConfig{})
	events, _ := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
	cfg := llmlb.DynamoKVCostConfig()
	cfg.Index = events
	policy, err := llmlb.KVCost(cfg)
	if err != nil {
		panic(err)
	}
	b, _ := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(5, 6)))
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})

	blocks, tokens := conversation(hasher, 3)
	// c reported (by its KV events) that it holds the conversation.
	_ = events.Stored("c", hasher.BlockTokens(), blocks...)
	p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: tokens, MaxTokens: 128, Prefix: blocks})
	fmt.Println(p.Endpoint().Key())
	p.Done(nil)
	// Output: c
}

// GIEDefault is the Kubernetes inference gateway's default endpoint picker:
// a weighted sum of queue, KV-cache utilization and approximate prefix
// scores over the engines' metrics (give it a Signal, such as a
// signals.Scraper).
func ExampleGIEDefault() {
	index, _ := prefix.NewIndex(prefix.IndexConfig{})
	policy, err := llmlb.GIEDefault(llmlb.GIEConfig{Index: index})
	if err != nil {
		panic(err)
	}
	now := time.Now()
	metrics := staticSignal{
		"a": {At: now, Running: 12, Waiting: 6, KVUsage: 0.9},
		"b": {At: now, Running: 3, Waiting: 0, KVUsage: 0.3},
		"c": {At: now, Running: 8, Waiting: 2, KVUsage: 0.7},
	}
	b, _ := llmlb.New(policy, llmlb.WithSignal(metrics, 2*time.Second))
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})
	p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: 900})
	fmt.Println(p.Endpoint().Key())
	p.Done(nil)
	// Output: b
}

// Segregated sends each request to the pool that claims its size, so a
// long document does not stall the prefill of replicas serving chat turns.
func ExampleSegregated() {
	policy, err := llmlb.Segregated(
		llmlb.Pool{Name: "long", MinPromptTokens: 32_000, Endpoints: []string{"big-1", "big-2"}, Policy: llmlb.LeastTokens()},
		llmlb.Pool{Name: "chat", Endpoints: []string{"small-1", "small-2"}, Policy: llmlb.LeastOutstanding()},
	)
	if err != nil {
		panic(err)
	}
	b, _ := llmlb.New(policy)
	_ = b.Update([]llmlb.Endpoint{replica("big-1"), replica("big-2"), replica("small-1"), replica("small-2")})
	for _, prompt := range []int{200, 90_000, 1_500} {
		p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: prompt})
		fmt.Println(prompt, "->", strings.Split(p.Endpoint().Key(), "-")[0])
		p.Done(nil)
	}
	// Output:
	// 200 -> small
	// 90000 -> big
	// 1500 -> small
}

// An Observer sees every pick, first token and completion, with their
// latencies, on the caller's goroutine: the place for metrics and logs
// (package telemetry builds one for OpenTelemetry).
func ExampleWithObserver() {
	clock := &stepClock{t: time.Unix(1_700_000_000, 0)}
	obs := &llmlb.Observer{
		Pick: func(i llmlb.PickInfo) { fmt.Println("picked", i.Endpoint.Key()) },
		FirstToken: func(i llmlb.FirstTokenInfo) {
			fmt.Println("first token after", i.Latency)
		},
		Done: func(i llmlb.DoneInfo) { fmt.Println("done after", i.Latency, "error:", i.Err) },
	}
	b, _ := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clock), llmlb.WithObserver(obs))
	_ = b.Update([]llmlb.Endpoint{replica("a")})

	p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: 500})
	clock.t = clock.t.Add(180 * time.Millisecond)
	p.FirstToken()
	clock.t = clock.t.Add(2 * time.Second)
	p.Done(nil)
	// Output:
	// picked a
	// first token after 180ms
	// done after 2.18s error: <nil>
}
