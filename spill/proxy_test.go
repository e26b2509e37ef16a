package spill

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/httplb"
)

// accountHeaders are response headers of managed providers that name the
// operator's account, organisation, project, deployment or region, its
// quota, or set the upstream's cookies, and headers that are the
// upstream's own.
var accountHeaders = []string{
	"Openai-Organization", "org-Zx81secret",
	"Openai-Project", "proj_secret",
	"Anthropic-Organization-Id", "0f1e2d3c-secret",
	"Anthropic-Ratelimit-Requests-Remaining", "10",
	"X-Ms-Region", "Sweden Central",
	"Azureml-Model-Deployment", "blue",
	"Apim-Request-Id", "6f1c0e9a-secret",
	"X-Ratelimit-Limit-Requests", "500",
	"X-Ratelimit-Remaining-Requests", "0",
	"X-Ratelimit-Reset-Requests", "1m0s",
	"Set-Cookie", "__cf_bm=secret; path=/; HttpOnly",
	// The tier's own: its software, the hosts behind it, its load report,
	// its origin's policies.
	"Server", "uvicorn",
	"X-Powered-By", "vllm/0.11.0",
	"Via", "1.1 egress-proxy.corp.internal (squid/5.7)",
	"Endpoint-Load-Metrics", "TEXT named_metrics.kv_cache_usage_perc=0.9",
	"Strict-Transport-Security", "max-age=31536000; includeSubDomains; preload",
	"Alt-Svc", `h3=":443"; ma=86400`,
	"Nel", `{"report_to":"cf-nel","max_age":604800}`,
	"Report-To", `{"group":"cf-nel","endpoints":[{"url":"https://a.nel.cloudflare.com/report/v4"}]}`,
	"Reporting-Endpoints", `default="https://reports.provider.example/"`,
}

// No answer a Transport returns, a 200 as much as an error, from the
// first tier or a later one, carries the tier's headers about the
// operator's account, or its own; the tier's cooldown reads its rate-limit headers
// before they are dropped.
func TestAnswersDropAccountHeaders(t *testing.T) {
	cases := []struct {
		name   string
		first  func(*http.Request) (*http.Response, error)
		last   func(*http.Request) (*http.Response, error)
		status int
	}{
		{"200", fromUpstream(200, []byte("ok"), "api.openai.com", append(accountHeaders, "Content-Type", "application/json")...), nil, 200},
		{"200 spilled", fromUpstream(503, nil, "10.0.0.7:8000", "Retry-After", "1"),
			fromUpstream(200, []byte("ok"), "api.openai.com", append(accountHeaders, "Content-Type", "application/json")...), 200},
		{"400", fromUpstream(400, []byte(`{"error":{"message":"bad temperature"}}`), "api.openai.com", append(accountHeaders, "Content-Type", "application/json")...), nil, 400},
		{"503", fromUpstream(503, []byte("down"), "api.openai.com", append(accountHeaders, "Content-Type", "application/json")...), nil, 503},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := 1
			if c.last != nil {
				n = 2
			}
			f := newFixture(t, n, Config{})
			f.tiers[0].set(c.first)
			if c.last != nil {
				f.tiers[1].set(c.last)
			}
			r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", strings.NewReader("{}"))
			resp, err := f.tr.RoundTrip(r)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			for i := 0; i < len(accountHeaders); i += 2 {
				if v := resp.Header.Values(accountHeaders[i]); len(v) > 0 {
					t.Errorf("%s: %q reached the client", accountHeaders[i], v)
				}
			}
			if got := resp.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type %q, want application/json", got)
			}
			// The tier that sent the headers cools down until its window
			// with nothing remaining resets: read before they were dropped.
			if want := f.tr.tiers[n-1].Name; !slices.Contains(f.tr.Cooling(), want) {
				t.Errorf("cooling %v, want %s, whose rate-limit window is spent", f.tr.Cooling(), want)
			}
		})
	}
}

// Behind httplb's proxy, a tier's error answer that the client gets with a
// generic body is logged once, by the Transport, with the tier's own body,
// and not again by httplb's NewUpstreamErrorHandler with the generic one.
func TestProxyLogsReplacedAnswerOnce(t *testing.T) {
	for _, c := range []struct {
		status int
		level  string
		client int // the client's status, if not status
	}{{500, "ERROR", 0}, {503, "ERROR", 0}, {401, "INFO", 0}, {429, "INFO", 0}, {424, "ERROR", 0}, {407, "ERROR", 502}} {
		t.Run(http.StatusText(c.status), func(t *testing.T) {
			log, buf := jsonLogger()
			f := newFixture(t, 1, Config{Logger: log})
			f.tiers[0].set(fromUpstream(c.status, []byte("Traceback: worker 3 died"), "10.0.0.7:8000"))
			proxy := httplb.NewProxy(nil)
			proxy.Transport = f.tr
			proxy.ModifyResponse = httplb.NewUpstreamErrorHandler(log)
			proxy.ErrorHandler = httplb.NewErrorHandler(log)
			w := httptest.NewRecorder()
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader("{}"))
			r.Header.Set("X-Request-Id", "req-1")
			proxy.ServeHTTP(w, r)
			client := c.status
			if c.client != 0 {
				client = c.client
			}
			if w.Code != client || strings.Contains(w.Body.String(), "Traceback") || !strings.Contains(w.Body.String(), "req-1") {
				t.Fatalf("client got %d %q", w.Code, w.Body)
			}
			recs := buf.records(t)
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1: %v", len(recs), recs)
			}
			if r := recs[0]; r["level"] != c.level || r["request_id"] != "req-1" || r["status"] != float64(c.status) ||
				r["upstream"] != "10.0.0.7:8000" || r["body"] != "Traceback: worker 3 died" {
				t.Fatalf("record %v", r)
			}
		})
	}
}
