package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/internal/natstest"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/share"
	"github.com/llmlb/llmlb/signals"
	"github.com/llmlb/llmlb/spill"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logBuffer is a concurrency-safe buffer of JSON log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns the log records whose message is msg.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func newLogger() (*slog.Logger, *logBuffer) {
	var b logBuffer
	return slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})), &b
}

// deadURL returns a base URL nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// post sends a streamed completion through h and returns the status and
// body.
func post(t *testing.T, h http.Handler, prompt string, header ...string) (int, string, http.Header) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": engine.DefaultModel, "prompt": prompt, "max_tokens": 4, "stream": true})
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	res := w.Result()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

func TestGatewayRoutesAndReports(t *testing.T) {
	c, err := e2e.StartCluster(2, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, logs := newLogger()
	dead := deadURL(t)
	g, err := New(append([]string{dead}, c.URLs...), Config{Logger: log, ScrapeInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()

	prompt := strings.Repeat("a shared system prompt for the gateway test. ", 40)
	for i := range 12 {
		code, body, _ := post(t, g, prompt+string(rune('a'+i)))
		if code != http.StatusOK || !strings.Contains(body, "data: [DONE]") {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}

	// The dead replica's scrapes failed and were logged. On a starved
	// machine a live replica's scrape may time out and be logged too.
	waitFor(t, func() bool {
		for _, rec := range logs.records(t, "gateway: scrape failed") {
			if rec["endpoint"] == dead {
				return true
			}
		}
		return false
	})

	// The debug view: every replica, the ejection, signals and the index.
	waitFor(t, func() bool {
		st := g.State()
		return st.Endpoints[1].Signal != nil && st.Endpoints[2].Signal != nil
	})
	rec := httptest.NewRecorder()
	g.Debug().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/llmlb", nil))
	var st DebugState
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("debug JSON: %v\n%s", err, rec.Body)
	}
	if len(st.Endpoints) != 3 || st.Endpoints[0].Key != dead || st.Ejected == nil {
		t.Fatalf("debug endpoints = %+v, ejected %v", st.Endpoints, st.Ejected)
	}
	if s := st.Endpoints[0].Scrape; s == nil || s.Failures == 0 || s.LastError == "" {
		t.Errorf("dead replica's scrape status = %+v", s)
	}
	blocks := 0
	for _, e := range st.Endpoints[1:] {
		if e.Signal == nil || e.Signal.Engine != "vllm" || e.Outstanding != 0 {
			t.Errorf("live replica %s: %+v signal %+v", e.Key, e, e.Signal)
		}
		if e.IndexBlocks != nil {
			blocks += *e.IndexBlocks
		}
	}
	if blocks == 0 {
		t.Error("the prefix index is empty after 12 requests with a shared prompt")
	}
	g.transport.CloseIdleConnections()
}

func TestGatewayRetriesAndEjects(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, logs := newLogger()
	dead := deadURL(t)
	g, err := New([]string{dead, c.URLs[0]}, Config{Logger: log, ScrapeInterval: -1, Policy: llmlb.RoundRobin()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if code, body, _ := post(t, g, "hello"); code != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	// The dead replica's failures were retried, logged with their detail,
	// and it was ejected.
	retried := logs.records(t, "gateway: attempt failed before its first token, retrying")
	if len(retried) == 0 {
		t.Fatal("no retry was logged")
	}
	if msg, _ := retried[0]["error"].(string); !strings.Contains(msg, strings.TrimPrefix(dead, "http://")) {
		t.Errorf("the retry log does not name the dead replica: %v", retried[0])
	}
	ejected := logs.records(t, "gateway: endpoint ejected")
	if len(ejected) != 1 || ejected[0]["endpoint"] != dead {
		t.Errorf("ejection logs = %v, want one for %s", ejected, dead)
	}
	if st := g.State(); st.Endpoints[0].Healthy || len(st.Ejected) != 1 || st.Ejected[0] != dead {
		t.Errorf("debug state after the ejection: %+v, ejected %v", st.Endpoints[0], st.Ejected)
	}
	// The ejected replica leaves: the one left is ready at once, and the
	// ejection is forgotten.
	if err := g.Update(c.URLs); err != nil {
		t.Fatal(err)
	}
	if ok, _ := g.ready(); !ok {
		t.Error("not ready after the ejected replica left")
	}
	waitFor(t, func() bool { return len(g.State().Ejected) == 0 })
	g.transport.CloseIdleConnections()
}

// reports records what a Reporter is told.
type reports struct {
	mu   sync.Mutex
	keys []string
	errs []error
}

func (r *reports) Report(key string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	r.errs = append(r.errs, err)
}

// Config.Retry reaches the transport: its Observer hears of each retry after
// the gateway logged it, and a Reporter of one's own replaces the ejector.
func TestGatewayRetryConfig(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	log, logs := newLogger()
	dead := deadURL(t)
	var mu sync.Mutex
	var retried []int
	rep := &reports{}
	g, err := New([]string{dead, up.URL}, Config{Logger: log, ScrapeInterval: -1, Policy: llmlb.RoundRobin(),
		Retry: retry.LoopConfig{MaxAttempts: 2, Reporter: rep, Observer: &retry.Observer{Retry: func(attempt int, _ error) {
			mu.Lock()
			retried = append(retried, attempt)
			mu.Unlock()
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if code, body, _ := post(t, g, "hello"); code != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	logged := len(logs.records(t, "gateway: attempt failed before its first token, retrying"))
	mu.Lock()
	if len(retried) != 6 || logged != 6 {
		t.Errorf("retries observed %v, logged %d; want 6 of attempt 2", retried, logged)
	}
	mu.Unlock()
	rep.mu.Lock()
	if n := len(rep.keys); n != 18 || !slices.Contains(rep.keys, dead) {
		t.Errorf("the Reporter was told of %d attempts (%v), want 18", n, rep.keys)
	}
	rep.mu.Unlock()
	// Told nothing, the ejector ejects nothing: the dead replica is tried
	// by every other request.
	if ejected := logs.records(t, "gateway: endpoint ejected"); len(ejected) != 0 {
		t.Errorf("ejections %v with a Reporter of the user's", ejected)
	}
	g.transport.CloseIdleConnections()
}

// The retry log names the replica that failed and the request's id, the
// client's or the one the gateway gave the request (which the replica
// received), even for a status answer, whose error names neither.
func TestGatewayRetryLogNamesEndpointAndRequest(t *testing.T) {
	var (
		mu            sync.Mutex
		refused, sent []string // the request ids each replica received
	)
	record := func(to *[]string, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		*to = append(*to, r.Header.Get("X-Request-Id"))
	}
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(&refused, r)
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer busy.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(&sent, r)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	log, logs := newLogger()
	g, err := New([]string{busy.URL, up.URL}, Config{Logger: log, ScrapeInterval: -1, Policy: llmlb.RoundRobin(),
		Retry: retry.LoopConfig{MaxPushback: -1, Budget: unlimitedBudget{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	for _, clientID := range []string{"req-7", ""} {
		var header []string
		if clientID != "" {
			header = []string{"X-Request-Id", clientID}
		}
		// Round robin: one of two requests goes to the busy replica first.
		for range 2 {
			if code, body, _ := post(t, g, "hello", header...); code != http.StatusOK {
				t.Fatalf("%d %q", code, body)
			}
		}
		mu.Lock()
		id := refused[len(refused)-1]
		retriedOnUp := slices.Contains(sent, id+"-2") // a retry's own id
		mu.Unlock()
		if clientID != "" && id != clientID || clientID == "" && (id == "" || id == "req-7") || !retriedOnUp {
			t.Fatalf("the busy replica got request id %q, the other %v; want the client's %q, or else a new one, and it with -2", id, sent, clientID)
		}
		retried := logs.records(t, "gateway: attempt failed before its first token, retrying")
		if len(retried) == 0 {
			t.Fatal("no retry was logged")
		}
		msg, _ := retried[len(retried)-1]["error"].(string)
		if !strings.Contains(msg, "endpoint "+busy.URL) || !strings.Contains(msg, "request "+id) || !strings.Contains(msg, "429") {
			t.Errorf("the retry log %q names not the endpoint %s, the request %q and the status", msg, busy.URL, id)
		}
	}
}

// unlimitedBudget allows every retry.
type unlimitedBudget struct{}

func (unlimitedBudget) Start()                     {}
func (unlimitedBudget) Withdraw() bool             { return true }
func (unlimitedBudget) Finish(bool, retry.Outcome) {}

// A gateway without backends, none given or all removed by Update, answers
// 503 service_unavailable, which OpenAI clients do not retry as a load, and
// logs it at level Error.
func TestGatewayNoBackends(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, name := range []string{"none given", "all removed"} {
		t.Run(name, func(t *testing.T) {
			log, logs := newLogger()
			var g *Gateway
			if name == "none given" {
				g, err = New(nil, Config{Logger: log, ScrapeInterval: -1})
			} else {
				g, err = New(c.URLs, Config{Logger: log, ScrapeInterval: -1})
				if err == nil {
					if code, body, _ := post(t, g, "hello"); code != http.StatusOK {
						t.Fatalf("with a backend: %d %q", code, body)
					}
					err = g.Update(nil)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			defer g.transport.CloseIdleConnections()
			code, body, h := post(t, g, "hello")
			if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "" {
				t.Errorf("status %d, Retry-After %q; want 503 without Retry-After", code, h.Get("Retry-After"))
			}
			var e struct {
				Error struct {
					Type string `json:"type"`
					Code int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "service_unavailable" || e.Error.Code != 503 {
				t.Errorf("body %q: want an OpenAI error of type service_unavailable (%v)", body, err)
			}
			recs := logs.records(t, "httplb: proxy error")
			if len(recs) != 1 || recs[0]["level"] != "ERROR" || recs[0]["request_id"] != h.Get("X-Request-Id") {
				t.Errorf("proxy error logs %v: want one at ERROR with the request id %q", recs, h.Get("X-Request-Id"))
			}
		})
	}
}

// With SpillTo, a request the replicas refuse (429) goes to the next tier,
// marked, and while every replica cools down for the wait it asked,
// requests go there directly.
func TestGatewaySpills(t *testing.T) {
	var refused sync.Mutex
	full := true
	self := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refused.Lock()
		defer refused.Unlock()
		if full {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"self\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer self.Close()
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	provider, err := New(c.URLs, Config{ScrapeInterval: -1, Policy: llmlb.LeastOutstanding()})
	if err != nil {
		t.Fatal(err)
	}
	var events []spill.Event
	var mu sync.Mutex
	log, logs := newLogger()
	g, err := New([]string{self.URL}, Config{ScrapeInterval: -1, Logger: log, Name: "ptu",
		SpillTo: []spill.Tier{provider.Tier("paygo")},
		SpillObserver: func(e spill.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []spill.Reason{spill.Throttled, spill.Cooling} {
		code, body, h := post(t, g, "hello")
		if code != http.StatusOK || h.Get(spill.DefaultHeader) != "ptu" || strings.Contains(body, "self") {
			t.Fatalf("request %d: %d, spilled from %q, %q", i, code, h.Get(spill.DefaultHeader), body)
		}
		mu.Lock()
		if len(events) != i+1 || events[i] != (spill.Event{From: "ptu", To: "paygo", Reason: want}) {
			t.Fatalf("events %v, want %v last", events, want)
		}
		mu.Unlock()
	}
	if st := g.State(); !slices.Equal(st.Cooling, []string{self.URL}) {
		t.Errorf("debug state: cooling %v, want the replica", st.Cooling)
	}
	if len(logs.records(t, "gateway: endpoint cooling down for the wait it asked")) != 1 {
		t.Error("the cooldown was not logged")
	}
	// Back once the wait has passed.
	refused.Lock()
	full = false
	refused.Unlock()
	time.Sleep(1100 * time.Millisecond)
	if code, body, h := post(t, g, "hello"); code != http.StatusOK || h.Get(spill.DefaultHeader) != "" || !strings.Contains(body, "self") {
		t.Fatalf("after the cooldown: %d, spilled from %q, %q", code, h.Get(spill.DefaultHeader), body)
	}
	g.transport.CloseIdleConnections()
	provider.transport.CloseIdleConnections()
}

func TestGatewayHidesUpstreamErrors(t *testing.T) {
	log, logs := newLogger()
	dead := deadURL(t)
	g, err := New([]string{dead}, Config{Logger: log, ScrapeInterval: -1, Retry: retry.LoopConfig{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	code, body, h := post(t, g, "hello", "X-Request-Id", "req-42")
	if code != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", code)
	}
	addr := strings.TrimPrefix(dead, "http://")
	if strings.Contains(body, addr) || strings.Contains(body, "refused") || !strings.Contains(body, "req-42") {
		t.Errorf("client body %q leaks detail or lacks the request id", body)
	}
	if h.Get("X-Request-Id") != "req-42" {
		t.Errorf("X-Request-Id = %q", h.Get("X-Request-Id"))
	}
	found := false
	for _, rec := range logs.records(t, "httplb: proxy error") {
		if msg, _ := rec["error"].(string); rec["request_id"] == "req-42" && strings.Contains(msg, addr) {
			found = true
		}
	}
	if !found {
		t.Error("the operator log lacks the upstream detail under the request id")
	}
}

// A replica's 5xx reaches the client with its status but without its
// body, and the log has the body under the request id; a stream cut after
// its first token is logged through the gateway's logger.
func TestGatewayHidesUpstreamAnswers(t *testing.T) {
	const secret = "panic: /srv/worker.go:12 10.4.4.4"
	var cut atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !cut.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, secret)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		_ = conn.(*net.TCPConn).SetLinger(0)
		_ = conn.Close() // a reset after the first event
	}))
	defer up.Close()
	log, logs := newLogger()
	g, err := New([]string{up.URL}, Config{Logger: log, ScrapeInterval: -1, Retry: retry.LoopConfig{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	code, body, h := post(t, g, "hello", "X-Request-Id", "req-43")
	if code != http.StatusServiceUnavailable || strings.Contains(body, "panic") || !strings.Contains(body, "req-43") || h.Get("X-Request-Id") != "req-43" {
		t.Errorf("client got %d %q (X-Request-Id %q), want 503 with a generic body naming req-43", code, body, h.Get("X-Request-Id"))
	}
	recs := logs.records(t, "httplb: upstream failed")
	if len(recs) != 1 || recs[0]["request_id"] != "req-43" || recs[0]["body"] != secret {
		t.Errorf("upstream failure logs = %v, want one with the body under req-43", recs)
	}
	cut.Store(true)
	post(t, g, "hello")
	logs.mu.Lock()
	found := strings.Contains(logs.buf.String(), `"level":"WARN","msg":"httputil: ReverseProxy read error`)
	logs.mu.Unlock()
	if !found {
		t.Error("the stream cut after its first token was not logged through Config.Logger")
	}
}

// A replica whose engine dies while it streams ends the stream with vLLM's
// error event (the emulator's, as vLLM's): the client gets the chunks sent
// so far and the event with a generic message naming the request, the log
// the event as the replica sent it.
func TestGatewayHidesMidStreamError(t *testing.T) {
	e, err := engine.New(engine.Config{Speedup: 1})
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(e)
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = e.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	log, logs := newLogger()
	g, err := New([]string{up.URL}, Config{Logger: log, ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	gw := httptest.NewServer(g)
	defer gw.Close()
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/completions",
		strings.NewReader(`{"model": "`+engine.DefaultModel+`", "prompt": "hello", "max_tokens": 1000, "stream": true}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "req-44")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: {") {
		t.Fatalf("first line %q, %v", first, err)
	}
	cancel() // the engine dies mid-stream
	<-ran
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	want := `data: {"error":{"message":"The upstream failed to answer. Request ID: req-44","type":"InternalServerError","code":500}}` + "\n\ndata: [DONE]\n\n"
	if !strings.HasSuffix(string(rest), want) || strings.Contains(string(rest), "EngineCore") {
		t.Errorf("the stream ends %q, want the generic error event %q", rest[max(len(rest)-300, 0):], want)
	}
	recs := logs.records(t, "httplb: upstream's stream failed after its first event")
	if len(recs) != 1 || recs[0]["request_id"] != "req-44" || !strings.Contains(fmt.Sprint(recs[0]["event"]), "EngineCore encountered an issue") {
		t.Errorf("logged %v, want the engine's event under req-44", recs)
	}
}

// A client that sends its body too slowly gets 408 after BodyTimeout, while
// a response that streams longer than BodyTimeout is not cut.
func TestGatewayBodyTimeout(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, _ := newLogger()
	const timeout = 300 * time.Millisecond
	g, err := New(c.URLs, Config{Logger: log, ScrapeInterval: -1, BodyTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	srv := httptest.NewServer(g)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The deadline runs from the server's reading of the headers, after
	// start.
	start := time.Now()
	fmt.Fprint(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("a stalled body got %d, want 408", resp.StatusCode)
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("answered after %v, before the %v deadline", d, timeout)
	}

	body := fmt.Sprintf(`{"model":%q,"prompt":"stream past the deadline","max_tokens":100,"stream":true}`, engine.DefaultModel)
	start = time.Now()
	res, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	all, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK || !strings.Contains(string(all), "data: [DONE]") {
		t.Fatalf("stream: %d %v %q", res.StatusCode, err, all)
	}
	if d := time.Since(start); d < 2*timeout {
		t.Fatalf("the stream took %v: too short to show that the deadline was cleared", d)
	}
}

func TestGatewayAdmissionLogged(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer slow.Close()
	log, logs := newLogger()
	g, err := New([]string{slow.URL}, Config{Logger: log, ScrapeInterval: -1, Admission: retry.AdmissionConfig{MaxInFlight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() {
		code, _, _ := post(t, g, "first")
		done <- code
	}()
	<-started
	code, _, h := post(t, g, "second")
	close(release)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Errorf("second request: %d, Retry-After %q; want 429 with Retry-After", code, h.Get("Retry-After"))
	}
	if first := <-done; first != http.StatusOK {
		t.Errorf("first request: %d", first)
	}
	if recs := logs.records(t, "gateway: request refused by admission"); len(recs) != 1 || recs[0]["scope"] != "global" {
		t.Errorf("admission logs = %v", recs)
	}
	if st := g.State(); st.InFlight == nil || *st.InFlight != 0 {
		t.Errorf("admission in flight after both requests = %v", st.InFlight)
	}
	g.transport.CloseIdleConnections()
}

// Two gateways sharing over a real NATS server: the second sees the
// first's requests in flight and sends its own to the one replica the first
// left idle (by chance, one time in eight).
func TestGatewaySharesOverNATS(t *testing.T) {
	srv := natstest.Start(t, -1)

	release := make(chan struct{})
	var mu sync.Mutex
	hits := map[string]int{}
	var backends []string
	for range 8 {
		var self string
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits[self]++
			mu.Unlock()
			<-release
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
		}))
		defer ts.Close()
		self = ts.URL
		backends = append(backends, ts.URL)
	}
	log, _ := newLogger()
	ctx, cancel := context.WithCancel(context.Background())
	var run sync.WaitGroup
	defer run.Wait()
	defer cancel()
	var gws []*Gateway
	for _, id := range []string{"a", "b"} {
		nc := natstest.Connect(t, srv.ClientURL())
		g, err := New(backends, Config{Logger: log, ScrapeInterval: -1, Policy: llmlb.LeastOutstanding(),
			Share: &share.Config{Conn: nc, ID: id, Interval: 10 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		run.Go(func() { _ = g.Run(ctx) })
		gws = append(gws, g)
	}
	waitFor(t, func() bool {
		a, b := gws[0].State().Share, gws[1].State().Share
		return a.Peers == 1 && b.Peers == 1 && a.Connected && b.Connected
	})

	var reqs sync.WaitGroup
	defer reqs.Wait()
	defer close(release)
	// One at a time: concurrent picks may read the same loads and meet on
	// one replica, which is not what this test is about.
	for i := range 7 {
		reqs.Go(func() { post(t, gws[0], "first gateway") })
		waitFor(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, c := range hits {
				n += c
			}
			return n == i+1
		})
	}
	waitFor(t, func() bool {
		busy := 0
		for _, k := range backends {
			if l, ok := gws[1].group.Load(k); ok && l.Running+l.Waiting > 0 {
				busy++
			}
		}
		mu.Lock()
		defer mu.Unlock()
		return busy == 7 && len(hits) == 7 // 7 distinct replicas, each reached
	})
	reqs.Go(func() { post(t, gws[1], "second gateway") })
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(hits) == 8
	})
	st := gws[1].State().Share
	if st.ID != "b" || st.Received == 0 || st.Published == 0 || st.Rejected != 0 {
		t.Errorf("second gateway's share state = %+v", st)
	}
}

// Through a fair queue of one slot, a tenant that has been served waits for
// one that has not, though it asked first.
func TestGatewayFairQueue(t *testing.T) {
	var mu sync.Mutex
	var order []string
	arrived := make(chan struct{}, 8)
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		order = append(order, r.Header.Get("X-Tenant")+":"+strings.Split(string(b), `"prompt":"`)[1][:1])
		mu.Unlock()
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer slow.Close()
	q, err := fair.New(fair.Config{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	log, _ := newLogger()
	g, err := New([]string{slow.URL}, Config{Logger: log, ScrapeInterval: -1, Queue: q,
		Parser: httplb.ParserConfig{TrustTenantHeader: "X-Tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	send := func(tenant, prompt string) {
		wg.Go(func() {
			if code, body, _ := post(t, g, prompt, "X-Tenant", tenant); code != http.StatusOK {
				t.Errorf("%s %s: %d %s", tenant, prompt, code, body)
			}
		})
	}
	send("a", "1")
	<-arrived
	send("a", "2")
	waitFor(t, func() bool { return g.State().Queue.Waiting == 1 })
	send("b", "3")
	waitFor(t, func() bool { return g.State().Queue.Waiting == 2 })
	close(release)
	wg.Wait()
	if want := []string{"a:1", "b:3", "a:2"}; !slices.Equal(order, want) {
		t.Errorf("order at the replica = %v, want %v", order, want)
	}
	if st := g.State().Queue; st.InFlight != 0 || st.Waiting != 0 {
		t.Errorf("queue after the requests: %+v", st)
	}
	g.transport.CloseIdleConnections()
}

func TestNewErrors(t *testing.T) {
	if _, err := New(nil, Config{Share: &share.Config{}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Share without a Conn: %v, want ErrInvalidConfig", err)
	}
	for _, backends := range [][]string{{"not a url"}, {"ftp://x"}, {""}, {"127.0.0.1:8000"}} {
		if _, err := New(backends, Config{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%q): %v, want ErrInvalidConfig", backends, err)
		}
	}
	// The OpenAI SDKs' base URL, ending in /v1, would send every request to
	// /v1/v1/... and every scrape to /v1/metrics.
	for _, base := range []string{"http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"} {
		_, err := New([]string{"http://127.0.0.1:8001", base}, Config{})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "give the server's base URL, http://127.0.0.1:8000, without /v1") {
			t.Errorf("New(%q): %v, want ErrInvalidConfig asking for the server's base URL", base, err)
		}
		g, err := New(nil, Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Update([]string{base}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Update(%q): %v, want ErrInvalidConfig", base, err)
		}
	}
	if _, err := New(nil, Config{Admission: retry.AdmissionConfig{MaxInFlight: -1}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("negative admission cap: %v", err)
	}
	for _, rc := range []retry.LoopConfig{{MaxAttempts: -1}, {Hedge: retry.HedgeConfig{Percentile: 1}}} {
		if _, err := New(nil, Config{Retry: rc}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Retry %+v: %v, want ErrInvalidConfig", rc, err)
		}
	}
}

func TestIsPowerOfTen(t *testing.T) {
	for n, want := range map[int]bool{1: true, 10: true, 1000: true, 2: false, 20: false, 11: false, 110: false} {
		if got := isPowerOfTen(n); got != want {
			t.Errorf("isPowerOfTen(%d) = %v", n, got)
		}
	}
}

// waitFor polls cond until it holds, failing the test after 30 s: a bound
// for a stuck test, not a timing assertion.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With Outputs, the gateway charges a request the output its kind streamed
// before; without, the allowance.
func TestGatewayPredictsOutputs(t *testing.T) {
	for _, tc := range []struct {
		outputs *llmlb.OutputConfig
		want    int64
	}{{nil, llmlb.DefaultDecodeAllowance}, {&llmlb.OutputConfig{MinObservations: 4}, 12}} {
		hold := make(chan struct{})
		arrived := make(chan struct{}, 1)
		backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			if r.Header.Get("X-Hold") != "" {
				arrived <- struct{}{}
				<-hold
			}
			w.Header().Set("Content-Type", "text/event-stream")
			for range 12 {
				io.WriteString(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
			}
			io.WriteString(w, "data: [DONE]\n\n")
		}))
		log, _ := newLogger()
		g, err := New([]string{backend.URL}, Config{Logger: log, ScrapeInterval: -1, Outputs: tc.outputs})
		if err != nil {
			t.Fatal(err)
		}
		send := func(header ...string) {
			body := `{"model":"m","prompt":"hello","stream":true}`
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(header); i += 2 {
				req.Header.Set(header[i], header[i+1])
			}
			w := httptest.NewRecorder()
			g.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				t.Errorf("status %d: %s", w.Code, w.Body)
			}
		}
		for range 6 {
			send()
		}
		done := make(chan struct{})
		go func() { defer close(done); send("X-Hold", "1") }()
		<-arrived
		got := g.Balancer().Stats()[0].DecodeTokens
		close(hold)
		<-done
		if got != tc.want {
			t.Errorf("outputs %+v: a request in flight is charged %d decode tokens, want %d", tc.outputs, got, tc.want)
		}
		g.transport.CloseIdleConnections()
		backend.Close()
	}
}

// A deployment's rate-limit headers reach Headroom, which PeakEWMA reads.
func TestGatewayHeadroom(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20, RequestsPerMinute: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := New(c.URLs, Config{ScrapeInterval: -1, Policy: llmlb.LeastOutstanding()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	if _, ok := g.Headroom(c.URLs[0]); ok {
		t.Fatal("headroom known before any answer")
	}
	for range 3 {
		if code, _, _ := post(t, g, "hello"); code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	// 7 of 10 left, and a little refilled since.
	if h, ok := g.Headroom(c.URLs[0]); !ok || h < 0.7 || h > 0.8 {
		t.Fatalf("headroom %v, %v after 3 of 10 requests; want about 0.7", h, ok)
	}
}

// Update replaces the backends of a running gateway: requests go to the new
// set only, the scraper follows it, and an invalid list changes nothing.
func TestGatewayUpdate(t *testing.T) {
	c, err := e2e.StartCluster(2, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, _ := newLogger()
	g, err := New(c.URLs[:1], Config{Logger: log, ScrapeInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	defer func() {
		cancel()
		<-ran
		g.transport.CloseIdleConnections()
	}()
	send := func(n int) {
		t.Helper()
		for i := range n {
			if code, body, _ := post(t, g, fmt.Sprintf("update test prompt %d", i)); code != http.StatusOK {
				t.Fatalf("request %d: %d %q", i, code, body)
			}
		}
	}
	finished := func(i int) int64 { return c.Engines[i].Stats().Finished }

	send(4)
	if a, b := finished(0), finished(1); a != 4 || b != 0 {
		t.Fatalf("before Update: %d and %d requests finished, want 4 and 0", a, b)
	}
	if err := g.Update(c.URLs[1:]); err != nil {
		t.Fatal(err)
	}
	send(4)
	if a, b := finished(0), finished(1); a != 4 || b != 4 {
		t.Fatalf("after Update: %d and %d requests finished, want 4 and 4", a, b)
	}
	st := g.State()
	if len(st.Endpoints) != 1 || st.Endpoints[0].Key != c.URLs[1] {
		t.Fatalf("endpoints after Update: %+v", st.Endpoints)
	}
	waitFor(t, func() bool { s := g.State().Endpoints[0].Scrape; return s != nil && s.Scrapes > 0 })

	if err := g.Update([]string{"not a url"}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Update with an invalid URL: %v, want ErrInvalidConfig", err)
	}
	if st := g.State(); len(st.Endpoints) != 1 || st.Endpoints[0].Key != c.URLs[1] {
		t.Fatalf("endpoints after a failed Update: %+v", st.Endpoints)
	}
	send(2)
	if b := finished(1); b != 6 {
		t.Fatalf("after a failed Update: %d requests finished on the second engine, want 6", b)
	}
}

// countingBody counts the bytes read of a request body.
type countingBody struct {
	r io.Reader
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return nil }

// With SpillTo, a request body is bounded by the parser's MaxBodyBytes, as
// without: one over it is refused with 413 having read no more than the
// cap, and one under it that is longer than spill's own default cap is
// served.
func TestGatewaySpillBodyCap(t *testing.T) {
	var got atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Store(n)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
	}))
	defer up.Close()
	provider, err := New([]string{up.URL}, Config{ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer provider.transport.CloseIdleConnections()
	newGateway := func(maxBody int64) *Gateway {
		g, err := New([]string{up.URL}, Config{ScrapeInterval: -1, Parser: httplb.ParserConfig{MaxBodyBytes: maxBody},
			SpillTo: []spill.Tier{provider.Tier("provider")}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.transport.CloseIdleConnections)
		return g
	}
	send := func(g *Gateway, body *countingBody) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", body)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		g.ServeHTTP(w, req)
		return w.Code
	}

	const small = 1 << 10
	body := &countingBody{r: strings.NewReader(`{"model":"m","prompt":"` + strings.Repeat("a", 1<<20) + `"}`)}
	if code := send(newGateway(small), body); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the parser's cap got %d, want 413", code)
	}
	if n := body.n.Load(); n > small+1 {
		t.Errorf("read %d bytes of a body over a cap of %d", n, small)
	}

	const large = spill.DefaultMaxBodyBytes + 1<<20
	prompt := strings.Repeat("a", spill.DefaultMaxBodyBytes)
	body = &countingBody{r: strings.NewReader(`{"model":"m","prompt":"` + prompt + `"}`)}
	if code := send(newGateway(large), body); code != http.StatusOK {
		t.Errorf("a body under the parser's cap of %d bytes got %d, want 200", large, code)
	}
	if n := got.Load(); n != body.n.Load() {
		t.Errorf("the replica received %d bytes of %d", n, body.n.Load())
	}
}

// An Update that lists a backend twice is refused and changes nothing:
// the replicas are still routed to and scraped as before.
func TestGatewayUpdateDuplicateChangesNothing(t *testing.T) {
	g, err := New([]string{"http://127.0.0.1:1"}, Config{ScrapeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, backends := range [][]string{
		{"http://127.0.0.1:2", "http://127.0.0.1:2"},
		{"http://127.0.0.1:2", "http://127.0.0.1:2/"},
	} {
		if err := g.Update(backends); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Update(%q): %v, want ErrInvalidConfig", backends, err)
		}
		st := g.State()
		if len(st.Endpoints) != 1 || st.Endpoints[0].Key != "http://127.0.0.1:1" {
			t.Fatalf("endpoints after a failed Update: %+v", st.Endpoints)
		}
		if st.Endpoints[0].Scrape == nil {
			t.Errorf("after a failed Update(%q), the replica is no longer scraped", backends)
		}
		if _, ok := g.scraper.Status("http://127.0.0.1:2"); ok {
			t.Errorf("after a failed Update(%q), the scraper has its backend", backends)
		}
	}
}

// The default upstream transport closes an idle connection before the
// engines' servers do (5 s), so that no request is sent on a connection as
// its replica closes it, and it bounds dialing and TLS handshakes, as
// net/http's DefaultTransport does, so that a replica that does not answer
// SYNs fails the attempt instead of holding it for the kernel's timeout.
func TestDefaultBaseTransport(t *testing.T) {
	tr := defaultBase()
	if tr.IdleConnTimeout <= 0 || tr.IdleConnTimeout >= 5*time.Second {
		t.Errorf("IdleConnTimeout %v, want in (0, 5s)", tr.IdleConnTimeout)
	}
	if tr.DialContext == nil || tr.TLSHandshakeTimeout <= 0 || tr.Proxy == nil {
		t.Errorf("DialContext set %v, TLSHandshakeTimeout %v, Proxy set %v: want DefaultTransport's", tr.DialContext != nil, tr.TLSHandshakeTimeout, tr.Proxy != nil)
	}
	if tr.MaxIdleConnsPerHost < 256 || tr.MaxIdleConns != 0 {
		t.Errorf("MaxIdleConnsPerHost %d, MaxIdleConns %d: want 256 per replica and no bound over all", tr.MaxIdleConnsPerHost, tr.MaxIdleConns)
	}
	if tr.MaxResponseHeaderBytes <= 0 || tr.MaxResponseHeaderBytes > 1<<20 {
		t.Errorf("MaxResponseHeaderBytes %d, want at most 1 MiB", tr.MaxResponseHeaderBytes)
	}
	if tr == http.DefaultTransport {
		t.Error("the default transport is shared with the process")
	}
}

// Run runs the background work once at a time: a second call while the
// first runs returns an error at once instead of seeming to run without
// scraping, and Run may be called again once the first has returned.
func TestGatewayRunOnceAtATime(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, _ := newLogger()
	g, err := New(c.URLs, Config{Logger: log, ScrapeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	// The first Run is running once a scrape has been made.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if s := g.State().Endpoints[0].Scrape; s != nil && s.Scrapes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no scrape made")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ended, stop := context.WithCancel(context.Background())
	stop()
	if err := g.Run(ended); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("second Run while the first runs: %v, want an error saying Run is running", err)
	}
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("first Run: %v, want context.Canceled", err)
	}
	if err := g.Run(ended); !errors.Is(err, context.Canceled) {
		t.Errorf("Run after the first returned: %v, want context.Canceled", err)
	}
}

// A refusal by admission is told to the Observer of Config.Admission as
// well as to Retry.Observer, and once to an Observer given as both.
func TestGatewayAdmissionObserver(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer slow.Close()
	var mu sync.Mutex
	told := map[string]int{}
	observer := func(name string) *retry.Observer {
		return &retry.Observer{Reject: func(err *retry.OverloadError) {
			mu.Lock()
			told[name]++
			mu.Unlock()
		}}
	}
	shared := observer("shared")
	cases := []struct {
		name              string
		admission, retrys *retry.Observer
		want              map[string]int
	}{
		{"admission only", observer("admission"), nil, map[string]int{"admission": 1}},
		{"both", observer("admission"), observer("retry"), map[string]int{"admission": 1, "retry": 1}},
		{"the same", shared, shared, map[string]int{"shared": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			clear(told)
			mu.Unlock()
			log, _ := newLogger()
			g, err := New([]string{slow.URL}, Config{Logger: log, ScrapeInterval: -1,
				Admission: retry.AdmissionConfig{MaxInFlight: 1, Observer: tc.admission},
				Retry:     retry.LoopConfig{Observer: tc.retrys}})
			if err != nil {
				t.Fatal(err)
			}
			defer g.transport.CloseIdleConnections()
			done := make(chan struct{})
			go func() {
				post(t, g, "first")
				close(done)
			}()
			<-started
			code, _, _ := post(t, g, "second")
			release <- struct{}{}
			<-done
			if code != http.StatusTooManyRequests {
				t.Fatalf("second request: %d, want 429", code)
			}
			mu.Lock()
			defer mu.Unlock()
			if !maps.Equal(told, tc.want) {
				t.Errorf("observers told %v, want %v", told, tc.want)
			}
		})
	}
}

// A client's "Expect: 100-continue" is answered by the gateway's server and
// not forwarded: the body is sent upstream from memory, and each attempt
// would otherwise hold it back until the replica answered 100 Continue.
func TestGatewayDoesNotForwardExpect(t *testing.T) {
	got := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Expect")
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	log, _ := newLogger()
	g, err := New([]string{up.URL}, Config{Logger: log, ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	srv := httptest.NewServer(g)
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()
	client.Transport.(*http.Transport).ExpectContinueTimeout = time.Minute

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"a long prompt","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("response %d %q", resp.StatusCode, body)
	}
	if e := <-got; e != "" {
		t.Errorf("the replica was sent Expect: %q, want none", e)
	}
}

// vllmMetrics answers a scrape with a vLLM exposition.
var vllmMetrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = io.WriteString(w, "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.25\n")
})

// recordingBase is a Base that records the URLs it is asked for.
type recordingBase struct {
	next http.RoundTripper
	mu   sync.Mutex
	urls []string
}

func (b *recordingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.urls = append(b.urls, r.URL.String())
	b.mu.Unlock()
	return b.next.RoundTrip(r)
}

func (b *recordingBase) seen() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.urls)
}

// The scrapes go through Base, as the upstream requests do: a replica
// reachable only with Base's TLS configuration (here, a CA of its own) is
// scraped, and Base sees each scrape.
func TestGatewayScrapesThroughBase(t *testing.T) {
	srv := httptest.NewTLSServer(vllmMetrics)
	defer srv.Close()
	tr := srv.Client().Transport.(*http.Transport).Clone() // trusts srv's certificate
	defer tr.CloseIdleConnections()
	base := &recordingBase{next: tr}
	g, err := New([]string{srv.URL}, Config{Base: base, ScrapeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	o, err := g.scraper.Scrape(context.Background(), srv.URL)
	if err != nil {
		t.Fatalf("scrape of an https replica that Base trusts: %v", err)
	}
	if o.Running != 3 || o.Waiting != 1 {
		t.Errorf("observation %+v, want 3 running and 1 waiting", o.Load)
	}
	if got := base.seen(); !slices.Equal(got, []string{srv.URL + "/metrics"}) {
		t.Errorf("Base saw %q, want the scrape of %s/metrics", got, srv.URL)
	}
}

// A Base that sends through an HTTP proxy sends the scrapes through it too.
func TestGatewayScrapesThroughProxy(t *testing.T) {
	replica := httptest.NewServer(vllmMetrics)
	defer replica.Close()
	var (
		mu      sync.Mutex
		proxied []string
	)
	fwd := &http.Transport{}
	defer fwd.CloseIdleConnections()
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A forward proxy is sent the absolute URL.
		mu.Lock()
		proxied = append(proxied, r.URL.String())
		mu.Unlock()
		out := r.Clone(r.Context())
		out.RequestURI = ""
		resp, err := fwd.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		maps.Copy(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	defer proxy.Close()
	proxyURL, err := url.Parse(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{Proxy: http.ProxyURL(proxyURL)}
	defer base.CloseIdleConnections()
	g, err := New([]string{replica.URL}, Config{Base: base, ScrapeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.scraper.Scrape(context.Background(), replica.URL); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(proxied, []string{replica.URL + "/metrics"}) {
		t.Errorf("the proxy was sent %q, want the scrape of %s/metrics", proxied, replica.URL)
	}
}

// A scrape through Base follows a few redirects on its replica's host, as
// the scraper's own client does, and not net/http's default of ten, nor
// any to another host, where a Base that adds credentials would send them.
func TestGatewayScrapeRedirects(t *testing.T) {
	var hits, elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		vllmMetrics(w, r)
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/away/metrics":
			http.Redirect(w, r, other.URL+"/metrics", http.StatusFound)
		case "/moved/metrics":
			http.Redirect(w, r, "/metrics", http.StatusMovedPermanently)
		case "/metrics":
			vllmMetrics(w, r)
		default:
			http.Redirect(w, r, r.URL.Path, http.StatusFound)
		}
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	loop, moved, away := srv.URL+"/loop", srv.URL+"/moved", srv.URL+"/away"
	g, err := New([]string{loop, moved, away}, Config{Base: base, ScrapeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := g.scraper.Scrape(ctx, loop); err == nil {
		t.Fatal("a redirect loop was scraped")
	}
	if n := hits.Load(); n != signals.DefaultMaxRedirects+1 {
		t.Errorf("%d requests for a redirect loop, want %d", n, signals.DefaultMaxRedirects+1)
	}
	if _, err := g.scraper.Scrape(ctx, moved); err != nil {
		t.Errorf("a scrape redirected on its host: %v", err)
	}
	if _, err := g.scraper.Scrape(ctx, away); err == nil || elsewhere.Load() != 0 {
		t.Errorf("a scrape redirected to another host: error %v, %d requests there", err, elsewhere.Load())
	}
}

// A replica that sends ORCA load reports with its responses, as vLLM does
// (KV usage and waiting requests), keeps the running requests its scrape
// reported: the report updates the fields it carries.
func TestGatewayOrcaReportKeepsScrape(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			vllmMetrics(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(signals.OrcaHeader, "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=4")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	g, err := New([]string{up.URL}, Config{ScrapeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	if _, err := g.scraper.Scrape(context.Background(), up.URL); err != nil {
		t.Fatal(err)
	}
	if code, body, _ := post(t, g, "a prompt"); code != http.StatusOK {
		t.Fatalf("response %d %q", code, body)
	}
	o, ok := g.scraper.Observation(up.URL)
	if !ok || o.Running != 3 || o.Waiting != 4 || o.KVUsage != 0.5 || o.Engine != signals.EngineVLLM {
		t.Errorf("observation %+v (found %v), want the scrape's 3 running with the report's 4 waiting and KV usage 0.5", o, ok)
	}
}

// With no Base, the scrapes take the proxy of the environment, as the
// upstream requests do. ProxyFromEnvironment reads the environment once per
// process and never proxies loopback addresses: the test runs itself in a
// process whose HTTP_PROXY is a proxy that answers for a replica named
// replica.test.
func TestGatewayScrapesThroughEnvironmentProxy(t *testing.T) {
	const replica = "http://replica.test"
	if os.Getenv("LLMLB_TEST_ENV_PROXY") == "1" {
		g, err := New([]string{replica}, Config{ScrapeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer g.transport.CloseIdleConnections()
		if _, err := g.scraper.Scrape(context.Background(), replica); err != nil {
			t.Fatal(err)
		}
		return
	}
	var (
		mu      sync.Mutex
		proxied []string
	)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		proxied = append(proxied, r.URL.String())
		mu.Unlock()
		if r.URL.Host != "replica.test" {
			http.Error(w, "unknown host", http.StatusBadGateway)
			return
		}
		vllmMetrics(w, r)
	}))
	defer proxy.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestGatewayScrapesThroughEnvironmentProxy$", "-test.count=1")
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(name) {
		case "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "REQUEST_METHOD":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, "LLMLB_TEST_ENV_PROXY=1", "HTTP_PROXY="+proxy.URL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the scrape through the environment's proxy failed: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(proxied, []string{replica + "/metrics"}) {
		t.Errorf("the proxy was sent %q, want the scrape of %s/metrics", proxied, replica)
	}
}

// When a replica's scrapes fail while its ORCA reports keep arriving, the
// scraped values the reports do not carry (the running requests) are kept
// for as long as the balancer trusts a scrape, three scrape intervals, and
// no longer; once the reports stop too, the debug view shows no signal
// past that age.
func TestGatewayOrcaReportsKeepScrapeOnlyWhileTrusted(t *testing.T) {
	const interval = 200 * time.Millisecond
	var failing atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			if failing.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			vllmMetrics(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(signals.OrcaHeader, "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=4")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	g, err := New([]string{up.URL}, Config{ScrapeInterval: interval, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	if _, err := g.scraper.Scrape(context.Background(), up.URL); err != nil {
		t.Fatal(err)
	}
	o, ok := g.scraper.Observation(up.URL)
	if !ok || o.Running != 3 {
		t.Fatalf("observation %+v (found %v) after the scrape, want 3 running", o, ok)
	}
	scraped := o.At
	failing.Store(true)
	report := func() {
		t.Helper()
		if _, err := g.scraper.Scrape(context.Background(), up.URL); err == nil {
			t.Fatal("scrape succeeded, want it to fail")
		}
		if code, body, _ := post(t, g, "a prompt"); code != http.StatusOK {
			t.Fatalf("response %d %q", code, body)
		}
	}
	report()
	if o, ok := g.scraper.Observation(up.URL); time.Since(scraped) < 2*interval && (!ok || o.Running != 3 || o.Waiting != 4) {
		t.Errorf("observation %+v (found %v) within the scrape's trust, want its 3 running with the report's 4 waiting", o, ok)
	}
	for time.Since(scraped) <= 3*interval+interval/4 {
		time.Sleep(interval / 4)
		report()
	}
	o, ok = g.scraper.Observation(up.URL)
	if !ok || o.Running != 0 || o.Waiting != 4 || o.KVUsage != 0.5 {
		t.Errorf("observation %+v (found %v) %v after the scrape, want the report's 4 waiting and KV usage 0.5, and no running requests kept",
			o, ok, time.Since(scraped))
	}
	st := g.State()
	if len(st.Endpoints) != 1 {
		t.Fatalf("debug state %+v", st)
	}
	e := st.Endpoints[0]
	if s := e.Signal; s == nil || s.Running != 0 || s.Waiting != 4 || s.KVUsage == nil || *s.KVUsage != 0.5 || s.AgeSeconds > (3*interval).Seconds() {
		t.Errorf("debug signal %+v, want the last report's", s)
	}
	if e.Scrape == nil || e.Scrape.ConsecutiveFailures == 0 {
		t.Errorf("debug scrape %+v, want failures", e.Scrape)
	}

	// The reports stop too: past the balancer's trust, no signal is shown.
	time.Sleep(3*interval + interval/4)
	if s := g.State().Endpoints[0].Signal; s != nil {
		t.Errorf("debug signal %+v after the reports stopped, want none", s)
	}
}

// The debug view names the source of a signal made of ORCA reports alone
// "orca", not the "auto" of an observation without an engine; a report
// recorded over a scrape the balancer trusts keeps the scrape's engine.
func TestGatewayDebugOrcaOnlyEngine(t *testing.T) {
	var scrapes atomic.Bool // whether /metrics answers
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			if !scrapes.Load() {
				http.Error(w, "down", http.StatusInternalServerError)
				return
			}
			vllmMetrics(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(signals.OrcaHeader, "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=4")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	// An interval of an hour: every scrape is trusted for the whole test.
	g, err := New([]string{up.URL}, Config{ScrapeInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	signal := func() *DebugSignal {
		t.Helper()
		st := g.State()
		if len(st.Endpoints) != 1 {
			t.Fatalf("debug state %+v", st)
		}
		return st.Endpoints[0].Signal
	}

	if _, err := g.scraper.Scrape(context.Background(), up.URL); err == nil {
		t.Fatal("scrape succeeded, want it to fail")
	}
	if code, body, _ := post(t, g, "a prompt"); code != http.StatusOK {
		t.Fatalf("response %d %q", code, body)
	}
	if s := signal(); s == nil || s.Engine != "orca" || s.Waiting != 4 || s.KVUsage == nil || *s.KVUsage != 0.5 {
		t.Errorf("debug signal %+v with ORCA reports alone, want engine orca with the report's values", s)
	}

	scrapes.Store(true)
	if _, err := g.scraper.Scrape(context.Background(), up.URL); err != nil {
		t.Fatal(err)
	}
	if code, body, _ := post(t, g, "a prompt"); code != http.StatusOK {
		t.Fatalf("response %d %q", code, body)
	}
	if s := signal(); s == nil || s.Engine != "vllm" || s.Running != 3 || s.Waiting != 4 {
		t.Errorf("debug signal %+v with a report over a scrape, want the scrape's engine vllm, its 3 running, the report's 4 waiting", s)
	}
}

// TestGatewaySpillsWithoutRetryingCoolingReplicas: with SpillTo, an answer
// asking for a wait is retried on another replica that is in picks, but
// not on the replica that asked, nor on one cooling down: the request
// spills instead.
func TestGatewaySpillsWithoutRetryingCoolingReplicas(t *testing.T) {
	paygo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"paygo\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer paygo.Close()
	provider, err := New([]string{paygo.URL}, Config{ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer provider.transport.CloseIdleConnections()
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprint("replicas=", replicas), func(t *testing.T) {
			var hits atomic.Int32
			var urls []string
			for range replicas {
				busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					w.Header().Set("Retry-After", "30")
					http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
				}))
				defer busy.Close()
				urls = append(urls, busy.URL)
			}
			log, _ := newLogger()
			g, err := New(urls, Config{ScrapeInterval: -1, Logger: log, Name: "ptu",
				Retry: retry.LoopConfig{MaxAttempts: 3}, SpillTo: []spill.Tier{provider.Tier("paygo")}})
			if err != nil {
				t.Fatal(err)
			}
			defer g.transport.CloseIdleConnections()
			code, body, h := post(t, g, "hello")
			if code != http.StatusOK || h.Get(spill.DefaultHeader) != "ptu" || !strings.Contains(body, "paygo") {
				t.Fatalf("%d, spilled from %q, %q", code, h.Get(spill.DefaultHeader), body)
			}
			// Each replica once: none is asked again after asking for a wait.
			if n := hits.Load(); n != int32(replicas) {
				t.Errorf("the replicas were sent %d attempts, want %d", n, replicas)
			}
		})
	}
}

// tierFunc is a tier of SpillTo answered by a function.
type tierFunc func(*http.Request) (*http.Response, error)

func (f tierFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// okTier is a next tier that serves every request it is sent, counting
// them.
func okTier(sent *atomic.Int32) spill.Tier {
	return spill.Tier{Name: "paygo", Transport: tierFunc(func(r *http.Request) (*http.Response, error) {
		sent.Add(1)
		if r.Body != nil {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: io.NopCloser(strings.NewReader("data: {\"choices\":[{\"text\":\"paygo\"}]}\n\ndata: [DONE]\n\n")), Request: r}, nil
	})}
}

// With SpillTo, a replica whose failure the request spills past is named
// in the operator's log at level Warn, with its status and body, as a
// failure the client sees is: once in an interval for the replica, not for
// every request.
func TestGatewayLogsReplicaSpilledPast(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, "CUDA error: an illegal memory access was encountered")
	}))
	defer up.Close()
	var sent atomic.Int32
	log, logs := newLogger()
	g, err := New([]string{up.URL}, Config{Logger: log, ScrapeInterval: -1, Retry: retry.LoopConfig{MaxAttempts: 1},
		SpillTo: []spill.Tier{okTier(&sent)}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	for range 3 {
		if code, body, h := post(t, g, "hello", "X-Request-Id", "req-7"); code != http.StatusOK || !strings.Contains(body, "paygo") || h.Get(spill.DefaultHeader) != "primary" {
			t.Fatalf("got %d %q spilled from %q; want the next tier's answer", code, body, h.Get(spill.DefaultHeader))
		}
	}
	recs := logs.records(t, "spill: tier refused the request, sent to the next tier")
	host := strings.TrimPrefix(up.URL, "http://")
	if len(recs) != 1 || recs[0]["level"] != "WARN" || recs[0]["upstream"] != host || recs[0]["status"] != float64(500) ||
		recs[0]["request_id"] != "req-7" || !strings.Contains(fmt.Sprint(recs[0]["body"]), "CUDA error") {
		t.Fatalf("records %v, want one at Warn naming the replica, its status and body", recs)
	}
}

// With SpillTo, a request whose tenant the gateway's Parser cannot
// establish is refused with 401, not spilled to a next tier that would
// serve it without authentication.
func TestGatewayUnauthenticatedDoesNotSpill(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sent atomic.Int32
	g, err := New(c.URLs, Config{Logger: slog.New(slog.DiscardHandler), ScrapeInterval: -1,
		Parser: httplb.ParserConfig{Tenant: func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				return k, nil
			}
			return "", errors.New("no key")
		}},
		SpillTo: []spill.Tier{okTier(&sent)}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	if code, body, _ := post(t, g, "hello"); code != http.StatusUnauthorized || sent.Load() != 0 {
		t.Fatalf("got %d %q, %d sent to the next tier; want 401 and none", code, body, sent.Load())
	}
	if code, _, _ := post(t, g, "hello", "X-Api-Key", "tenant-a"); code != http.StatusOK || sent.Load() != 0 {
		t.Fatalf("an authenticated request: %d, %d sent to the next tier", code, sent.Load())
	}
}

// With SpillTo, a managed provider's 429, which names the operator's
// organisation in its body and headers, reaches the client with its status
// and Retry-After but a generic error; the operator's log has the body.
func TestGatewayHidesProviderRefusal(t *testing.T) {
	const org = "org-Zx81secret"
	provider := spill.Tier{Name: "paygo", Transport: tierFunc(func(r *http.Request) (*http.Response, error) {
		h := http.Header{}
		h.Set("Retry-After", "7")
		h.Set("Openai-Organization", org)
		h.Set("Content-Type", "application/json")
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: h, Request: r, Body: io.NopCloser(strings.NewReader(
			`{"error":{"message":"Rate limit reached for gpt-4o in organization ` + org + ` on requests per min (RPM): Limit 500.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`))}, nil
	})}
	log, logs := newLogger()
	g, err := New([]string{deadURL(t)}, Config{Logger: log, ScrapeInterval: -1, Retry: retry.LoopConfig{MaxAttempts: 1},
		SpillTo: []spill.Tier{provider}})
	if err != nil {
		t.Fatal(err)
	}
	code, body, h := post(t, g, "hello", "X-Request-Id", "req-9")
	if code != http.StatusTooManyRequests || h.Get("Retry-After") != "7" || strings.Contains(body, org) ||
		strings.Contains(fmt.Sprint(h), org) || !strings.Contains(body, "rate_limit_exceeded") || !strings.Contains(body, "req-9") {
		t.Fatalf("client got %d %v %q; want 429 with Retry-After and a generic error naming req-9", code, h, body)
	}
	recs := logs.records(t, "spill: tier's error answer replaced with a generic one for the client")
	if len(recs) != 1 || !strings.Contains(fmt.Sprint(recs[0]["body"]), org) || recs[0]["request_id"] != "req-9" {
		t.Fatalf("records %v, want the provider's body under req-9", recs)
	}
}
