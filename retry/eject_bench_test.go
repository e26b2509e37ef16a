package retry

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// BenchmarkEjectorReport reports failures to an ejector whose ejection cap
// is full, so every report is an ejection decision that the cap refuses. Its
// cost per report should not grow with the number of endpoints.
func BenchmarkEjectorReport(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			clk := newFakeClock()
			ks := keys(n)
			bal := newBalancer(b, ks...)
			e, err := NewEjector(bal, EjectorConfig{Clock: clk, ConsecutiveFailures: 1})
			if err != nil {
				b.Fatal(err)
			}
			fail := errors.New("connection reset")
			for _, k := range ks[:n/10] {
				e.Report(k, fail)
			}
			if got := len(e.Ejected()); got != n/10 {
				b.Fatalf("%d ejected, want %d", got, n/10)
			}
			rest := ks[n/10:]
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				clk.Advance(time.Microsecond)
				e.Report(rest[i%len(rest)], fail)
			}
		})
	}
}
