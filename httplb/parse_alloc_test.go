package httplb

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxAllocRatio bounds the bytes Parse allocates per body byte.
const maxAllocRatio = 8

// repeated returns head, then elem repeated with commas, then tail: a body
// of about size bytes.
func repeated(size int, head, elem, tail string) []byte {
	n := max((size-len(head)-len(tail))/(len(elem)+1), 1)
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(head)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem)
	}
	b.WriteString(tail)
	return b.Bytes()
}

// parseAlloc returns the bytes one Parse of body allocates, on average over
// runs, with a known or (chunked) unknown Content-Length.
func parseAlloc(t *testing.T, p *Parser, body []byte, chunked bool, runs int) float64 {
	t.Helper()
	reqs := make([]*http.Request, runs)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		if chunked {
			reqs[i].Body = io.NopCloser(bytes.NewReader(body))
			reqs[i].ContentLength = -1
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, r := range reqs {
		if _, err := p.Parse(r); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// Parsing allocates at most maxAllocRatio times the body, whatever its
// shape: nothing per message, content part or prompt. Parsing happens
// before admission, so a body near the cap must not cost a hundred times its
// size.
func TestParseAllocBounded(t *testing.T) {
	if raceEnabled {
		t.Skip("measures allocations, which the race detector changes")
	}
	size := DefaultMaxBodyBytes - 64
	if testing.Short() {
		size = 1 << 20
	}
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	turn := `{"role":"user","content":"` + text + `"},{"role":"assistant","content":[{"type":"text","text":"` + text + `"}]}`
	large := []struct {
		name string
		body []byte
	}{
		{"messages of empty objects", repeated(size, `{"messages":[`, `{}`, `]}`)},
		{"messages of nulls", repeated(size, `{"messages":[`, `null`, `]}`)},
		{"prompt of empty arrays", repeated(size, `{"prompt":[`, `[]`, `]}`)},
		{"prompt of token IDs", repeated(size, `{"prompt":[`, `1`, `]}`)},
		{"prompt of token ID arrays", repeated(size, `{"prompt":[`, `[1]`, `]}`)},
		{"prompt of empty strings", repeated(size, `{"prompt":[`, `""`, `]}`)},
		{"prompt of short strings", repeated(size, `{"prompt":[`, `"a"`, `]}`)},
		{"content of empty parts", repeated(size, `{"messages":[{"role":"user","content":[`, `{}`, `]}]}`)},
		{"content of text parts", repeated(size, `{"messages":[{"role":"user","content":[`, `{"text":"a"}`, `]}]}`)},
		{"content of image parts", repeated(size, `{"messages":[{"role":"user","content":[`, `{"image_url":1}`, `]}]}`)},
		{"tool calls", repeated(size, `{"messages":[`, `{"tool_calls":[]}`, `]}`)},
		{"invalid UTF-8", repeated(size, `{"prompt":"`, "\xff\xff\xff", `"}`)},
		{"escapes", repeated(size, `{"prompt":"`, `\ud83d\ude00\n`, `"}`)},
		{"nested arrays", repeated(size, `{"messages":[{"content":`+strings.Repeat("[", 9000), `1`, strings.Repeat("]", 9000)+`}]}`)},
		{"long conversation", repeated(size, `{"model":"m","messages":[`, turn, `]}`)},
		{"long prompt", []byte(`{"prompt":"` + strings.Repeat("a", size-16) + `"}`)},
		{"many keys", repeated(size, `{`, `"k":0`, `}`)},
	}
	// The parser as configured by default, with a body of known length;
	// and the parser that keeps the most (the whole text, for a token
	// counter) with a body of unknown length (read in chunks, then copied).
	plain := newParser(t, ParserConfig{})
	counted := newParser(t, ParserConfig{CountTokens: func(s string) int { return len(s) / 3 }})
	for _, c := range large {
		for _, counting := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/counted=%t", c.name, counting), func(t *testing.T) {
				require.LessOrEqual(t, len(c.body), DefaultMaxBodyBytes)
				p := plain
				if counting {
					p = counted
				}
				ratio := parseAlloc(t, p, c.body, counting, 1) / float64(len(c.body))
				t.Logf("%d bytes, allocated %.2fx", len(c.body), ratio)
				assert.LessOrEqual(t, ratio, float64(maxAllocRatio))
			})
		}
	}

	sys := strings.Repeat("You are a helpful assistant. ", 100)
	realistic := []struct {
		name string
		body string
	}{
		{"short chat", `{"model":"llama-3-8b","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France? Answer in one word."}]}`},
		{"long system prompt", `{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hello"}]}`},
		{"multi-turn", string(repeated(64<<10, `{"model":"m","messages":[`, turn, `]}`))},
		{"completion", `{"model":"m","prompt":"` + sys + `","max_tokens":16}`},
		{"token IDs", string(repeated(16<<10, `{"model":"m","prompt":[`, `12345`, `]}`))},
	}
	p := newParser(t, ParserConfig{})
	for _, c := range realistic {
		t.Run(c.name, func(t *testing.T) {
			ratio := parseAlloc(t, p, []byte(c.body), false, 100) / float64(len(c.body))
			t.Logf("%d bytes, allocated %.2fx", len(c.body), ratio)
			assert.LessOrEqual(t, ratio, float64(maxAllocRatio))
		})
	}
}

// The number of allocations of Parse does not depend on the number of
// messages, parts or prompts.
func TestParseAllocsPerElement(t *testing.T) {
	if raceEnabled {
		t.Skip("counts allocations, which the race detector changes")
	}
	p := newParser(t, ParserConfig{})
	shapes := []struct{ head, elem, tail string }{
		{`{"model":"m","messages":[`, `{"role":"user","content":"hello"}`, `]}`},
		{`{"messages":[{"role":"user","content":[`, `{"type":"text","text":"hi"}`, `]}]}`},
		{`{"prompt":[`, `"abc"`, `]}`},
		{`{"prompt":[`, `[1,2]`, `]}`},
	}
	allocs := func(body []byte) float64 {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		return testing.AllocsPerRun(20, func() {
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			if _, err := p.Parse(r); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, s := range shapes {
		few := allocs(repeated(2<<10, s.head, s.elem, s.tail))
		many := allocs(repeated(64<<10, s.head, s.elem, s.tail))
		assert.Equal(t, few, many, "%s...: allocations grow with elements", s.head)
		t.Logf("%s...: %v allocations", s.head, few)
	}
}
