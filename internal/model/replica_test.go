package model

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func mustReplica(t testing.TB, eng Engine) *Replica {
	t.Helper()
	r, err := NewReplica(eng)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// step plans and finishes one iteration.
func step(t *testing.T, r *Replica) (Batch, []*Sequence) {
	t.Helper()
	b, ok := r.Plan()
	if !ok {
		t.Fatal("Plan: nothing to do")
	}
	return b, r.Finish()
}

// checkBlocks asserts the replica's block accounting against its running
// and receiving sequences.
func checkBlocks(t *testing.T, r *Replica) {
	t.Helper()
	held := 0
	seen := map[int32]bool{}
	for _, s := range append(slices.Clip(r.Running()), r.receiving...) {
		held += int(s.private)
		for _, e := range s.held {
			if !seen[e] {
				seen[e] = true
				held += int(r.kv.ents[e].blocks)
			}
		}
	}
	if r.kv.used != held || r.kv.used+r.kv.evictable > r.kv.total {
		t.Fatalf("KV used %d, evictable %d, total %d; running sequences hold %d", r.kv.used, r.kv.evictable, r.kv.total, held)
	}
}

// Step by step: chunked prefill, the first token at its end, decode, and a
// later prompt with the same head served from the prefix cache.
func TestReplicaSteps(t *testing.T) {
	r := mustReplica(t, Engine{TokenBudget: 100, KVBlocks: 100, BlockSize: 16})
	prefix := make([]uint64, 9)
	for i := range prefix {
		prefix[i] = 7<<32 | uint64(i+1)
	}
	mk := func(id int) *Sequence {
		s := &Sequence{ID: id, PromptTokens: 150, OutputTokens: 3, Prefix: prefix, BlockTokens: 16}
		if err := r.Submit(s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := mk(1)
	b, out := step(t, r)
	if b.PrefillTokens != 100 || b.DecodeSeqs != 0 || b.KVUsage != 0.07 || len(out) != 0 {
		t.Fatalf("iteration 1: %+v, %d emitted; want a 100-token chunk over 7 blocks", b, len(out))
	}
	b, out = step(t, r)
	if b.PrefillTokens != 50 || len(out) != 1 || out[0] != a || a.Generated() != 1 {
		t.Fatalf("iteration 2: %+v, emitted %v; want the rest of the prompt and the first token", b, out)
	}
	for range 2 {
		if b, _ = step(t, r); b.DecodeSeqs != 1 || b.PrefillTokens != 0 {
			t.Fatalf("decode iteration: %+v", b)
		}
	}
	if !a.Done() || a.Generated() != 3 {
		t.Fatalf("a: done %v, generated %d; want done after 3", a.Done(), a.Generated())
	}
	if st := r.Stats(); st.KVUsed != 0 || st.KVCached != 9 || st.Running != 0 {
		t.Fatalf("stats %+v; want the 9 full prompt blocks cached and nothing running", st)
	}
	if _, ok := r.Plan(); ok {
		t.Fatal("Plan with nothing to do")
	}
	c := mk(2)
	if b, _ = step(t, r); b.PrefillTokens != 150-9*16 || c.Generated() != 1 {
		t.Fatalf("cached head prefilled again: %+v", b)
	}
	st := r.Stats()
	if st.PrefixQueries != 300 || st.PrefixHits != 144 {
		t.Fatalf("prefix queries %d, hits %d; want 300, 144", st.PrefixQueries, st.PrefixHits)
	}
	checkBlocks(t, r)
}

func TestReplicaSubmitErrors(t *testing.T) {
	r := mustReplica(t, Engine{KVBlocks: 4, BlockSize: 16})
	ok := &Sequence{PromptTokens: 10, OutputTokens: 10}
	if err := r.Submit(ok); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Sequence{
		"twice":         ok,
		"empty prompt":  {OutputTokens: 1},
		"no output":     {PromptTokens: 1},
		"too large":     {PromptTokens: 60, OutputTokens: 5},
		"bad prefix":    {PromptTokens: 40, OutputTokens: 1, Prefix: []uint64{1}, BlockTokens: 24},
		"prefix, no bt": {PromptTokens: 40, OutputTokens: 1, Prefix: []uint64{1}},
	} {
		if err := r.Submit(s); !errors.Is(err, ErrInvalidWorkload) {
			t.Errorf("%s: error %v, want ErrInvalidWorkload", name, err)
		}
	}
	if _, err := NewReplica(Engine{BlockSize: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewReplica: error %v, want ErrInvalidConfig", err)
	}
}

// Random submissions, cancellations and iterations on a small cache: block
// accounting stays exact, every sequence not cancelled finishes, and all
// blocks come back.
func TestReplicaRandom(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		r := mustReplica(t, Engine{TokenBudget: 64, MaxRunning: 6, KVBlocks: 40, BlockSize: 4})
		var live []*Sequence
		for i := range 300 {
			switch x := rng.IntN(10); {
			case x < 3:
				n := 1 + rng.IntN(4)
				prefix := make([]uint64, n)
				for j := range prefix {
					prefix[j] = uint64(rng.IntN(3))<<32 | uint64(j+1)
				}
				s := &Sequence{ID: i, PromptTokens: 8*n + rng.IntN(8), OutputTokens: 1 + rng.IntN(40), Prefix: prefix, BlockTokens: 8}
				if err := r.Submit(s); err != nil {
					t.Fatal(err)
				}
				live = append(live, s)
			case x == 3 && len(live) > 0:
				k := rng.IntN(len(live))
				s := live[k]
				if want := !s.Done() && s.State() != StateCancelled; r.Cancel(s) != want {
					t.Fatalf("seed %d: Cancel(%d) = %v, want %v", seed, s.ID, !want, want)
				}
			default:
				if _, ok := r.Plan(); ok {
					r.Finish()
				}
			}
			checkBlocks(t, r)
		}
		for n := 0; ; n++ {
			if _, ok := r.Plan(); !ok {
				break
			}
			r.Finish()
			checkBlocks(t, r)
			if n > 100000 {
				t.Fatalf("seed %d: no progress", seed)
			}
		}
		for _, s := range live {
			if !s.Done() && s.State() != StateCancelled {
				t.Fatalf("seed %d: sequence %d neither done nor cancelled", seed, s.ID)
			}
		}
		if st := r.Stats(); st.KVUsed != 0 || st.Running+st.Waiting != 0 {
			t.Fatalf("seed %d: ended with %+v", seed, st)
		}
	}
}

func BenchmarkReplicaStep(b *testing.B) {
	r := mustReplica(b, Engine{})
	seqs := make([]Sequence, 64)
	for i := range seqs {
		seqs[i] = Sequence{ID: i, PromptTokens: 512, OutputTokens: 64}
		if err := r.Submit(&seqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := r.Plan(); !ok {
			b.Fatal("idle")
		}
		for _, s := range r.Finish() {
			if s.Done() {
				*s = Sequence{ID: s.ID, PromptTokens: 512, OutputTokens: 64}
				if err := r.Submit(s); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// TestKVEventsBatches runs random prompts sharing heads, with replies, on a
// small cache that evicts often, and checks the batches the events handler
// hears against the events heard one by one: the same events in the same
// order, each batch of one kind, none left over when a Plan or Finish
// returns, and at most one batch of stored blocks per Finish, which only
// stores.
func TestKVEventsBatches(t *testing.T) {
	merged := 0 // Finishes with several sequences' blocks to store
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 2))
		r := mustReplica(t, Engine{TokenBudget: 96, MaxRunning: 8, KVBlocks: 60, BlockSize: 4})
		var single, batched []uint64
		var kinds []bool
		calls := 0
		r.SetKVEventHandler(func(h uint64, stored bool) {
			single = append(single, h)
			kinds = append(kinds, stored)
		})
		r.SetKVEventsHandler(func(hs []uint64, stored bool) {
			calls++
			for _, h := range hs {
				if i := len(batched); kinds[i] != stored {
					t.Fatalf("seed %d: event %d in a batch of stored=%v, heard alone with %v", seed, i, stored, kinds[i])
				}
				batched = append(batched, h)
			}
		})
		check := func(op string) {
			t.Helper()
			if !slices.Equal(batched, single) {
				t.Fatalf("seed %d: after %s, batches %v, events %v", seed, op, batched, single)
			}
		}
		var seqs []*Sequence
		step := func() bool {
			if _, ok := r.Plan(); !ok {
				return false
			}
			check("Plan")
			prefilling := 0
			for i, s := range r.running {
				if r.lanes[i].chunk > 0 && s.computed < s.target {
					prefilling++
				}
			}
			calls = 0
			stored := len(single)
			r.Finish()
			check("Finish")
			if calls > 1 || slices.Contains(kinds[stored:], false) {
				t.Fatalf("seed %d: a Finish reported %d events in %d batches, removals among them: %v", seed, len(single)-stored, calls, kinds[stored:])
			}
			if prefilling > 1 && calls == 1 {
				merged++
			}
			return true
		}
		for i := range 200 {
			if rng.IntN(3) == 0 {
				n := 1 + rng.IntN(6)
				prefix := make([]uint64, n)
				for j := range prefix {
					prefix[j] = uint64(rng.IntN(4))<<32 | uint64(j+1)
				}
				reply := []uint64{uint64(i) << 40, uint64(i)<<40 | 1}
				s := &Sequence{ID: i, PromptTokens: 8*n + rng.IntN(8), OutputTokens: 1 + rng.IntN(20), Prefix: prefix, BlockTokens: 8, Reply: reply}
				if err := r.Submit(s); err != nil {
					t.Fatal(err)
				}
				seqs = append(seqs, s)
			}
			step()
		}
		for step() {
		}
		for _, s := range seqs {
			if !s.Done() {
				t.Fatalf("seed %d: sequence %d not done", seed, s.ID)
			}
		}
		if !slices.Contains(kinds, false) {
			t.Fatalf("seed %d: %d events, none a removal: the test exercises too little", seed, len(single))
		}
	}
	if merged == 0 {
		t.Fatal("no Finish stored several sequences' blocks: the test exercises too little")
	}
}

// TestSequenceAllocs checks that a sequence's prefix and reply blocks cost
// one allocation however many they are: the list of the cache entries it
// holds is made once, at its size.
func TestSequenceAllocs(t *testing.T) {
	r := mustReplica(t, Engine{KVBlocks: 1000, BlockSize: 16})
	prefix := make([]uint64, 30)
	for i := range prefix {
		prefix[i] = uint64(i + 1)
	}
	reply := []uint64{100, 101, 102}
	var s Sequence
	allocs := testing.AllocsPerRun(20, func() {
		s = Sequence{PromptTokens: 30*16 + 5, OutputTokens: 50, Prefix: prefix, BlockTokens: 16, Reply: reply}
		if err := r.Submit(&s); err != nil {
			t.Fatal(err)
		}
		for !s.Done() {
			if _, ok := r.Plan(); !ok {
				t.Fatal("nothing planned")
			}
			r.Finish()
		}
	})
	if allocs != 1 {
		t.Errorf("%v allocations per sequence, want 1", allocs)
	}
}
