package apierror

import (
	"net/http"
	"strings"
	"testing"
)

func TestFields(t *testing.T) {
	cases := []struct {
		body string
		typ  string
		code any
	}{
		{`{"error":{"message":"Rate limit reached in organization org-x","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, "requests", "rate_limit_exceeded"},
		{`{"error":{"message":"m","type":"insufficient_quota","code":null}}`, "insufficient_quota", nil},
		{`{"object":"error","message":"m","type":"BadRequestError","code":400}`, "BadRequestError", int64(400)},
		{`{"type":"error","error":{"type":"rate_limit_error","message":"m"}}`, "rate_limit_error", nil},
		{`{"error":{"type":"has spaces, so a message","code":"org-x key sk-abc"}}`, "", nil},
		{`{"error":"Unauthorized"}`, "", nil},
		{`not json`, "", nil},
		{``, "", nil},
		{`{"error":{"code":1.5}}`, "", nil},
	}
	for _, c := range cases {
		typ, code := Fields([]byte(c.body))
		if typ != c.typ || code != c.code {
			t.Errorf("Fields(%s) = %q, %#v; want %q, %#v", c.body, typ, code, c.typ, c.code)
		}
	}
}

// Whatever the body, Fields returns only plain tokens or numbers.
func FuzzFields(f *testing.F) {
	f.Add([]byte(`{"error":{"type":"requests","code":"rate_limit_exceeded"}}`))
	f.Add([]byte(`{"object":"error","type":"X","code":400}`))
	f.Add([]byte(`{"error":{"type":"a b","code":"c\u0000d"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		typ, code := Fields(body)
		if typ != "" && !IsToken(typ) {
			t.Fatalf("type %q is not a plain token", typ)
		}
		switch c := code.(type) {
		case nil, int64:
		case string:
			if !IsToken(c) {
				t.Fatalf("code %q is not a plain token", c)
			}
		default:
			t.Fatalf("code %#v of type %T", code, code)
		}
	})
}

func TestAccountHeader(t *testing.T) {
	for _, name := range []string{
		"Openai-Organization", "openai-project", "Anthropic-Organization-Id", "Anthropic-Ratelimit-Tokens-Reset",
		"X-Ratelimit-Remaining-Tokens", "RateLimit-Policy", "Ratelimit", "X-Ms-Region", "X-Ms-Deployment-Name",
		"Azureml-Model-Deployment", "Apim-Request-Id", "Set-Cookie", "set-cookie2",
	} {
		if !AccountHeader(name) {
			t.Errorf("AccountHeader(%q) = false", name)
		}
	}
	for _, name := range []string{
		"Retry-After", "Retry-After-Ms", "Content-Type", "X-Request-Id", "Request-Id", "Cache-Control", "Openai", "X-Ms",
	} {
		if AccountHeader(name) {
			t.Errorf("AccountHeader(%q) = true", name)
		}
	}
}

func TestStripUpstream(t *testing.T) {
	h := http.Header{}
	gone := []string{"Server", "X-Powered-By", "Via", "Endpoint-Load-Metrics", "Strict-Transport-Security",
		"Alt-Svc", "Nel", "Report-To", "Reporting-Endpoints", "Openai-Organization", "Set-Cookie"}
	kept := []string{"Retry-After", "Content-Type", "X-Request-Id", "Cf-Ray", "X-Envoy-Upstream-Service-Time",
		"Access-Control-Allow-Origin", "Cache-Control", "Date"}
	for _, k := range append(gone, kept...) {
		h.Set(k, "v")
	}
	lower := strings.ToLower("Endpoint-Load-Metrics") // as a RoundTripper of one's own may keep it
	h[lower] = []string{"v"}
	StripUpstream(h)
	for _, k := range gone {
		if v := h.Values(k); len(v) > 0 {
			t.Errorf("%s kept", k)
		}
	}
	if _, ok := h[lower]; ok {
		t.Error("endpoint-load-metrics, lower-cased, kept")
	}
	for _, k := range kept {
		if h.Get(k) == "" {
			t.Errorf("%s deleted", k)
		}
	}
}
