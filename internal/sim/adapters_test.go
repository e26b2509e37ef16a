package sim

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"
)

func TestSimulatedAdapterLoadStalls(t *testing.T) {
	reqs := []Request{{PromptTokens: 100, OutputTokens: 1, Adapter: "a"}}
	cfg := Config{Replicas: 1, Engine: Engine{AdapterSlots: 2, AdapterLoad: 300 * time.Millisecond}}
	with := run1(t, cfg, reqs)
	cfg.Engine.AdapterSlots = 0
	without := run1(t, cfg, reqs)
	if d := with.TTFT.P50 - without.TTFT.P50; d < 299 || d > 301 {
		t.Fatalf("TTFT %v ms with a load, %v without: want 300 ms apart", with.TTFT.P50, without.TTFT.P50)
	}
}

func TestSyntheticAdapters(t *testing.T) {
	plain, err := DefaultSynthetic(3000, 50).Generate(7)
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := LoRASynthetic(3000, 50).Generate(7)
	if err != nil {
		t.Fatal(err)
	}
	// The adapters are drawn from a source of their own: the arrivals and
	// lengths are those of the workload without them.
	for i := range reqs {
		if reqs[i].Arrival != plain[i].Arrival || reqs[i].PromptTokens != plain[i].PromptTokens || reqs[i].OutputTokens != plain[i].OutputTokens {
			t.Fatalf("request %d differs beyond its adapter", i)
		}
		if plain[i].Adapter != "" {
			t.Fatalf("request %d of a workload without adapters has adapter %q", i, plain[i].Adapter)
		}
	}
	count := map[string]int{}
	bySession := map[string]string{}
	for _, r := range reqs {
		if r.Adapter == "" {
			t.Fatal("a request without an adapter")
		}
		count[r.Adapter]++
		if r.Session == "" {
			continue
		}
		if a, ok := bySession[r.Session]; ok && a != r.Adapter {
			t.Fatalf("session %s switches from %s to %s", r.Session, a, r.Adapter)
		}
		bySession[r.Session] = r.Adapter
	}
	if len(count) > LoRAAdapters || count["lora-0"] <= count["lora-1"] || count["lora-1"] <= count["lora-8"] {
		t.Fatalf("adapter counts %v: want Zipf popularity over at most %d", count, LoRAAdapters)
	}
	bad := LoRASynthetic(10, 1)
	bad.AdapterZipf = 1
	if _, err := bad.Generate(1); err == nil {
		t.Fatal("Zipf exponent 1 accepted")
	}
}

func TestSaltedPrefix(t *testing.T) {
	head := []uint64{1, 2, 3}
	if got := salted(head, ""); !slices.Equal(got, head) {
		t.Fatalf("the base model's prefix changed: %v", got)
	}
	a, b := salted(head, "a"), salted(head, "b")
	if slices.Equal(a, b) || a[0] == head[0] || !slices.Equal(a, salted(head, "a")) {
		t.Fatalf("salted chains a %v, b %v", a, b)
	}
}

func TestLoRAScenarioAdapterAwareWins(t *testing.T) {
	s, err := LookupScenario("lora")
	if err != nil {
		t.Fatal(err)
	}
	n := 4000
	if testing.Short() {
		n = 1500
	}
	w := s.Workload
	w.Requests = n
	reqs, err := w.Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Compare(context.Background(), s.Config, reqs, []string{"default", "default-lora"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	blind, aware := res[0], res[1]
	if !(aware.SLOAttainment > blind.SLOAttainment) {
		t.Fatalf("SLO attainment %v adapter-aware, %v blind: want aware higher", aware.SLOAttainment, blind.SLOAttainment)
	}
}

// A scrape of replicas with many adapter slots and few adapters loaded
// costs the adapters, not the slots.
func TestScrapeAdaptersCostsTheAdaptersLoaded(t *testing.T) {
	var reqs []Request
	for i := range 20 {
		reqs = append(reqs, Request{Arrival: time.Duration(i) * time.Second, PromptTokens: 100, OutputTokens: 1, Adapter: "a"})
	}
	cfg := Config{Replicas: 4, Engine: Engine{AdapterSlots: 1 << 16}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run1(t, cfg, reqs)
	runtime.ReadMemStats(&after)
	// 4 replicas scraped every second for 20 s: a slice of all the slots
	// at each scrape would take 80 MiB.
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Fatalf("the run allocated %d MiB, want under 16", got>>20)
	}
}
