package httplb

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/retry"
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
		{name: "completion: max_tokens wins", body: `{"prompt":"x","max_tokens":5,"max_completion_tokens":9}`, tokens: 1, max: 5},
		{name: "chat: max_completion_tokens wins", body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":9}`, tokens: 2, max: 9},
		{name: "chat: max_tokens if max_completion_tokens is invalid", body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":-9}`, tokens: 2, max: 5},
		{name: "bad max_tokens", body: `{"prompt":"x","max_tokens":-5}`, tokens: 1},
		{name: "fractional max_tokens", body: `{"prompt":"x","max_tokens":1.5}`, tokens: 1},
		{name: "huge max_tokens", body: `{"prompt":"x","max_tokens":1e300}`, tokens: 1},
		{name: "user is affinity", body: `{"prompt":"x","user":"u1"}`, tokens: 1, affinity: "u1"},
		{name: "session header wins", body: `{"prompt":"x","user":"u1"}`, header: map[string]string{"X-Session-ID": "s1"}, tokens: 1, affinity: "s1"},
		{name: "client tenant header ignored", body: `{"prompt":"x","user":"u"}`, header: map[string]string{"X-Tenant-ID": "t1"}, tokens: 1, affinity: "u"},
		{name: "chat tool calls", body: `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`, tokens: 6},
		{name: "chat image part", body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, tokens: 5},
		{name: "chat bad part", body: `{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, tokens: 2},
		{name: "chat of non-objects", body: `{"messages":[1,null]}`, tokens: 1},
		{name: "empty messages use prompt", body: `{"messages":[],"prompt":"abcd"}`, tokens: 1},
		{name: "escaped text", body: `{"prompt":"\u00e9\ud83d\ude00\n"}`, tokens: 2},
		{name: "escaped key", body: `{"pr\u006fmpt":"abcd","us\u0065r":"\u0075"}`, tokens: 1, affinity: "u"},
		{name: "repeated key, last wins", body: `{"prompt":"abcdefgh","prompt":"abcd"}`, tokens: 1},
		{name: "integral float max_tokens", body: `{"prompt":"x","max_tokens":1e2}`, tokens: 1, max: 100},
		{name: "string max_tokens", body: `{"prompt":"x","max_tokens":"12"}`, tokens: 1},
		{name: "null prompt batch", body: `{"prompt":[null,"abcd"]}`, tokens: 1},
		{name: "mixed prompt array", body: `{"prompt":["a",1]}`},
		{name: "token id out of int64", body: `{"prompt":[1,99999999999999999999]}`},
		{name: "trailing garbage", body: `{"prompt":"x"} x`},
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

	tp := newParser(t, ParserConfig{TrustTenantHeader: "X-Tenant-ID"})
	req := post(turn1)
	req.Header.Set("X-Tenant-ID", "acme")
	r4, err := tp.Parse(req)
	require.NoError(t, err)
	assert.NotEqual(t, r1.Prefix[0], r4.Prefix[0], "another tenant must not share blocks")
}

func TestParseConfig(t *testing.T) {
	_, err := NewParser(ParserConfig{MaxBodyBytes: -1})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewParser(ParserConfig{
		Tenant:            func(*http.Request) (string, error) { return "t", nil },
		TrustTenantHeader: "X-Tenant-ID",
	})
	assert.ErrorIs(t, err, ErrInvalidConfig, "two tenant sources")
	// A header no request can carry would silently never be read.
	for _, cfg := range []ParserConfig{{SessionHeader: "X Session"}, {TrustTenantHeader: "bad header"}, {FeatureHeader: "X-Feature:"}, {TrustTenantHeader: "X-Ténant"}} {
		_, err = NewParser(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
	_, err = NewParser(ParserConfig{SessionHeader: "x-session_id", TrustTenantHeader: "X-Tenant-ID", FeatureHeader: "X-Prompt-Template"})
	assert.NoError(t, err)

	h, err := prefix.NewHasher(prefix.HasherConfig{BlockBytes: 8})
	require.NoError(t, err)
	p := newParser(t, ParserConfig{
		SessionHeader: "X-Conv",
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

// tenantKey is the context key under which the tests' authentication stores
// the tenant.
type tenantKey struct{}

func authTenant(r *http.Request) (string, error) {
	t, ok := r.Context().Value(tenantKey{}).(string)
	if !ok {
		return "", errors.New("unauthenticated")
	}
	return t, nil
}

func withTenant(r *http.Request, tenant string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
}

// The tenant comes from the caller's authentication; a client's header is
// read only when the operator names it, and the session key is scoped by the
// tenant.
func TestParseTenant(t *testing.T) {
	const body = `{"prompt":"` + "abcdefgh" + "abcdefgh" + "abcdefgh" + "abcdefgh" + "abcdefgh" + "abcdefgh" + "abcdefgh" + "abcdefgh" + `","user":"alice"}`
	cases := []struct {
		name     string
		cfg      ParserConfig
		auth     string // the authenticated tenant; "" for none
		header   string // the client's X-Tenant-ID
		session  string // the client's X-Session-ID
		tenant   string
		affinity string
	}{
		{name: "default ignores the client", header: "victim", tenant: "", affinity: "alice"},
		{name: "default session", session: "s", header: "victim", affinity: "s"},
		{name: "authenticated", cfg: ParserConfig{Tenant: authTenant}, auth: "acme", header: "victim", tenant: "acme", affinity: "4:acmealice"},
		{name: "authenticated session", cfg: ParserConfig{Tenant: authTenant}, auth: "acme", session: "s", tenant: "acme", affinity: "4:acmes"},
		{name: "authenticated empty tenant", cfg: ParserConfig{Tenant: authTenant}, auth: "", session: "s", affinity: "0:s"},
		{name: "trusted header", cfg: ParserConfig{TrustTenantHeader: "x-tenant-id"}, header: "acme", tenant: "acme", affinity: "4:acmealice"},
		{name: "trusted header absent", cfg: ParserConfig{TrustTenantHeader: "X-Tenant-ID"}, affinity: "0:alice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newParser(t, c.cfg)
			r := withTenant(post(body), c.auth)
			if c.header != "" {
				r.Header.Set("X-Tenant-ID", c.header)
			}
			if c.session != "" {
				r.Header.Set("X-Session-ID", c.session)
			}
			got, err := p.Parse(r)
			require.NoError(t, err)
			assert.Equal(t, c.tenant, got.Tenant, "Tenant")
			assert.Equal(t, c.affinity, got.AffinityKey, "AffinityKey")
			h := p.hasher
			assert.Equal(t, h.HashString(prefix.Salt{Tenant: c.tenant}, strings.Repeat("abcdefgh", 8)), got.Prefix,
				"the prefix is salted with the tenant")
		})
	}

	t.Run("refused", func(t *testing.T) {
		p := newParser(t, ParserConfig{Tenant: authTenant})
		r := post(body)
		closed := &closeRecorder{Reader: strings.NewReader(body)}
		r.Body = closed
		_, err := p.Parse(r)
		assert.ErrorContains(t, err, "unauthenticated")
		assert.True(t, closed.closed, "the body of a refused request is closed")
	})
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error {
	c.closed = true
	return nil
}

// Session keys of different tenants never collide, however the tenant and
// key split a string, for affinity and for admission.
func TestTenantScopesSessionKeys(t *testing.T) {
	p := newParser(t, ParserConfig{Tenant: authTenant})
	pairs := [][2]string{
		{"a|b", "c"}, {"a", "b|c"},
		{"ab", "c"}, {"a", "bc"},
		{"", "1:ac"}, {"a", "c"},
		{"1:a", "c"}, {"1", ":ac"},
		{"", "c"}, {"c", ""},
	}
	affinity := map[string][2]string{}
	admission := map[string][2]string{}
	for _, pair := range pairs {
		r := withTenant(post(`{"prompt":"x"}`), pair[0])
		r.Header.Set("X-Session-ID", pair[1])
		got, err := p.Parse(r)
		require.NoError(t, err)
		if pair[1] == "" {
			assert.Empty(t, got.AffinityKey, "no session, no key")
			assert.Empty(t, admissionKey(&got), "no session, no key")
			continue
		}
		if prev, ok := affinity[got.AffinityKey]; ok {
			t.Errorf("affinity key %q of %q is also that of %q", got.AffinityKey, pair, prev)
		}
		affinity[got.AffinityKey] = pair
		key := admissionKey(&got)
		if prev, ok := admission[key]; ok {
			t.Errorf("admission key %q of %q is also that of %q", key, pair, prev)
		}
		admission[key] = pair
		// A key set by Config.Adjust is scoped too.
		adjusted := llmlb.Request{Tenant: pair[0], AffinityKey: pair[1]}
		if prev, ok := admission[admissionKey(&adjusted)]; ok && prev != pair {
			t.Errorf("adjusted admission key of %q is also that of %q", pair, prev)
		}
		admission[admissionKey(&adjusted)] = pair
	}
}

// Through a Transport, one tenant's session cannot exhaust another's session
// of the same name, whether the tenant comes from the Parser or from
// Config.Adjust.
func TestTransportAdmissionPerTenant(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return &http.Response{
			StatusCode: http.StatusOK,
			Header:     http.Header{"Content-Type": {"text/event-stream"}},
			Body:       io.NopCloser(strings.NewReader("data: {}\n\ndata: [DONE]\n\n")),
			Request:    r,
		}, nil
	})
	adjust := func(r *http.Request, lr *llmlb.Request) {
		lr.Tenant, _ = authTenant(r)
	}
	cases := []struct {
		name string
		cfg  Config
	}{
		{"parser", Config{Parser: newParser(t, ParserConfig{Tenant: authTenant})}},
		{"adjust", Config{Adjust: adjust}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bal, err := llmlb.New(llmlb.LeastOutstanding())
			require.NoError(t, err)
			eps, err := NewEndpoints("http://a:1")
			require.NoError(t, err)
			require.NoError(t, bal.Update(eps))
			adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxPerSession: 1})
			require.NoError(t, err)
			cfg := c.cfg
			cfg.Balancer, cfg.Base, cfg.Admission = bal, base, adm
			tr, err := NewTransport(cfg)
			require.NoError(t, err)
			send := func(tenant string) (*http.Response, error) {
				r, err := http.NewRequest(http.MethodPost, "http://gw/v1/chat/completions",
					strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"user":"alice"}`))
				require.NoError(t, err)
				return tr.RoundTrip(withTenant(r, tenant))
			}
			a, err := send("a")
			require.NoError(t, err)
			defer a.Body.Close()
			_, err = send("a")
			require.ErrorIs(t, err, retry.ErrOverloaded, "tenant a's alice is at its cap")
			b, err := send("b")
			require.NoError(t, err, "tenant b's alice is another session")
			b.Body.Close()
		})
	}
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

// TestReadBodyMemory: the buffer follows the bytes received, whatever the
// length announced, and every body comes back whole.
func TestReadBodyMemory(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	for _, c := range []struct {
		name    string
		body    string
		length  int64 // announced
		maxCap  int   // of the buffer returned
		limit   int64
		wantLen int
	}{
		{"announced 8 MiB, sent 2 bytes", "{}", 8 << 20, firstBodyBuffer, 16 << 20, 2},
		{"announced exactly", "{}", 2, 3, 16 << 20, 2},
		{"1 MiB announced", big, int64(len(big)), 2 * (len(big) + 1), 16 << 20, len(big)},
		{"1 MiB chunked", big, -1, 2 * (len(big) + 1), 16 << 20, len(big)},
		{"shorter than announced", big[:100], 1000, 1001, 16 << 20, 100},
		{"longer than announced", big[:5000], 100, 2 * 5001, 16 << 20, 5000},
		{"over the limit", big, -1, 2 * 1025, 1024, 1025},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := post("")
			r.Body = io.NopCloser(strings.NewReader(c.body))
			r.ContentLength = c.length
			buf, err := readBody(r, c.limit)
			require.NoError(t, err)
			assert.Equal(t, c.body[:c.wantLen], string(buf))
			assert.LessOrEqual(t, cap(buf), c.maxCap)
		})
	}
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

// One conversation hashes alike through the Chat Completions, Messages
// (Anthropic) and Responses APIs, so that it keeps its replica whichever a
// client uses, and the system prompt counts in the prompt.
func TestAPIsHashAlike(t *testing.T) {
	p := newParser(t, ParserConfig{})
	sys := strings.Repeat("You are a careful assistant. ", 20)
	parse := func(body string) llmlb.Request {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, "/v1/x", strings.NewReader(body))
		req, err := p.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	chat := parse(`{"model":"m","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hello"}]}`)
	for name, body := range map[string]string{
		"messages, system string": `{"model":"m","system":"` + sys + `","messages":[{"role":"user","content":"hello"}]}`,
		"messages, system blocks": `{"model":"m","system":[{"type":"text","text":"` + sys + `"}],"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`,
		"responses, input text":   `{"model":"m","instructions":"` + sys + `","input":"hello"}`,
		"responses, input items":  `{"model":"m","instructions":"` + sys + `","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}]}`,
	} {
		got := parse(body)
		if !slices.Equal(got.Prefix, chat.Prefix) || got.PromptTokens != chat.PromptTokens {
			t.Errorf("%s: %d blocks, %d tokens; the chat has %d blocks, %d tokens", name, len(got.Prefix), got.PromptTokens, len(chat.Prefix), chat.PromptTokens)
		}
	}
	if len(chat.Prefix) < 8 {
		t.Fatalf("the system prompt is not hashed: %d blocks", len(chat.Prefix))
	}
	// An empty system prompt or instructions add nothing.
	bare := parse(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	for _, body := range []string{
		`{"model":"m","system":"","messages":[{"role":"user","content":"hello"}]}`,
		`{"model":"m","system":null,"messages":[{"role":"user","content":"hello"}]}`,
		`{"model":"m","input":"hello"}`,
		`{"model":"m","instructions":"","input":"hello"}`,
	} {
		if got := parse(body); got.PromptTokens != bare.PromptTokens || !slices.Equal(got.Prefix, bare.Prefix) {
			t.Errorf("%s: %d tokens, want %d", body, got.PromptTokens, bare.PromptTokens)
		}
	}
}

// ParserConfig.Adapter names the request's LoRA adapter from its model.
func TestParserAdapter(t *testing.T) {
	p := newParser(t, ParserConfig{Adapter: func(model string) string {
		if model == "llama-3-8b" {
			return ""
		}
		return model
	}})
	for body, want := range map[string]string{
		`{"model":"sql-lora","prompt":"x"}`:                                 "sql-lora",
		`{"model":"llama-3-8b","messages":[{"role":"user","content":"x"}]}`: "",
		`{"prompt":"x"}`: "",
		`not json`:       "",
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		req, err := p.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		if req.Adapter != want {
			t.Errorf("%s: adapter %q, want %q", body, req.Adapter, want)
		}
	}
	if req, _ := newParser(t, ParserConfig{}).Parse(httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"model":"sql-lora"}`))); req.Adapter != "" {
		t.Errorf("without ParserConfig.Adapter: adapter %q", req.Adapter)
	}
}

// A request's cache_salt (vLLM's) keeps its prompt's blocks apart from
// those of the same prompt under another salt or none, as the engine's
// cache does; the same salt shares them.
func TestParseCacheSalt(t *testing.T) {
	p := newParser(t, ParserConfig{})
	sys := strings.Repeat("You are a helpful assistant. ", 10)
	body := func(extra string) string {
		return `{"model":"m",` + extra + `"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"hi"}]}`
	}
	parse := func(b string) llmlb.Request {
		t.Helper()
		r, err := p.Parse(post(b))
		require.NoError(t, err)
		require.NotEmpty(t, r.Prefix)
		return r
	}
	none := parse(body(""))
	a := parse(body(`"cache_salt":"tenant-a",`))
	a2 := parse(body(`"cache_salt":"tenant-a",`))
	b := parse(body(`"cache_salt":"tenant-b",`))
	assert.NotEqual(t, none.Prefix[0], a.Prefix[0], "a salted prompt must not share the unsalted one's blocks")
	assert.NotEqual(t, a.Prefix[0], b.Prefix[0], "two salts must not share blocks")
	assert.Equal(t, a.Prefix, a2.Prefix, "one salt shares its blocks")
	assert.Equal(t, none.PromptTokens, a.PromptTokens)
	// Not a string, or empty: no salt, as vLLM refuses the first and
	// ignores the second.
	for _, extra := range []string{`"cache_salt":7,`, `"cache_salt":null,`, `"cache_salt":"",`} {
		assert.Equal(t, none.Prefix, parse(body(extra)).Prefix, extra)
	}
}

// A chat or completion request's n is the completions the balancer
// charges it for; an invalid one is charged as one, a huge one as the
// most a Request holds, and n means nothing elsewhere.
func TestParseChoices(t *testing.T) {
	p := newParser(t, ParserConfig{})
	chat := func(n string) string { return `{"messages":[{"role":"user","content":"x"}],"n":` + n + `}` }
	for _, tc := range []struct {
		body string
		want int
	}{
		{chat("4"), 4},
		{`{"prompt":"x","n":2,"max_tokens":8}`, 2},
		{chat("1"), 1},
		{`{"messages":[{"role":"user","content":"x"}]}`, 0},
		{chat("0"), 0},
		{chat("-3"), 0},
		{chat("2.5"), 0},
		{chat(`"4"`), 0},
		{chat("null"), 0},
		{chat("1e9"), maxChoices},
		{`{"input":"x","n":4}`, 0}, // the Responses API has none
		{`{"model":"m","n":4}`, 0}, // no prompt
		{`{"prompt":"x","n":65536}`, 65536},
	} {
		r, err := p.Parse(post(tc.body))
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.want, r.Choices, tc.body)
	}
}
