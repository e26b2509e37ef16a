package sim

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestReplicaAdapterSlots(t *testing.T) {
	r, err := NewReplica(Engine{AdapterSlots: 1, KVBlocks: 1024})
	if err != nil {
		t.Fatal(err)
	}
	a := &Sequence{ID: 0, PromptTokens: 32, OutputTokens: 2, Adapter: "a"}
	b := &Sequence{ID: 1, PromptTokens: 32, OutputTokens: 2, Adapter: "b"}
	base := &Sequence{ID: 2, PromptTokens: 32, OutputTokens: 2}
	a2 := &Sequence{ID: 3, PromptTokens: 32, OutputTokens: 2, Adapter: "a"}
	for _, s := range []*Sequence{a, b, base, a2} {
		if err := r.Submit(s); err != nil {
			t.Fatal(err)
		}
	}
	// One slot: a loads it, b is skipped, the base model and a second
	// request of a are admitted past it.
	batch, ok := r.Plan()
	if !ok || batch.AdapterLoads != 1 {
		t.Fatalf("first batch %+v, want one adapter load", batch)
	}
	if b.state != stateWaiting || a.state != stateRunning || base.state != stateRunning || a2.state != stateRunning {
		t.Fatalf("states a %d b %d base %d a2 %d", a.state, b.state, base.state, a2.state)
	}
	if got := r.Adapters(nil); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("adapters in use %q, want a (running) and b (waiting)", got)
	}
	// Until a's requests end, b waits; then it takes the slot.
	loads := 0
	for i := 0; i < 10 && b.state != stateRunning; i++ {
		r.Finish()
		batch, ok = r.Plan()
		if !ok {
			t.Fatal("nothing planned while b waits")
		}
		loads += batch.AdapterLoads
	}
	if b.state != stateRunning || a.state != stateDone || a2.state != stateDone || loads != 1 {
		t.Fatalf("b %d, a %d, a2 %d, loads %d: want b running after a's requests ended, one load", b.state, a.state, a2.state, loads)
	}
	if st := r.Stats(); st.AdapterLoads != 2 {
		t.Fatalf("%d adapter loads, want 2", st.AdapterLoads)
	}
}

func TestReplicaAdapterSlotReleasedOnPreemptAndCancel(t *testing.T) {
	r, err := NewReplica(Engine{AdapterSlots: 1, KVBlocks: 1024})
	if err != nil {
		t.Fatal(err)
	}
	a := &Sequence{ID: 0, PromptTokens: 32, OutputTokens: 50, Adapter: "a"}
	b := &Sequence{ID: 1, PromptTokens: 32, OutputTokens: 2, Adapter: "b"}
	_ = r.Submit(a)
	_ = r.Submit(b)
	r.Plan()
	if !r.Cancel(a) {
		t.Fatal("cancel failed")
	}
	r.Finish()
	if batch, _ := r.Plan(); b.state != stateRunning || batch.AdapterLoads != 1 {
		t.Fatalf("b %d, batch %+v: want b admitted into a's slot", b.state, batch)
	}
}

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
