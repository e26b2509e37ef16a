package sim

import (
	"context"
	"flag"
	"strconv"
	"testing"
)

// scaleRequests, when set, makes TestScaleRun simulate a large cluster (see
// scaleConfig) for that many requests, to profile the simulator at scale:
//
//	go test ./internal/sim -run TestScaleRun -scale.requests 100000 -cpuprofile cpu.out
var (
	scaleRequests = flag.Int("scale.requests", 0, "with TestScaleRun: simulate this many requests on the large cluster (0 skips it)")
	scalePolicy   = flag.String("scale.policy", "default", "with TestScaleRun: the policy")
	scaleReplicas = flag.Int("scale.replicas", 512, "with TestScaleRun: the replicas, behind one router per 32")
)

// scaleConfig returns the default scenario's cluster grown to replicas
// replicas behind routers routers, and its workload at the same load per
// replica.
func scaleConfig(tb testing.TB, replicas, routers, requests int) (Config, []Request) {
	tb.Helper()
	sc, err := LookupScenario("default")
	if err != nil {
		tb.Fatal(err)
	}
	cfg := sc.Config
	cfg.Seed = 1
	cfg.Replicas, cfg.Routers = replicas, routers
	w := sc.Workload
	w.Requests = requests
	w.Rate *= float64(replicas) / float64(sc.Config.Replicas)
	reqs, err := w.Generate(cfg.Seed)
	if err != nil {
		tb.Fatal(err)
	}
	return cfg, reqs
}

// TestScaleRun simulates the large cluster when -scale.requests is set, for
// profiling; it checks nothing beyond the run succeeding.
func TestScaleRun(t *testing.T) {
	if *scaleRequests == 0 {
		t.Skip("set -scale.requests to run")
	}
	cfg, reqs := scaleConfig(t, *scaleReplicas, max(*scaleReplicas/32, 1), *scaleRequests)
	var info ScenarioInfo
	if err := info.Describe(cfg, reqs); err != nil {
		t.Fatal(err)
	}
	res, err := Simulate(context.Background(), cfg, reqs, *scalePolicy)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: SLO %.4f, TTFT p50 %.1f p99 %.1f ms, hit %.4f", res.Policy, res.SLOAttainment, res.TTFT.P50, res.TTFT.P99, res.PrefixHitRate)
}

// BenchmarkSimulateScale measures the simulator on the default scenario's
// workload and load per replica grown to 128 replicas behind 4 routers, the
// shape of a large cluster at a size a benchmark can repeat, with Default
// sampling its candidates (as it does beyond 64) and scoring them all.
func BenchmarkSimulateScale(b *testing.B) {
	const n = 20000
	cfg, reqs := scaleConfig(b, 128, 4, n)
	for _, policy := range []string{"default", "default-full"} {
		b.Run("policy="+policy+"/requests="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Simulate(context.Background(), cfg, reqs, policy); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

// TestReplicaIndex checks that replicaIndex inverts replicaKey and refuses
// every other key.
func TestReplicaIndex(t *testing.T) {
	for i := range 1100 {
		if got, ok := replicaIndex(replicaKey(i), 1100); !ok || got != i {
			t.Errorf("replicaIndex(%q) = %d, %v", replicaKey(i), got, ok)
		}
	}
	for _, key := range []string{"", "replica-", "replica-1100", "replica-01", "replica--1", "replica-1x", "Replica-1", "replica-99999999999999999999999", "x"} {
		if i, ok := replicaIndex(key, 1100); ok {
			t.Errorf("replicaIndex(%q) = %d, true; want false", key, i)
		}
	}
}
