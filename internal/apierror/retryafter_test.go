package apierror

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Unix(1e9, 0)
	at := func(d time.Duration) string { return now.Add(d).UTC().Format(time.RFC3339) }
	cases := []struct {
		name string
		code int
		kv   []string
		want string
	}{
		{"OpenAI requests window", 429, []string{"X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "1s"}, "1"},
		{"OpenAI, rounded up", 429, []string{"X-Ratelimit-Reset-Tokens", "1.2s"}, "2"},
		{"OpenAI spent window above the limit, beside a short one", 429,
			[]string{"X-Ratelimit-Remaining-Requests", "99", "X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "6m0s"}, ""},
		{"OpenAI spent window within the limit", 429,
			[]string{"X-Ratelimit-Remaining-Requests", "99", "X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "4m0s"}, "240"},
		{"503 with RateLimit-Reset", 503, []string{"Ratelimit-Reset", "7"}, "7"},
		{"Anthropic spent window", 429, []string{
			"Anthropic-Ratelimit-Requests-Remaining", "0", "Anthropic-Ratelimit-Requests-Reset", at(20 * time.Second),
			"Anthropic-Ratelimit-Tokens-Remaining", "500", "Anthropic-Ratelimit-Tokens-Reset", at(50 * time.Second)}, "20"},
		{"Anthropic, no window spent", 429, []string{
			"Anthropic-Ratelimit-Input-Tokens-Remaining", "5", "Anthropic-Ratelimit-Input-Tokens-Reset", at(3 * time.Second),
			"Anthropic-Ratelimit-Output-Tokens-Remaining", "9", "Anthropic-Ratelimit-Output-Tokens-Reset", at(8 * time.Second)}, "8"},
		{"Anthropic reset in the past", 429, []string{"Anthropic-Ratelimit-Requests-Remaining", "0", "Anthropic-Ratelimit-Requests-Reset", at(-time.Second)}, ""},
		{"Anthropic reset unreadable", 429, []string{"Anthropic-Ratelimit-Requests-Reset", "soon"}, ""},
		{"Retry-After already", 429, []string{"Retry-After", "3", "X-Ratelimit-Reset-Requests", "1s"}, ""},
		{"Retry-After-Ms already", 429, []string{"Retry-After-Ms", "300", "X-Ratelimit-Reset-Requests", "1s"}, ""},
		{"500", 500, []string{"X-Ratelimit-Reset-Requests", "1s"}, ""},
		{"200", 200, []string{"X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "1s"}, ""},
		{"nothing", 429, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for i := 0; i+1 < len(c.kv); i += 2 {
				h.Add(c.kv[i], c.kv[i+1])
			}
			if got := RetryAfter(c.code, h, now, 5*time.Minute); got != c.want {
				t.Errorf("RetryAfter = %q, want %q", got, c.want)
			}
		})
	}
}

// Whatever the headers, RetryAfter gives nothing or a whole number of
// seconds from 1 to the limit's.
func FuzzRetryAfter(f *testing.F) {
	f.Add(429, "X-Ratelimit-Reset-Requests", "6m0s")
	f.Add(503, "Anthropic-Ratelimit-Tokens-Reset", "2001-09-09T01:46:50Z")
	f.Add(429, "Ratelimit-Reset", "1e400")
	f.Fuzz(func(t *testing.T, code int, name, value string) {
		h := http.Header{}
		h.Set(name, value)
		v := RetryAfter(code, h, time.Unix(1e9, 0), 5*time.Minute)
		if v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 300 {
			t.Fatalf("RetryAfter = %q", v)
		}
	})
}
