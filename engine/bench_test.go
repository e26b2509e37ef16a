package engine

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkIteration measures one planned and finished iteration with a
// batch of running sequences (finished ones are replaced), the engine's work
// per model step besides sleeping.
func BenchmarkIteration(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("running=%d", n), func(b *testing.B) {
			e, err := New(Config{DefaultMaxTokens: 64})
			if err != nil {
				b.Fatal(err)
			}
			body := []byte(`{"prompt":"` + strings.Repeat("p", 1024) + `"}`)
			add := func() *seq {
				s, _, code, msg := e.parse(body, false)
				if code != 0 {
					b.Fatal(msg)
				}
				if err := e.submit(s); err != nil {
					b.Fatal(err)
				}
				return s
			}
			seqs := make([]*seq, n)
			for i := range seqs {
				seqs[i] = add()
			}
			b.ReportAllocs()
			for b.Loop() {
				e.mu.Lock()
				e.rep.Plan()
				e.finish()
				e.mu.Unlock()
				for i, s := range seqs {
					if s.Done() {
						seqs[i] = add()
					}
				}
			}
		})
	}
}
