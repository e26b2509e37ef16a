package sim

import (
	"context"
	"errors"
	"testing"

	"github.com/llmlb/llmlb"
)

// cancellingPolicy sends every request to the first candidate, and cancels
// the run's context at its cancelAt-th pick, counting the picks made after.
type cancellingPolicy struct {
	picks    *int
	cancelAt int
	cancel   context.CancelFunc
}

func (p cancellingPolicy) Choose(*llmlb.Candidates) int {
	*p.picks++
	if *p.picks == p.cancelAt {
		p.cancel()
	}
	return 0
}

// TestSimulateStopsPromptlyWhenCancelled cancels a run in its middle, from
// the policy's pick of the 200th request. Each pick is an event of its own,
// so the run must return the context's error having made at most
// cancelEvery more picks; checking the context every 65,536 events made
// hundreds more, or finished the run.
func TestSimulateStopsPromptlyWhenCancelled(t *testing.T) {
	const cancelAt = 200
	reqs, err := DefaultSynthetic(2000, 50).Generate(3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	picks := 0
	spec := PolicySpec{Name: "cancelling", Doc: "cancels its run", New: func(*PolicyEnv) (llmlb.Policy, error) {
		return cancellingPolicy{picks: &picks, cancelAt: cancelAt, cancel: cancel}, nil
	}}
	res, err := simulate(ctx, Config{Seed: 3, Replicas: 4}, reqs, spec)
	if !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("simulate returned %v (a result: %t), want context.Canceled", err, res != nil)
	}
	if picks < cancelAt {
		t.Fatalf("%d picks: the run ended before it was cancelled", picks)
	}
	if after := picks - cancelAt; after > cancelEvery {
		t.Errorf("%d picks after the cancellation, want at most %d", after, cancelEvery)
	}
}

// TestRunPoolStopsPromptlyWhenCancelled cancels a run of the providers
// scenario from the pick of its 200th attempt: the run must return the
// context's error having made at most cancelEvery more picks.
func TestRunPoolStopsPromptlyWhenCancelled(t *testing.T) {
	const cancelAt = 200
	sc, ok := LookupPoolScenario("providers")
	if !ok {
		t.Fatal("no providers scenario")
	}
	rt := sc.Routings[0]
	if rt.Cooldown || rt.Flat || len(rt.Policies) != 1 || len(sc.Tiers[0]) < 2 {
		t.Fatalf("routing %+v: want one tier of several deployments without cooldown", rt)
	}
	run, err := newPoolRun(&sc, rt, 1, sc.Workload.generate(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	picks := 0
	bal, err := llmlb.New(cancellingPolicy{picks: &picks, cancelAt: cancelAt, cancel: cancel})
	if err != nil {
		t.Fatal(err)
	}
	var eps []llmlb.Endpoint
	for i, d := range sc.Tiers[0] {
		eps = append(eps, &endpoint{key: d.Name, idx: i})
	}
	if err := bal.Update(eps); err != nil {
		t.Fatal(err)
	}
	run.tiers[0].bal = bal
	res, err := run.run(ctx)
	if !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("run returned %v (a result: %t), want context.Canceled", err, res != nil)
	}
	if picks < cancelAt {
		t.Fatalf("%d picks: the run ended before it was cancelled", picks)
	}
	if after := picks - cancelAt; after > cancelEvery {
		t.Errorf("%d picks after the cancellation, want at most %d", after, cancelEvery)
	}
}
