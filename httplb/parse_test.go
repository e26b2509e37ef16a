package httplb

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/prefix"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newParser(t testing.TB, cfg ParserConfig) *Parser {
	t.Helper()
	p, err := NewParser(cfg)
	require.NoError(t, err)
	return p
}

func post(body string) *http.Request {
	return httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
}

func TestParse(t *testing.T) {
	long := strings.Repeat("abcdefgh", 40) // 320 bytes: 5 blocks of 64
	cases := []struct {
		name     string
		body     string
		header   map[string]string
		tokens   int
		max      int
		blocks   int
		affinity string
		tenant   string
	}{
		{name: "completion string", body: `{"model":"m","prompt":"` + long + `","max_tokens":100}`, tokens: 80, max: 100, blocks: 5},
		{name: "completion batch", body: `{"prompt":["` + long + `","abcd"]}`, tokens: 81, blocks: 5},
		{name: "completion token ids", body: `{"prompt":[` + strings.TrimSuffix(strings.Repeat("7,", 40), ",") + `]}`, tokens: 40, blocks: 2},
		{name: "completion token batch", body: `{"prompt":[[1,2,3],[4,5]]}`, tokens: 5},
		{name: "negative token id", body: `{"prompt":[1,-2,3]}`, tokens: 3},
		{name: "chat string", body: `{"messages":[{"role":"user","content":"` + long + `"}],"max_completion_tokens":7}`, tokens: 82, max: 7, blocks: 5},
		{name: "chat parts", body: `{"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"}]}]}`, tokens: 82, blocks: 5},
		{name: "max_tokens wins", body: `{"prompt":"x","max_tokens":5,"max_completion_tokens":9}`, tokens: 1, max: 5},
		{name: "bad max_tokens", body: `{"prompt":"x","max_tokens":-5}`, tokens: 1},
		{name: "fractional max_tokens", body: `{"prompt":"x","max_tokens":1.5}`, tokens: 1},
		{name: "huge max_tokens", body: `{"prompt":"x","max_tokens":1e300}`, tokens: 1},
		{name: "user is affinity", body: `{"prompt":"x","user":"u1"}`, tokens: 1, affinity: "u1"},
		{name: "session header wins", body: `{"prompt":"x","user":"u1"}`, header: map[string]string{"X-Session-ID": "s1"}, tokens: 1, affinity: "s1"},
		{name: "tenant header", body: `{"prompt":"x"}`, header: map[string]string{"X-Tenant-ID": "t1"}, tokens: 1, tenant: "t1"},
		{name: "malformed", body: `{"prompt":"x"`, header: map[string]string{"X-Session-ID": "s"}, affinity: "s"},
		{name: "not an object", body: `[1,2,3]`},
		{name: "wrong field type", body: `{"model":5,"prompt":"` + long + `"}`, tokens: 80, blocks: 5},
		{name: "empty", body: ``},
	}
	p := newParser(t, ParserConfig{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := post(c.body)
			for k, v := range c.header {
				r.Header.Set(k, v)
			}
			got, err := p.Parse(r)
			require.NoError(t, err)
			assert.Equal(t, c.tokens, got.PromptTokens, "PromptTokens")
			assert.Equal(t, c.max, got.MaxTokens, "MaxTokens")
			assert.Len(t, got.Prefix, c.blocks, "Prefix")
			assert.Equal(t, c.affinity, got.AffinityKey, "AffinityKey")
			assert.Equal(t, c.tenant, got.Tenant, "Tenant")
			// The body is restored, and GetBody returns fresh copies.
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, c.body, string(b))
			if c.body != "" {
				require.NotNil(t, r.GetBody)
				for range 2 {
					rc, err := r.GetBody()
					require.NoError(t, err)
					b, _ := io.ReadAll(rc)
					assert.Equal(t, c.body, string(b))
				}
				assert.EqualValues(t, len(c.body), r.ContentLength)
			}
		})
	}
}

// A conversation's next turn extends the previous turn's prefix, and the
// model and tenant salt it.
func TestParseChatTurnsSharePrefix(t *testing.T) {
	p := newParser(t, ParserConfig{})
	sys := strings.Repeat("You are a helpful assistant. ", 10)
	turn1 := `{"model":"m","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hello there, how are you doing today? tell me a story."}]}`
	turn2 := `{"model":"m","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hello there, how are you doing today? tell me a story."},{"role":"assistant","content":"Once upon a time, there was a router that knew where every prefix lived."},{"role":"user","content":"more"}]}`
	r1, err := p.Parse(post(turn1))
	require.NoError(t, err)
	r2, err := p.Parse(post(turn2))
	require.NoError(t, err)
	require.NotEmpty(t, r1.Prefix)
	require.Greater(t, len(r2.Prefix), len(r1.Prefix))
	assert.Equal(t, r1.Prefix, r2.Prefix[:len(r1.Prefix)])

	other := strings.Replace(turn1, `"model":"m"`, `"model":"n"`, 1)
	r3, err := p.Parse(post(other))
	require.NoError(t, err)
	assert.NotEqual(t, r1.Prefix[0], r3.Prefix[0], "another model must not share blocks")

	req := post(turn1)
	req.Header.Set("X-Tenant-ID", "acme")
	r4, err := p.Parse(req)
	require.NoError(t, err)
	assert.NotEqual(t, r1.Prefix[0], r4.Prefix[0], "another tenant must not share blocks")
}

func TestParseConfig(t *testing.T) {
	_, err := NewParser(ParserConfig{MaxBodyBytes: -1})
	assert.ErrorIs(t, err, ErrInvalidConfig)

	h, err := prefix.NewHasher(prefix.HasherConfig{BlockBytes: 8})
	require.NoError(t, err)
	p := newParser(t, ParserConfig{
		SessionHeader: "X-Conv",
		TenantHeader:  "-",
		Hasher:        h,
		CountTokens:   func(s string) int { return len(strings.Fields(s)) },
	})
	r := post(`{"prompt":"one two three four five six"}`)
	r.Header.Set("X-Conv", "c")
	r.Header.Set("X-Tenant-ID", "ignored")
	got, err := p.Parse(r)
	require.NoError(t, err)
	assert.Equal(t, 6, got.PromptTokens)
	assert.Len(t, got.Prefix, 3) // 28 bytes in blocks of 8
	assert.Equal(t, "c", got.AffinityKey)
	assert.Empty(t, got.Tenant)
}

func TestParseBodyTooLarge(t *testing.T) {
	p := newParser(t, ParserConfig{MaxBodyBytes: 10})
	// Known length.
	_, err := p.Parse(post(`{"prompt":"0123456789"}`))
	assert.ErrorIs(t, err, ErrBodyTooLarge)
	// Unknown length (chunked).
	r := post("")
	r.Body = io.NopCloser(strings.NewReader(`{"prompt":"0123456789"}`))
	r.ContentLength = -1
	_, err = p.Parse(r)
	assert.ErrorIs(t, err, ErrBodyTooLarge)
	// Exactly at the cap is fine.
	_, err = p.Parse(post(`{"a":"123"}`[:10]))
	assert.NoError(t, err)
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestParseReadError(t *testing.T) {
	p := newParser(t, ParserConfig{})
	r := post("")
	r.Body = io.NopCloser(failingReader{})
	r.ContentLength = -1
	_, err := p.Parse(r)
	assert.ErrorContains(t, err, "boom")
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":16,"stream":true}`,
		`{"prompt":["a","b"]}`,
		`{"prompt":[1,2,3]}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"messages":[{"role":"user","content":"hi"}],"user":"u"}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`,
		`{"max_tokens":"12"}`,
		`{`,
		``,
		`null`,
	} {
		f.Add([]byte(s))
	}
	p := newParser(f, ParserConfig{MaxBodyBytes: 1 << 16})
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
		got, err := p.Parse(r)
		if err != nil {
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if got.PromptTokens < 0 || got.MaxTokens < 0 || len(got.Prefix) > p.hasher.MaxBlocks() {
			t.Fatalf("out of range: %+v", got)
		}
		rest, err := io.ReadAll(r.Body)
		if err != nil || !slices.Equal(rest, body) {
			t.Fatalf("body not restored: %q, %v", rest, err)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	sys := strings.Repeat("You are a helpful assistant. ", 100)
	body := []byte(`{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hello"}]}`)
	p := newParser(b, ParserConfig{})
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		if _, err := p.Parse(r); err != nil {
			b.Fatal(err)
		}
	}
}
