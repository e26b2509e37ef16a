package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/model"
	"github.com/llmlb/llmlb/signals"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0 never stops the sending goroutine of a PUB socket, one
	// per kvevents.Publisher run.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// serve starts e on a loopback port and returns its base URL and a function
// that stops it.
func serve(t *testing.T, e *Engine) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.Serve(ctx, l)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return "http://" + l.Addr().String(), stop
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.Speedup == 0 {
		cfg.Speedup = 50
	}
	e, err := New(cfg)
	require.NoError(t, err)
	return e
}

var client = &http.Client{Transport: &http.Transport{}}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close(); client.CloseIdleConnections() })
	return resp
}

func events(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func TestStreamCompletions(t *testing.T) {
	e := newEngine(t, Config{Model: "m"})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/completions", `{"model":"m","prompt":"hello world","max_tokens":5,"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	ev := events(t, resp.Body)
	require.Len(t, ev, 6)
	assert.Equal(t, "[DONE]", ev[5])
	var chunk struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Text         string  `json:"text"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(ev[0]), &chunk))
	assert.Equal(t, "text_completion", chunk.Object)
	assert.Equal(t, "m", chunk.Model)
	assert.Nil(t, chunk.Choices[0].FinishReason)
	require.NoError(t, json.Unmarshal([]byte(ev[4]), &chunk))
	assert.Equal(t, "length", *chunk.Choices[0].FinishReason)
	assert.EqualValues(t, 1, e.Stats().Finished)
}

func TestStreamChat(t *testing.T) {
	e := newEngine(t, Config{DefaultMaxTokens: 3})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	ev := events(t, resp.Body)
	// As vLLM's, the role chunk, then a chunk a token, then [DONE].
	require.Len(t, ev, 5)
	assert.Contains(t, ev[0], `"delta":{"role":"assistant","content":""}`)
	for _, e := range ev[1:4] {
		assert.Contains(t, e, `"delta":{"content":" tok"}`)
	}
	assert.Equal(t, "[DONE]", ev[4])
}

func TestNonStreaming(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	assert.Equal(t, " tok tok tok tok", out.Choices[0].Message.Content)
	assert.Equal(t, 4, out.Usage.CompletionTokens)
	assert.Equal(t, 2, out.Usage.PromptTokens) // "user\nhi\n" is 8 bytes
}

// TestModelEchoed: the engine's model comes back in every answer as valid
// JSON, whatever characters it holds.
func TestModelEchoed(t *testing.T) {
	const model = "a<b\"c\\d/é 😀"
	e := newEngine(t, Config{Model: model})
	url, _ := serve(t, e)
	name, _ := json.Marshal(model)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		for _, stream := range []bool{true, false} {
			body := fmt.Sprintf(`{"model":%s,"prompt":"hi","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":%v}`, name, stream)
			resp := post(t, url+path, body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			answers := []string{}
			if stream {
				for _, ev := range events(t, resp.Body) {
					if ev != "[DONE]" {
						answers = append(answers, ev)
					}
				}
			} else {
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				answers = append(answers, string(b))
			}
			require.NotEmpty(t, answers)
			for _, a := range answers {
				var out struct{ Model string }
				require.NoError(t, json.Unmarshal([]byte(a), &out), "%s stream=%v: %s", path, stream, a)
				assert.Equal(t, model, out.Model)
			}
		}
	}
}

func TestBadRequests(t *testing.T) {
	e := newEngine(t, Config{MaxBodyBytes: 1 << 10, KVBlocks: 16})
	url, _ := serve(t, e)
	cases := []struct {
		path, body string
		code       int
		msg        string // a part of the error's message, if set
	}{
		{"/v1/completions", `{"prompt":`, http.StatusBadRequest, ""},
		{"/v1/completions", `[1,2,3]`, http.StatusBadRequest, "the body must be a JSON object"},
		{"/v1/completions", `{"prompt":"x","max_tokens":"3"}`, http.StatusBadRequest, "max_tokens must not be a JSON string"},
		{"/v1/chat/completions", `{"messages":[{"role":1}]}`, http.StatusBadRequest, "messages[0].role: a string is required"},
		// Each endpoint reads only its own field, as vLLM's.
		{"/v1/completions", `{"messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "prompt: a string is required"},
		{"/v1/chat/completions", `{"prompt":"hi"}`, http.StatusBadRequest, "messages: a non-empty list is required"},
		{"/v1/chat/completions", `{"messages":[]}`, http.StatusBadRequest, "messages: a non-empty list is required"},
		{"/v1/completions", `{"prompt":["a","b"]}`, http.StatusBadRequest, "one prompt a request"},
		{"/v1/completions", `{"prompt":[]}`, http.StatusBadRequest, "one prompt a request"},
		{"/v1/completions", `{"prompt":[1,2,3]}`, http.StatusBadRequest, "token IDs"},
		{"/v1/completions", `{"prompt":null}`, http.StatusBadRequest, "prompt: a string is required"},
		{"/v1/completions", `{"prompt":""}`, http.StatusBadRequest, "the prompt is empty"},
		{"/v1/completions", `{"prompt":["a"],"max_tokens":1}`, http.StatusOK, ""},
		{"/v1/completions", `{"max_tokens":3}`, http.StatusBadRequest, ""},
		{"/v1/completions", `{"prompt":"x","max_tokens":0}`, http.StatusBadRequest, ""},
		{"/v1/completions", `{"prompt":"x","max_tokens":2.5}`, http.StatusBadRequest, ""},
		{"/v1/completions", `{"prompt":"x","max_tokens":1e100}`, http.StatusBadRequest, ""},
		{"/v1/completions", `{"prompt":"x","max_tokens":300}`, http.StatusBadRequest, ""}, // exceeds 16 blocks of 16
		{"/v1/completions", `{"prompt":"` + strings.Repeat("x", 2000) + `"}`, http.StatusRequestEntityTooLarge, ""},
		{"/v2/whatever", `{}`, http.StatusNotFound, ""},
		// One choice a request, as one prompt.
		{"/v1/completions", `{"prompt":"x","n":3}`, http.StatusBadRequest, "n: this emulator answers one choice a request"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":-1}`, http.StatusBadRequest, "n: this emulator answers one choice a request"},
		{"/v1/completions", `{"prompt":"x","n":0}`, http.StatusBadRequest, "n: this emulator answers one choice a request"},
		{"/v1/completions", `{"prompt":"x","n":"2"}`, http.StatusBadRequest, "n must not be a JSON string"},
		{"/v1/completions", `{"prompt":"x","n":1,"max_tokens":1}`, http.StatusOK, ""},
		{"/v1/completions", `{"prompt":"x","n":null,"max_tokens":1}`, http.StatusOK, ""},
	}
	for _, c := range cases {
		resp := post(t, url+c.path, c.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, c.code, resp.StatusCode, "%s %s", c.path, c.body)
		assert.Contains(t, string(b), c.msg, "%s %s", c.path, c.body)
		assert.NotContains(t, string(b), "engine.", "%s %s: a Go name in the message", c.path, c.body)
	}
	resp, err := client.Get(url + "/v1/completions")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodPost, resp.Header.Get("Allow"))
	resp, err = client.Get(url + "/v1/models")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), `"id":"emulated"`)
}

// Metrics are vLLM's names, parsed by package signals, and the prefix cache
// hits a repeated prompt head.
func TestMetricsAndPrefixCache(t *testing.T) {
	e := newEngine(t, Config{Model: "m", KVBlocks: 1000})
	url, _ := serve(t, e)
	shared := strings.Repeat("the same long system prompt. ", 40) // 1160 bytes: 18 blocks of 64
	for i := range 2 {
		resp := post(t, url+"/v1/completions", fmt.Sprintf(`{"prompt":"%s question %d","max_tokens":2}`, shared, i))
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	resp, err := client.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	obs, err := signals.Parse(resp.Body, resp.Header.Get("Content-Type"), signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, signals.EngineVLLM, obs.Engine)
	assert.Equal(t, 1000, obs.KVBlocks)
	assert.Equal(t, 16, obs.BlockSize)
	assert.Zero(t, obs.Running)
	assert.Zero(t, obs.Waiting)
	assert.Zero(t, obs.KVUsage)
	promptTokens := (len(shared) + len(" question 0") + 3) / 4
	assert.EqualValues(t, 2*promptTokens, obs.PrefixQueries)
	assert.EqualValues(t, 18*16, obs.PrefixHits, "the second prompt reuses the shared head's full blocks")
	assert.Zero(t, obs.Preemptions)
}

func TestQueueFullAndCancel(t *testing.T) {
	e := newEngine(t, Config{MaxWaiting: 1})
	// No Run: requests wait.
	srvURL := startHandlerOnly(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srvURL+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	require.Eventually(t, func() bool { return e.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	resp := post(t, srvURL+"/v1/completions", `{"prompt":"y"}`)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.EqualValues(t, 1, e.Stats().Refused)
	cancel()
	assert.Error(t, <-errc)
	require.Eventually(t, func() bool { return e.Stats().Waiting == 0 }, 5*time.Second, time.Millisecond)
	assert.EqualValues(t, 1, e.Stats().Cancelled)
	assert.Zero(t, e.rep.Stats().KVUsed)
}

// RequestsPerMinute emulates a managed API's rate limit with OpenAI's
// headers, and a prompt beyond the context gets vLLM's message.
func TestRateLimitAndContextLength(t *testing.T) {
	e := newEngine(t, Config{RequestsPerMinute: 2, MaxModelLen: 100})
	url, _ := serve(t, e)
	for i, want := range []string{"1", "0"} {
		resp := post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":2}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "request %d", i)
		assert.Equal(t, "2", resp.Header.Get("X-Ratelimit-Limit-Requests"))
		assert.Equal(t, want, resp.Header.Get("X-Ratelimit-Remaining-Requests"), "request %d", i)
		d, err := time.ParseDuration(resp.Header.Get("X-Ratelimit-Reset-Requests"))
		require.NoError(t, err)
		assert.InDelta(t, float64(30*(i+1)), d.Seconds(), 1, "request %d: reset", i)
	}
	resp := post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":2}`)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "30", resp.Header.Get("Retry-After"))
	assert.EqualValues(t, 1, e.Stats().RateLimited)

	e2 := newEngine(t, Config{MaxModelLen: 100})
	url2, _ := serve(t, e2)
	resp = post(t, url2+"/v1/completions", `{"prompt":"x","max_tokens":200}`)
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(b), "maximum context length is 100 tokens")
}

func startHandlerOnly(t *testing.T, e *Engine) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: e}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close(); e.waitHandlers() })
	return "http://" + l.Addr().String()
}

// Stopping the engine breaks the streams in progress with an error.
func TestStopBreaksStreams(t *testing.T) {
	e := newEngine(t, Config{Speedup: 1})
	url, stop := serve(t, e)
	resp := post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":1000,"stream":true}`)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "data: "))
	stop()
	_, err = io.ReadAll(br)
	assert.Error(t, err, "a killed engine's stream must end with an error")
	_, err = client.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	assert.Error(t, err, "connection refused after stop")
}

// An engine served by another server reports itself healthy while its Run
// runs and, as vLLM's dead engine, unhealthy once Run has returned, when it
// refuses every request.
func TestHealthAfterStop(t *testing.T) {
	e := newEngine(t, Config{})
	url := startHandlerOnly(t, e)
	health := func() int {
		t.Helper()
		resp, err := client.Get(url + "/health")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()
	assert.Equal(t, http.StatusOK, health())
	cancel()
	require.ErrorIs(t, <-ran, context.Canceled)
	assert.Equal(t, http.StatusServiceUnavailable, health())
	resp := post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
}

// With a tiny KV cache, concurrent requests preempt each other and still all
// finish, and every block is released.
func TestPreemption(t *testing.T) {
	e := newEngine(t, Config{Speedup: 200, KVBlocks: 24})
	url, _ := serve(t, e)
	var wg sync.WaitGroup
	bodies := make([]int, 12)
	for i := range bodies {
		wg.Go(func() {
			resp, err := client.Post(url+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"prompt":"%s","max_tokens":40,"stream":true}`, strings.Repeat(string(rune('a'+i)), 200))))
			if err != nil {
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: {") {
					bodies[i]++
				}
			}
		})
	}
	wg.Wait()
	client.CloseIdleConnections()
	for i, n := range bodies {
		assert.Equal(t, 40, n, "request %d", i)
	}
	st := e.Stats()
	assert.Positive(t, st.Preemptions)
	assert.EqualValues(t, 12, st.Finished)
	assert.Zero(t, st.KVUsage)
}

// The batching model step by step, without HTTP or time.
func TestModelSteps(t *testing.T) {
	e, err := New(Config{TokenBudget: 100, KVBlocks: 100, BlockSize: 16})
	require.NoError(t, err)
	text := strings.Repeat("x", 600) // 150 tokens, 9 full blocks of 64 bytes
	mk := func() *seq {
		s, _, code, msg := e.parse([]byte(`{"prompt":"`+text+`","max_tokens":3}`), false)
		require.Zero(t, code, msg)
		require.NoError(t, e.submit(s))
		return s
	}
	a := mk()
	step := func() model.Batch {
		e.mu.Lock()
		defer e.mu.Unlock()
		b, ok := e.rep.Plan()
		require.True(t, ok)
		e.finish()
		return b
	}
	b := step()
	assert.Equal(t, 100, b.PrefillTokens, "chunked prefill")
	assert.InDelta(t, 0.07, b.KVUsage, 1e-9, "7 blocks held")
	assert.Zero(t, a.Generated())
	b = step()
	assert.Equal(t, 50, b.PrefillTokens)
	assert.Equal(t, 1, a.Generated(), "the first token ends the prefill")
	assert.Equal(t, 1, step().DecodeSeqs)
	assert.Equal(t, 1, step().DecodeSeqs)
	assert.True(t, a.Done())
	assert.Equal(t, 9, e.rep.Stats().KVCached, "the prompt's full blocks stay cached")
	assert.Zero(t, e.Stats().KVUsage)

	c := mk()
	b = step()
	assert.Equal(t, 150-9*16, b.PrefillTokens, "the cached head is not prefilled again")
	assert.Equal(t, 1, c.Generated())
	st := e.Stats()
	assert.EqualValues(t, 300, st.PrefixQueries)
	assert.EqualValues(t, 144, st.PrefixHits)
}

func TestRunOnce(t *testing.T) {
	e := newEngine(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, e.Run(ctx), context.Canceled)
	assert.ErrorIs(t, e.Run(context.Background()), ErrRunning)
	s, _, code, _ := e.parse([]byte(`{"prompt":"x"}`), false)
	require.Zero(t, code)
	assert.ErrorIs(t, e.submit(s), ErrStopped)
}

// Serve runs the engine too, so it refuses an engine that has run, or is
// being served, at once, and closes the listener it was given.
func TestServeOnce(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	// An answer shows that the first Serve runs the engine.
	resp := post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, e.Serve(ctx, l), ErrRunning)
	assert.NoError(t, ctx.Err(), "Serve returned at once")
	_, err = l.Accept()
	assert.ErrorIs(t, err, net.ErrClosed)
	resp = post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the first Serve still serves")

	ran := newEngine(t, Config{})
	done, stop := context.WithCancel(context.Background())
	stop()
	require.ErrorIs(t, ran.Run(done), context.Canceled)
	l, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	assert.ErrorIs(t, ran.Serve(context.Background(), l), ErrRunning)
}

func TestConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Speedup: -1},
		{DefaultMaxTokens: -1},
		{BlockSize: -1},
		{TokenBudget: -1},
		{MaxRunning: -1},
		{KVBlocks: -1},
		{MaxWaiting: -1},
		{RequestsPerMinute: -1},
		{MaxModelLen: -1},
		{ReadTimeout: -time.Second},
		{IdleTimeout: -time.Second},
		{ShutdownTimeout: -time.Second},
		// Iteration times of these overflow time.Duration: the engine
		// would not wait at all.
		{Speedup: 1e-300},
		{Speedup: minSpeedup / 2},
		// A model name its JSON and metrics would quote differently.
		{Model: "llama\t3"},
		{Model: "llama\x003"},
		{Model: "\xff"},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
		// One package's prefix: the engine model is an internal package.
		assert.Equal(t, 1, strings.Count(err.Error(), "invalid config"), "%v", err)
	}
	_, err := New(Config{Speedup: minSpeedup})
	assert.NoError(t, err, "the slowest speedup allowed")
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":4,"stream":true}`,
		`{"prompt":["a","b"]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"prompt":"x","max_tokens":-1}`,
		`{"prompt":"x","n":2,"model":"m"}`,
		`{"prompt":"x","model":"emulated"}`,
		`{"prompt":"x","model":null}`,
		`{"messages":[{"role":"assistant","content":null},{"role":"user","content":["a",{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"messages":[{"content":"x"}]}`,
		`{"prompt":"x","stream":true,"stream_options":{"include_usage":"yes","continuous_usage_stats":1}}`,
		`{"prompt":"x","stream_options":{"include_usage":true}}`,
		`{`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	e, err := New(Config{KVBlocks: 64})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		s, q, code, _ := e.parse(body, chat)
		if code != 0 {
			if s != nil {
				t.Fatal("refused request returned a sequence")
			}
			return
		}
		if !e.serves(q.Model) {
			t.Fatalf("accepted model %q", q.Model)
		}
		if q.N != nil && *q.N != 1 {
			t.Fatalf("accepted n %v", *q.N)
		}
		if !q.Stream && q.usage != (streamUsage{}) {
			t.Fatalf("accepted stream_options %s without a stream", q.StreamOptions)
		}
		if q.usage.continuous && !q.usage.final {
			t.Fatal("continuous usage without include_usage")
		}
		if s.PromptTokens < 1 || s.OutputTokens < 1 || s.OutputTokens > e.maxCap || !e.rep.Fits(&s.Sequence) {
			t.Fatalf("accepted out-of-range request %+v", s)
		}
	})
}

// TestLargestMaxBodyBytes: the largest body limit reads bodies as any other.
func TestLargestMaxBodyBytes(t *testing.T) {
	e := newEngine(t, Config{MaxBodyBytes: math.MaxInt64, KVBlocks: 16})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/completions", `{"prompt":"hello","max_tokens":1}`)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// A request naming a model the engine does not serve gets vLLM's 404, and
// no work; one naming the engine's model, or none, is served, and every
// answer names the engine's model, as vLLM's.
func TestUnknownModel(t *testing.T) {
	for _, c := range []struct {
		served  string   // Config.Model
		unknown []string // names refused, as JSON strings
	}{
		{"", []string{`"nope"`, `" emulated"`, `"a\"b\\c\u0001\u2028é"`, `"` + strings.Repeat("m", 2000) + `"`}},
		{"llama 3", []string{`"emulated"`, `"llama"`, `"llama 3 "`}},
	} {
		e := newEngine(t, Config{Model: c.served, DefaultMaxTokens: 2})
		url, _ := serve(t, e)
		name := e.Model()
		served := 0
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			for _, stream := range []bool{false, true} {
				body := func(model string) string {
					return fmt.Sprintf(`{%s"prompt":"hi","messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, stream)
				}
				for _, model := range c.unknown {
					resp := post(t, url+path, body(`"model":`+model+`,`))
					b, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s stream=%v model %.40s: %s", path, stream, model, b)
					assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
					var got struct{ Error map[string]any }
					require.NoError(t, json.Unmarshal(b, &got), "%s", b)
					var want string
					require.NoError(t, json.Unmarshal([]byte(model), &want))
					assert.Equal(t, map[string]any{
						"message": "The model `" + want + "` does not exist.",
						"type":    "NotFoundError",
						"param":   "model",
						"code":    float64(http.StatusNotFound),
					}, got.Error)
				}
				for _, model := range []string{`"model":"` + name + `",`, `"model":"",`, `"model":null,`, ``} {
					resp := post(t, url+path, body(model))
					b, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s stream=%v %s: %s", path, stream, model, b)
					served++
					answer := string(b)
					if stream {
						answer = events(t, strings.NewReader(answer))[0]
					}
					var out struct{ Model string }
					require.NoError(t, json.Unmarshal([]byte(answer), &out), answer)
					assert.Equal(t, name, out.Model, "%s stream=%v %s", path, stream, model)
				}
			}
		}
		assert.EqualValues(t, served, e.Stats().Finished, "only the requests for the engine's model are served")
	}
}

// TestModelKeyAndOrder: the model is the "model" key's, matched exactly as
// vLLM's request models match it (encoding/json would take "Model" too),
// and it is checked before the prompt is rendered, as vLLM's handler does:
// an unknown model with a prompt the engine would refuse gets 404.
func TestModelKeyAndOrder(t *testing.T) {
	e := newEngine(t, Config{DefaultMaxTokens: 2})
	url, _ := serve(t, e)
	for _, c := range []struct {
		path, body string
		code       int
	}{
		{"/v1/completions", `{"prompt":"hi","Model":"nope"}`, http.StatusOK},
		{"/v1/completions", `{"prompt":"hi","model":"emulated","MODEL":"nope"}`, http.StatusOK},
		{"/v1/completions", `{"prompt":"hi","model":"nope","MODEL":"emulated"}`, http.StatusNotFound},
		{"/v1/completions", `{"prompt":"hi","model":7}`, http.StatusBadRequest},
		{"/v1/completions", `{"model":"nope","prompt":""}`, http.StatusNotFound},
		{"/v1/completions", `{"model":"nope","prompt":["a","b"]}`, http.StatusNotFound},
		{"/v1/completions", `{"model":"nope","prompt":"hi","n":2}`, http.StatusNotFound},
		{"/v1/completions", `{"model":"nope"}`, http.StatusBadRequest},
		{"/v1/completions", `{"model":"nope","prompt":"hi","stream_options":{"include_usage":true}}`, http.StatusBadRequest},
		{"/v1/chat/completions", `{"model":"nope","messages":[]}`, http.StatusNotFound},
		{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":[{"type":"foo"}]}]}`, http.StatusNotFound},
		{"/v1/chat/completions", `{"model":"nope"}`, http.StatusBadRequest},
		{"/v1/chat/completions", `{"model":"emulated","messages":[]}`, http.StatusBadRequest},
	} {
		resp := post(t, url+c.path, c.body)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, c.code, resp.StatusCode, "%s %s: %s", c.path, c.body, b)
	}
}
