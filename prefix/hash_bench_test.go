package prefix

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func BenchmarkHashTokens(b *testing.B) {
	for _, n := range []int{256, 8192} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			h, err := NewHasher(HasherConfig{})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = r.Uint32N(150000)
			}
			root := h.Root(Salt{Model: "m"})
			dst := make([]uint64, 0, n/h.BlockTokens())
			b.SetBytes(int64(n * 4))
			b.ReportAllocs()
			for b.Loop() {
				dst = h.AppendTokens(dst[:0], root, tokens)
			}
		})
	}
}

func BenchmarkHashBytes(b *testing.B) {
	for _, n := range []int{1024, 32768} {
		b.Run(fmt.Sprintf("bytes=%d", n), func(b *testing.B) {
			h, err := NewHasher(HasherConfig{})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			text := make([]byte, n)
			for i := range text {
				text[i] = byte('a' + r.IntN(26))
			}
			s := string(text)
			root := h.Root(Salt{Model: "m"})
			dst := make([]uint64, 0, n/h.BlockBytes())
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				dst = h.AppendString(dst[:0], root, s)
			}
		})
	}
}
