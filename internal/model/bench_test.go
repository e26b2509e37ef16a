package model

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkReplicaFleet steps 256 replicas in turn, as a simulation of a
// large cluster does, each running 32 prompts at a time that share one of
// 32 heads, end in blocks of their own and cache replies, on caches that
// fill and evict. The sequences lie in one large array, in the order they
// were submitted, as the simulator's requests do: the engine model's cost
// when neither its sequences nor its caches fit in the processor's caches.
// An op is one iteration of every replica. With decode=quiet the replicas
// decode quietly, as the simulator's do ([Replica.SetQuietDecode]).
func BenchmarkReplicaFleet(b *testing.B) {
	for _, quiet := range []bool{false, true} {
		name := "decode=reported"
		if quiet {
			name = "decode=quiet"
		}
		b.Run(name, func(b *testing.B) { benchmarkReplicaFleet(b, quiet) })
	}
}

func benchmarkReplicaFleet(b *testing.B, quiet bool) {
	const replicas, running, groups, headBlocks, bt = 256, 32, 32, 24, 64
	rng := rand.New(rand.NewPCG(1, 2))
	heads := make([][]uint64, groups)
	for g := range heads {
		heads[g] = make([]uint64, headBlocks)
		for i := range heads[g] {
			heads[g][i] = uint64(g)<<48 | uint64(i)
		}
	}
	seqs := make([]Sequence, 1<<17)
	next, fresh := 0, uint64(1)<<56
	submit := func(r *Replica) {
		for seqs[next].state != StatePending && seqs[next].state != StateDone {
			next = (next + 1) % len(seqs)
		}
		tail := 4 + rng.IntN(9)
		prefix := make([]uint64, 0, headBlocks+tail)
		prefix = append(prefix, heads[rng.IntN(groups)]...)
		for range tail {
			prefix = append(prefix, fresh)
			fresh++
		}
		reply := []uint64{fresh, fresh + 1}
		fresh += 2
		seqs[next] = Sequence{ID: next, PromptTokens: len(prefix)*bt + rng.IntN(bt), OutputTokens: 16 + rng.IntN(80), Prefix: prefix, BlockTokens: bt, Reply: reply}
		if err := r.Submit(&seqs[next]); err != nil {
			b.Fatal(err)
		}
		next = (next + 1) % len(seqs)
	}
	reps := make([]*Replica, replicas)
	for i := range reps {
		reps[i] = mustReplica(b, Engine{})
		reps[i].SetQuietDecode(quiet)
		for range running {
			submit(reps[i])
		}
	}
	round := func() {
		for _, r := range reps {
			if _, ok := r.Plan(); !ok {
				b.Fatal("idle replica")
			}
			for _, s := range r.Finish() {
				if s.Done() {
					submit(r)
				}
			}
		}
	}
	for range 500 {
		round() // fill the caches
	}
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
}
