package sim

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSlowdownShareCut checks that default cuts the share of a replica
// that slows to half speed mid-run within 30 s of simulated time: over the
// 30 s that start 30 s after the slowdown, the replica gets at most 3/4 of
// its share of the 30 s before it.
func TestSlowdownShareCut(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 3000 requests twice")
	}
	const slowAt = 60 * time.Second
	wl := DefaultSynthetic(3000, DefaultRate*0.8)
	reqs, err := wl.Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	share := func(policy string) (before, after float64) {
		var n [2][2]int // window (before, after) x (replica 0, all)
		cfg := Config{
			Replicas: 8, Seed: 1, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks},
			SpeedChanges: []SpeedChange{{Replica: 0, At: slowAt, Speed: 0.5}},
		}
		cfg.onPick = func(at time.Duration, m int) {
			w := -1
			switch {
			case at >= slowAt-30*time.Second && at < slowAt:
				w = 0
			case at >= slowAt+30*time.Second && at < slowAt+60*time.Second:
				w = 1
			}
			if w < 0 {
				return
			}
			n[w][1]++
			if m == 0 {
				n[w][0]++
			}
		}
		if _, err := Simulate(context.Background(), cfg, reqs, policy); err != nil {
			t.Fatal(err)
		}
		if n[0][1] == 0 || n[1][1] == 0 {
			t.Fatalf("%s: no arrivals in a window: %v", policy, n)
		}
		return float64(n[0][0]) / float64(n[0][1]), float64(n[1][0]) / float64(n[1][1])
	}
	before, after := share("default")
	t.Logf("default: replica 0 share %.3f before, %.3f 30-60 s after the slowdown", before, after)
	if after > 0.75*before {
		t.Errorf("default: share %.3f after the slowdown, want at most 3/4 of %.3f", after, before)
	}
	b0, a0 := share("default-nolearn")
	t.Logf("default-nolearn: replica 0 share %.3f before, %.3f after", b0, a0)
}

// TestSpeedScalesIterations checks that a replica's speed divides its
// iteration times, from the start and after a change, and that existing
// configurations (no speeds) are unchanged.
func TestSpeedScalesIterations(t *testing.T) {
	cfg := Config{Speed: []float64{1, 0.5}, SpeedChanges: []SpeedChange{{Replica: 0, At: time.Second, Speed: 0.25}, {Replica: 0, At: 2 * time.Second, Speed: 2}}}
	cases := []struct {
		replica int
		at      time.Duration
		want    float64
	}{
		{0, 0, 1}, {0, time.Second - 1, 1}, {0, time.Second, 0.25}, {0, 3 * time.Second, 2},
		{1, 0, 0.5}, {1, time.Hour, 0.5}, {7, 0, 1},
	}
	for _, c := range cases {
		if got := cfg.speedAt(c.replica, c.at); got != c.want {
			t.Errorf("speedAt(%d, %v) = %v, want %v", c.replica, c.at, got, c.want)
		}
	}
	var none Config
	if got := none.speedAt(3, time.Hour); got != 1 {
		t.Errorf("speed without a configuration %v, want 1", got)
	}
}

func TestSpeedConfigInvalid(t *testing.T) {
	for _, cfg := range []Config{
		{Speed: []float64{0}},
		{Speed: []float64{-1}},
		{SpeedChanges: []SpeedChange{{Replica: 8, Speed: 1}}},
		{SpeedChanges: []SpeedChange{{Replica: 0, Speed: 0}}},
		{SpeedChanges: []SpeedChange{{Replica: 0, At: -1, Speed: 1}}},
		// Beyond the bounds, iteration times overflow or the run never ends.
		{Speed: []float64{1e-300}},
		{Speed: []float64{MinSpeed / 2}},
		{Speed: []float64{1, MaxSpeed * 2}},
		{SpeedChanges: []SpeedChange{{Replica: 0, Speed: 1e-12}}},
	} {
		if err := cfg.normalize(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("normalize(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestMixedLearningHelps checks, on one seed of the mixed scenario, that
// learning the replicas' speeds raises goodput over default-nolearn.
func TestMixedLearningHelps(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates the mixed scenario twice")
	}
	sc, err := LookupScenario("mixed")
	if err != nil {
		t.Fatal(err)
	}
	sc.Config.Seed = 1
	reqs, err := sc.Workload.Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Compare(context.Background(), sc.Config, reqs, []string{"default-nolearn", "default"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d, l := res[0], res[1]; l.GoodputRPS < 1.2*d.GoodputRPS {
		t.Errorf("mixed: default goodput %.2f/s, default-nolearn %.2f/s; want at least 1.2x", l.GoodputRPS, d.GoodputRPS)
	}
}
