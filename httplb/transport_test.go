package httplb

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/signals"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// upstream is a loopback test server that counts its requests.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// streamTokens streams n events, flushing each.
func streamTokens(n int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

func status(code int, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":"%d"}`, code)
	}
}

// hangUp closes the connection after writing prelude (raw bytes of a
// response start, possibly empty).
func hangUp(prelude string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		_, _ = buf.WriteString(prelude)
		_ = buf.Flush()
		_ = conn.Close()
	}
}

// fixed picks the endpoints in the order given, skipping excluded ones, so
// that tests know which endpoint an attempt goes to.
type fixed struct{}

func (fixed) Choose(c *llmlb.Candidates) int {
	best := 0
	for i := 1; i < c.Len(); i++ {
		if c.Member(i) < c.Member(best) {
			best = i
		}
	}
	return best
}

type harness struct {
	b    *llmlb.Balancer
	tr   *Transport
	base *http.Transport
	cfg  Config
}

func newHarness(t *testing.T, policy llmlb.Policy, cfg Config, ups ...*upstream) *harness {
	t.Helper()
	b, err := llmlb.New(policy, llmlb.WithRand(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	urls := make([]string, len(ups))
	for i, u := range ups {
		urls[i] = u.URL
	}
	eps, err := NewEndpoints(urls...)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{}
	cfg.Balancer = b
	cfg.Base = base
	if cfg.Retry.After == nil {
		cfg.Retry.After = func(time.Duration) <-chan time.Time { return closedTime }
	}
	tr, err := NewTransport(cfg)
	require.NoError(t, err)
	t.Cleanup(base.CloseIdleConnections)
	h := &harness{b: b, tr: tr, base: base, cfg: cfg}
	t.Cleanup(func() { h.requireIdle(t) })
	return h
}

var closedTime = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// requireIdle asserts the balancer's accounting is back to zero.
func (h *harness) requireIdle(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, s := range h.b.Stats() {
			if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "accounting not released: %+v", h.b.Stats())
}

func (h *harness) proxy(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(NewProxy(h.tr))
	t.Cleanup(s.Close)
	return s
}

const chatBody = `{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`

func do(t *testing.T, h *harness, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://gateway.invalid/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	return h.tr.RoundTrip(req)
}

func readAll(t *testing.T, resp *http.Response) (string, error) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestStreamPassesThrough(t *testing.T) {
	up := newUpstream(t, streamTokens(3))
	h := newHarness(t, llmlb.LeastOutstanding(), Config{}, up)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	// Committed: the prefill charge is released, the request still counts.
	st := h.b.Stats()[0]
	assert.EqualValues(t, 1, st.Outstanding)
	assert.EqualValues(t, 0, st.Queued)
	assert.EqualValues(t, 0, st.PrefillTokens)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: [DONE]\n\n", body)
}

// The client receives the first event before the upstream sends the second.
func TestProxyStreamsWithoutBuffering(t *testing.T) {
	gate := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-time.After(10 * time.Second):
			return // the client never saw the first event
		}
		fmt.Fprint(w, "data: second\n\n")
	})
	h := newHarness(t, llmlb.LeastOutstanding(), Config{}, up)
	gw := h.proxy(t)
	resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: first\n", line)
	close(gate)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: second\n\n", string(rest))
	http.DefaultClient.CloseIdleConnections()
}

func TestNonStreamingJSON(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	})
	h := newHarness(t, llmlb.LeastOutstanding(), Config{}, up)
	resp, err := do(t, h, `{"prompt":"x"}`)
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, `{"choices":[{"text":"hi"}]}`, body)
}

func TestClientDisconnectReleases(t *testing.T) {
	stop := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			fmt.Fprint(w, "data: x\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	defer close(stop)
	h := newHarness(t, llmlb.LeastOutstanding(), Config{}, up)
	gw := h.proxy(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/completions", strings.NewReader(`{"prompt":"hello","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.EqualValues(t, 1, h.b.Stats()[0].Outstanding)
	cancel()
	resp.Body.Close()
	h.requireIdle(t)
	http.DefaultClient.CloseIdleConnections()
}

// An upstream that dies mid-stream: the caller gets a read error, the
// request is not sent again, and the accounting is released.
func TestErrorMidStreamNotRetried(t *testing.T) {
	a := newUpstream(t, hangUp("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n10\r\ndata: first\n\n   \r\n"))
	b := newUpstream(t, streamTokens(2))
	h := newHarness(t, fixed{}, Config{}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.Error(t, err, "a broken stream must end with an error")
	assert.True(t, strings.HasPrefix(body, "data: first"), "got %q", body)
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 0, b.hits.Load(), "no retry after the first event")
}

func TestRetryBeforeFirstToken(t *testing.T) {
	cases := []struct {
		name string
		h    http.HandlerFunc
	}{
		{"503", status(http.StatusServiceUnavailable)},
		{"502", status(http.StatusBadGateway)},
		{"connection closed", hangUp("")},
		{"headers then closed", hangUp("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")},
		{"comment then closed", hangUp("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n: ping\n\n\n\r\n")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, c.h)
			b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				got, _ := io.ReadAll(r.Body)
				if string(got) != chatBody {
					http.Error(w, "body not replayed: "+string(got), http.StatusBadRequest)
					return
				}
				streamTokens(1)(w, r)
			})
			h := newHarness(t, fixed{}, Config{}, a, b)
			resp, err := do(t, h, chatBody)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			body, err := readAll(t, resp)
			require.NoError(t, err)
			assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body)
			assert.EqualValues(t, 1, a.hits.Load())
			assert.EqualValues(t, 1, b.hits.Load())
		})
	}
}

// TestRetryAfterStalledErrorBody: an upstream that answers 503 and then
// stops sending its error body is retried elsewhere at once, not when the
// body or the caller's deadline ends.
func TestRetryAfterStalledErrorBody(t *testing.T) {
	release := make(chan struct{})
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":`)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before a's Close, which waits for its handlers
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{}, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gateway.invalid/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	start := time.Now()
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 1, b.hits.Load())
	// The retry waited maxDrainTime for the stalled body; a minute would
	// be the caller's deadline. The bound leaves room for a loaded machine.
	assert.Less(t, time.Since(start), 20*maxDrainTime, "the retry waited for the stalled error body")
}

func TestAdjust(t *testing.T) {
	a := newUpstream(t, streamTokens(1))
	b := newUpstream(t, streamTokens(1))
	var seen llmlb.Request
	h := newHarness(t, fixed{}, Config{Adjust: func(r *http.Request, lr *llmlb.Request) {
		seen = *lr
		lr.Exclude = []string{a.URL}
		lr.OutputTokens = 7
	}}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	assert.EqualValues(t, 7, h.b.Stats()[1].DecodeTokens)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 0, a.hits.Load())
	assert.EqualValues(t, 1, b.hits.Load())
	assert.Equal(t, 8, seen.MaxTokens)
	assert.Positive(t, seen.PromptTokens)
}

func TestNotRetried(t *testing.T) {
	a := newUpstream(t, status(http.StatusBadRequest))
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 0, b.hits.Load())
}

func TestRetryAfterHonoured(t *testing.T) {
	a := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "2"))
	b := newUpstream(t, streamTokens(1))
	var mu sync.Mutex
	var waits []time.Duration
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{After: func(d time.Duration) <-chan time.Time {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return closedTime
	}}}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{2 * time.Second}, waits)
	assert.EqualValues(t, 1, b.hits.Load())
}

// With a negative MaxPushback a retry elsewhere waits only for its back-off,
// not for the wait the first endpoint asked for.
func TestRetryAfterNotHonoured(t *testing.T) {
	a := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "2"))
	b := newUpstream(t, streamTokens(1))
	var mu sync.Mutex
	var waits []time.Duration
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{MaxPushback: -1, After: func(d time.Duration) <-chan time.Time {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return closedTime
	}}}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	require.Len(t, waits, 1)
	assert.Less(t, waits[0], time.Second, "the retry waited for the pushback")
	assert.EqualValues(t, 1, b.hits.Load())
}

// A successful answer saying the endpoint's request quota is spent cools it
// down in the Reporter, an Ejector: the next request goes elsewhere.
func TestQuotaSpentCoolsDown(t *testing.T) {
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("X-Ratelimit-Reset-Requests", "30s")
		streamTokens(1)(w, r)
	})
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, llmlb.RoundRobin(), Config{}, a, b)
	ej, err := retry.NewEjector(h.b, retry.EjectorConfig{})
	require.NoError(t, err)
	h.tr.reporter = ej
	for range 4 {
		resp, err := do(t, h, chatBody)
		require.NoError(t, err)
		_, err = readAll(t, resp)
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, a.hits.Load(), "the spent endpoint was picked again")
	assert.Equal(t, []string{a.URL}, ej.Cooling())
}

// A Retry-After that would end after the request's deadline gives up at
// once and returns the upstream's answer.
func TestRetryAfterPastDeadline(t *testing.T) {
	a := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "60"))
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{}, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "60", resp.Header.Get("Retry-After"))
	_, _ = readAll(t, resp)
	assert.EqualValues(t, 0, b.hits.Load())
}

func TestAllOverloadedPassesThrough429(t *testing.T) {
	a := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "1"))
	b := newUpstream(t, status(http.StatusTooManyRequests, "Retry-After", "1"))
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Retry: retry.LoopConfig{MaxAttempts: 4}}, a, b)
	gw := h.proxy(t)
	resp, err := http.Post(gw.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	require.NoError(t, err)
	_, _ = readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.EqualValues(t, 4, a.hits.Load()+b.hits.Load())
	assert.Positive(t, a.hits.Load())
	assert.Positive(t, b.hits.Load())
	http.DefaultClient.CloseIdleConnections()
}

func TestGiveUpOnConnectionErrors(t *testing.T) {
	a := newUpstream(t, hangUp(""))
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Retry: retry.LoopConfig{MaxAttempts: 2}}, a)
	_, err := do(t, h, chatBody)
	require.Error(t, err)
	assert.ErrorIs(t, err, retry.ErrExhausted)
	assert.EqualValues(t, 2, a.hits.Load(), "the failed endpoint is tried again when no other is left")

	gw := h.proxy(t)
	resp, err := http.Post(gw.URL+"/v1/completions", "application/json", strings.NewReader(chatBody))
	require.NoError(t, err)
	_, _ = readAll(t, resp)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	http.DefaultClient.CloseIdleConnections()
}

func TestProxyStatuses(t *testing.T) {
	up := newUpstream(t, streamTokens(1))
	adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 1, RetryAfter: 1500 * time.Millisecond})
	require.NoError(t, err)
	p, err := NewParser(ParserConfig{MaxBodyBytes: 64})
	require.NoError(t, err)
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Parser: p, Admission: adm}, up)
	gw := h.proxy(t)
	defer http.DefaultClient.CloseIdleConnections()
	postGW := func(body string) *http.Response {
		resp, err := http.Post(gw.URL+"/v1/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_, _ = readAll(t, resp)
		return resp
	}

	resp := postGW(`{"prompt":"` + strings.Repeat("x", 100) + `"}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	resp = postGW(`{"prompt": this is not json`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "malformed JSON is routed")

	// Hold the only admission slot with a request in flight.
	req, err := http.NewRequest(http.MethodPost, "http://gw.invalid/v1/completions", strings.NewReader(`{}`))
	require.NoError(t, err)
	held, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	resp = postGW(`{"prompt":"x"}`)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("Retry-After"))
	_, _ = readAll(t, held)
	assert.Zero(t, adm.InFlight())

	require.NoError(t, h.b.SetHealthy(up.URL, false))
	resp = postGW(`{"prompt":"x"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a lone unhealthy endpoint is still tried")
	require.NoError(t, h.b.SetHealthy(up.URL, true))
}

// A balancer with no endpoints (none configured, or discovery found none)
// answers 503, which clients do not take for a load to back off from, and
// logs the cause at level Error.
func TestNoEndpoints(t *testing.T) {
	for _, name := range []string{"none given", "all removed"} {
		t.Run(name, func(t *testing.T) {
			b, err := llmlb.New(llmlb.LeastOutstanding())
			require.NoError(t, err)
			if name == "all removed" {
				eps, err := NewEndpoints("http://10.0.0.1:8000")
				require.NoError(t, err)
				require.NoError(t, b.Update(eps))
				require.NoError(t, b.Update(nil))
			}
			tr, err := NewTransport(Config{Balancer: b})
			require.NoError(t, err)
			var logs syncBuffer
			proxy := NewProxy(tr)
			proxy.ErrorHandler = NewErrorHandler(slog.New(slog.NewJSONHandler(&logs, nil)))
			gw := httptest.NewServer(proxy)
			defer gw.Close()
			resp, err := http.Post(gw.URL+"/v1/completions", "application/json", strings.NewReader(`{}`))
			require.NoError(t, err)
			body, _ := readAll(t, resp)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Empty(t, resp.Header.Get("Retry-After"))
			assert.Contains(t, body, `"type":"service_unavailable"`)
			id := resp.Header.Get("X-Request-Id")
			assert.NotEmpty(t, id)
			var rec struct {
				Level     string `json:"level"`
				RequestID string `json:"request_id"`
				Status    int    `json:"status"`
				Error     string `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(logs.String()), &rec), logs.String())
			assert.Equal(t, "ERROR", rec.Level)
			assert.Equal(t, http.StatusServiceUnavailable, rec.Status)
			assert.Equal(t, id, rec.RequestID)
			assert.Contains(t, rec.Error, llmlb.ErrNoEndpoints.Error())
			http.DefaultClient.CloseIdleConnections()
		})
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := NewTransport(Config{})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	b, err := llmlb.New(llmlb.RoundRobin())
	require.NoError(t, err)
	_, err = NewTransport(Config{Balancer: b, MaxPeekBytes: -1})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	// The retry settings NewLoop rejects, NewTransport rejects too.
	for _, rc := range []retry.LoopConfig{
		{MaxAttempts: -1},
		{Hedge: retry.HedgeConfig{Delay: -1}},
		{Hedge: retry.HedgeConfig{Percentile: 1}},
		{Hedge: retry.HedgeConfig{Percentile: -0.5}},
		{Hedge: retry.HedgeConfig{Percentile: math.NaN()}},
		{Hedge: retry.HedgeConfig{MaxHedges: -1}},
	} {
		_, err = NewTransport(Config{Balancer: b, Retry: rc})
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", rc)
		_, err = retry.NewLoop(b, rc)
		assert.ErrorIs(t, err, retry.ErrInvalidConfig, "%+v", rc)
	}
	// A negative MaxPushback honours no server-requested delay.
	_, err = NewTransport(Config{Balancer: b, Retry: retry.LoopConfig{MaxPushback: -1}})
	assert.NoError(t, err)
	for _, bad := range []string{"", "10.0.0.1:80", "ftp://x", "http://", "http://:8000", "https://:", "http://[]:80", "http://h/?q=1", "http://u:p@h/"} {
		_, err := NewEndpoint(bad)
		assert.ErrorIs(t, err, ErrInvalidConfig, bad)
	}
	e, err := NewEndpoint("http://h:1/base/")
	require.NoError(t, err)
	assert.Equal(t, "http://h:1/base", e.Key())
	assert.Equal(t, "/base", e.URL().Path)
}

// NewEndpoint keeps a base URL's path, /v1 included (it suits requests
// whose /v1 was stripped), and says what to give for one without a scheme.
func TestNewEndpointBase(t *testing.T) {
	cases := []struct {
		base string
		key  string // "" when refused
		says string // in the error of a refused one
	}{
		{"http://h:8000", "http://h:8000", ""},
		{"http://h:8000/", "http://h:8000", ""},
		{"https://gw/team-a/llm/", "https://gw/team-a/llm", ""},
		{"http://h:8000/v10", "http://h:8000/v10", ""},
		{"http://h:8000/v1", "http://h:8000/v1", ""},
		{"http://h:8000/v1/", "http://h:8000/v1", ""},
		{"127.0.0.1:8000", "", `want an absolute http or https URL, such as "http://127.0.0.1:8000"`},
		{"localhost:8000", "", `want an absolute http or https URL, such as "http://localhost:8000"`},
		{"10.0.0.7", "", `such as "http://10.0.0.7"`},
	}
	for _, c := range cases {
		e, err := NewEndpoint(c.base)
		if c.key != "" {
			if assert.NoError(t, err, c.base) {
				assert.Equal(t, c.key, e.Key())
			}
			continue
		}
		assert.ErrorIs(t, err, ErrInvalidConfig, c.base)
		assert.ErrorContains(t, err, c.says, c.base)
		_, err = NewEndpoints("http://ok:1", c.base)
		assert.ErrorIs(t, err, ErrInvalidConfig, c.base)
	}
}

// A base URL ending in /v1 takes requests whose /v1 was stripped, as behind
// http.StripPrefix("/v1", ...); a request that still carries /v1 would go
// to /v1/v1/...: it fails at its first attempt, not retried, with an error
// saying what base URL to give, and the upstream sees nothing.
func TestBaseEndingInV1(t *testing.T) {
	var path atomic.Value
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.Path)
		fmt.Fprint(w, "{}")
	})
	for _, custom := range []bool{false, true} {
		b, err := llmlb.New(llmlb.RoundRobin())
		require.NoError(t, err)
		eps, err := NewEndpoints(up.URL+"/v1", up.URL+"/team/v1/")
		require.NoError(t, err)
		require.NoError(t, b.Update(eps))
		cfg := Config{Balancer: b, Retry: retry.LoopConfig{Classify: func(error) bool { return true }, Budget: unlimited{},
			After: func(time.Duration) <-chan time.Time { return closedTime }}}
		if custom {
			cfg.URL = func(ep llmlb.Endpoint) *url.URL { u, _ := url.Parse(ep.Key()); return u }
		}
		var ev events
		cfg.Retry.Observer = ev.observer()
		tr, err := NewTransport(cfg)
		require.NoError(t, err)
		h := NewProxy(tr)
		for range 2 {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/chat/completions", strings.NewReader(`{}`)))
			require.Equal(t, http.StatusOK, rec.Code, "Config.URL %v: %s", custom, rec.Body)
			assert.Contains(t, []string{"/v1/chat/completions", "/team/v1/chat/completions"}, path.Load())
		}
		hits := up.hits.Load()
		req, _ := http.NewRequest(http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(`{}`))
		_, err = tr.RoundTrip(req)
		require.ErrorIs(t, err, ErrInvalidConfig, "Config.URL %v", custom)
		assert.ErrorContains(t, err, "without /v1: the client's /v1/... path is forwarded as it was sent")
		assert.Empty(t, ev.retries, "retried: %v", err)
		assert.Equal(t, hits, up.hits.Load(), "the upstream saw the request")
	}
}

type keyOnly string

func (k keyOnly) Key() string { return string(k) }

// An endpoint without a URL is a configuration error: it fails on the first
// attempt, whatever the classifier says, and its error says how to give
// the endpoints URLs.
func TestEndpointWithoutURL(t *testing.T) {
	up := newUpstream(t, streamTokens(1))
	retryAll := func(error) bool { return true }
	cases := []struct {
		name  string
		url   func(llmlb.Endpoint) *url.URL
		is    error
		says  []string
		retry func(error) bool
	}{
		{"not an Endpoint", nil, ErrNoURL,
			[]string{`endpoint "http://127.0.0.1:20051", of type httplb.keyOnly, is not an *httplb.Endpoint`, "httplb.NewEndpoints", "Config.URL"}, nil},
		{"classifier retries all", nil, ErrNoURL, []string{"httplb.NewEndpoints"}, retryAll},
		{"Config.URL returns nil", func(llmlb.Endpoint) *url.URL { return nil }, ErrNoURL,
			[]string{`Config.URL returned nil for endpoint "http://127.0.0.1:20051"`}, nil},
		{"Config.URL ends in /v1", func(llmlb.Endpoint) *url.URL { u, _ := url.Parse(up.URL + "/v1/"); return u }, ErrInvalidConfig,
			[]string{"give the server's base URL, " + up.URL + ", without /v1"}, retryAll},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := llmlb.New(llmlb.RoundRobin())
			require.NoError(t, err)
			require.NoError(t, b.Update([]llmlb.Endpoint{keyOnly("http://127.0.0.1:20051"), keyOnly("http://127.0.0.1:20052")}))
			var ev events
			tr, err := NewTransport(Config{Balancer: b, URL: c.url, Retry: retry.LoopConfig{
				Classify: c.retry, Observer: ev.observer(), Budget: unlimited{},
				After: func(time.Duration) <-chan time.Time { return closedTime }}})
			require.NoError(t, err)
			req, _ := http.NewRequest(http.MethodPost, "http://gw.invalid/v1/completions", strings.NewReader(`{}`))
			_, err = tr.RoundTrip(req)
			require.ErrorIs(t, err, c.is)
			var gaveUp *retry.GiveUpError
			assert.False(t, errors.As(err, &gaveUp), "retried: %v", err)
			assert.Empty(t, ev.retries, "retried: %v", err)
			for _, s := range c.says {
				assert.ErrorContains(t, err, s)
			}
			assert.Zero(t, up.hits.Load())
			for _, st := range b.Stats() {
				assert.Zero(t, st.Outstanding)
			}
		})
	}
}

func TestEndpointBasePath(t *testing.T) {
	var path atomic.Value
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.Path + "?" + r.URL.RawQuery + " " + r.Host)
		fmt.Fprint(w, "ok")
	})
	b, err := llmlb.New(llmlb.RoundRobin())
	require.NoError(t, err)
	eps, err := NewEndpoints(up.URL + "/api")
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := NewTransport(Config{Balancer: b, Base: base})
	require.NoError(t, err)
	req, _ := http.NewRequest(http.MethodGet, "http://gw.invalid/v1/models?x=1", nil)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = readAll(t, resp)
	assert.Equal(t, "/api/v1/models?x=1 "+strings.TrimPrefix(up.URL, "http://"), path.Load())
}

// The request's path reaches the upstream as the client escaped it: an
// escaped slash (in a model name such as "org/model") stays escaped, with or
// without a base path.
func TestEscapedPathKept(t *testing.T) {
	var uri atomic.Value
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		uri.Store(r.RequestURI)
		fmt.Fprint(w, "{}")
	})
	for _, prefix := range []string{"", "/api"} {
		b, err := llmlb.New(llmlb.RoundRobin())
		require.NoError(t, err)
		eps, err := NewEndpoints(up.URL + prefix)
		require.NoError(t, err)
		require.NoError(t, b.Update(eps))
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		tr, err := NewTransport(Config{Balancer: b, Base: base})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodGet, "http://gw.invalid/v1/models/org%2Fmodel?x=a%2Fb", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, _ = readAll(t, resp)
		assert.Equal(t, prefix+"/v1/models/org%2Fmodel?x=a%2Fb", uri.Load())
	}
}

// A request path with dot segments ("..", or "%2e%2e" escaped) stays under
// the endpoint's base path: an upstream that resolves them, as a path-routing
// ingress in front of several backends does, is never sent a path that
// climbs out of the base path to another backend's.
func TestDotSegmentsStayUnderBasePath(t *testing.T) {
	var got atomic.Value
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.URL.Path)
		fmt.Fprint(w, "{}")
	})
	b, err := llmlb.New(llmlb.RoundRobin())
	require.NoError(t, err)
	eps, err := NewEndpoints(up.URL + "/api")
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := NewTransport(Config{Balancer: b, Base: base})
	require.NoError(t, err)
	cases := []struct{ path, want string }{
		{"/../secret", "/api/secret"},
		{"/v1/../../secret/", "/api/secret/"},
		{"/%2e%2e/secret", "/api/secret"},
		{"/v1/%2E%2E/.%2e/secret", "/api/secret"},
		{"/v1/..%2F..%2Fsecret", "/api/secret"},
		{"/v1/./models/..", "/api/v1/"},
		{"/v1/models/.", "/api/v1/models/"},
		{"/v1/models", "/api/v1/models"},
		{"/v1/models/..x/.y", "/api/v1/models/..x/.y"},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, "http://gw.invalid"+c.path, nil)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			_, _ = readAll(t, resp)
			sent := got.Load().(string)
			assert.Equal(t, c.want, sent)
			resolved := path.Clean(sent)
			assert.True(t, strings.HasPrefix(resolved, "/api/") || resolved == "/api", "sent %q, which resolves to %q", sent, resolved)
		})
	}
}

// Many concurrent requests through the proxy, some of them to a failing
// endpoint: every one succeeds, and the accounting returns to zero.
func TestConcurrentWithFailingEndpoint(t *testing.T) {
	a := newUpstream(t, streamTokens(3))
	b := newUpstream(t, hangUp(""))
	c := newUpstream(t, streamTokens(3))
	h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 3, Budget: unlimited{}}}, a, b, c)
	gw := h.proxy(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range 30 {
		wg.Go(func() {
			resp, err := client.Post(gw.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
			if err != nil {
				failures.Add(1)
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "[DONE]\n\n") {
				failures.Add(1)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, failures.Load())
	assert.Positive(t, b.hits.Load())
}

type unlimited struct{}

func (unlimited) Start()                     {}
func (unlimited) Withdraw() bool             { return true }
func (unlimited) Finish(bool, retry.Outcome) {}

type denyAll struct{ finished atomic.Int64 }

func (*denyAll) Start()                       {}
func (*denyAll) Withdraw() bool               { return false }
func (d *denyAll) Finish(bool, retry.Outcome) { d.finished.Add(1) }

type recorder struct {
	mu   sync.Mutex
	keys []string
	errs []error
}

func (r *recorder) Report(key string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	r.errs = append(r.errs, err)
}

func TestNoRetryWhen(t *testing.T) {
	cases := []struct {
		name   string
		h      http.HandlerFunc
		cfg    func(*Config)
		status int
		err    error
	}{
		{"budget spent", status(http.StatusServiceUnavailable), func(c *Config) { c.Retry.Budget = &denyAll{} }, http.StatusServiceUnavailable, nil},
		{"pushback forbids", status(http.StatusServiceUnavailable, retry.HeaderGRPCPushback, "-1"), nil, http.StatusServiceUnavailable, nil},
		{"one attempt", hangUp(""), func(c *Config) { c.Retry.MaxAttempts = 1 }, 0, retry.ErrExhausted},
		{"custom classifier", status(http.StatusInternalServerError), func(c *Config) {
			c.Retry.Classify = retry.OnCodes([]int{http.StatusServiceUnavailable}, nil)
		}, http.StatusInternalServerError, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, c.h)
			b := newUpstream(t, streamTokens(1))
			var cfg Config
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			h := newHarness(t, fixed{}, cfg, a, b)
			resp, err := do(t, h, chatBody)
			if c.err != nil {
				assert.ErrorIs(t, err, c.err)
			} else {
				require.NoError(t, err)
				assert.Equal(t, c.status, resp.StatusCode)
				_, _ = readAll(t, resp)
			}
			assert.EqualValues(t, 0, b.hits.Load(), "not retried")
		})
	}
}

func TestReporterAndStore(t *testing.T) {
	a := newUpstream(t, status(http.StatusServiceUnavailable))
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Endpoint-Load-Metrics", "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_running=3")
		streamTokens(1)(w, r)
	})
	rec := &recorder{}
	store, err := signals.NewStore(signals.StoreConfig{})
	require.NoError(t, err)
	budget := &denyAll{}
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Reporter: rec, Budget: unlimitedFinish{budget}}, Store: store}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	rec.mu.Lock()
	assert.Equal(t, []string{a.URL, b.URL}, rec.keys)
	var se *retry.StatusError
	assert.ErrorAs(t, rec.errs[0], &se)
	assert.NoError(t, rec.errs[1])
	rec.mu.Unlock()
	assert.EqualValues(t, 2, budget.finished.Load(), "Finish once per attempt")
	l, ok := store.Load(b.URL)
	require.True(t, ok)
	assert.Equal(t, 3, l.Running)
	assert.InDelta(t, 0.5, l.KVUsage, 1e-9)
}

// unlimitedFinish grants every retry and counts Finish calls.
type unlimitedFinish struct{ d *denyAll }

func (u unlimitedFinish) Start()                         {}
func (u unlimitedFinish) Withdraw() bool                 { return true }
func (u unlimitedFinish) Finish(r bool, o retry.Outcome) { u.d.Finish(r, o) }

// frozenClock is an injected clock that never moves.
type frozenClock struct{ t time.Time }

func (c frozenClock) Now() time.Time { return c.t }

// TestRetryDeadlineOnWallClock: the request's deadline is the context's,
// on the wall clock, whatever clock Config.Retry.Clock injects: a retry that
// fits before it is sent, however far the injected clock is from the wall
// clock's time.
func TestRetryDeadlineOnWallClock(t *testing.T) {
	a := newUpstream(t, status(http.StatusServiceUnavailable))
	b := newUpstream(t, streamTokens(1))
	clock := frozenClock{time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)}
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Clock: clock}}, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the retry was refused for a deadline a minute away")
	assert.EqualValues(t, 1, b.hits.Load())
}

// TestShortBodyDecodedThenClosed: a short non-streaming answer that the
// caller decodes and then closes, without another Read for the EOF that
// came with its last bytes, ends normally: its pick and the reporter are
// told nil, not that the body was closed early.
func TestShortBodyDecodedThenClosed(t *testing.T) {
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"hi"}],"usage":{"completion_tokens":1}}`)
	})
	rec := &recorder{}
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Reporter: rec}}, a)
	resp, err := do(t, h, `{"model":"m","prompt":"x"}`)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	require.NoError(t, resp.Body.Close())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.errs, 1)
	assert.NoError(t, rec.errs[0], "a body read whole was reported as closed early")
}

// A request's Expect: 100-continue is not sent on: the Transport has read
// the body already, and the endpoint would otherwise be waited for before
// the body is sent, on every attempt.
func TestExpectNotForwarded(t *testing.T) {
	var got atomic.Value
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Expect"))
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	})
	h := newHarness(t, fixed{}, Config{}, a)
	req, err := http.NewRequest(http.MethodPost, "http://gateway.invalid/v1/completions", strings.NewReader(`{"model":"m","prompt":"x"}`))
	require.NoError(t, err)
	req.Header.Set("Expect", "100-continue")
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, "", got.Load(), "Expect reached the endpoint")
	assert.Equal(t, "100-continue", req.Header.Get("Expect"), "the caller's request was changed")
}

// FuzzResolveDotSegments checks that a request path, once its dot segments
// are resolved, has none left and, appended to a base path, resolves under
// it; a path without dot segments is left as it is.
func FuzzResolveDotSegments(f *testing.F) {
	for _, s := range []string{"/v1/models", "/../x", "/a/./b/../", "/%2e%2e/x", "/v1/..%2F..%2Fx", "..", "", "/", "//..//", "/a/.../b", "x/../../y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse("http://gw.invalid/" + strings.TrimPrefix(raw, "/"))
		if err != nil {
			return
		}
		before := *u
		resolveDotSegments(u)
		if !hasDotSegment(before.Path) {
			if *u != before {
				t.Fatalf("%q changed to %q", before.String(), u.String())
			}
			return
		}
		if hasDotSegment(u.Path) || !strings.HasPrefix(u.Path, "/") || u.RawPath != "" {
			t.Fatalf("%q resolved to %q", before.Path, u.Path)
		}
		if joined := path.Clean(joinPath("/api", u.EscapedPath())); joined != "/api" && !strings.HasPrefix(joined, "/api/") {
			t.Fatalf("%q resolved to %q, which climbs out of /api: %q", before.Path, u.Path, joined)
		}
	})
}
