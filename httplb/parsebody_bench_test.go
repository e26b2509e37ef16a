package httplb

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// benchText returns n bytes of words of random letters, as a prompt.
func benchText(n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	b.Grow(n)
	for b.Len() < n {
		if b.Len() > 0 && r.IntN(6) == 0 {
			b.WriteByte(' ')
			continue
		}
		b.WriteByte(byte('a' + r.IntN(26)))
	}
	return b.String()
}

// BenchmarkParseBody measures ParseBody of 16 KiB bodies: a completion
// whose prompt is one string, and a chat of a system prompt and eight turns.
// hash=16KiB is the reference: hashing a 16 KiB prompt text, the work
// ParseBody cannot avoid.
func BenchmarkParseBody(b *testing.B) {
	const size = 16 << 10
	text := benchText(size)
	var chat strings.Builder
	chat.WriteString(`{"model":"m","stream":true,"max_tokens":256,"messages":[`)
	fmt.Fprintf(&chat, `{"role":"system","content":%q}`, text[:size/2])
	for i := range 8 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		turn := text[size/2+i*size/16 : size/2+(i+1)*size/16]
		fmt.Fprintf(&chat, `,{"role":%q,"content":[{"type":"text","text":%q}]}`, role, turn)
	}
	chat.WriteString(`]}`)
	bodies := []struct {
		name string
		body []byte
	}{
		{"completion", fmt.Appendf(nil, `{"model":"m","prompt":%q,"max_tokens":256,"stream":true}`, text)},
		{"chat", []byte(chat.String())},
	}
	p := newParser(b, ParserConfig{})
	r, err := http.NewRequest(http.MethodPost, "http://gw.example/v1/completions", nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range bodies {
		b.Run("body="+c.name+"/size=16KiB", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				req, err := p.ParseBody(r, c.body)
				if err != nil || len(req.Prefix) == 0 {
					b.Fatal(req, err)
				}
			}
		})
	}
	b.Run("hash=16KiB", func(b *testing.B) {
		root := p.hasher.Root(prefix.Salt{Model: "m"})
		dst := make([]uint64, 0, p.hasher.MaxBlocks())
		b.ReportAllocs()
		b.SetBytes(size)
		for b.Loop() {
			dst = p.hasher.AppendString(dst[:0], root, text)
		}
	})
}
