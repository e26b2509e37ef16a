package model

import (
	"slices"
	"testing"
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
	if b.state != StateWaiting || a.state != StateRunning || base.state != StateRunning || a2.state != StateRunning {
		t.Fatalf("states a %d b %d base %d a2 %d", a.state, b.state, base.state, a2.state)
	}
	if got := r.Adapters(nil); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("adapters in use %q, want a (running) and b (waiting)", got)
	}
	// Until a's requests end, b waits; then it takes the slot.
	loads := 0
	for i := 0; i < 10 && b.state != StateRunning; i++ {
		r.Finish()
		batch, ok = r.Plan()
		if !ok {
			t.Fatal("nothing planned while b waits")
		}
		loads += batch.AdapterLoads
	}
	if b.state != StateRunning || a.state != StateDone || a2.state != StateDone || loads != 1 {
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
	if batch, _ := r.Plan(); b.state != StateRunning || batch.AdapterLoads != 1 {
		t.Fatalf("b %d, batch %+v: want b admitted into a's slot", b.state, batch)
	}
}
