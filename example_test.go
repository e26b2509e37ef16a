package llmlb_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// replica is an Endpoint: anything with a stable key.
type replica string

func (r replica) Key() string { return string(r) }

func Example() {
	b, err := llmlb.New(llmlb.LeastTokens(), llmlb.WithRand(rand.NewPCG(1, 2)))
	if err != nil {
		panic(err)
	}
	if err := b.Update([]llmlb.Endpoint{replica("10.0.0.1:8000"), replica("10.0.0.2:8000")}); err != nil {
		panic(err)
	}
	ctx := context.Background()

	// A long summarization lands on one replica...
	long, _ := b.Pick(ctx, &llmlb.Request{PromptTokens: 30000, MaxTokens: 1024})
	// ...so the short chat turns that follow go to the other one.
	for range 3 {
		short, _ := b.Pick(ctx, &llmlb.Request{PromptTokens: 40, MaxTokens: 64})
		fmt.Println(long.Endpoint().Key() != short.Endpoint().Key())
		short.FirstToken()
		short.Done(nil)
	}
	long.FirstToken() // prefill done: the prompt no longer counts as pending work
	long.Done(nil)    // all work released
	// Output:
	// true
	// true
	// true
}

// staticSignal reports fixed observations, as a metrics scraper would.
type staticSignal map[string]llmlb.Load

func (s staticSignal) Load(key string) (llmlb.Load, bool) {
	l, ok := s[key]
	return l, ok
}

func ExampleWithSignal() {
	now := time.Now()
	sig := staticSignal{
		"a": {At: now, Running: 30, Waiting: 10, KVUsage: 0.95},
		"b": {At: now, Running: 4, Waiting: 0, KVUsage: 0.20},
	}
	b, _ := llmlb.New(llmlb.P2C(llmlb.KVScore), llmlb.WithSignal(sig, 10*time.Second))
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b")})

	p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: 2000})
	fmt.Println(p.Endpoint().Key())
	p.Done(nil)
	// Output: b
}

func ExampleBalancer_SetHealthy() {
	b, _ := llmlb.New(llmlb.RoundRobin())
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})
	_ = b.SetHealthy("b", false) // ejected by an outlier detector

	for range 4 {
		p, _ := b.Pick(context.Background(), nil)
		fmt.Print(p.Endpoint().Key(), " ")
		p.Done(nil)
	}
	fmt.Println()
	// Output: a c a c
}

func ExampleRequest_exclude() {
	b, _ := llmlb.New(llmlb.P2C(nil))
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b")})

	// A retry excludes the endpoint its first attempt failed on.
	first, _ := b.Pick(context.Background(), nil)
	first.Done(fmt.Errorf("503"))
	retry, _ := b.Pick(context.Background(), &llmlb.Request{Exclude: []string{first.Endpoint().Key()}})
	fmt.Println(retry.Endpoint().Key() != first.Endpoint().Key())
	retry.Done(nil)
	// Output: true
}

// sessionPolicy is a custom Policy: it keeps a session on the endpoint its
// key hashes to unless that endpoint has twice the mean load.
type sessionPolicy struct{}

func (sessionPolicy) Choose(c *llmlb.Candidates) int {
	r := c.Request()
	if r.AffinityKey == "" {
		return llmlb.P2C(nil).Choose(c)
	}
	var h uint64 = 14695981039346656037
	for i := 0; i < len(r.AffinityKey); i++ {
		h = (h ^ uint64(r.AffinityKey[i])) * 1099511628211
	}
	home := int(h % uint64(c.Len()))
	total := 0.0
	for i := 0; i < c.Len(); i++ {
		total += float64(c.Load(i).Requests)
	}
	if float64(c.Load(home).Requests) > 2*math.Max(total/float64(c.Len()), 1) {
		return llmlb.P2C(nil).Choose(c)
	}
	return home
}

func ExamplePolicy() {
	b, _ := llmlb.New(sessionPolicy{})
	_ = b.Update([]llmlb.Endpoint{replica("a"), replica("b"), replica("c")})
	seen := map[string]bool{}
	for range 5 {
		p, _ := b.Pick(context.Background(), &llmlb.Request{AffinityKey: "conversation-42"})
		seen[p.Endpoint().Key()] = true
		p.Done(nil)
	}
	fmt.Println(len(seen))
	// Output: 1
}

// Engines that publish KV events (vLLM's BlockStored and BlockRemoved) tell
// Default what they really hold: feed the events to an events-only index and
// pass it as DefaultConfig.Events.
func ExampleDefault_events() {
	hasher, err := prefix.NewHasher(prefix.HasherConfig{})
	if err != nil {
		panic(err)
	}
	events, err := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
	if err != nil {
		panic(err)
	}
	policy, err := llmlb.Default(llmlb.DefaultConfig{Events: events})
	if err != nil {
		panic(err)
	}
	b, err := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(1, 2)))
	if err != nil {
		panic(err)
	}
	_ = b.Update([]llmlb.Endpoint{replica("a:8000"), replica("b:8000"), replica("c:8000")})

	prompt := make([]uint32, 2048) // the prompt's token IDs
	for i := range prompt {
		prompt[i] = uint32(i % 1000)
	}
	blocks := hasher.HashTokens(prefix.Salt{Model: "llama-3-8b"}, prompt)
	// b:8000 reports that it stored the prompt's blocks.
	if err := events.Stored("b:8000", hasher.BlockTokens(), blocks...); err != nil {
		panic(err)
	}
	p, _ := b.Pick(context.Background(), &llmlb.Request{PromptTokens: len(prompt), MaxTokens: 256, Prefix: blocks})
	fmt.Println(p.Endpoint().Key())
	p.Done(nil)
	// Output:
	// b:8000
}

// stepClock is a clock that the example moves by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }

// Managed API deployments report no load: PeakEWMA routes on the latency per
// output token they answer with, and a slow answer steers traffic away at
// once.
func ExamplePeakEWMA() {
	clock := &stepClock{t: time.Unix(1_700_000_000, 0)}
	policy, err := llmlb.PeakEWMA(llmlb.PeakEWMAConfig{})
	if err != nil {
		panic(err)
	}
	b, err := llmlb.New(policy, llmlb.WithClock(clock), llmlb.WithRand(rand.NewPCG(1, 2)))
	if err != nil {
		panic(err)
	}
	if err := b.Update([]llmlb.Endpoint{replica("eastus"), replica("swedencentral")}); err != nil {
		panic(err)
	}
	ctx := context.Background()
	// One answer from each: 200 tokens in 2 s from eastus, in 8 s from
	// swedencentral, which is having a bad minute.
	for _, d := range []struct {
		other string
		took  time.Duration
	}{{"swedencentral", 2 * time.Second}, {"eastus", 8 * time.Second}} {
		p, _ := b.Pick(ctx, &llmlb.Request{Exclude: []string{d.other}})
		p.FirstToken()
		clock.t = clock.t.Add(d.took)
		p.Generated(200)
		p.Done(nil)
	}
	picks := map[string]int{}
	for range 10 {
		p, _ := b.Pick(ctx, &llmlb.Request{})
		picks[p.Endpoint().Key()]++
		defer p.Done(nil) // all ten in flight at once
	}
	fmt.Println(picks["eastus"], picks["swedencentral"])
	// Output:
	// 9 1
}

func ExampleDisaggregated() {
	ctx := context.Background()
	// The prefill pool weighs prefix affinity against queued prefill; the
	// decode pool, with its own index, weighs KV footprint and batch.
	newPool := func(keys ...string) *llmlb.Balancer {
		ix, err := prefix.NewIndex(prefix.IndexConfig{})
		if err != nil {
			panic(err)
		}
		policy, err := llmlb.Default(llmlb.DefaultConfig{Index: ix})
		if err != nil {
			panic(err)
		}
		b, err := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(1, 2)))
		if err != nil {
			panic(err)
		}
		eps := make([]llmlb.Endpoint, len(keys))
		for i, k := range keys {
			eps[i] = replica(k)
		}
		if err := b.Update(eps); err != nil {
			panic(err)
		}
		return b
	}
	pd, err := llmlb.NewDisaggregated(newPool("prefill-0", "prefill-1"), newPool("decode-0", "decode-1", "decode-2"),
		llmlb.DisaggConfig{LocalPrefillTokens: 512, LocalPrefillRatio: 1})
	if err != nil {
		panic(err)
	}
	for _, tokens := range []int{6000, 200} {
		p, err := pd.Pick(ctx, &llmlb.Request{PromptTokens: tokens, MaxTokens: 256})
		if err != nil {
			panic(err)
		}
		if p.Local() {
			fmt.Printf("%d tokens: prefill and decode on %s\n", tokens, p.Decode.Endpoint().Key()[:6])
		} else {
			fmt.Printf("%d tokens: prefill on %s, decode on %s\n", tokens, p.Prefill.Endpoint().Key()[:7], p.Decode.Endpoint().Key()[:6])
		}
		// Send the prompt to the prefill endpoint and the request to the
		// decode endpoint; when the first token streams:
		p.FirstToken()
		// ... and when the response ends:
		p.Done(nil)
	}
	// Output:
	// 6000 tokens: prefill on prefill, decode on decode
	// 200 tokens: prefill and decode on decode
}
