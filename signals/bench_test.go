package signals_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

func BenchmarkParse(b *testing.B) {
	for _, c := range []struct{ engine, file string }{
		{"vllm", "vllm.prom"},
		{"vllm-openmetrics", "vllm_openmetrics.prom"},
		{"sglang", "sglang.prom"},
		{"trtllm", "trtllm.prom"},
		{"triton", "triton.prom"},
		{"llamacpp", "llamacpp.prom"},
	} {
		body := fixture(b, c.file)
		ct := textType
		if c.engine == "vllm-openmetrics" {
			ct = omType
		}
		b.Run("engine="+c.engine, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := signals.Parse(bytes.NewReader(body), ct, signals.EngineAuto); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseLoRALabel parses a 4 MiB LoRA label (within
// DefaultMaxBodyBytes) of one name repeated, and of 1024 distinct names and
// then repeats: the two should cost about the same, linear in the label.
func BenchmarkParseLoRALabel(b *testing.B) {
	for _, distinct := range []int{1, 1024} {
		body := loraLabel(distinct, 4<<20-256)
		b.Run(fmt.Sprintf("distinct=%d", distinct), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := signals.Parse(strings.NewReader(body), textType, signals.EngineVLLM); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad is Store.Load, the read path of a caller that asks a store
// directly; the balancers of this module read through its loader instead
// (BenchmarkPickDefault, BenchmarkPickAbsent).
func BenchmarkLoad(b *testing.B) {
	for _, n := range []int{16, 1024} {
		var s signals.Store
		keys := make([]string, n)
		now := time.Now()
		for i := range keys {
			keys[i] = fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
			if err := s.Record(keys[i], llmlb.Load{At: now, Running: i, KVUsage: 0.5}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(1, 2))
				for pb.Next() {
					if _, ok := s.Load(keys[r.IntN(n)]); !ok {
						b.Fatal("missing")
					}
				}
			})
		})
	}
}

// BenchmarkPickAbsent is BenchmarkPickDefault at 64 endpoints that have
// not reported into the Store, which holds 1024 others: a shared store
// that has no observation of this balancer's endpoints yet, as every pick
// asks it for each.
func BenchmarkPickAbsent(b *testing.B) {
	var s signals.Store
	now := time.Now()
	for i := range 1024 {
		if err := s.Record(fmt.Sprintf("10.1.%d.%d:8000", i/256, i%256), llmlb.Load{At: now, Running: 1}); err != nil {
			b.Fatal(err)
		}
	}
	eps := make([]llmlb.Endpoint, 64)
	for i := range eps {
		eps[i] = benchEndpoint(fmt.Sprintf("10.0.0.%d:8000", i))
	}
	benchPickDefault(b, &s, eps)
}

// BenchmarkStoreAdd measures recording a new endpoint into a Store that
// holds n: with room (the endpoint is then deleted, so the store keeps n);
// full at MaxKeys n, where each new endpoint evicts one; and full with half
// of the endpoints live, eight of them recorded again before each new one,
// so that the eviction passes over recorded endpoints. Each should cost
// about the same at every n: a store filled one endpoint at a time, or
// churning through endpoints, must not pay for the ones it holds.
func BenchmarkStoreAdd(b *testing.B) {
	for _, n := range []int{1024, 65536} {
		keys := make([]string, 2*n) // the first n fill the store
		for i := range keys {
			keys[i] = fmt.Sprintf("10.%d.%d.%d:8000", i>>16, i>>8&255, i&255)
		}
		now := time.Unix(1000, 0)
		fill := func(b *testing.B, maxKeys int) *signals.Store {
			s, err := signals.NewStore(signals.StoreConfig{MaxKeys: maxKeys})
			if err != nil {
				b.Fatal(err)
			}
			for i, k := range keys[:n] {
				if err := s.Record(k, llmlb.Load{At: now.Add(time.Duration(i)), Running: 1}); err != nil {
					b.Fatal(err)
				}
			}
			return s
		}
		b.Run(fmt.Sprintf("op=add-delete/endpoints=%d", n), func(b *testing.B) {
			s := fill(b, n+1)
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Record("new", llmlb.Load{At: now, Running: 1}); err != nil {
					b.Fatal(err)
				}
				s.Delete("new")
			}
		})
		b.Run(fmt.Sprintf("op=add-full/endpoints=%d", n), func(b *testing.B) {
			s := fill(b, n)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// A key not held: each comes back after n others, when
				// it has been evicted.
				if err := s.Record(keys[(n+i)%(2*n)], llmlb.Load{At: now.Add(time.Duration(n + i)), Running: 1}); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if s.Len() != n {
				b.Fatalf("store holds %d endpoints, want %d", s.Len(), n)
			}
		})
		b.Run(fmt.Sprintf("op=add-rolling/endpoints=%d", n), func(b *testing.B) {
			s := fill(b, n)
			live := keys[:n/2]
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				at := now.Add(time.Duration(n + i))
				for j := range 8 {
					if err := s.Record(live[(8*i+j)%len(live)], llmlb.Load{At: at, Running: 1}); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Record(keys[n+i%n], llmlb.Load{At: at, Running: 1}); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkPickDefault measures one Pick plus Done of llmlb.Default that
// reads a fresh observation of every endpoint from a Store, the set-up of a
// router that scrapes its engines: the cost of a decision with a signal, to
// compare with llmlb's BenchmarkPick and BenchmarkDecision.
func BenchmarkPickDefault(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			var s signals.Store
			eps := make([]llmlb.Endpoint, n)
			now := time.Now()
			for i := range eps {
				key := fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
				eps[i] = benchEndpoint(key)
				if err := s.Record(key, llmlb.Load{At: now, Running: 3 + i%5, Waiting: i % 3, KVUsage: 0.5, KVBlocks: 32768, BlockSize: 16}); err != nil {
					b.Fatal(err)
				}
			}
			benchPickDefault(b, &s, eps)
		})
	}
}

// benchEndpoint is an endpoint named by its key.
type benchEndpoint string

func (e benchEndpoint) Key() string { return string(e) }

// BenchmarkRecord is the push path, one key per goroutine contended by all.
func BenchmarkRecord(b *testing.B) {
	var s signals.Store
	base := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			_ = s.Record("a", llmlb.Load{At: base.Add(time.Duration(i)), Running: i})
		}
	})
}

// BenchmarkScrapeOnce is one scrape of a vLLM exposition over loopback HTTP,
// client and server in this process.
func BenchmarkScrapeOnce(b *testing.B) {
	srv := newSwitchServer(b, serve(textType, fixture(b, "vllm.prom")))
	s, err := signals.NewScraper(signals.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.SetTargets(map[string]string{"a": srv.URL}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Scrape(context.Background(), "a"); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPickDefault measures one Pick plus Done of llmlb.Default over eps
// with s as its signal.
func benchPickDefault(b *testing.B, s *signals.Store, eps []llmlb.Endpoint) {
	policy, err := llmlb.Default(llmlb.DefaultConfig{})
	if err != nil {
		b.Fatal(err)
	}
	bal, err := llmlb.New(policy, llmlb.WithSignal(s, time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	if err := bal.Update(eps); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := &llmlb.Request{PromptTokens: 1000, MaxTokens: 256}
	b.ReportAllocs()
	for b.Loop() {
		p, err := bal.Pick(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		p.Done(nil)
	}
}
