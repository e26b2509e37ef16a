package httplb

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// accountHeaders are response headers of managed providers that name the
// operator's account, organisation, project, deployment or region, its
// quota, or set the upstream's cookies.
var accountHeaders = map[string]string{
	"Openai-Organization":              "org-Zx81secret",
	"Openai-Project":                   "proj_secret",
	"Openai-Processing-Ms":             "120",
	"Anthropic-Organization-Id":        "0f1e2d3c-secret",
	"Anthropic-Ratelimit-Tokens-Limit": "400000",
	"X-Ms-Region":                      "Sweden Central",
	"X-Ms-Deployment-Name":             "gpt-4o-prod-eu",
	"Azureml-Model-Deployment":         "blue",
	"Apim-Request-Id":                  "6f1c0e9a-secret",
	"X-Ratelimit-Limit-Requests":       "500",
	"X-Ratelimit-Remaining-Requests":   "0",
	"X-Ratelimit-Reset-Requests":       "6m0s",
	"Set-Cookie":                       "__cf_bm=secret; path=/; HttpOnly",
}

// upstreamOwnHeaders are response headers that are the upstream's own:
// its software and version, the hosts and proxies behind the gateway, its
// ORCA load report, and its origin's policies.
var upstreamOwnHeaders = map[string]string{
	"Server":                    "uvicorn",
	"X-Powered-By":              "vllm/0.11.0",
	"Via":                       "1.1 egress-proxy.corp.internal (squid/5.7)",
	"Endpoint-Load-Metrics":     "TEXT cpu_utilization=0.5, named_metrics.kv_cache_usage_perc=0.9",
	"Strict-Transport-Security": "max-age=31536000; includeSubDomains; preload",
	"Alt-Svc":                   `h3=":443"; ma=86400`,
	"Nel":                       `{"success_fraction":0,"report_to":"cf-nel","max_age":604800}`,
	"Report-To":                 `{"endpoints":[{"url":"https://a.nel.cloudflare.com/report/v4"}],"group":"cf-nel","max_age":604800}`,
	"Reporting-Endpoints":       `default="https://reports.provider.example/"`,
}

// quotaRecorder is a retry.QuotaReporter that keeps the headers it is given.
type quotaRecorder struct {
	mu      sync.Mutex // protects headers
	headers []http.Header
}

func (q *quotaRecorder) Report(string, error) {}

func (q *quotaRecorder) ReportQuota(_ string, h http.Header) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.headers = append(q.headers, h.Clone())
}

// No answer through NewProxy, a 200 as much as an error, stream or not,
// passes on the upstream's headers about the operator's account, or its
// own (its software, its load report, its origin's policies); the
// Transport's QuotaReporter still reads the rate-limit headers, before the
// proxy drops them.
func TestProxyDropsAccountHeaders(t *testing.T) {
	cases := []struct {
		name        string
		status      int
		contentType string
		body        string
	}{
		{"200", http.StatusOK, "application/json", `{"id":"chatcmpl-1","choices":[]}`},
		{"200 stream", http.StatusOK, "text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"},
		{"400", http.StatusBadRequest, "application/json", `{"error":{"message":"bad temperature"}}`},
		{"500", http.StatusInternalServerError, "text/plain", "boom"},
		{"503", http.StatusServiceUnavailable, "text/plain", "busy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range accountHeaders {
					w.Header().Set(k, v)
				}
				for k, v := range upstreamOwnHeaders {
					w.Header().Set(k, v)
				}
				w.Header().Set("Cf-Ray", "8f1e2d3c4b5a6978-ARN")
				w.Header().Set("Retry-After", "3")
				w.Header().Set("Content-Type", c.contentType)
				w.WriteHeader(c.status)
				fmt.Fprint(w, c.body)
			})
			quota := &quotaRecorder{}
			h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1, Reporter: quota}}, up)
			resp, raw, _ := postLogged(t, h)
			assert.Equal(t, c.status, resp.StatusCode)
			for k := range accountHeaders {
				assert.Empty(t, resp.Header.Values(k), "%s reached the client", k)
			}
			for k := range upstreamOwnHeaders {
				assert.Empty(t, resp.Header.Values(k), "%s reached the client", k)
			}
			assert.Equal(t, "8f1e2d3c4b5a6978-ARN", resp.Header.Get("Cf-Ray"), "a request's id at the provider's CDN names nothing: kept")
			assert.Empty(t, resp.Cookies())
			assert.Equal(t, "3", resp.Header.Get("Retry-After"))
			if c.status == http.StatusOK {
				assert.Equal(t, c.body, raw)
				assert.Equal(t, c.contentType, resp.Header.Get("Content-Type"))
				quota.mu.Lock()
				defer quota.mu.Unlock()
				require.Len(t, quota.headers, 1)
				assert.Equal(t, "0", quota.headers[0].Get("X-Ratelimit-Remaining-Requests"), "the Transport reads the quota before the proxy drops it")
			}
		})
	}
}
