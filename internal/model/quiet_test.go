package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestQuietDecode drives two replicas in lockstep through random prompts
// sharing heads and caching replies, cancellations and prompts prefilled
// elsewhere, on caches small enough to evict and preempt: one reports every
// token, the other decodes quietly. They must plan the same batches, hear
// the same KV events and keep the same counts, every sequence must hold the
// blocks of its tokens, as if it took them token by token, the quiet one's
// sequences
// must match the other's whenever Running brings them up to date, and its
// Finish must return exactly the tokens that end a prefill, are a
// sequence's first, or its last.
func TestQuietDecode(t *testing.T) {
	cases := []struct {
		name string
		eng  Engine
	}{
		{"small cache", Engine{TokenBudget: 96, MaxRunning: 8, KVBlocks: 60, BlockSize: 4}},
		// A budget smaller than the batch: the last sequences of a batch
		// get no token in some iterations.
		{"small budget", Engine{TokenBudget: 5, MaxRunning: 12, KVBlocks: 80, BlockSize: 4}},
		{"large blocks", Engine{TokenBudget: 64, MaxRunning: 6, KVBlocks: 30, BlockSize: 8}},
	}
	var n quietCounts
	for _, c := range cases {
		for seed := range uint64(10) {
			quietLockstep(t, c.eng, seed, &n)
		}
	}
	if n.preempted == 0 || n.skipped == 0 || n.received == 0 || n.cancelled == 0 {
		t.Fatalf("%+v: the test exercises too little", n)
	}
}

// quietCounts counts what the trials of TestQuietDecode exercised:
// preemptions, decode tokens deferred by a spent budget, sequences
// received after a prefill elsewhere and running sequences cancelled.
type quietCounts struct{ preempted, skipped, received, cancelled int }

// quietLockstep runs one random trial of TestQuietDecode.
func quietLockstep(t *testing.T, eng Engine, seed uint64, n *quietCounts) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	loud, quiet := mustReplica(t, eng), mustReplica(t, eng)
	quiet.SetQuietDecode(true)
	var events [2][]string
	for k, r := range []*Replica{loud, quiet} {
		r.SetKVEventsHandler(func(hs []uint64, stored bool) {
			events[k] = append(events[k], fmt.Sprint(hs, stored))
		})
	}
	var seqs [2][]*Sequence
	type transfer struct {
		k  int // the index of the sequences in seqs[0] and seqs[1]
		at int // the step the KV arrives at
	}
	var transfers []transfer
	fail := func(step int, format string, args ...any) {
		t.Helper()
		t.Fatalf("%+v, seed %d, step %d: %s", eng, seed, step, fmt.Sprintf(format, args...))
	}
	for step := 0; ; step++ {
		switch x := rng.IntN(12); {
		case step < 300 && x < 3:
			n := 1 + rng.IntN(6)
			prefix := make([]uint64, n)
			for j := range prefix {
				prefix[j] = uint64(rng.IntN(4))<<32 | uint64(j+1)
			}
			reply := []uint64{uint64(step) << 40, uint64(step)<<40 | 1}
			prompt, output := 8*n+rng.IntN(8), 1+rng.IntN(30)
			remote := rng.IntN(5) == 0
			for k, r := range []*Replica{loud, quiet} {
				s := &Sequence{ID: step, PromptTokens: prompt, OutputTokens: output, Prefix: prefix, BlockTokens: 8, Reply: reply}
				if remote {
					s.SetRemote()
				}
				if err := r.Submit(s); err != nil {
					t.Fatal(err)
				}
				seqs[k] = append(seqs[k], s)
			}
		case step < 300 && x == 3 && len(seqs[0]) > 0:
			k := rng.IntN(len(seqs[0]))
			// A sequence whose KV is on its way cannot be cancelled.
			running := seqs[0][k].State() == StateRunning
			if a, b := loud.Cancel(seqs[0][k]), quiet.Cancel(seqs[1][k]); a != b {
				fail(step, "Cancel(%d): %v, quiet %v", seqs[0][k].ID, a, b)
			}
			if running {
				n.cancelled++
			}
		default:
			for i := 0; i < len(transfers); i++ {
				if tr := transfers[i]; tr.at <= step {
					loud.Receive(seqs[0][tr.k])
					quiet.Receive(seqs[1][tr.k])
					n.received++
					transfers = slices.Delete(transfers, i, i+1)
					i--
				}
			}
			before := loud.Stats().Preemptions
			b, ok := loud.Plan()
			qb, qok := quiet.Plan()
			if b != qb || ok != qok {
				fail(step, "Plan: %+v, %v; quiet %+v, %v", b, ok, qb, qok)
			}
			n.preempted += int(loud.Stats().Preemptions - before)
			// Every running sequence holds the blocks of its tokens and
			// of those planned, as if it took them token by token.
			for i, s := range loud.Running() {
				if got, want := int(s.private+s.shared), loud.BlocksFor(s.computed+s.decoded+int(loud.lanes[i].chunk)); got != want {
					fail(step, "sequence %d holds %d blocks for %d tokens, %d planned; want %d", s.ID, got, s.computed+s.decoded, loud.lanes[i].chunk, want)
				}
			}
			for i, s := range loud.running {
				if loud.lanes[i].chunk == 0 && s.computed >= s.target {
					n.skipped++
				}
			}
			for _, s := range loud.Started() {
				k := slices.Index(seqs[0], s)
				transfers = append(transfers, transfer{k: k, at: step + 1 + rng.IntN(4)})
			}
			if !slices.EqualFunc(loud.Started(), quiet.Started(), func(a, b *Sequence) bool { return a.ID == b.ID }) {
				fail(step, "the replicas started different transfers")
			}
			loud.ClearStarted()
			quiet.ClearStarted()
			if !ok {
				if step >= 300 && len(transfers) == 0 {
					if err := quiet.CheckIdle(); err != nil {
						t.Fatal(err)
					}
					for k, s := range seqs[1] {
						if s.State() != seqs[0][k].State() || s.Generated() != seqs[0][k].Generated() {
							fail(step, "sequence %d ended %d after %d tokens, quiet %d after %d", s.ID, seqs[0][k].State(), seqs[0][k].Generated(), s.State(), s.Generated())
						}
					}
					return
				}
				continue
			}
			var want []string
			for _, s := range loud.Finish() {
				if s.Decoded() == 0 || s.Generated() == 1 || s.Done() {
					want = append(want, fmt.Sprint(s.ID, s.Generated(), s.Done()))
				}
			}
			var got []string
			for _, s := range quiet.Finish() {
				got = append(got, fmt.Sprint(s.ID, s.Generated(), s.Done()))
			}
			if !slices.Equal(got, want) {
				fail(step, "quiet Finish returned %v (ID, generated, done), want %v", got, want)
			}
		}
		if !slices.Equal(events[0], events[1]) {
			fail(step, "KV events %v, quiet %v", events[0], events[1])
		}
		if a, b := loud.Stats(), quiet.Stats(); a != b {
			fail(step, "stats %+v, quiet %+v", a, b)
		}
		if rng.IntN(3) == 0 {
			lr, qr := loud.Running(), quiet.Running()
			if len(lr) != len(qr) {
				fail(step, "%d running, quiet %d", len(lr), len(qr))
			}
			for i, s := range lr {
				q := qr[i]
				a := [...]int{s.ID, s.generated, s.decoded, s.computed, s.target, int(s.private), int(s.shared)}
				b := [...]int{q.ID, q.generated, q.decoded, q.computed, q.target, int(q.private), int(q.shared)}
				if a != b {
					fail(step, "running sequence (ID, generated, decoded, computed, target, private, shared) %v, quiet %v", a, b)
				}
			}
			checkBlocks(t, quiet)
		}
	}
}
