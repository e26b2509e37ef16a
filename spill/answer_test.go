package spill

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/apierror"
)

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// records returns the JSON log records in s.
func (s *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(s.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func jsonLogger() (*slog.Logger, *syncBuffer) {
	var buf syncBuffer
	return slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

// fromUpstream is a fake tier's answer as a transport gives it, from the
// upstream at host.
func fromUpstream(code int, body []byte, host string, kv ...string) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		sent := r.Clone(r.Context())
		sent.URL = &url.URL{Scheme: "https", Host: host, Path: r.URL.Path}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(bytes.NewReader(body)), Request: sent}, nil
	}
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	_, _ = io.WriteString(z, s)
	_ = z.Close()
	return b.Bytes()
}

// An error answer about the tier (its quota, its credentials, its failure)
// reaches the client with its status, but with a generic error in the
// OpenAI format instead of its body, and none of its headers but
// Retry-After: a managed provider's 429 names the operator's organisation,
// its 401 part of the operator's key, and its headers the organisation and
// project. The error's type and code stay when they are plain tokens, and
// the body goes to the operator's log, decoded, under the request's id. A
// refusal of the request itself (400, 404) reaches the client as it came.
func TestErrorAnswerHidesProviderDetail(t *testing.T) {
	const secret = "org-S3CRET"
	openAI429 := `{"error":{"message":"Rate limit reached for gpt-4o in organization ` + secret + ` on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`
	cases := []struct {
		name      string
		code      int
		body      []byte
		kv        []string
		wantType  string
		wantCode  any
		wantRetry string
		hidden    bool
		status    int // the client's, if not code
	}{
		{"OpenAI 429", 429, []byte(openAI429),
			[]string{"Retry-After", "3", "Openai-Organization", secret, "Openai-Project", "proj_" + secret, "X-Ratelimit-Limit-Tokens", "30000", "Set-Cookie", "__cf_bm=" + secret},
			"tokens", "rate_limit_exceeded", "3", true, 0},
		{"OpenAI 429 gzipped, with a rate-limit reset alone", 429, gzipped(openAI429),
			[]string{"Content-Encoding", "gzip", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "1.5s"},
			"tokens", "rate_limit_exceeded", "2", true, 0},
		{"insufficient quota", 429, []byte(`{"error":{"message":"You exceeded your current quota (` + secret + `).","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`),
			nil, "insufficient_quota", "insufficient_quota", "", true, 0},
		{"Azure 429", 429, []byte(`{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current ` + secret + ` pricing tier."}}`),
			[]string{"Retry-After-Ms", "1200", "Azureml-Model-Deployment", secret}, "rate_limit_error", "429", "", true, 0},
		{"401 naming the key", 401, []byte(`{"error":{"message":"Incorrect API key provided: sk-proj-****` + secret + `.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`),
			nil, "invalid_request_error", "invalid_api_key", "", true, 0},
		{"403", 403, []byte(`{"error":{"message":"Project ` + secret + ` does not have access to model gpt-5"}}`), nil, "permission_error", float64(403), "", true, 0},
		{"500 with a trace", 500, []byte("Traceback (most recent call last):\n  File \"/srv/" + secret + "/app.py\""), nil, "upstream_error", float64(500), "", true, 0},
		{"503 with a token type too long", 503, []byte(`{"error":{"message":"` + secret + `","type":"` + strings.Repeat("x", 65) + `","code":{"nested":1}}}`),
			[]string{"Retry-After", "5"}, "upstream_error", float64(503), "5", true, 0},
		{"OpenAI 429 with a spent window's reset above the limit", 429, []byte(openAI429),
			[]string{"X-Ratelimit-Remaining-Requests", "99", "X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "6m0s"},
			"tokens", "rate_limit_exceeded", "", true, 0},
		{"Anthropic 429 with a rate-limit reset alone", 429, []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization (` + secret + `)"}}`),
			[]string{"Anthropic-Ratelimit-Requests-Remaining", "0", "Anthropic-Ratelimit-Requests-Reset", time.Unix(1e9+20, 0).UTC().Format(time.RFC3339),
				"Anthropic-Ratelimit-Tokens-Remaining", "1000", "Anthropic-Ratelimit-Tokens-Reset", time.Unix(1e9+2, 0).UTC().Format(time.RFC3339),
				"Anthropic-Organization-Id", secret},
			"rate_limit_error", float64(429), "20", true, 0},
		{"TGI 424, a failure of its shard", 424, []byte(`{"error":"Request failed during generation: Server error: CUDA out of memory at /srv/` + secret + `/flash_causal_lm.py","error_type":"generation"}`),
			nil, "upstream_error", float64(424), "", true, 0},
		{"407 from a forward proxy", 407, []byte("ERR_CACHE_ACCESS_DENIED generated by egress.corp (" + secret + ")"),
			[]string{"Proxy-Authenticate", `Basic realm="` + secret + `"`, "Via", "1.1 egress.corp (squid/5.7)", "Retry-After", "9"},
			"upstream_error", float64(502), "", true, http.StatusBadGateway},
		{"400 about the request", 400, []byte(`{"error":{"message":"Invalid value for 'temperature': 7 is greater than 2.","type":"invalid_request_error"}}`), nil, "", nil, "", false, 0},
		{"404 about the request", 404, []byte(`{"error":{"message":"The model ` + "`gpt-9`" + ` does not exist."}}`), nil, "", nil, "", false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			log, buf := jsonLogger()
			f := newFixture(t, 1, Config{Logger: log})
			f.tiers[0].set(fromUpstream(tc.code, tc.body, "api.provider.example", tc.kv...))
			r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", strings.NewReader("{}"))
			r.Header.Set("X-Request-Id", "req_client1")
			resp, err := f.tr.RoundTrip(r)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := tc.code
			if tc.status != 0 {
				want = tc.status
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d", resp.StatusCode, want)
			}
			if !tc.hidden {
				if !bytes.Equal(got, tc.body) {
					t.Fatalf("a refusal of the request reached the client as %q, want it whole", got)
				}
				return
			}
			if strings.Contains(string(got), secret) || strings.Contains(fmt.Sprint(resp.Header), secret) {
				t.Fatalf("the client got the provider's detail: %v %s", resp.Header, got)
			}
			var e struct {
				Error struct {
					Message string
					Type    string
					Param   any
					Code    any
				}
			}
			if err := json.Unmarshal(got, &e); err != nil {
				t.Fatalf("body %q: %v", got, err)
			}
			if e.Error.Type != tc.wantType || e.Error.Code != tc.wantCode || e.Error.Param != nil ||
				!strings.HasSuffix(e.Error.Message, "Request ID: req_client1") {
				t.Fatalf("error %+v, want type %q, code %v and the request id", e.Error, tc.wantType, tc.wantCode)
			}
			if ct, ce := resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding"); ct != "application/json" || ce != "" {
				t.Fatalf("Content-Type %q, Content-Encoding %q", ct, ce)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.wantRetry {
				t.Fatalf("Retry-After %q, want %q", got, tc.wantRetry)
			}
			for _, k := range []string{"Openai-Organization", "Openai-Project", "Set-Cookie", "X-Ratelimit-Limit-Tokens", "Azureml-Model-Deployment",
				"Proxy-Authenticate", "Via", "Anthropic-Ratelimit-Requests-Reset"} {
				if v := resp.Header.Get(k); v != "" {
					t.Fatalf("header %s: %q reached the client", k, v)
				}
			}
			if slices.Contains(tc.kv, "Retry-After-Ms") && resp.Header.Get("Retry-After-Ms") != "1200" {
				t.Fatalf("Retry-After-Ms %q, want it kept", resp.Header.Get("Retry-After-Ms"))
			}
			if resp.ContentLength != int64(len(got)) || resp.Header.Get("Content-Length") != fmt.Sprint(len(got)) {
				t.Fatalf("Content-Length %d / %q for %d bytes", resp.ContentLength, resp.Header.Get("Content-Length"), len(got))
			}
			recs := buf.records(t)
			if len(recs) != 1 || recs[0]["request_id"] != "req_client1" || recs[0]["upstream"] != "api.provider.example" ||
				recs[0]["status"] != float64(tc.code) || !strings.Contains(recs[0]["body"].(string), secret) {
				t.Fatalf("log %v, want one record of the answer with its body, decoded", recs)
			}
			level := "INFO"
			if tc.code >= 500 || tc.code == 407 || tc.code == 424 {
				level = "ERROR"
			}
			if recs[0]["level"] != level {
				t.Fatalf("logged at %v, want %s", recs[0]["level"], level)
			}
		})
	}
}

// An invalid request does not spill: a tier's refusal of a request whose
// tenant it could not establish (or whose body it could not take) is the
// answer, as a 400 is, and the next tier never sees the request, which
// would otherwise go past the first tier's authentication.
func TestRequestFaultsDoNotSpill(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("httplb: %w: bad key", httplb.ErrUnauthenticated),
		fmt.Errorf("httplb: %w: short read", httplb.ErrBodyRead),
	} {
		f := newFixture(t, 2, Config{})
		f.tiers[0].set(fail(err))
		if _, _, _, got := f.send("{}"); !errors.Is(got, err) || f.tiers[1].sent() != 0 || len(f.takeEvents()) != 0 {
			t.Fatalf("%v: got %v, %d sent to the next tier; want the error and no spill", err, got, f.tiers[1].sent())
		}
	}
}

// A request that spilled past a refusal of its own (a prompt too long for
// the first tier's context), and that the next tier then fails, gets the
// refusal, which tells it what to change, not the later tier's failure; a
// later refusal or success is the answer, marked. With a Spill that moves
// every 4xx, the same holds for any refusal of the request.
func TestRequestRefusalOutlivesLaterFailure(t *testing.T) {
	refusal := `{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}`
	cases := []struct {
		name     string
		later    func(*http.Request) (*http.Response, error)
		code     int
		body     string // "" for any
		marked   bool
		spillAll bool
	}{
		{"503", status(503, "down"), 400, refusal, false, false},
		{"502", status(502, "bad gateway"), 400, refusal, false, false},
		{"429", status(429, "busy", "Retry-After", "1"), 400, refusal, false, false},
		{"408", status(408, ""), 400, refusal, false, false},
		{"unreachable", fail(errors.New("dial tcp: connection refused")), 400, refusal, false, false},
		{"its own refusal", status(400, `{"error":{"message":"maximum context length is 32768"}}`), 400, `{"error":{"message":"maximum context length is 32768"}}`, true, false},
		{"success", status(200, "ok"), 200, "ok", true, false},
		{"any 4xx spilled, then 500", status(500, ""), 422, `{"error":"bad temperature"}`, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{}
			first := status(400, refusal)
			if tc.spillAll {
				cfg.Spill = func(resp *http.Response, err error) (Reason, bool) {
					if resp != nil && resp.StatusCode >= 400 && resp.StatusCode < 500 {
						return "invalid", true
					}
					return DefaultSpill(resp, err)
				}
				first = status(422, `{"error":"bad temperature"}`)
			}
			f := newFixture(t, 2, cfg)
			f.tiers[0].set(first)
			f.tiers[1].set(tc.later)
			code, from, body, err := f.send("{}")
			if err != nil || code != tc.code || body != tc.body || (from != "") != tc.marked {
				t.Fatalf("got %d %q from %q, %v; want %d %q, marked %v", code, body, from, err, tc.code, tc.body, tc.marked)
			}
			if f.tiers[1].sent() != 1 {
				t.Fatalf("the next tier was sent %d requests, want 1", f.tiers[1].sent())
			}
		})
	}
}

// The answers that requests spill past reach the operator's log, which
// otherwise never sees them: a failure (5xx, unreachable) at level Warn, a
// refusal under load at Info, with the tier, the upstream, the status or
// error and the body; one record in each interval for a tier and upstream,
// the next telling how many were left out.
func TestSpilledAnswersLogged(t *testing.T) {
	log, buf := jsonLogger()
	f := newFixture(t, 2, Config{Logger: log})
	f.tiers[0].set(fromUpstream(500, []byte("boom: worker 3 died"), "10.0.0.7:8000"))
	for range 3 {
		if code, from, _, err := f.send("{}"); err != nil || code != 200 || from != "t0" {
			t.Fatalf("%d from %q %v", code, from, err)
		}
	}
	recs := buf.records(t)
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1 in the interval: %v", len(recs), recs)
	}
	if r := recs[0]; r["level"] != "WARN" || r["tier"] != "t0" || r["to"] != "t1" || r["reason"] != "server_error" ||
		r["upstream"] != "10.0.0.7:8000" || r["status"] != float64(500) || r["body"] != "boom: worker 3 died" {
		t.Fatalf("record %v", r)
	}
	f.clk.Advance(logInterval)
	f.send("{}")
	recs = buf.records(t)
	if len(recs) != 2 || recs[1]["suppressed"] != float64(2) {
		t.Fatalf("records %v, want a second one telling of the 2 left out", recs)
	}
	// Another upstream of the tier has records of its own; a transport
	// error is a failure too.
	f.tiers[0].set(fromUpstream(500, nil, "10.0.0.8:8000"))
	f.send("{}")
	f.tiers[0].set(fail(errors.New("httplb: endpoint 10.0.0.9:8000: connection refused")))
	f.send("{}")
	recs = buf.records(t)
	if len(recs) != 4 || recs[2]["upstream"] != "10.0.0.8:8000" || recs[3]["level"] != "WARN" ||
		!strings.Contains(fmt.Sprint(recs[3]["error"]), "10.0.0.9:8000") {
		t.Fatalf("records %v", recs)
	}
	// A refusal under load is logged at Info.
	f.tiers[0].set(fromUpstream(429, nil, "10.0.0.10:8000"))
	f.send("{}")
	recs = buf.records(t)
	if r := recs[len(recs)-1]; r["level"] != "INFO" || r["reason"] != "throttled" {
		t.Fatalf("record %v", r)
	}
}

// The log's limiter forgets the keys whose interval is over once it holds
// maxLogKeys, and logs a new key unrecorded while every key is recent.
func TestLimiterBounded(t *testing.T) {
	var l limiter
	now := time.Unix(1e9, 0)
	for i := range maxLogKeys {
		if ok, _ := l.allow(fmt.Sprint(i), now); !ok {
			t.Fatalf("key %d refused", i)
		}
	}
	if ok, _ := l.allow("new", now); !ok || len(l.last) != maxLogKeys {
		t.Fatalf("a new key past the bound: %v, %d keys", ok, len(l.last))
	}
	if ok, _ := l.allow("0", now.Add(time.Second)); ok {
		t.Fatal("a recent key logged again within its interval")
	}
	if ok, _ := l.allow("new", now.Add(logInterval)); !ok || len(l.last) != 1 {
		t.Fatalf("after the interval: %v, %d keys; want the old ones forgotten", ok, len(l.last))
	}
}

// FuzzReplaceBody: whatever a tier's error answer holds, the client gets a
// JSON error of a generic message, whose type and code are plain tokens (a
// number, for a code) and carry nothing else of the body, and none of its
// headers but those kept.
func FuzzReplaceBody(f *testing.F) {
	f.Add(429, []byte(`{"error":{"message":"org-x","type":"tokens","code":"rate_limit_exceeded"}}`), "", "Retry-After", "1")
	f.Add(500, []byte(`{"object":"error","type":"InternalServerError","code":500}`), "gzip", "X-Ratelimit-Reset-Requests", "2s")
	f.Add(401, []byte(`{"type":"error","error":{"type":"authentication_error"}}`), "identity", "Set-Cookie", "a=b")
	f.Add(503, []byte(`{"error":"overloaded","error_type":"overloaded","code":1e400}`), "br, gzip", "Retry-After-Ms", "5")
	f.Fuzz(func(t *testing.T, code int, body []byte, enc, k, v string) {
		if !hidden(code) {
			return
		}
		h := http.Header{}
		h.Set("Content-Encoding", enc)
		if k != "" {
			h.Add(k, v)
		}
		resp := &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(bytes.NewReader(body))}
		replaceBody(resp, "req_1", time.Unix(1e9, 0), time.Minute)
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct {
				Message string
				Type    string
				Param   any
				Code    any
			}
		}
		if err := json.Unmarshal(got, &e); err != nil {
			t.Fatalf("body %q: %v", got, err)
		}
		if !strings.HasPrefix(e.Error.Message, "The upstream ") || !strings.HasSuffix(e.Error.Message, " Request ID: req_1") || !apierror.IsToken(e.Error.Type) || e.Error.Param != nil {
			t.Fatalf("error %+v", e.Error)
		}
		switch c := e.Error.Code.(type) {
		case string:
			if !apierror.IsToken(c) {
				t.Fatalf("code %q", c)
			}
		case float64:
		default:
			t.Fatalf("code %v", c)
		}
		for name := range resp.Header {
			switch name {
			case "Retry-After", "Retry-After-Ms", "Content-Type", "Content-Length", "X-Request-Id":
			default:
				t.Fatalf("header %s kept", name)
			}
		}
	})
}
