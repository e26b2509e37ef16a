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

// BenchmarkLoad is the read path the balancer takes on every pick.
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
			policy, err := llmlb.Default(llmlb.DefaultConfig{})
			if err != nil {
				b.Fatal(err)
			}
			bal, err := llmlb.New(policy, llmlb.WithSignal(&s, time.Hour))
			if err != nil {
				b.Fatal(err)
			}
			if err := bal.Update(eps); err != nil {
				b.Fatal(err)
			}
			req := &llmlb.Request{PromptTokens: 1000, MaxTokens: 256}
			b.ReportAllocs()
			for b.Loop() {
				p, err := bal.Pick(context.Background(), req)
				if err != nil {
					b.Fatal(err)
				}
				p.Done(nil)
			}
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
