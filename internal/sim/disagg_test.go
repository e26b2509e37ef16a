package sim

import (
	"context"
	"reflect"
	"testing"
	"time"
)

func TestKVTransferTime(t *testing.T) {
	cases := []struct {
		name   string
		t      KVTransfer
		tokens int
		want   time.Duration
	}{
		{"defaults, nothing pulled", KVTransfer{}, 0, DefaultTransferLatency},
		{"defaults, 4k tokens", KVTransfer{}, 4096, DefaultTransferLatency + 4096*DefaultTransferPerToken},
		{"set", KVTransfer{PerToken: time.Microsecond, Latency: 5 * time.Millisecond}, 1000, 6 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.t.Time(c.tokens); got != c.want {
				t.Errorf("Time(%d) = %v, want %v", c.tokens, got, c.want)
			}
		})
	}
	// 128 KiB per token at 50 GB/s.
	if d := (KVTransfer{}).Time(1) - DefaultTransferLatency; d < 2600*time.Nanosecond || d > 2650*time.Nanosecond {
		t.Errorf("default per-token time %v, want about 2.62us", d)
	}
	if err := (&Config{Transfer: KVTransfer{PerToken: -1}}).normalize(); err == nil {
		t.Error("a negative transfer time is accepted")
	}
}

// prefixBlocks returns n chained block hashes of 64 tokens starting from
// seed.
func prefixBlocks(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := seed
	for i := range out {
		h = ChainHash(h, uint64(i))
		out[i] = h
	}
	return out
}

// A decode worker that holds the head of a prompt, received with an earlier
// request's KV, pulls only the blocks it lacks.
func TestDisaggPullsOnlyMissing(t *testing.T) {
	head := prefixBlocks(1, 16)
	longer := append(append([]uint64(nil), head...), prefixBlocks(2, 16)...)
	reqs := []Request{
		{Arrival: 0, PromptTokens: 1024, OutputTokens: 4, Prefix: head, BlockTokens: 64},
		// Long after the first ended: the decode worker holds its prompt.
		{Arrival: 10 * time.Second, PromptTokens: 2048, OutputTokens: 4, Prefix: longer, BlockTokens: 64},
		// The same prompt again: all but the last block is cached (a
		// prompt always computes at least one token).
		{Arrival: 20 * time.Second, PromptTokens: 2048, OutputTokens: 4, Prefix: longer, BlockTokens: 64},
	}
	pulled := map[int]int{}
	var times []time.Duration
	cfg := Config{Replicas: 2, Prefill: 1, onTransfer: func(req, tokens int, d time.Duration) {
		pulled[req] = tokens
		times = append(times, d)
	}}
	res, err := Simulate(context.Background(), cfg, reqs, "pd-round-robin")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]int{0: 1024, 1: 1024, 2: 64}
	if !reflect.DeepEqual(pulled, want) {
		t.Errorf("tokens pulled by request %v, want %v", pulled, want)
	}
	for i, d := range times {
		if w := (KVTransfer{}).Time(want[i]); d != w {
			t.Errorf("request %d: transfer %v, want %v", i, d, w)
		}
	}
	if res.Completed != 3 || res.Prefill != 1 || res.Decode != 1 {
		t.Errorf("completed %d with %d+%d workers, want 3 with 1+1", res.Completed, res.Prefill, res.Decode)
	}
	// The first token comes after the prefill, the transfer and one decode
	// iteration: the TTFT of the first request is at least the prefill's
	// iteration plus the transfer.
	least := time.Duration(MockerPrefillMillis(1024)*float64(time.Millisecond)) + (KVTransfer{}).Time(1024)
	if got := time.Duration(res.TTFTs[len(res.TTFTs)-1] * float64(time.Millisecond)); got < least {
		t.Errorf("largest TTFT %v, want at least %v", got, least)
	}
}

// pdRun runs policy disaggregated on a small default workload and returns
// the result and the runner at its end.
func pdRun(t *testing.T, policy string, cfg Config) (*Result, *runner) {
	t.Helper()
	reqs, err := DefaultSynthetic(1500, 30).Generate(5)
	if err != nil {
		t.Fatal(err)
	}
	var end *runner
	cfg.onEnd = func(r *runner) { end = r }
	res, err := Simulate(context.Background(), cfg, reqs, policy)
	if err != nil {
		t.Fatalf("%s: %v", policy, err)
	}
	return res, end
}

// Every disaggregated policy finishes every request, and both pools'
// Balancers and every replica end with nothing charged (Simulate checks
// both and fails otherwise).
func TestDisaggRunsComplete(t *testing.T) {
	for _, p := range Policies() {
		if p.Decode == nil {
			continue
		}
		t.Run(p.Name, func(t *testing.T) {
			res, r := pdRun(t, p.Name, Config{Seed: 1, Prefill: 3, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}})
			if res.Completed != res.Requests {
				t.Errorf("%d of %d requests completed", res.Completed, res.Requests)
			}
			if res.Prefill != 3 || res.Decode != 5 {
				t.Errorf("%d+%d workers, want 3+5", res.Prefill, res.Decode)
			}
			for _, rep := range r.reps {
				if rep.outstanding != 0 || rep.NumReceiving() != 0 || len(rep.Started()) != 0 {
					t.Errorf("replica %d ended with %d outstanding, %d receiving", rep.idx, rep.outstanding, rep.NumReceiving())
				}
			}
		})
	}
}

// Prefill workers only prefill and decode workers only decode the requests
// prefilled remotely: without the conditional rule and without preemption,
// a prefill worker emits no decode token and a decode worker prefills no
// prompt token; every request's prompt is computed once, on its prefill
// worker, and its output on its decode worker.
func TestDisaggRoles(t *testing.T) {
	res, r := pdRun(t, "pd-default", Config{Seed: 2, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}})
	if res.Preemptions != 0 || res.Local != 0 {
		t.Fatalf("%d preemptions and %d local prefills; the test needs none", res.Preemptions, res.Local)
	}
	p := r.cfg.Prefill
	if p != 2 {
		t.Fatalf("%d prefill workers, want the default of a quarter of 8", p)
	}
	var computed, output, prefilled, decoded int64
	for i := range r.st {
		s := &r.st[i]
		if s.pd == nil || s.pd.prefill < 0 || s.pd.prefill >= p || s.replica < p {
			t.Fatalf("request %d: prefill replica %d, decode replica %d", i, s.pd.prefill, s.replica)
		}
		computed += int64(s.req.PromptTokens - s.pd.pre.Cached())
		output += int64(s.req.OutputTokens)
	}
	for _, rep := range r.reps {
		if rep.idx < p && rep.Stats().Decoded != 0 {
			t.Errorf("prefill replica %d decoded %d tokens", rep.idx, rep.Stats().Decoded)
		}
		if rep.idx >= p && rep.Stats().Prefilled != 0 {
			t.Errorf("decode replica %d prefilled %d tokens", rep.idx, rep.Stats().Prefilled)
		}
		prefilled += rep.Stats().Prefilled
		decoded += rep.Stats().Decoded
	}
	if prefilled != computed {
		t.Errorf("%d prompt tokens prefilled, want the %d uncached on the prefill workers", prefilled, computed)
	}
	if decoded != output {
		t.Errorf("%d tokens decoded, want the %d output tokens", decoded, output)
	}
}

// The conditional rule keeps a conversation's next turn, most of whose
// prompt its decode worker holds, on that worker; without it, nothing
// prefills locally.
func TestDisaggConditionalRule(t *testing.T) {
	cfg := Config{Seed: 4, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}}
	plain, _ := pdRun(t, "pd-default", cfg)
	if plain.Local != 0 {
		t.Errorf("pd-default prefilled %d requests locally, want 0", plain.Local)
	}
	res, r := pdRun(t, "pd-default-local", cfg)
	if res.Local < res.Requests/4 {
		t.Errorf("pd-default-local prefilled %d of %d requests locally, want a quarter at least", res.Local, res.Requests)
	}
	mostly := 0
	for i := range r.st {
		s := &r.st[i]
		if s.pd.prefill >= 0 {
			continue
		}
		uncached := s.req.PromptTokens - s.Cached()
		if uncached < PDLocalPrefillTokens && float64(uncached) < 0.7*float64(s.req.PromptTokens) {
			mostly++
		}
	}
	if mostly < res.Local*9/10 {
		t.Errorf("%d of %d local prefills found most of their prompt in the decode worker's cache, want nine in ten", mostly, res.Local)
	}
	if res.Completed != res.Requests {
		t.Errorf("%d of %d requests completed", res.Completed, res.Requests)
	}
}

func TestDisaggDeterministic(t *testing.T) {
	reqs, err := DefaultSynthetic(800, 30).Generate(9)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Seed: 3, Routers: 2, Prefill: 3, Delay: time.Millisecond}
	for _, p := range []string{"pd-default-local", "pd-dynamo"} {
		a, err := Simulate(context.Background(), cfg, reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Simulate(context.Background(), cfg, reqs, p)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs with the same seed differ", p)
		}
	}
}

func TestDisaggInvalidConfig(t *testing.T) {
	reqs, _ := DefaultSynthetic(10, 10).Generate(1)
	for _, cfg := range []Config{
		{Replicas: 4, Prefill: 4},
		{Replicas: 4, Prefill: -1},
		{Replicas: 1},
		{Replicas: 4, Routers: 2, Share: time.Second},
	} {
		if _, err := Simulate(context.Background(), cfg, reqs, "pd-default"); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
