package spill

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// tier is a fake tier: it records the bodies it was sent and answers with
// its next answer function.
type tier struct {
	mu     sync.Mutex
	bodies []string
	answer func(r *http.Request) (*http.Response, error)
}

func (f *tier) RoundTrip(r *http.Request) (*http.Response, error) {
	var b []byte
	if r.Body != nil {
		b, _ = io.ReadAll(r.Body)
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, string(b))
	answer := f.answer
	f.mu.Unlock()
	return answer(r)
}

func (f *tier) sent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

func (f *tier) set(answer func(r *http.Request) (*http.Response, error)) {
	f.mu.Lock()
	f.answer = answer
	f.mu.Unlock()
}

func status(code int, body string, kv ...string) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	}
}

func fail(err error) func(*http.Request) (*http.Response, error) {
	return func(*http.Request) (*http.Response, error) { return nil, err }
}

type fixture struct {
	t      *testing.T
	clk    *fakeClock
	tiers  []*tier
	tr     *Transport
	events []Event
	mu     sync.Mutex
}

func newFixture(t *testing.T, n int, cfg Config) *fixture {
	f := &fixture{t: t, clk: &fakeClock{now: time.Unix(1e9, 0)}}
	for i := range n {
		ft := &tier{answer: status(200, "ok")}
		f.tiers = append(f.tiers, ft)
		cfg.Tiers = append(cfg.Tiers, Tier{Name: fmt.Sprintf("t%d", i), Transport: ft})
	}
	cfg.Clock = f.clk
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Observer = func(e Event) {
		f.mu.Lock()
		f.events = append(f.events, e)
		f.mu.Unlock()
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.tr = tr
	return f
}

// send sends a request with body and returns the answer's status, spill
// header and body.
func (f *fixture) send(body string) (int, string, string, error) {
	f.t.Helper()
	r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", strings.NewReader(body))
	resp, err := f.tr.RoundTrip(r)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(DefaultHeader), string(b), nil
}

func (f *fixture) takeEvents() []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.events
	f.events = nil
	return e
}

// A request stays on the first tier while it answers; a 429 asking for a
// wait moves it, and the following requests, to the next tier, marked, until
// the wait passes.
func TestSpillOnThrottleAndComeBack(t *testing.T) {
	f := newFixture(t, 2, Config{})
	if code, from, _, err := f.send(`{"a":1}`); err != nil || code != 200 || from != "" {
		t.Fatalf("first tier: %d %q %v", code, from, err)
	}
	f.tiers[0].set(status(429, "slow down", "Retry-After", "10"))
	code, from, body, err := f.send(`{"b":2}`)
	if err != nil || code != 200 || from != "t0" || body != "ok" {
		t.Fatalf("spilled: %d from %q body %q %v", code, from, body, err)
	}
	if got := f.tiers[1].bodies; !slices.Equal(got, []string{`{"b":2}`}) {
		t.Fatalf("second tier got %q, want the same body", got)
	}
	if ev := f.takeEvents(); !slices.Equal(ev, []Event{{From: "t0", To: "t1", Reason: Throttled}}) {
		t.Fatalf("events %v", ev)
	}
	if got := f.tr.Cooling(); !slices.Equal(got, []string{"t0"}) {
		t.Fatalf("cooling %v, want [t0]", got)
	}
	// While t0 cools, requests go straight to t1, still marked.
	sent := f.tiers[0].sent()
	if code, from, _, _ := f.send(`{}`); code != 200 || from != "t0" || f.tiers[0].sent() != sent {
		t.Fatalf("during the cooldown: %d from %q, t0 sent %d (was %d)", code, from, f.tiers[0].sent(), sent)
	}
	if ev := f.takeEvents(); !slices.Equal(ev, []Event{{From: "t0", To: "t1", Reason: Cooling}}) {
		t.Fatalf("events %v", ev)
	}
	// Capacity is back when the wait has passed.
	f.tiers[0].set(status(200, "ok"))
	f.clk.Advance(10 * time.Second)
	if code, from, _, _ := f.send(`{}`); code != 200 || from != "" || f.tiers[0].sent() != sent+1 {
		t.Fatalf("after the cooldown: %d from %q", code, from)
	}
}

// Each trigger of DefaultSpill spills, and nothing else does.
func TestDefaultTriggers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(*http.Request) (*http.Response, error)
		reason Reason // "" = stays
	}{
		{"429 without a wait", status(429, ""), Throttled},
		{"admission full", fail(fmt.Errorf("httplb: %w", &retry.OverloadError{Scope: "global"})), Overloaded},
		{"503 asking for a wait", status(503, "", "Retry-After", "1"), Overloaded},
		// Whether a 503 asks for a wait does not depend on the time it is
		// read at (DefaultSpill reads none): a date past or future asks.
		{"503 asking for a wait until a date", status(503, "", "Retry-After", "Sun, 06 Nov 2101 08:49:37 GMT"), Overloaded},
		{"503 asking for a wait until a date past", status(503, "", "Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT"), Overloaded},
		{"503 asking for a wait until a Unix time", status(503, "", "X-Ratelimit-Reset", "4102444800"), Overloaded},
		{"503", status(503, ""), ServerError},
		{"500", status(500, ""), ServerError},
		{"OpenAI context length", status(400, `{"error":{"code":"context_length_exceeded","message":"..."}}`), ContextLength},
		{"vLLM context length", status(400, `{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens"}`), ContextLength},
		{"vLLM multimodal prompt length", status(400, "{\"object\":\"error\",\"message\":\"The decoder prompt (length 8825) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens.\",\"type\":\"BadRequestError\",\"code\":400}"), ContextLength},
		{"Anthropic context length", status(400, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`), ContextLength},
		{"Gemini context length", status(400, `{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`), ContextLength},
		{"Bedrock context length", status(400, `{"message":"Input is too long for requested model."}`), ContextLength},
		{"llama.cpp context length", status(400, `{"error":{"code":400,"message":"request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}}`), ContextLength},
		// text-generation-inference's router (v3.3.6): InferError::
		// ValidationError is a 422 whose error is "Input validation error: "
		// and ValidationError's message.
		{"TGI total tokens", status(422, "{\"error\":\"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`\",\"error_type\":\"validation\"}"), ContextLength},
		{"TGI input length", status(422, "{\"error\":\"Input validation error: `inputs` must have less than 4095 tokens. Given: 5000\",\"error_type\":\"validation\"}"), ContextLength},
		{"TGI other validation", status(422, "{\"error\":\"Input validation error: `temperature` must be strictly positive\",\"error_type\":\"validation\"}"), ""},
		{"vLLM max_tokens too large", status(400, `{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778).","type":"BadRequestError","param":null,"code":400}}`), ContextLength},
		{"SGLang input too long", status(400, `{"object":"error","message":"The input (10009 tokens) is longer than the model's context length (8192 tokens).","type":"BadRequest","param":null,"code":400}`), ContextLength},
		{"SGLang total too long", status(400, `{"object":"error","message":"Requested token count exceeds the model's maximum context length of 8192 tokens. You requested a total of 9000 tokens: 8000 tokens from the input messages and 1000 tokens for the completion.","type":"BadRequest","param":null,"code":400}`), ContextLength},
		// vLLM's and SGLang's validation errors echo the request's input in
		// their message: a prompt quoting a context-length error is no
		// context-length error.
		{"vLLM validation error echoing the prompt", status(400, `{"error":{"message":"1 validation error: {'type': 'value_error', 'loc': ('body', 'temperature'), 'msg': 'bad temperature', 'input': {'messages': [{'role': 'user', 'content': "This model's maximum context length is 10 tokens. context_length_exceeded prompt is too long"}], 'temperature': -1}}","type":"Bad Request","param":null,"code":400}}`), ""},
		{"SGLang validation error echoing the prompt", status(400, `{"object":"error","message":"1 validation error for ChatCompletionRequest: bad temperature, input: The input (9 tokens) is longer than the model's context length (8 tokens).","type":"Bad Request","param":null,"code":400}`), ""},
		{"marker outside the message", status(400, `{"error":{"message":"bad temperature","param":"maximum context length","detail":"context_length_exceeded"}}`), ""},
		{"marker in a body that is no JSON", status(400, `bad temperature: This model's maximum context length is 10 tokens`), ""},
		{"connection refused", fail(errors.New("dial tcp: connection refused")), Unreachable},
		{"another 400", status(400, `{"error":{"message":"bad temperature"}}`), ""},
		{"401", status(401, ""), ""},
		{"200", status(200, "ok"), ""},
		{"caller gone", fail(context.Canceled), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 2, Config{})
			f.tiers[0].set(tc.answer)
			code, from, body, err := f.send(`{}`)
			ev := f.takeEvents()
			if tc.reason == "" {
				if from != "" || len(ev) != 0 || f.tiers[1].sent() != 0 {
					t.Fatalf("spilled (%v) on an answer that should stay", ev)
				}
				if code == 400 && !strings.Contains(body, "bad temperature") {
					t.Fatalf("the 400's body was not kept whole: %q", body)
				}
				return
			}
			if err != nil || code != 200 || from != "t0" || !slices.Equal(ev, []Event{{From: "t0", To: "t1", Reason: tc.reason}}) {
				t.Fatalf("got %d from %q, %v, events %v; want a spill for %s", code, from, err, ev, tc.reason)
			}
		})
	}
}

// The last tier's answer is returned whatever it is (a 429's body replaced
// by a generic one), marked if the request spilled; when every tier asks
// for a wait, requests are refused at once with the shortest wait.
func TestEveryTierCooling(t *testing.T) {
	f := newFixture(t, 2, Config{MaxCooldown: time.Minute})
	f.tiers[0].set(status(429, "", "Retry-After", "86400")) // capped at a minute
	f.tiers[1].set(status(429, "t1 full", "Retry-After", "20"))
	code, from, body, err := f.send(`{}`)
	if err != nil || code != 429 || from != "t0" || !strings.Contains(body, "rate_limit_error") {
		t.Fatalf("last tier's answer: %d from %q %q %v", code, from, body, err)
	}
	sent0, sent1 := f.tiers[0].sent(), f.tiers[1].sent()
	_, _, _, err = f.send(`{}`)
	var oe *retry.OverloadError
	if !errors.As(err, &oe) || oe.RetryAfter != 20*time.Second {
		t.Fatalf("every tier cooling: %v, want an OverloadError with RetryAfter 20s", err)
	}
	if f.tiers[0].sent() != sent0 || f.tiers[1].sent() != sent1 {
		t.Fatal("a request was sent to a tier that asked to wait")
	}
	f.clk.Advance(20 * time.Second)
	f.tiers[1].set(status(200, "ok"))
	if code, from, _, err := f.send(`{}`); err != nil || code != 200 || from != "t0" {
		t.Fatalf("t1 back: %d from %q %v", code, from, err)
	}
	f.clk.Advance(40 * time.Second) // the minute cap on t0's day-long wait
	f.tiers[0].set(status(200, "ok"))
	if code, from, _, err := f.send(`{}`); err != nil || code != 200 || from != "" {
		t.Fatalf("t0 back after the cap: %d from %q %v", code, from, err)
	}
}

// A tier whose rate-limit window has nothing left is skipped until it
// resets, before it refuses anything; the answer that says so is kept.
func TestQuotaExhausted(t *testing.T) {
	f := newFixture(t, 2, Config{})
	f.tiers[0].set(status(200, "last one", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "2s",
		"X-Ratelimit-Remaining-Tokens", "1000", "X-Ratelimit-Reset-Tokens", "1m0s"))
	if code, from, body, _ := f.send(`{}`); code != 200 || from != "" || body != "last one" {
		t.Fatalf("the answer with no quota left: %d from %q %q", code, from, body)
	}
	if got := f.tr.Cooling(); !slices.Equal(got, []string{"t0"}) {
		t.Fatalf("cooling %v, want [t0] until the window resets", got)
	}
	if _, from, _, _ := f.send(`{}`); from != "t0" {
		t.Fatal("not spilled while the window is spent")
	}
	f.clk.Advance(2 * time.Second)
	f.tiers[0].set(status(200, "ok"))
	if _, from, _, _ := f.send(`{}`); from != "" {
		t.Fatal("still spilled after the window reset")
	}
}

func TestBodies(t *testing.T) {
	f := newFixture(t, 2, Config{MaxBodyBytes: 8})
	if _, _, _, err := f.send(`{"0123456789"}`); !errors.Is(err, httplb.ErrBodyTooLarge) {
		t.Fatalf("a body over the cap: %v, want httplb.ErrBodyTooLarge", err)
	}
	f.tiers[0].set(status(500, ""))
	r, _ := http.NewRequest("GET", "http://gateway/v1/models", nil)
	resp, err := f.tr.RoundTrip(r)
	if err != nil || resp.StatusCode != 200 || !slices.Equal(f.tiers[1].bodies, []string{""}) {
		t.Fatalf("a request without a body: %v %v", resp, err)
	}
	body := bytes.Repeat([]byte("x"), 8)
	r, _ = http.NewRequest("POST", "http://gateway/", bytes.NewReader(body))
	if _, err := f.tr.RoundTrip(r); err != nil || f.tiers[0].bodies[len(f.tiers[0].bodies)-1] != string(body) || f.tiers[1].bodies[len(f.tiers[1].bodies)-1] != string(body) {
		t.Fatalf("a body at the cap, replayed: %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	ok := &tier{answer: status(200, "")}
	for _, cfg := range []Config{
		{},
		{Tiers: []Tier{{Name: "", Transport: ok}}},
		{Tiers: []Tier{{Name: "a", Transport: ok}, {Name: "a", Transport: ok}}},
		{Tiers: []Tier{{Name: "a"}}},
		{Tiers: []Tier{{Name: "a", Transport: ok}}, MaxBodyBytes: -1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// FuzzDefaultSpill: any answer is classified without a panic, as its status
// says (429 spills as throttled, any other 5xx spills, and a status below
// 500 other than 400 and 429 stays), and an answer that stays keeps its
// whole body.
func FuzzDefaultSpill(f *testing.F) {
	f.Add(400, []byte(`{"error":{"code":"context_length_exceeded"}}`), "")
	f.Add(503, []byte(""), "1")
	f.Add(429, []byte("x"), "Wed, 21 Oct 2015 07:28:00 GMT")
	f.Add(400, bytes.Repeat([]byte("a"), maxPeekBytes+10), "")
	f.Fuzz(func(t *testing.T, code int, body []byte, retryAfter string) {
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		resp := &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(bytes.NewReader(body))}
		reason, spill := DefaultSpill(resp, nil)
		if spill != (reason != "") {
			t.Fatalf("spill %v with reason %q", spill, reason)
		}
		switch {
		case code == http.StatusTooManyRequests:
			if reason != Throttled {
				t.Fatalf("status %d: reason %q, want %q", code, reason, Throttled)
			}
		case code == http.StatusServiceUnavailable:
			if reason != Overloaded && reason != ServerError {
				t.Fatalf("status %d: reason %q", code, reason)
			}
		case code >= 500 && code <= 599:
			if reason != ServerError {
				t.Fatalf("status %d: reason %q, want %q", code, reason, ServerError)
			}
		case code < 500 && code != http.StatusBadRequest:
			if spill {
				t.Fatalf("status %d spilled: %q", code, reason)
			}
		}
		if !spill {
			got, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("body changed: %d bytes, want %d", len(got), len(body))
			}
		}
	})
}

// A tier with Ready is skipped while it is not ready, and its answers'
// waits do not cool it down: it knows its endpoints better.
func TestReady(t *testing.T) {
	ready, wait := true, time.Duration(0)
	var mu sync.Mutex
	f := &fixture{t: t, clk: &fakeClock{now: time.Unix(1e9, 0)}}
	t0, t1 := &tier{answer: status(429, "", "Retry-After", "30")}, &tier{answer: status(200, "ok")}
	f.tiers = []*tier{t0, t1}
	tr, err := New(Config{Clock: f.clk, Tiers: []Tier{
		{Name: "t0", Transport: t0, Ready: func() (bool, time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			return ready, wait
		}},
		{Name: "t1", Transport: t1, Ready: func() (bool, time.Duration) { return false, 7 * time.Second }},
	}})
	if err != nil {
		t.Fatal(err)
	}
	f.tr = tr
	// t1 is not ready either: t0's 429 is the answer, and t0 is not
	// cooled by it.
	if code, from, _, err := f.send(`{}`); err != nil || code != 429 || from != "" || t1.sent() != 0 {
		t.Fatalf("%d from %q %v, t1 sent %d", code, from, err, t1.sent())
	}
	if got := tr.Cooling(); !slices.Equal(got, []string{"t1"}) {
		t.Fatalf("cooling %v, want [t1]", got)
	}
	mu.Lock()
	ready, wait = false, 3*time.Second
	mu.Unlock()
	_, _, _, err = f.send(`{}`)
	var oe *retry.OverloadError
	if !errors.As(err, &oe) || oe.RetryAfter != 3*time.Second || t0.sent() != 1 {
		t.Fatalf("no tier ready: %v, want an OverloadError with the shortest wait, 3s", err)
	}
}

// When no tier is ready, the wait suggested is the shortest a tier's Ready
// reports, a negative one counting as none, and at most MaxCooldown however
// long a Ready says.
func TestReadyWaitsOutOfRange(t *testing.T) {
	cases := []struct {
		name  string
		waits []time.Duration
		want  time.Duration
	}{
		{"shortest", []time.Duration{10 * time.Second, 3 * time.Second, 20 * time.Second}, 3 * time.Second},
		{"negative in the middle", []time.Duration{10 * time.Second, -time.Second, 20 * time.Second}, 0},
		{"negative first", []time.Duration{math.MinInt64, 5 * time.Second}, 0},
		{"zero", []time.Duration{0, 0}, 0},
		{"huge", []time.Duration{math.MaxInt64}, time.Minute},
		{"huge and negative", []time.Duration{5 * time.Second, math.MinInt64, math.MaxInt64}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tiers []Tier
			for i, w := range tc.waits {
				tiers = append(tiers, Tier{Name: fmt.Sprintf("t%d", i), Transport: &tier{answer: status(200, "ok")},
					Ready: func() (bool, time.Duration) { return false, w }})
			}
			tr, err := New(Config{Tiers: tiers, MaxCooldown: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			r, _ := http.NewRequest("POST", "http://gateway/", strings.NewReader("{}"))
			_, err = tr.RoundTrip(r)
			var oe *retry.OverloadError
			if !errors.As(err, &oe) || oe.RetryAfter != tc.want {
				t.Fatalf("waits %v: %v, want an OverloadError with RetryAfter %v", tc.waits, err, tc.want)
			}
			// With the Transport's own cooldowns off, the suggestion is
			// still bounded, by DefaultMaxCooldown.
			off, err := New(Config{Tiers: tiers, MaxCooldown: -1})
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == time.Minute {
				want = DefaultMaxCooldown
			}
			r, _ = http.NewRequest("POST", "http://gateway/", strings.NewReader("{}"))
			_, err = off.RoundTrip(r)
			if !errors.As(err, &oe) || oe.RetryAfter != want {
				t.Fatalf("waits %v, MaxCooldown -1: %v, want an OverloadError with RetryAfter %v", tc.waits, err, want)
			}
		})
	}
}

// A request whose client leaves while its tier refuses it goes to no other
// tier, and the observer is told of no spill.
func TestClientGoneNoSpill(t *testing.T) {
	f := newFixture(t, 2, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.tiers[0].set(func(r *http.Request) (*http.Response, error) {
		cancel() // the client leaves as the tier answers
		return status(http.StatusTooManyRequests, "busy")(r)
	})
	r, _ := http.NewRequestWithContext(ctx, "POST", "http://gateway/v1/chat/completions", strings.NewReader("{}"))
	resp, err := f.tr.RoundTrip(r)
	if resp != nil {
		resp.Body.Close()
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("RoundTrip: %v, want context.Canceled", err)
	}
	if n := f.tiers[1].sent(); n != 0 {
		t.Errorf("the next tier was sent %d requests, want 0", n)
	}
	if e := f.takeEvents(); len(e) != 0 {
		t.Errorf("events %v, want none", e)
	}
}

// A tier that breaks the RoundTripper contract, answering neither a
// response nor an error, or a response without a header map, does not
// panic the Transport: the first spills as unreachable (and is an error
// from the last tier), the second is returned with the spill header set.
func TestBrokenTierAnswers(t *testing.T) {
	nilNil := func(*http.Request) (*http.Response, error) { return nil, nil }
	noHeader := func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
	}

	f := newFixture(t, 2, Config{})
	f.tiers[0].set(status(http.StatusInternalServerError, "down"))
	f.tiers[1].set(noHeader)
	code, from, body, err := f.send("x")
	if err != nil || code != 200 || from != "t0" || body != "ok" {
		t.Fatalf("header-less answer: got %d %q %q %v; want 200 from the second tier, marked t0", code, from, body, err)
	}
	f.takeEvents()

	f.tiers[0].set(nilNil)
	code, from, body, err = f.send("x")
	if err != nil || code != 200 || from != "t0" || body != "ok" {
		t.Fatalf("got %d %q %q %v; want 200 from the second tier, marked t0", code, from, body, err)
	}
	if ev := f.takeEvents(); len(ev) != 1 || ev[0].Reason != Unreachable {
		t.Fatalf("events %v, want one spill as unreachable", ev)
	}

	f.tiers[1].set(nilNil)
	if _, _, _, err := f.send("x"); err == nil || !strings.Contains(err.Error(), `tier "t1" returned a nil *http.Response`) {
		t.Fatalf("err = %v, want the last tier's broken answer as an error", err)
	}

	if reason, spill := DefaultSpill(nil, nil); !spill || reason != Unreachable {
		t.Fatalf("DefaultSpill(nil, nil) = %q, %v; want unreachable", reason, spill)
	}
}

// A tier that asked for a wait at a reading of the clock far ahead (an
// injected clock without monotonic readings) is skipped for at most
// MaxCooldown after the clock went back, not until it catches up with
// that reading.
func TestCooldownAfterClockWentBack(t *testing.T) {
	f := newFixture(t, 2, Config{MaxCooldown: time.Minute})
	f.tiers[0].set(status(429, "slow down", "Retry-After", "30"))
	f.clk.Advance(24 * time.Hour)
	if code, from, _, err := f.send(`{}`); err != nil || code != 200 || from != "t0" {
		t.Fatalf("spilled: %d from %q %v", code, from, err)
	}
	f.clk.Advance(-24 * time.Hour)
	f.tiers[0].set(status(200, "ok"))
	if got := f.tr.Cooling(); !slices.Equal(got, []string{"t0"}) {
		t.Fatalf("cooling %v right after the clock went back, want [t0]", got)
	}
	f.clk.Advance(time.Minute)
	if got := f.tr.Cooling(); len(got) != 0 {
		t.Errorf("cooling %v a MaxCooldown after the clock went back, want none", got)
	}
	if code, from, _, err := f.send(`{}`); err != nil || code != 200 || from != "" {
		t.Errorf("a MaxCooldown after the clock went back: %d from %q %v, want the first tier's answer", code, from, err)
	}
}
