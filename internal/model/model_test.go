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
