package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	gw "github.com/llmlb/llmlb/gateway"
	"github.com/llmlb/llmlb/internal/model"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The OpenAI Responses API end to end: a gateway of package gateway, on a
// loopback listener, in front of emulated engines that stream vLLM's
// response.* events, whose response.created and response.in_progress come
// before the prefill.

// startResponsesGateway serves a gateway.Gateway over urls on a loopback
// listener, with cfg (its Logger discarded unless set), and runs it until
// the test ends. It returns the gateway and its base URL.
func startResponsesGateway(t *testing.T, urls []string, cfg gw.Config) (*gw.Gateway, string) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = 100 * time.Millisecond
	}
	g, err := gw.New(urls, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = g.Run(ctx)
	}()
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-ran // Run closes the idle connections to the engines
	})
	return g, srv.URL
}

// idleBalancer reports whether b's accounting is back to zero.
func idleBalancer(b *llmlb.Balancer) bool {
	for _, s := range b.Stats() {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			return false
		}
	}
	return true
}

// responsesBody returns a Responses API request of instructions and a
// string input.
func responsesBody(instructions, input string, maxOutput int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model": engine.DefaultModel, "instructions": instructions, "input": input,
		"max_output_tokens": maxOutput, "stream": stream,
	})
	return string(b)
}

// chatBody returns the streamed chat request whose prompt is the one of
// responsesBody(system, user, ...).
func chatBody(system, user string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model": engine.DefaultModel, "max_tokens": maxTokens, "stream": true,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	return string(b)
}

// postBody posts body to url and returns the status and the whole answer,
// or the error that broke it.
func postBody(ctx context.Context, client *http.Client, url, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// sseEvent is one server-sent event of a Responses stream.
type sseEvent struct {
	name string         // its "event:" line
	data map[string]any // its "data:" line, decoded
}

// parseSSE reads the events of a Responses stream. Every event must have
// an "event:" line and a "data:" line of JSON, and end with a blank line.
func parseSSE(body []byte) ([]sseEvent, error) {
	var (
		events []sseEvent
		cur    sseEvent
		open   bool
	)
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if !open {
				continue
			}
			if cur.name == "" || cur.data == nil {
				return events, fmt.Errorf("event %d lacks an event or a data line", len(events))
			}
			events = append(events, cur)
			cur, open = sseEvent{}, false
		case strings.HasPrefix(line, "event: "):
			cur.name, open = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				return events, fmt.Errorf("event %d: %w", len(events), err)
			}
			open = true
		default:
			return events, fmt.Errorf("unexpected line %q", line)
		}
	}
	if open {
		return events, errors.New("the stream ends inside an event")
	}
	return events, sc.Err()
}

// usageOf returns the usage of a response object: input tokens and their
// cached part, and output tokens.
func usageOf(t *testing.T, resp map[string]any) (input, cached, output int) {
	t.Helper()
	u, ok := resp["usage"].(map[string]any)
	require.True(t, ok, "response without usage: %v", resp)
	details, _ := u["input_tokens_details"].(map[string]any)
	num := func(m map[string]any, k string) int {
		f, ok := m[k].(float64)
		require.True(t, ok, "usage without %s: %v", k, u)
		return int(f)
	}
	return num(u, "input_tokens"), num(details, "cached_tokens"), num(u, "output_tokens")
}

// checkResponseObject checks a response object answering a request for
// want output tokens, and returns its usage's cached input tokens.
func checkResponseObject(t *testing.T, resp map[string]any, want int) int {
	t.Helper()
	assert.Equal(t, "response", resp["object"])
	assert.Equal(t, "incomplete", resp["status"]) // ended at max_output_tokens, as vLLM reports it
	output, _ := resp["output"].([]any)
	require.Len(t, output, 1, "output of %v", resp)
	content, _ := output[0].(map[string]any)["content"].([]any)
	require.Len(t, content, 1)
	assert.Equal(t, strings.Repeat(" tok", want), content[0].(map[string]any)["text"])
	input, cached, out := usageOf(t, resp)
	assert.Equal(t, want, out)
	assert.Positive(t, input)
	return cached
}

// checkStream checks that body is one clean Responses stream of want
// output tokens: vLLM's preamble once, events numbered from 0 without a
// gap or a repeat, one output_text.delta a token, and response.completed
// last. It returns the cached input tokens of the final response.
func checkStream(t *testing.T, body []byte, want int) int {
	t.Helper()
	events, err := parseSSE(body)
	require.NoError(t, err, "stream:\n%s", body)
	require.GreaterOrEqual(t, len(events), 4, "stream:\n%s", body)
	counts := map[string]int{}
	for i, ev := range events {
		assert.Equal(t, ev.name, ev.data["type"], "event %d names another type than its data", i)
		assert.EqualValues(t, i, ev.data["sequence_number"], "event %d (%s) out of sequence", i, ev.name)
		counts[ev.name]++
	}
	assert.Equal(t, "response.created", events[0].name)
	assert.Equal(t, "response.in_progress", events[1].name)
	assert.Equal(t, 1, counts["response.created"], "the preamble must come once")
	assert.Equal(t, 1, counts["response.in_progress"], "the preamble must come once")
	assert.Equal(t, want, counts["response.output_text.delta"])
	assert.Zero(t, counts["error"]+counts["response.failed"])
	last := events[len(events)-1]
	require.Equal(t, "response.completed", last.name)
	final, ok := last.data["response"].(map[string]any)
	require.True(t, ok)
	return checkResponseObject(t, final, want)
}

// randomText returns n bytes of random words from a source seeded with
// seed.
func randomText(seed uint64, n int) string {
	return text(rand.New(rand.NewPCG(seed, 0x5e5)), n)
}

// Responses requests that share long instructions, streamed and not, all
// succeed through the gateway, and its prefix routing sends every repeat to
// the engine that caches the instructions: each reports cached input
// tokens, which an engine reports only for a prompt whose head it has
// prefilled before.
func TestResponsesThroughGateway(t *testing.T) {
	c, err := StartCluster(3, engine.Config{Speedup: 20})
	require.NoError(t, err)
	defer c.Close()
	g, url := startResponsesGateway(t, c.URLs, gw.Config{})
	client := newClient()
	defer client.CloseIdleConnections()
	url += "/v1/responses"
	ctx := context.Background()

	const prefixBytes, want = 4096, 4
	instructions := randomText(1, prefixBytes)
	// The instructions' whole blocks, less one for the rendering around
	// them (engine.DefaultBlockSize tokens of engine.BytesPerToken bytes).
	minCached := (prefixBytes/engine.BytesPerToken/engine.DefaultBlockSize - 1) * engine.DefaultBlockSize
	const n = 8
	for i := range n {
		stream := i%2 == 1
		status, body, err := postBody(ctx, client, url, responsesBody(instructions, fmt.Sprintf("question %d", i), want, stream))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%s", body)
		var cached int
		if stream {
			cached = checkStream(t, body, want)
		} else {
			var resp map[string]any
			require.NoError(t, json.Unmarshal(body, &resp), "%s", body)
			cached = checkResponseObject(t, resp, want)
		}
		if i == 0 {
			assert.Zero(t, cached, "the first request found the instructions cached")
		} else {
			assert.GreaterOrEqual(t, cached, minCached, "request %d went to an engine without the instructions", i)
		}
	}
	served := 0
	for _, e := range c.Engines {
		if st := e.Stats(); st.Finished > 0 {
			served++
			assert.EqualValues(t, n, st.Finished, "the requests were split")
		}
	}
	assert.Equal(t, 1, served, "one engine serves every request of the prefix")

	// A concurrent mix, streamed and not, of new prefixes and repeats.
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			instr := instructions
			if i%3 == 0 {
				instr = randomText(uint64(100+i), prefixBytes)
			}
			stream := i%2 == 0
			status, body, err := postBody(ctx, client, url, responsesBody(instr, fmt.Sprintf("concurrent %d", i), want, stream))
			if !assert.NoError(t, err) || !assert.Equal(t, http.StatusOK, status, "%s", body) {
				return
			}
			if stream {
				checkStream(t, body, want)
				return
			}
			var resp map[string]any
			if assert.NoError(t, json.Unmarshal(body, &resp), "%s", body) {
				checkResponseObject(t, resp, want)
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return idleBalancer(g.Balancer()) }, 10*time.Second, 5*time.Millisecond,
		"accounting not released: %+v", g.Balancer().Stats())
}

// The time to first token the gateway reports for a Responses stream is
// the prefill's, as a chat stream's of the same prompt, not the moment of
// the preamble vLLM sends before the prefill. The engines run slowly enough
// that a prompt of about 2,000 tokens takes about 200 ms to prefill; the
// engine sleeps that long at least, so the bound cannot flake on a slow
// machine.
func TestResponsesFirstTokenAfterPrefill(t *testing.T) {
	const speedup = 0.25
	c, err := StartCluster(2, engine.Config{Speedup: speedup})
	require.NoError(t, err)
	defer c.Close()
	firsts := make(chan llmlb.FirstTokenInfo, 8)
	obs := &llmlb.Observer{FirstToken: func(i llmlb.FirstTokenInfo) {
		select {
		case firsts <- i:
		default:
		}
	}}
	_, url := startResponsesGateway(t, c.URLs, gw.Config{Observer: obs})
	client := newClient()
	defer client.CloseIdleConnections()
	ctx := context.Background()

	const promptBytes, want = 8000, 2
	// Each request has its own prompt, so that none finds another's
	// prefill cached.
	system := func(seed uint64) string { return randomText(seed, promptBytes) }
	firstToken := func() time.Duration {
		t.Helper()
		select {
		case i := <-firsts:
			return i.Latency
		case <-time.After(10 * time.Second):
			t.Fatal("no first token reported")
			return 0
		}
	}

	status, body, err := postBody(ctx, client, url+"/v1/chat/completions", chatBody(system(1), "go on", want))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	chat := firstToken()

	status, body, err = postBody(ctx, client, url+"/v1/responses", responsesBody(system(2), "go on", want, true))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	checkStream(t, body, want)
	resp := firstToken()

	// The engine sleeps at least the iteration time of the prefill (the
	// prompt fits one iteration's token budget) before the first token;
	// the count of prompt tokens is rounded down.
	prefill := time.Duration(float64(model.MockerIterTime(model.Batch{PrefillTokens: promptBytes / engine.BytesPerToken})) / speedup)
	t.Logf("first token: chat %v, responses %v; prefill at least %v", chat, resp, prefill)
	assert.GreaterOrEqual(t, chat, prefill)
	// The prefill's own time is the bound: a first token reported at the
	// stream's preamble comes at once, and comparing with the chat
	// stream's time would measure the machine's load as well.
	assert.GreaterOrEqual(t, resp, prefill, "the Responses stream's first token was reported before its prefill ended")
}

// preambleWatch is a gateway's transport to the engines that tells, once,
// which engine has sent a Responses stream's preamble (its
// response.in_progress event, whole), and remembers the engines that sent
// an output_text.delta.
type preambleWatch struct {
	next     *http.Transport
	preamble chan string // the host:port of the first engine to send a preamble
	once     sync.Once

	mu     sync.Mutex      // protects deltas
	deltas map[string]bool // host:port of the engines that sent a delta
}

func (w *preambleWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(req)
	if err != nil || req.URL.Path != "/v1/responses" {
		return resp, err
	}
	resp.Body = &watchedBody{ReadCloser: resp.Body, w: w, host: req.URL.Host}
	return resp, nil
}

func (w *preambleWatch) CloseIdleConnections() { w.next.CloseIdleConnections() }

func (w *preambleWatch) sentDelta(host string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deltas[host]
}

// watchedBody is a Responses stream read through a preambleWatch.
type watchedBody struct {
	io.ReadCloser
	w    *preambleWatch
	host string
	seen bytes.Buffer // what has been read so far
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.seen.Write(p[:n])
	s := b.seen.Bytes()
	if i := bytes.Index(s, []byte(`"type":"response.in_progress"`)); i >= 0 && bytes.Contains(s[i:], []byte("\n\n")) {
		b.w.once.Do(func() { b.w.preamble <- b.host })
	}
	if bytes.Contains(s, []byte("response.output_text.delta")) {
		b.w.mu.Lock()
		b.w.deltas[b.host] = true
		b.w.mu.Unlock()
	}
	return n, err
}

// An engine stopped during the prefill of a Responses stream, after it has
// sent the stream's preamble and before its first output, fails an attempt
// that has not reached the client: the gateway retries it on another
// engine, and the client gets one clean stream, with the preamble once.
// The engines take about half a second to prefill the prompt; the engine
// is stopped as soon as the gateway has read its preamble.
func TestResponsesEngineStoppedDuringPrefill(t *testing.T) {
	c, err := StartCluster(2, engine.Config{Speedup: 0.1})
	require.NoError(t, err)
	defer c.Close()
	watch := &preambleWatch{
		next:     &http.Transport{MaxIdleConnsPerHost: 16},
		preamble: make(chan string, 1),
		deltas:   map[string]bool{},
	}
	var (
		retries atomic.Int64
		mu      sync.Mutex // protects done
		done    []llmlb.DoneInfo
	)
	obs := &llmlb.Observer{Done: func(i llmlb.DoneInfo) {
		mu.Lock()
		defer mu.Unlock()
		done = append(done, i)
	}}
	g, url := startResponsesGateway(t, c.URLs, gw.Config{
		Base:     watch,
		Observer: obs,
		Retry:    retry.LoopConfig{Observer: &retry.Observer{Retry: func(int, error) { retries.Add(1) }}},
	})
	client := newClient()
	defer client.CloseIdleConnections()

	const want = 3
	type answer struct {
		status int
		body   []byte
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		status, body, err := postBody(context.Background(), client, url+"/v1/responses", responsesBody(randomText(3, 8000), "go on", want, true))
		answered <- answer{status, body, err}
	}()
	var host string
	select {
	case host = <-watch.preamble:
	case a := <-answered:
		t.Fatalf("answered before any preamble: %d %v %s", a.status, a.err, a.body)
	case <-time.After(10 * time.Second):
		t.Fatal("no engine sent a preamble")
	}
	killed := -1
	for i, u := range c.URLs {
		if u == "http://"+host {
			killed = i
		}
	}
	require.NotEqual(t, -1, killed, "preamble from an unknown engine %s", host)
	c.Kill(killed)

	var a answer
	select {
	case a = <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer after the engine stopped")
	}
	require.False(t, watch.sentDelta(host), "the stopped engine had sent output before it stopped: the test's premise failed (a machine too slow?)")
	require.NoError(t, a.err, "the client's stream broke")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	checkStream(t, a.body, want)
	assert.EqualValues(t, 1, retries.Load(), "one retry")
	survivor := c.Engines[1-killed].Stats()
	assert.EqualValues(t, 1, survivor.Finished, "the other engine served the retry")

	require.Eventually(t, func() bool { return idleBalancer(g.Balancer()) }, 10*time.Second, 5*time.Millisecond,
		"accounting not released: %+v", g.Balancer().Stats())
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, done, 2, "one Done a pick")
	failed, ok := 0, 0
	for _, d := range done {
		switch {
		case d.Err != nil && !d.Streamed && d.Endpoint.Key() == c.URLs[killed]:
			failed++
		case d.Err == nil && d.Streamed && d.Endpoint.Key() == c.URLs[1-killed]:
			ok++
		}
	}
	assert.Equal(t, 1, failed, "the stopped engine's pick fails before its first token: %+v", done)
	assert.Equal(t, 1, ok, "the other engine's pick streams and succeeds: %+v", done)
}

// A Responses stream whose prefill outlasts the hedge delay is hedged on
// another engine, although its engine sent the preamble at once; the
// first to stream output wins, the other is cancelled, and the client gets
// one clean stream.
func TestResponsesHedgedDuringPrefill(t *testing.T) {
	c, err := StartCluster(2, engine.Config{Speedup: 0.1})
	require.NoError(t, err)
	defer c.Close()
	var hedges atomic.Int64
	g, url := startResponsesGateway(t, c.URLs, gw.Config{Retry: retry.LoopConfig{
		MaxAttempts: 2,
		Hedge:       retry.HedgeConfig{Delay: 50 * time.Millisecond},
		Observer:    &retry.Observer{Hedge: func(int) { hedges.Add(1) }},
	}})
	client := newClient()
	defer client.CloseIdleConnections()

	// About 500 ms of prefill, ten times the hedge delay.
	const want = 2
	status, body, err := postBody(context.Background(), client, url+"/v1/responses", responsesBody(randomText(4, 8000), "go on", want, true))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	checkStream(t, body, want)
	assert.EqualValues(t, 1, hedges.Load(), "the stream was not hedged during its prefill")
	require.Eventually(t, func() bool {
		var finished, cancelled int64
		for _, e := range c.Engines {
			st := e.Stats()
			finished += st.Finished
			cancelled += st.Cancelled
		}
		return finished == 1 && cancelled == 1
	}, 10*time.Second, 5*time.Millisecond, "one engine finishes the stream, the other's attempt is cancelled")
	require.Eventually(t, func() bool { return idleBalancer(g.Balancer()) }, 10*time.Second, 5*time.Millisecond,
		"accounting not released: %+v", g.Balancer().Stats())
}

// Endpoint keys are canonical: a base URL whose host differs only in case
// names the same replica, so a gateway refuses it listed twice, and the
// replica it routes to is known by the canonical key.
func TestResponsesCanonicalEndpointKeys(t *testing.T) {
	c, err := StartCluster(1, engine.Config{Speedup: 20})
	require.NoError(t, err)
	defer c.Close()
	port := c.URLs[0][strings.LastIndexByte(c.URLs[0], ':'):]
	upper, lower := "http://LOCALHOST"+port, "http://localhost"+port

	_, err = gw.New([]string{upper, lower}, gw.Config{ScrapeInterval: -1})
	require.ErrorIs(t, err, gw.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "same replica")

	picked := make(chan string, 4)
	obs := &llmlb.Observer{Pick: func(i llmlb.PickInfo) {
		if i.Endpoint != nil {
			picked <- i.Endpoint.Key()
		}
	}}
	g, url := startResponsesGateway(t, []string{upper}, gw.Config{Observer: obs})
	client := newClient()
	defer client.CloseIdleConnections()
	status, body, err := postBody(context.Background(), client, url+"/v1/responses", responsesBody("Be brief.", "hello", 2, true))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	checkStream(t, body, 2)
	assert.Equal(t, lower, <-picked)
	require.Len(t, g.Balancer().Stats(), 1)
	assert.Equal(t, lower, g.Balancer().Stats()[0].Key)
}

// preferPolicy picks the candidate named key while it is a candidate, and
// otherwise the first.
type preferPolicy struct{ key string }

func (p preferPolicy) Choose(c *llmlb.Candidates) int {
	for i := range c.Len() {
		if c.Key(i) == p.key {
			return i
		}
	}
	return 0
}

// A replica that accepts a Responses stream, sends vLLM's preamble, then
// fails it with an error event (an "error" event, or response.failed) has
// sent no output: its pick ends as a failure, the request is retried on an
// emulated engine, and the client gets that engine's stream alone.
func TestResponsesErrorEventRetried(t *testing.T) {
	cases := []struct {
		name, event string
	}{
		{"error", `{"type":"error","code":"server_error","message":"engine failure","param":null,"sequence_number":2}`},
		{"response.failed", `{"type":"response.failed","sequence_number":2,"response":{"id":"resp_1","object":"response","status":"failed","output":[],"error":{"code":"server_error","message":"engine failure"}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := StartCluster(1, engine.Config{Speedup: 20})
			require.NoError(t, err)
			defer c.Close()
			var failing atomic.Int64
			fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/responses" {
					http.NotFound(w, r)
					return
				}
				failing.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				const initial = `"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}`
				fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,%s}\n\n", initial)
				fmt.Fprintf(w, "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,%s}\n\n", initial)
				w.(http.Flusher).Flush()
				fmt.Fprintf(w, "event: %s\ndata: %s\n\n", tc.name, tc.event)
			}))
			defer fake.Close()
			var (
				retries atomic.Int64
				mu      sync.Mutex // protects done
				done    []llmlb.DoneInfo
			)
			obs := &llmlb.Observer{Done: func(i llmlb.DoneInfo) {
				mu.Lock()
				defer mu.Unlock()
				done = append(done, i)
			}}
			g, url := startResponsesGateway(t, []string{fake.URL, c.URLs[0]}, gw.Config{
				Policy:         preferPolicy{key: fake.URL},
				ScrapeInterval: -1,
				Observer:       obs,
				Retry:          retry.LoopConfig{Observer: &retry.Observer{Retry: func(int, error) { retries.Add(1) }}},
			})
			client := newClient()
			defer client.CloseIdleConnections()

			const want = 3
			status, body, err := postBody(context.Background(), client, url+"/v1/responses", responsesBody("Be brief.", "hello", want, true))
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, status, "%s", body)
			checkStream(t, body, want)
			assert.EqualValues(t, 1, failing.Load(), "the failing replica was tried first")
			assert.EqualValues(t, 1, retries.Load())
			assert.EqualValues(t, 1, c.Engines[0].Stats().Finished)
			require.Eventually(t, func() bool { return idleBalancer(g.Balancer()) }, 10*time.Second, 5*time.Millisecond,
				"accounting not released: %+v", g.Balancer().Stats())
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, done, 2, "one Done a pick")
			for _, d := range done {
				if d.Endpoint.Key() == fake.URL {
					assert.Error(t, d.Err, "the failing replica's pick")
					assert.False(t, d.Streamed, "the failing replica's pick")
				} else {
					assert.NoError(t, d.Err, "the engine's pick")
					assert.True(t, d.Streamed, "the engine's pick")
				}
			}
		})
	}
}
