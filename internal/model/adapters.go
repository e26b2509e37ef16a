package model

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
