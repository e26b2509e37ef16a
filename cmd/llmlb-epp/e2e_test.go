package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/internal/natstest"
)

// epp is llmlb-epp running in the test, with a data plane in front of it.
type epp struct {
	s      *server
	front  *httptest.Server
	client *http.Client
	health healthpb.HealthClient
	conns  []*grpc.ClientConn
	cancel context.CancelFunc
	done   chan error
}

// startEPP runs llmlb-epp with args (listeners on free loopback ports) and
// a data plane in front of it that reaches it over TLS, as gateways do.
func startEPP(t *testing.T, args ...string) *epp {
	t.Helper()
	args = append([]string{"-grpc-addr", "127.0.0.1:0", "-grpc-health-addr", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-drain-delay", "0", "-scrape", "100ms"}, args...)
	o, err := parseFlags(args, io.Discard)
	require.NoError(t, err)
	o.logOut = testWriter{t}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *server, 1)
	e := &epp{cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- run(ctx, o, func(s *server) { started <- s }) }()
	select {
	case e.s = <-started:
	case err := <-e.done:
		t.Fatalf("llmlb-epp did not start: %v", err)
	}
	cc, err := grpc.NewClient(e.s.grpcL.Addr().String(),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	require.NoError(t, err)
	hc, err := grpc.NewClient(e.s.healthL.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	e.conns = []*grpc.ClientConn{cc, hc}
	e.health = healthpb.NewHealthClient(hc)
	upstream := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	e.front = httptest.NewServer(&dataPlane{epp: extprocv3.NewExternalProcessorClient(cc), upstream: upstream, chunk: 1000})
	e.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(func() {
		e.stop(t)
		e.front.Close()
		upstream.CloseIdleConnections()
		e.client.CloseIdleConnections()
		for _, c := range e.conns {
			_ = c.Close()
		}
	})
	require.Eventually(t, func() bool { return e.serving("readiness") }, 5*time.Second, 10*time.Millisecond)
	return e
}

// stop drains llmlb-epp and waits for run to return; later calls do nothing.
func (e *epp) stop(t *testing.T) {
	e.cancel()
	if e.done == nil {
		return
	}
	select {
	case err := <-e.done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("llmlb-epp did not stop")
	}
	e.done = nil
}

func (e *epp) serving(service string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// complete sends a chat completion through the data plane and returns the
// status and the number of data events (or the body, if not streamed).
func (e *epp) complete(ctx context.Context, t *testing.T, session, prompt string, maxTokens int, stream bool) (int, int, string) {
	body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		engine.DefaultModel, stream, maxTokens, prompt)
	req, err := http.NewRequestWithContext(ctx, "POST", e.front.URL+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if !stream || resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, 0, string(b)
	}
	events, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
			done = done || sc.Text() == "data: [DONE]"
		}
	}
	require.NoError(t, sc.Err())
	require.True(t, done, "the stream ended with [DONE]")
	return resp.StatusCode, events, ""
}

func startEngines(t *testing.T, n int) (*e2e.Cluster, string) {
	t.Helper()
	c, err := e2e.StartCluster(n, engine.Config{MaxRunning: 4, KVBlocks: 512, Speedup: 20})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	var addrs []string
	for _, u := range c.URLs {
		addrs = append(addrs, strings.TrimPrefix(u, "http://"))
	}
	return c, strings.Join(addrs, ",")
}

// TestEndToEnd runs requests' whole lives over real sockets: client ->
// data plane -> llmlb-epp (ext_proc over TLS) -> emulated engine, streamed
// back through the picker; then a client that disconnects mid-stream.
func TestEndToEnd(t *testing.T) {
	c, addrs := startEngines(t, 3)
	e := startEPP(t, "-endpoints", addrs, "-fallbacks", "1", "-max-in-flight", "100")
	require.True(t, e.serving(extprocv3.ExternalProcessor_ServiceDesc.ServiceName))
	require.True(t, e.serving("inference-extension"))
	require.True(t, e.serving("liveness"))

	// Six sessions, each a conversation with a long shared head.
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for s := range 6 {
		wg.Go(func() {
			head := strings.Repeat(fmt.Sprintf("session %d shares this long system prompt. ", s), 60)
			for turn := range 5 {
				code, events, _ := e.complete(ctx, t, fmt.Sprint("s", s), head+fmt.Sprint(" turn ", turn), 8, true)
				mu.Lock()
				statuses[code]++
				mu.Unlock()
				require.Greater(t, events, 1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, map[int]int{200: 30}, statuses)
	code, _, body := e.complete(ctx, t, "x", "not streamed", 4, false)
	require.Equal(t, 200, code)
	require.Contains(t, body, "choices")

	require.Eventually(t, func() bool { return idle(e.s) }, 5*time.Second, 10*time.Millisecond, "%+v", e.s.b.Stats())
	var finished, hits int64
	for _, eng := range c.Engines {
		st := eng.Stats()
		finished += st.Finished
		hits += st.PrefixHits
	}
	require.EqualValues(t, 31, finished, "each request reached exactly one engine")
	require.Positive(t, hits, "sessions reuse the engines' prefix caches")

	// A client that goes away after the first event.
	dctx, disconnect := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(dctx, "POST", e.front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"emulated","stream":true,"max_tokens":3000,"messages":[{"role":"user","content":"long answer"}]}`))
	require.NoError(t, err)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "), line)
	require.False(t, idle(e.s))
	disconnect()
	_ = resp.Body.Close()
	require.Eventually(t, func() bool { return idle(e.s) }, 5*time.Second, 10*time.Millisecond, "%+v", e.s.b.Stats())
	require.Equal(t, 0, *e.s.state().InFlight)

	// The admin listener: metrics and the debug view.
	admin := "http://" + e.s.adminL.Addr().String()
	metrics := get(t, e.client, admin+"/metrics")
	for _, name := range []string{"llmlb_picks_total", "gen_ai_server_time_to_first_token_seconds", "llmlb_endpoint_outstanding"} {
		require.Contains(t, metrics, name)
	}
	// Every replica is scraped at start, each in its own time: on a busy
	// machine the view may be read before the last first scrape ends.
	var st debugState
	require.Eventually(t, func() bool {
		st = debugState{}
		require.NoError(t, json.Unmarshal([]byte(get(t, e.client, admin+"/debug/llmlb")), &st))
		for _, r := range st.Replicas {
			if r.Scrape == nil || r.Scrape.Scrapes == 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "a replica never scraped")
	require.Len(t, st.Replicas, 3)
	require.True(t, st.Ready)
}

// TestDrain: on shutdown the picker reports NOT_SERVING, refuses new
// streams, and lets a stream in flight finish.
func TestDrain(t *testing.T) {
	_, addrs := startEngines(t, 2)
	e := startEPP(t, "-endpoints", addrs)
	ctx := context.Background()
	req, err := http.NewRequestWithContext(ctx, "POST", e.front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"emulated","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"drain me"}]}`))
	require.NoError(t, err)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "), line)

	e.cancel()
	require.Eventually(t, func() bool { return !e.serving("readiness") }, 5*time.Second, 5*time.Millisecond)
	rest, err := io.ReadAll(r)
	require.NoError(t, err, "the stream in flight finishes")
	require.Contains(t, string(rest), "data: [DONE]")
	e.stop(t)
	require.True(t, idle(e.s))
	code, _, _ := e.complete(ctx, t, "late", "after the drain", 4, false)
	require.Equal(t, http.StatusInternalServerError, code, "no picker, FailClose")
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func idle(s *server) bool {
	for _, e := range s.b.Stats() {
		if e.Outstanding != 0 || e.Queued != 0 || e.PrefillTokens != 0 || e.DecodeTokens != 0 {
			return false
		}
	}
	return true
}

// testWriter sends the command's log to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// Two pickers sharing over a real NATS server: each sees the other's
// request in flight.
func TestShareOverNATS(t *testing.T) {
	ns := natstest.Start(t, -1)
	_, addrs := startEngines(t, 2)
	a := startEPP(t, "-endpoints", addrs, "-nats", ns.ClientURL(), "-share-id", "a", "-share-interval", "20ms")
	b := startEPP(t, "-endpoints", addrs, "-nats", ns.ClientURL(), "-share-id", "b", "-share-interval", "20ms")
	require.Eventually(t, func() bool {
		return a.s.group.Stats().Peers == 1 && b.s.group.Stats().Peers == 1
	}, 10*time.Second, 10*time.Millisecond)

	ctx := context.Background()
	req, err := http.NewRequestWithContext(ctx, "POST", a.front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"emulated","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"a long answer"}]}`))
	require.NoError(t, err)
	resp, err := a.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var key string
	for _, st := range a.s.b.Stats() {
		if st.Outstanding == 1 {
			key = st.Key
		}
	}
	require.NotEmpty(t, key, "the first picker has the request in flight")
	require.Eventually(t, func() bool {
		l, ok := b.s.group.Load(key)
		return ok && l.Running+l.Waiting >= 1
	}, 10*time.Second, 10*time.Millisecond, "the second picker counts the first's request at %s", key)
	var st debugState
	require.NoError(t, json.Unmarshal([]byte(get(t, http.DefaultClient, "http://"+b.s.adminL.Addr().String()+"/debug/llmlb")), &st))
	require.NotNil(t, st.Share)
	require.Equal(t, "b", st.Share.ID)
	require.True(t, st.Share.Connected)
	require.Equal(t, 1, st.Share.Peers)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
}

// TestBufferedLargeBody: in BUFFERED mode the data plane sends the whole
// body in one message; one larger than grpc-go's default 4 MiB limit but
// under -max-body-bytes (or its default, for 0) is routed, and one just over
// the cap gets 413, not a failed stream.
func TestBufferedLargeBody(t *testing.T) {
	type body struct {
		prompt int
		want   int // the immediate response's status, or 0 for a route
	}
	for _, c := range []struct {
		maxBody string
		bodies  []body
	}{
		{"6000000", []body{{5 << 20, 0}, {6000000, http.StatusRequestEntityTooLarge}}},
		{"0", []body{{5 << 20, 0}, {httplb.DefaultMaxBodyBytes, http.StatusRequestEntityTooLarge}}},
		// No cap the gRPC message limit can follow: the largest it has.
		{"9223372036854775807", []body{{5 << 20, 0}}},
	} {
		t.Run("max-body-bytes="+c.maxBody, func(t *testing.T) {
			e := startEPP(t, "-endpoints", "10.0.0.1:8000,10.0.0.2:8000", "-max-body-bytes", c.maxBody)
			for _, b := range c.bodies {
				m, err := sendBuffered(t, e, b.prompt)
				require.NoError(t, err, "a prompt of %d bytes", b.prompt)
				if b.want == 0 {
					require.NotNil(t, m.GetRequestBody(), "routed in the body answer: %v", m)
				} else {
					require.EqualValues(t, b.want, m.GetImmediateResponse().GetStatus().GetCode())
				}
			}
			require.Eventually(t, func() bool { return idle(e.s) }, 5*time.Second, 5*time.Millisecond)
		})
	}
}

// sendBuffered sends a completion request with a prompt of n bytes to e in
// BUFFERED mode and returns the answer to its body.
func sendBuffered(t *testing.T, e *epp, n int) (*extprocv3.ProcessingResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(e.conns[0]).Process(ctx)
	require.NoError(t, err)
	body := fmt.Sprintf(`{"model":"m","max_tokens":4,"prompt":%q}`, strings.Repeat("x", n))
	require.NoError(t, s.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
			Headers: []*corev3.HeaderValue{hv(":method", "POST"), hv(":path", "/v1/completions"), hv("content-type", "application/json")}}}},
	}))
	m, err := s.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetRequestHeaders(), "headers answered first: %v", m)
	require.NoError(t, s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}))
	return s.Recv()
}

// TestDrainWithHealthWatcher: the stream of a client watching the health
// service on the ext_proc port (a grpc-go client with health checking does)
// ends when the listener stops: it does not hold the drain until
// -drain-timeout.
func TestDrainWithHealthWatcher(t *testing.T) {
	o, err := parseFlags([]string{"-grpc-addr", "127.0.0.1:0", "-grpc-health-addr", "", "-admin", "",
		"-endpoints", "10.0.0.1:8000", "-drain-delay", "0", "-drain-timeout", "1m", "-scrape", "-1s"}, io.Discard)
	require.NoError(t, err)
	o.logOut = testWriter{t}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan *server, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, func(s *server) { started <- s }) }()
	s := <-started
	cc, err := grpc.NewClient(s.grpcL.Addr().String(),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	require.NoError(t, err)
	defer cc.Close()
	w, err := healthpb.NewHealthClient(cc).Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "readiness"})
	require.NoError(t, err)
	m, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, m.GetStatus())

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the drain waited for the health watcher")
	}
	for err == nil { // NOT_SERVING may come first
		_, err = w.Recv()
	}
	require.NotEqual(t, io.EOF, err, "the watch ended when the listener stopped, not by itself")
}

// TestNotReadyWhileDraining: a picker that first reads its replicas while
// draining stays NOT_SERVING, and its debug view says it is not ready.
func TestNotReadyWhileDraining(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints") // not there yet
	o, err := parseFlags([]string{"-grpc-addr", "127.0.0.1:0", "-grpc-health-addr", "127.0.0.1:0", "-admin", "",
		"-endpoints-file", path, "-refresh", "10ms", "-drain-delay", "2s", "-scrape", "-1s"}, io.Discard)
	require.NoError(t, err)
	draining := make(chan struct{})
	o.logOut = lineWatcher{w: testWriter{t}, substr: "llmlb-epp draining", seen: draining, once: new(sync.Once)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan *server, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, func(s *server) { started <- s }) }()
	s := <-started
	hc, err := grpc.NewClient(s.healthL.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer hc.Close()
	e := &epp{health: healthpb.NewHealthClient(hc)}
	require.False(t, e.serving("readiness"), "no replicas read yet")

	cancel()
	<-draining
	require.NoError(t, os.WriteFile(path, []byte("10.0.0.1:8000\n"), 0o644))
	require.Eventually(t, func() bool { return s.members.status().synced }, 5*time.Second, 5*time.Millisecond)
	for _, svc := range readyServices {
		require.False(t, e.serving(svc), "%q reports SERVING while draining", svc)
	}
	require.False(t, s.state().Ready, "the debug view reports ready while draining")
	require.NoError(t, <-done)
}

// lineWatcher writes to w and closes seen, once, at the first write that
// contains substr.
type lineWatcher struct {
	w      io.Writer
	substr string
	seen   chan struct{}
	once   *sync.Once
}

func (l lineWatcher) Write(p []byte) (int, error) {
	if strings.Contains(string(p), l.substr) {
		l.once.Do(func() { close(l.seen) })
	}
	return l.w.Write(p)
}

// TestMaxConcurrentStreams: one data plane connection holds at most
// -max-concurrent-streams ext_proc streams at once; a further one waits
// until a stream ends.
func TestMaxConcurrentStreams(t *testing.T) {
	e := startEPP(t, "-endpoints", "10.0.0.1:8000", "-max-concurrent-streams", "2")
	client := extprocv3.NewExternalProcessorClient(e.conns[0])
	open := func(ctx context.Context) (extprocv3.ExternalProcessor_ProcessClient, error) {
		s, err := client.Process(ctx)
		if err != nil {
			return nil, err
		}
		// A request without a body is routed on its headers.
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{
				Headers: []*corev3.HeaderValue{hv(":method", "GET"), hv(":path", "/v1/models")}}}}}); err != nil {
			return nil, err
		}
		_, err = s.Recv()
		return s, err
	}
	var cancels []context.CancelFunc
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		defer cancel()
		_, err := open(ctx)
		require.NoError(t, err)
	}
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := open(short)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "a third stream on the connection waits: %v", err)

	cancels[0]()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = open(ctx)
	require.NoError(t, err, "a stream ended: room for another")
}
