package sim

import (
	"context"
	"reflect"
	"testing"
	"time"
)

func TestDeclareWeightsEndpoints(t *testing.T) {
	cfg := Config{Speed: []float64{1, 0.5}, SpeedChanges: []SpeedChange{{Replica: 0, At: time.Second, Speed: 0.25}}}
	if _, ok := cfg.newEndpoint("replica-0", 0).(interface{ Weight() float64 }); ok {
		t.Error("without DeclareWeights, an endpoint declares a weight")
	}
	cfg.DeclareWeights = true
	for i, want := range []float64{1, 0.5, 1} { // replica 0's change comes later; replica 2 is beyond Speed
		ep := cfg.newEndpoint(replicaKey(i), i)
		w, ok := ep.(interface{ Weight() float64 })
		if !ok {
			t.Fatalf("replica %d declares no weight", i)
		}
		if got := w.Weight(); got != want {
			t.Errorf("replica %d weight %v, want %v", i, got, want)
		}
		if got := replicaOf(ep); got != i {
			t.Errorf("replicaOf(replica %d) = %d", i, got)
		}
	}
	cfg.DeclareWeights = false
	if got := replicaOf(cfg.newEndpoint(replicaKey(3), 3)); got != 3 {
		t.Errorf("replicaOf(undeclared replica 3) = %d", got)
	}
}

// TestDeclareWeightsShare checks, on two full-speed and two half-speed
// replicas at moderate load, that declared weights reach the policies:
// Envoy's weighted least request then sends each full-speed replica about
// twice the requests of a half-speed one, Default without learning shifts
// requests to the full-speed replicas, and round robin, which ignores
// weights, is unchanged.
func TestDeclareWeightsShare(t *testing.T) {
	reqs, err := DefaultSynthetic(3000, 12).Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	// run returns the result and the requests per full-speed replica over
	// those per half-speed one.
	run := func(policy string, declare bool) (*Result, float64) {
		t.Helper()
		var n [4]int
		cfg := Config{Replicas: 4, Seed: 1, Speed: []float64{1, 1, 0.5, 0.5}, DeclareWeights: declare, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}}
		cfg.onPick = func(_ time.Duration, m int) { n[m]++ }
		res, err := Simulate(context.Background(), cfg, reqs, policy)
		if err != nil {
			t.Fatal(err)
		}
		ratio := float64(n[0]+n[1]) / float64(n[2]+n[3])
		t.Logf("%s, weights declared %v: requests per replica %v, full/half %.2f", policy, declare, n, ratio)
		return res, ratio
	}
	if _, r := run("weighted-least-request", true); r < 1.8 || r > 2.2 {
		t.Errorf("weighted-least-request with weights 1,1,0.5,0.5: full/half requests %.2f, want about 2", r)
	}
	_, plain := run("default-nolearn", false)
	if _, declared := run("default-nolearn", true); declared <= plain {
		t.Errorf("default-nolearn: full/half requests %.2f with weights declared, %.2f without; want more with", declared, plain)
	}
	rr, _ := run("round-robin", false)
	rrw, _ := run("round-robin", true)
	if !reflect.DeepEqual(rr, rrw) {
		t.Error("round-robin: declared weights changed the result")
	}
}

// TestDeclareUnitWeightsUnchanged checks that replicas of equal speed that
// declare their weights of 1 run exactly as replicas that declare none.
func TestDeclareUnitWeightsUnchanged(t *testing.T) {
	reqs, err := DefaultSynthetic(1500, 20).Generate(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{"default", "default-nolearn", "weighted-least-request"} {
		cfg := Config{Replicas: 4, Seed: 2}
		plain, err := Simulate(context.Background(), cfg, reqs, policy)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DeclareWeights = true
		declared, err := Simulate(context.Background(), cfg, reqs, policy)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(plain, declared) {
			t.Errorf("%s: weights of 1 changed the result", policy)
		}
	}
}

func TestSpeedsHeader(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"zero config", Config{}, ""},
		{"equal speeds", Config{Speed: []float64{1, 1}}, ""},
		{"mixed", Config{Speed: []float64{1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}}, "replica speeds 2x1,6x0.5, not declared to the routers"},
		{"short Speed", Config{Replicas: 3, Speed: []float64{2}}, "replica speeds 2,2x1, not declared to the routers"},
		{"declared", Config{Replicas: 3, Speed: []float64{1, 0.5, 1}, DeclareWeights: true}, "replica speeds 1,0.5,1, declared to the routers as weights"},
		{"declared equal", Config{Replicas: 2, DeclareWeights: true}, "replica speeds 2x1, declared to the routers as weights"},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			var info ScenarioInfo
			if err := info.Describe(test.cfg, []Request{{PromptTokens: 1, OutputTokens: 1}}); err != nil {
				t.Fatal(err)
			}
			if got := info.speeds(); got != test.want {
				t.Errorf("speeds() = %q, want %q", got, test.want)
			}
			if test.want == "" && (info.Speeds != nil || info.DeclaredWeights) {
				t.Errorf("Describe set Speeds %v, DeclaredWeights %v; want neither", info.Speeds, info.DeclaredWeights)
			}
		})
	}
}
