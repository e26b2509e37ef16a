package httplb

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A managed provider's 429 (or a 503) that tells when to come back only in
// its rate-limit headers, which the proxy drops, reaches the client with a
// Retry-After of that wait, as package spill gives it; one that asks for a
// wait above retry.DefaultMaxCooldown, or has a Retry-After of its own,
// gets none made up.
func TestProxyRateLimitResetBecomesRetryAfter(t *testing.T) {
	cases := []struct {
		name   string
		status int
		kv     func() []string
		min    int // the Retry-After wanted, from min to max; 0 for none
		max    int
	}{
		{"OpenAI requests window", 429, func() []string {
			return []string{"X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Remaining-Tokens", "9000", "X-Ratelimit-Reset-Tokens", "6m0s"}
		}, 1, 1},
		{"OpenAI tokens window above the limit", 429, func() []string {
			return []string{"X-Ratelimit-Remaining-Requests", "99", "X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "6m0s"}
		}, 0, 0},
		{"Anthropic", 429, func() []string {
			return []string{"Anthropic-Ratelimit-Tokens-Remaining", "0",
				"Anthropic-Ratelimit-Tokens-Reset", time.Now().Add(30 * time.Second).UTC().Format(time.RFC3339Nano)}
		}, 29, 30},
		{"503 with RateLimit-Reset", 503, func() []string { return []string{"Ratelimit-Reset", "7"} }, 7, 7},
		{"Retry-After of its own", 429, func() []string { return []string{"Retry-After", "4", "X-Ratelimit-Reset-Requests", "1s"} }, 4, 4},
		{"500", 500, func() []string { return []string{"X-Ratelimit-Reset-Requests", "1s"} }, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				kv := c.kv()
				for i := 0; i+1 < len(kv); i += 2 {
					w.Header().Set(kv[i], kv[i+1])
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(c.status)
				fmt.Fprint(w, `{"error":{"message":"Rate limit reached in organization org-secret","type":"requests","code":"rate_limit_exceeded"}}`)
			})
			h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
			resp, _, _ := postLogged(t, h)
			assert.Equal(t, c.status, resp.StatusCode)
			for k := range resp.Header {
				assert.False(t, strings.Contains(strings.ToLower(k), "ratelimit"), "header %s reached the client", k)
			}
			got := resp.Header.Get("Retry-After")
			if c.min == 0 {
				assert.Empty(t, got)
				return
			}
			n, err := strconv.Atoi(got)
			require.NoError(t, err, "Retry-After %q", got)
			assert.True(t, c.min <= n && n <= c.max, "Retry-After %d, want %d to %d", n, c.min, c.max)
		})
	}
}
