package sim

import (
	"context"
	"strconv"
	"testing"
)

// BenchmarkSimulate measures the simulator on the default scenario with one
// policy: simulated requests per second of wall time, over 8 replicas.
func BenchmarkSimulate(b *testing.B) {
	sc, err := LookupScenario("default")
	if err != nil {
		b.Fatal(err)
	}
	cfg := sc.Config
	cfg.Seed = 1
	for _, n := range []int{12000, 100000} {
		w := DefaultSynthetic(n, DefaultRate)
		reqs, err := w.Generate(1)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("policy=p2c/requests="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Simulate(context.Background(), cfg, reqs, "p2c"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}
