package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/llmlb/llmlb"
)

// A replica with [Engine].AdapterSlots serves LoRA adapters the way vLLM
// does with --max-loras: a fixed number of GPU slots, each holding one
// adapter; a batch uses only adapters in slots; an adapter no running
// request uses stays loaded until a slot is needed, least recently used
// first; loading one stalls the iteration that admits its first request.

// adapterSlot is one adapter slot of a replica.
type adapterSlot struct {
	name   string
	active int    // running sequences using it
	used   uint64 // Replica.tick of the last admission using it
}

// Slot choices of nextAdmissible besides a slot index.
const (
	slotNone = -1 // no slot needed: the base model, or adapters not modelled
	slotNew  = -2 // a slot never used yet
)

// nextAdmissible returns the position in r.waiting of the first waiting
// sequence whose adapter can be served now, and the slot it takes (an
// index into r.slots, slotNone or slotNew); -1 if none can.
func (r *Replica) nextAdmissible() (w, slot int) {
	if r.eng.AdapterSlots == 0 {
		return r.whead, slotNone
	}
	for w := r.whead; w < len(r.waiting); w++ {
		if slot, ok := r.adapterSlot(r.waiting[w].Adapter); ok {
			return w, slot
		}
	}
	return -1, slotNone
}

// adapterSlot returns the slot a sequence of adapter name would use, and
// whether there is one: the slot holding it, else an unused slot, else the
// least recently used slot no running sequence uses.
func (r *Replica) adapterSlot(name string) (int, bool) {
	if name == "" {
		return slotNone, true
	}
	lru := -1
	for i := range r.slots {
		sl := &r.slots[i]
		if sl.name == name {
			return i, true
		}
		if sl.active == 0 && (lru < 0 || sl.used < r.slots[lru].used) {
			lru = i
		}
	}
	if len(r.slots) < r.eng.AdapterSlots {
		return slotNew, true
	}
	return lru, lru >= 0
}

// removeWaiting removes the waiting sequence at position w.
func (r *Replica) removeWaiting(w int) {
	if w == r.whead {
		r.popFront()
		return
	}
	copy(r.waiting[w:], r.waiting[w+1:])
	r.waiting[len(r.waiting)-1] = nil
	r.waiting = r.waiting[:len(r.waiting)-1]
}

// takeAdapter makes s, just admitted, a running user of slot (as returned
// by nextAdmissible), loading its adapter there if needed and counting the
// load in b.
func (r *Replica) takeAdapter(s *Sequence, slot int, b *Batch) {
	if slot == slotNone {
		return
	}
	if slot == slotNew {
		r.slots = append(r.slots, adapterSlot{})
		slot = len(r.slots) - 1
	}
	sl := &r.slots[slot]
	if sl.name != s.Adapter {
		sl.name = s.Adapter
		b.AdapterLoads++
		r.adapterLoads++
	}
	r.tick++
	sl.active++
	sl.used = r.tick
	s.onAdapter = true
}

// releaseAdapter ends s's use of its adapter's slot, if it had one.
func (r *Replica) releaseAdapter(s *Sequence) {
	if !s.onAdapter {
		return
	}
	s.onAdapter = false
	for i := range r.slots {
		if r.slots[i].name == s.Adapter {
			r.slots[i].active--
			return
		}
	}
}

// Adapters returns the distinct adapters of the replica's running and
// waiting sequences, as vLLM reports them in the running_lora_adapters and
// waiting_lora_adapters labels of vllm:lora_requests_info, appended to dst.
func (r *Replica) Adapters(dst []string) []string {
	add := func(name string) {
		if name == "" {
			return
		}
		for _, a := range dst {
			if a == name {
				return
			}
		}
		dst = append(dst, name)
	}
	for _, s := range r.running {
		add(s.Adapter)
	}
	for _, s := range r.waiting[r.whead:] {
		add(s.Adapter)
	}
	return dst
}

// scrapeAdapters sets the adapter fields of an observation of rep, when
// adapters are modelled.
func (r *runner) scrapeAdapters(l *llmlb.Load, rep *replica) {
	if rep.eng.AdapterSlots == 0 {
		return
	}
	l.Adapters = rep.Adapters(make([]string, 0, rep.eng.AdapterSlots))
	l.MaxAdapters = rep.eng.AdapterSlots
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
