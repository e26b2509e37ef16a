package model

import (
	"math"
	"testing"
	"time"
)

func TestMockerIterTime(t *testing.T) {
	cases := []struct {
		name string
		b    Batch
		want float64 // ms, computed by hand from the polynomials
	}{
		{"prefill 1000", Batch{PrefillTokens: 1000}, 0.4209989 + 15.18344 + 16.50142},
		{"prefill 8192", Batch{PrefillTokens: 8192}, 4.209989e-7*8192*8192 + 1.518344e-2*8192 + 16.50142},
		{"decode idle cache", Batch{DecodeSeqs: 1}, 5.74},
		{"decode half cache", Batch{DecodeSeqs: 4, KVUsage: 0.5}, -25.74*0.25 + 54.01*0.5 + 5.74},
		{"decode full cache", Batch{DecodeSeqs: 4, KVUsage: 1}, -25.74 + 54.01 + 5.74},
		{"usage above 1 is clamped", Batch{DecodeSeqs: 4, KVUsage: 3}, -25.74 + 54.01 + 5.74},
		{"NaN usage counts as 0", Batch{DecodeSeqs: 1, KVUsage: math.NaN()}, 5.74},
		{"mixed is the sum", Batch{PrefillTokens: 100, DecodeSeqs: 3, KVUsage: 0.25}, 4.209989e-7*1e4 + 1.518344 + 16.50142 + (-25.74*0.0625 + 54.01*0.25 + 5.74)},
		{"empty", Batch{}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := MockerIterTime(c.b)
			want := time.Duration(c.want * float64(time.Millisecond))
			if d := got - want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("MockerIterTime(%+v) = %v, want %v", c.b, got, want)
			}
		})
	}
	if got := MockerDecodeMillis(-1); got != 5.74 {
		t.Errorf("MockerDecodeMillis(-1) = %v, want 5.74", got)
	}
}

func TestMockerFusedIterTime(t *testing.T) {
	cases := []struct {
		name string
		b    Batch
		want float64 // ms, computed by hand from the polynomials
	}{
		{"prefill only is the mocker's", Batch{PrefillTokens: 1000}, 0.4209989 + 15.18344 + 16.50142},
		{"decode only is the mocker's", Batch{DecodeSeqs: 4, KVUsage: 0.5}, -25.74*0.25 + 54.01*0.5 + 5.74},
		// Decode part 26.31 ms, above the constant: paid instead of it.
		{"mixed, decode part above the constant", Batch{PrefillTokens: 1000, DecodeSeqs: 4, KVUsage: 0.5}, 0.4209989 + 15.18344 + (-25.74*0.25 + 54.01*0.5 + 5.74)},
		// Decode part 5.74 ms, below the constant: the constant is paid.
		{"mixed, decode part below the constant", Batch{PrefillTokens: 1000, DecodeSeqs: 1}, 0.4209989 + 15.18344 + 16.50142},
		{"empty", Batch{}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := MockerFusedIterTime(c.b)
			want := time.Duration(c.want * float64(time.Millisecond))
			if d := got - want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("MockerFusedIterTime(%+v) = %v, want %v", c.b, got, want)
			}
		})
	}
	// Between either phase alone and the sum, and within the constant of
	// the sum.
	for _, tokens := range []int{0, 1, 16, 512, 8192} {
		for _, seqs := range []int{0, 1, 64} {
			for _, u := range []float64{0, 0.1, 0.22, 0.5, 0.9, 1} {
				b := Batch{PrefillTokens: tokens, DecodeSeqs: seqs, KVUsage: u}
				fused, sum := MockerFusedIterTime(b), MockerIterTime(b)
				prefill := MockerIterTime(Batch{PrefillTokens: tokens})
				decode := MockerIterTime(Batch{DecodeSeqs: seqs, KVUsage: u})
				if fused > sum || fused < max(prefill, decode)-time.Microsecond ||
					sum-fused > time.Duration(16.50142*float64(time.Millisecond))+time.Microsecond {
					t.Errorf("%+v: fused %v, sum %v, prefill alone %v, decode alone %v", b, fused, sum, prefill, decode)
				}
			}
		}
	}
	for name, f := range IterTimes {
		if f == nil || f(Batch{DecodeSeqs: 1}) <= 0 {
			t.Errorf("IterTimes[%q] does not model a decode iteration", name)
		}
	}
}
