package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/signals"
)

// sleepyReplica is a vLLM server as far as the picker sees it: its
// /metrics carry vllm:engine_sleep_state as vLLM's PrometheusStatLogger
// writes it (vllm/v1/metrics/loggers.py, record_sleep_state): awake 0 and
// weights_offloaded 1 after POST /sleep?level=1, awake 1 after wake_up. It
// answers chat completions, and counts them.
type sleepyReplica struct {
	srv        *httptest.Server
	asleep     atomic.Bool
	badMetrics atomic.Bool // /metrics answers 500
	chats      atomic.Int64
}

func startSleepyReplica(t *testing.T) *sleepyReplica {
	t.Helper()
	r := &sleepyReplica{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// addr is the replica's ip:port, its key in the picker.
func (r *sleepyReplica) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *sleepyReplica) serve(w http.ResponseWriter, req *http.Request) {
	switch req.URL.Path {
	case "/metrics":
		if r.badMetrics.Load() {
			http.Error(w, "unavailable", http.StatusInternalServerError)
			return
		}
		awake, offloaded := 1, 0
		if r.asleep.Load() {
			awake, offloaded = 0, 1
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\n"+
			"vllm:num_requests_running{engine=\"0\",model_name=\"%[1]s\"} 0.0\n"+
			"# TYPE vllm:num_requests_waiting gauge\n"+
			"vllm:num_requests_waiting{engine=\"0\",model_name=\"%[1]s\"} 0.0\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\n"+
			"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"%[1]s\"} 0.0\n"+
			"# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n"+
			"# TYPE vllm:engine_sleep_state gauge\n"+
			"vllm:engine_sleep_state{engine=\"0\",model_name=\"%[1]s\",sleep_state=\"awake\"} %[2]d.0\n"+
			"vllm:engine_sleep_state{engine=\"0\",model_name=\"%[1]s\",sleep_state=\"weights_offloaded\"} %[3]d.0\n"+
			"vllm:engine_sleep_state{engine=\"0\",model_name=\"%[1]s\",sleep_state=\"discard_all\"} 0.0\n",
			engine.DefaultModel, awake, offloaded)
	case "/v1/chat/completions":
		_, _ = io.Copy(io.Discard, req.Body)
		r.chats.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":%q,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, engine.DefaultModel)
	default:
		http.NotFound(w, req)
	}
}

// healthy reports whether the balancer has key healthy.
func healthy(t *testing.T, b *llmlb.Balancer, key string) bool {
	t.Helper()
	e, ok := b.StatsOf(key)
	require.True(t, ok, "no endpoint %s", key)
	return e.Healthy
}

// A replica whose engine is asleep reports no requests, the idlest of
// all; the picker sends it none while the other is awake, sends it
// requests again once it wakes, and answers 503 while both sleep.
func TestSleepingEngineNotPicked(t *testing.T) {
	a, b := startSleepyReplica(t), startSleepyReplica(t)
	e := startEPP(t, "-endpoints", a.addr()+","+b.addr())
	admin := "http://" + e.s.adminL.Addr().String()
	send := func(round string, n int) {
		t.Helper()
		for i := range n {
			code, _, body := e.complete(context.Background(), t, fmt.Sprint(round, i), fmt.Sprintf("%s request %d", round, i), 4, false)
			require.Equal(t, http.StatusOK, code, "%s request %d: %s", round, i, body)
		}
	}
	// settled waits until the scrapes have marked each replica as want
	// says: healthy, or held out as asleep.
	settled := func(want map[*sleepyReplica]bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			for r, awake := range want {
				if healthy(t, e.s.b, r.addr()) != awake {
					return false
				}
			}
			return true
		}, 10*time.Second, 5*time.Millisecond, "the scrapes did not mark the replicas")
	}
	replica := func(r *sleepyReplica) debugEndpoint {
		t.Helper()
		var st debugState
		require.NoError(t, json.Unmarshal([]byte(get(t, e.client, admin+"/debug/llmlb")), &st))
		for _, de := range st.Replicas {
			if de.Key == r.addr() {
				return de
			}
		}
		t.Fatalf("no replica %s in the debug view", r.addr())
		return debugEndpoint{}
	}

	send("both awake", 10)
	require.EqualValues(t, 10, a.chats.Load()+b.chats.Load())

	// a sleeps: every request goes to b.
	a.asleep.Store(true)
	settled(map[*sleepyReplica]bool{a: false, b: true})
	if de := replica(a); !de.Asleep || de.Healthy {
		t.Errorf("sleeping replica in the debug view: asleep %v, healthy %v; want asleep, not healthy", de.Asleep, de.Healthy)
	}
	if de := replica(b); de.Asleep || !de.Healthy {
		t.Errorf("awake replica in the debug view: asleep %v, healthy %v", de.Asleep, de.Healthy)
	}
	fromA, fromB := a.chats.Load(), b.chats.Load()
	send("a asleep", 20)
	require.Equal(t, fromA, a.chats.Load(), "the sleeping replica got requests")
	require.Equal(t, fromB+20, b.chats.Load())

	// a wakes and b sleeps: every request goes to a.
	a.asleep.Store(false)
	b.asleep.Store(true)
	settled(map[*sleepyReplica]bool{a: true, b: false})
	fromA, fromB = a.chats.Load(), b.chats.Load()
	send("b asleep", 20)
	require.Equal(t, fromA+20, a.chats.Load(), "the woken replica is picked again")
	require.Equal(t, fromB, b.chats.Load(), "the sleeping replica got requests")

	// Both asleep: 503, rather than a request held by a sleeping engine.
	a.asleep.Store(true)
	settled(map[*sleepyReplica]bool{a: false, b: false})
	req, err := http.NewRequest("POST", e.front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"emulated","messages":[{"role":"user","content":"anyone awake?"}]}`))
	require.NoError(t, err)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "rejected-no-endpoints", resp.Header.Get(extproc.DroppedReasonHeader))
	require.Equal(t, fromA+20, a.chats.Load())
	require.Equal(t, fromB, b.chats.Load())

	// Both awake: both picked again.
	a.asleep.Store(false)
	b.asleep.Store(false)
	settled(map[*sleepyReplica]bool{a: true, b: true})
	send("both awake again", 2)
}

// lockedBuffer is a log sink for a test that reads it while the picker
// writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), substr)
}

// The sleep is logged once per change, and an observation older than the
// balancer trusts (the scrapes failing since) no longer holds the replica
// out.
func TestScrapedSleepState(t *testing.T) {
	r := startSleepyReplica(t)
	var logs lockedBuffer
	b, err := llmlb.New(llmlb.LeastOutstanding())
	require.NoError(t, err)
	require.NoError(t, b.Update([]llmlb.Endpoint{replica(r.addr())}))
	s := &server{log: slog.New(slog.NewTextHandler(&logs, nil)), b: b, sleep: &sleeping{b: b}, maxAge: time.Hour}
	s.scraper, err = signals.NewScraper(signals.Config{OnResult: s.scraped})
	require.NoError(t, err)
	defer s.scraper.Close()
	require.NoError(t, s.scraper.SetTargets(map[string]string{r.addr(): r.srv.URL + "/metrics"}))
	scrape := func() {
		t.Helper()
		_, _ = s.scraper.Scrape(context.Background(), r.addr())
	}

	r.asleep.Store(true)
	for range 3 {
		scrape()
		require.False(t, healthy(t, b, r.addr()))
	}
	require.Equal(t, 1, logs.count("engine asleep"), "the sleep is logged once")

	r.asleep.Store(false)
	for range 3 {
		scrape()
		require.True(t, healthy(t, b, r.addr()))
	}
	require.Equal(t, 1, logs.count("engine awake"), "the waking is logged once")

	// Asleep, then the scrapes fail: the last observation holds the
	// replica out while the balancer trusts it, and not after.
	r.asleep.Store(true)
	scrape()
	require.False(t, healthy(t, b, r.addr()))
	r.badMetrics.Store(true)
	scrape()
	require.False(t, healthy(t, b, r.addr()), "held out while the observation is trusted")
	s.maxAge = time.Nanosecond // the observation is now too old to trust
	scrape()
	require.True(t, healthy(t, b, r.addr()), "an untrusted observation holds nothing out")
	require.Equal(t, 2, logs.count("engine awake"))
}

// A replica held out as asleep that leaves the pool is forgotten: when it
// comes back it joins healthy, as a new replica does, and the first scrape
// that finds it asleep holds it out again.
func TestSleepingForgetsDeparted(t *testing.T) {
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	m := newMembership(t, source{static: []string{a, b}})
	m.sleep = &sleeping{b: m.b}
	ctx := context.Background()
	require.NoError(t, m.refresh(ctx))
	require.True(t, m.sleep.set(a, true))
	require.False(t, healthy(t, m.b, a))
	require.True(t, m.sleep.is(a))

	m.src.static = []string{b}
	require.NoError(t, m.refresh(ctx))
	require.False(t, m.sleep.is(a), "a departed replica is forgotten")

	m.src.static = []string{a, b}
	require.NoError(t, m.refresh(ctx))
	require.True(t, healthy(t, m.b, a), "a replica that comes back joins healthy")
	require.True(t, m.sleep.set(a, true), "and is held out by the next scrape that finds it asleep")
	require.False(t, healthy(t, m.b, a))

	// A replica that is not a member is not marked, nor remembered.
	require.False(t, m.sleep.set("10.0.0.9:8000", true))
	require.False(t, m.sleep.is("10.0.0.9:8000"))
}
