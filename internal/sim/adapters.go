package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/llmlb/llmlb"
)

// scrapeAdapters sets the adapter fields of an observation of rep, when
// adapters are modelled.
func (r *runner) scrapeAdapters(l *llmlb.Load, rep *replica) {
	if rep.Engine().AdapterSlots == 0 {
		return
	}
	// Sized by the adapters found, not by the slots: a replica of many
	// slots with few adapters loaded must not cost its slots at every scrape.
	l.Adapters = rep.Adapters([]string{}) // empty, not nil: the engine reports adapters
	l.MaxAdapters = rep.Engine().AdapterSlots
}

// adapterName is the name of adapter k of a workload.
func adapterName(k uint64) string { return "lora-" + strconv.FormatUint(k, 10) }

// validateAdapters checks the adapter fields of a workload.
func (s *Synthetic) validateAdapters() error {
	switch {
	case s.Adapters < 0 || s.Adapters > 1<<20:
		return fmt.Errorf("%w: %d adapters, want 0 to 2^20", ErrInvalidWorkload, s.Adapters)
	case s.Adapters > 0 && (!(s.AdapterZipf > 1) || math.IsInf(s.AdapterZipf, 0)):
		return fmt.Errorf("%w: adapter zipf %v, want finite and > 1", ErrInvalidWorkload, s.AdapterZipf)
	}
	return nil
}

// drawAdapter draws the adapter of a new conversation or agent burst, or
// returns "" for a workload without adapters, drawing no random number.
func (g *generator) drawAdapter() string {
	if g.s.Adapters == 0 {
		return ""
	}
	if g.adapters == nil {
		// A generator of its own, so that the other draws do not depend on
		// the adapters.
		g.adapters = rand.NewZipf(rand.New(rand.NewPCG(g.seed, 0xada)), g.s.AdapterZipf, 1, uint64(g.s.Adapters-1))
	}
	return adapterName(g.adapters.Uint64())
}

// salted returns head's chain under adapter: an engine keys its prefix
// cache by the adapter too (vLLM hashes the LoRA id into each block's
// hash), so a shared prefix served with two adapters is cached twice.
func salted(head []uint64, adapter string) []uint64 {
	if adapter == "" || len(head) == 0 {
		return head
	}
	salt := uint64(0)
	for i := 0; i < len(adapter); i++ {
		salt = ChainHash(salt, uint64(adapter[i]))
	}
	out := make([]uint64, len(head))
	prev := salt
	for i, h := range head {
		prev = ChainHash(prev, h)
		out[i] = prev
	}
	return out
}

// LoRA scenario defaults.
const (
	// LoRARate is the arrival rate of the lora scenario, in requests per
	// second for 8 replicas.
	LoRARate = 50.0
	// LoRAAdapters and LoRAZipf are the adapters of the lora scenario and
	// the exponent of their popularity.
	LoRAAdapters = 32
	LoRAZipf     = 1.1
	// LoRASlots is the adapter slots per replica of the lora scenario.
	LoRASlots = 8
)

// LoRASynthetic returns the workload of the lora scenario: the default
// scenario's ([DefaultSynthetic]) at rate requests per second, every
// conversation and agent burst served with one of LoRAAdapters adapters
// drawn with Zipf popularity of exponent LoRAZipf.
func LoRASynthetic(n int, rate float64) Synthetic {
	w := DefaultSynthetic(n, rate)
	w.Adapters, w.AdapterZipf = LoRAAdapters, LoRAZipf
	return w
}

// loraScenario returns the lora scenario (see [Scenarios]).
func loraScenario() Scenario {
	return Scenario{
		Name: "lora",
		Doc:  "default, every conversation on one of 32 Zipf-popular LoRA adapters; 4 adapter slots per replica, 50 ms per load",
		Config: Config{Replicas: 8, Routers: 1, Scrape: time.Second,
			Engine: Engine{KVBlocks: DefaultScenarioKVBlocks, AdapterSlots: LoRASlots, AdapterLoad: DefaultAdapterLoad}},
		Workload: LoRASynthetic(DefaultRequests, LoRARate),
		Policies: []string{"round-robin", "least-outstanding", "least-outstanding-lora", "default", "default-lora"},
	}
}
