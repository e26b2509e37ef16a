package signals_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

func newScraper(t testing.TB, cfg signals.Config) *signals.Scraper {
	t.Helper()
	s, err := signals.NewScraper(cfg)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func TestScrapeEveryEngine(t *testing.T) {
	cases := []struct {
		file, contentType string
		engine            signals.Engine
		running, waiting  int
		kv                float64
	}{
		{"vllm.prom", textType, signals.EngineVLLM, 12, 3, 0.42},
		{"vllm_openmetrics.prom", omType, signals.EngineVLLM, 12, 3, 0.42},
		{"sglang.prom", textType, signals.EngineSGLang, 7, 2, 0.28},
		{"trtllm.prom", textType, signals.EngineTRTLLM, 9, 4, 0.55},
		{"triton.prom", textType, signals.EngineTriton, 5, 2, 0.369629},
		{"llamacpp.prom", textType, signals.EngineLlamaCpp, 2, 1, 0.125},
	}
	clock := newFakeClock()
	s := newScraper(t, signals.Config{Clock: clock})
	targets := map[string]string{}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			srv := newSwitchServer(t, serve(c.contentType, fixture(t, c.file)))
			targets[c.file] = srv.URL + "/metrics"
			require.NoError(t, s.SetTargets(targets))
			clock.Advance(time.Second)
			o, err := s.Scrape(context.Background(), c.file)
			require.NoError(t, err)
			assert.Equal(t, c.engine, o.Engine)
			l, ok := s.Load(c.file)
			require.True(t, ok)
			assert.Equal(t, clock.Now(), l.At, "At is when the scrape was sent")
			assert.Equal(t, c.running, l.Running)
			assert.Equal(t, c.waiting, l.Waiting)
			assert.InDelta(t, c.kv, l.KVUsage, 1e-12)
			st, ok := s.Status(c.file)
			require.True(t, ok)
			assert.Equal(t, c.engine, st.Engine)
			assert.Equal(t, clock.Now(), st.LastSuccess)
			assert.NoError(t, st.LastError)
			assert.Equal(t, uint64(1), st.Scrapes)
			assert.Positive(t, st.LastDuration)
		})
	}
	assert.Len(t, s.Statuses(), len(cases))
}

// An engine upgrade renames vllm:gpu_cache_usage_perc to
// vllm:kv_cache_usage_perc between two scrapes of the same endpoint.
func TestScrapeEngineUpgrade(t *testing.T) {
	srv := newSwitchServer(t, serve(textType, fixture(t, "vllm_v0.prom")))
	s := newScraper(t, signals.Config{Engine: signals.EngineVLLM})
	require.NoError(t, s.SetTargets(map[string]string{"a": srv.URL}))
	o, err := s.Scrape(context.Background(), "a")
	require.NoError(t, err)
	assert.InDelta(t, 0.9, o.KVUsage, 1e-12)

	srv.Set(serve(textType, fixture(t, "vllm.prom")))
	o, err = s.Scrape(context.Background(), "a")
	require.NoError(t, err)
	assert.InDelta(t, 0.42, o.KVUsage, 1e-12)
	l, ok := s.Load("a")
	require.True(t, ok)
	assert.InDelta(t, 0.42, l.KVUsage, 1e-12)
	assert.Equal(t, 27153, l.KVBlocks)
	assert.Equal(t, 16, l.BlockSize)
}

// gzipped returns body compressed with gzip.
func gzipped(t testing.TB, body []byte) []byte {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(body)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// gzipBomb returns n bytes of newlines (a valid empty exposition), gzipped
// as a sequence of 1 MiB gzip members, which readers concatenate.
func gzipBomb(t testing.TB, n int) []byte {
	member := gzipped(t, bytes.Repeat([]byte{'\n'}, 1<<20))
	return bytes.Repeat(member, n>>20)
}

func TestScrapeBadEndpoints(t *testing.T) {
	good := fixture(t, "vllm.prom")
	head := "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
	bomb := gzipBomb(t, 100<<20)
	t.Logf("gzip bomb: %d bytes compressed, 100 MiB inflated", len(bomb))
	const maxBody = 4 << 20
	cases := []struct {
		name    string
		handler http.Handler
		want    error  // the wrapped cause
		mention string // in the message
	}{
		{"malformed", serve(textType, []byte("vllm:num_requests_running{ 1\n")), signals.ErrParse, ""},
		{"NaN", serve(textType, []byte(head+"vllm:num_requests_waiting NaN\n")), signals.ErrInvalidValue, "vllm:num_requests_waiting is NaN"},
		{"Inf", serve(textType, []byte(head+"vllm:num_requests_waiting +Inf\n")), signals.ErrInvalidValue, "vllm:num_requests_waiting is +Inf"},
		{"negative", serve(textType, []byte(head+"vllm:num_requests_waiting -1\n")), signals.ErrInvalidValue, "vllm:num_requests_waiting is -1"},
		{"huge", serve(textType, []byte(head+"vllm:num_requests_waiting 1e300\n")), signals.ErrInvalidValue, "plausible"},
		{"missing metric", serve(textType, []byte(head)), signals.ErrMissingMetric, "vllm:num_requests_waiting"},
		{"html with 200", serve("text/html", []byte("<html><body>Welcome to nginx!</body></html>")), signals.ErrParse, "text/html"},
		{"html as text with 200", serve("", []byte("<!DOCTYPE html><html><body>login</body></html>\n")), signals.ErrParse, ""},
		{"500", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "engine dead", http.StatusInternalServerError)
		}), signals.ErrHTTPStatus, "500 Internal Server Error"},
		{"404", http.NotFoundHandler(), signals.ErrHTTPStatus, "404"},
		{"never answers", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}), context.DeadlineExceeded, "deadline exceeded"},
		{"stalls mid-body", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(good[:1000])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}), context.DeadlineExceeded, "deadline exceeded"},
		{"100 MiB body", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", textType)
			line := []byte("# " + strings.Repeat("x", 1<<16-3) + "\n")
			for i := 0; i < 100<<20/len(line); i++ {
				if _, err := w.Write(line); err != nil {
					return // the client hung up at the cap
				}
			}
		}), signals.ErrBodyTooLarge, "more than 4194304 bytes"},
		{"8 MiB of headers", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pad := strings.Repeat("x", 64<<10)
			for i := range 128 {
				w.Header().Set(fmt.Sprintf("X-Pad-%d", i), pad)
			}
			w.Header().Set("Content-Type", textType)
			_, _ = w.Write(good)
		}), nil, "headers exceeded"},
		{"redirect loop", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, r.URL.Path, http.StatusFound)
		}), nil, "stopped after 3 redirects"},
		{"gzip bomb", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", textType)
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(bomb)
		}), signals.ErrBodyTooLarge, "more than"},
		{"corrupt gzip", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write([]byte("not gzip at all"))
		}), nil, "gzip"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			srv := newSwitchServer(t, serve(textType, good))
			timeout := 10 * time.Second // only the hanging servers need to time out
			if c.want == context.DeadlineExceeded {
				timeout = 100 * time.Millisecond
			}
			s := newScraper(t, signals.Config{Clock: clock, Timeout: timeout, MaxAge: 10 * time.Second})
			require.NoError(t, s.SetTargets(map[string]string{"ep": srv.URL + "/metrics"}))
			_, err := s.Scrape(context.Background(), "ep")
			require.NoError(t, err)
			goodAt := clock.Now()

			srv.Set(c.handler)
			clock.Advance(time.Second)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = s.Scrape(context.Background(), "ep")
			runtime.ReadMemStats(&after)
			require.Error(t, err)
			t.Logf("error: %v", err)
			var se *signals.ScrapeError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, "ep", se.Key)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			assert.Contains(t, err.Error(), c.mention)
			assert.True(t, strings.HasPrefix(err.Error(), `signals: scrape of ep (`), "message %q", err)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*maxBody {
				t.Errorf("scrape allocated %d bytes; want at most %d", alloc, 3*maxBody)
			}

			// The last good observation is served until it is too old.
			l, ok := s.Load("ep")
			require.True(t, ok)
			assert.Equal(t, goodAt, l.At)
			assert.Equal(t, 12, l.Running)
			st, _ := s.Status("ep")
			assert.Equal(t, 1, st.ConsecutiveFailures)
			assert.Equal(t, uint64(2), st.Scrapes)
			assert.Equal(t, uint64(1), st.Failures)
			assert.Equal(t, goodAt, st.LastSuccess)
			assert.Equal(t, clock.Now(), st.LastErrorAt)
			assert.Equal(t, err, st.LastError)

			clock.Advance(9*time.Second + time.Millisecond)
			_, ok = s.Load("ep")
			assert.False(t, ok, "an observation older than MaxAge is not served")
			_, ok = s.Store().Load("ep")
			assert.True(t, ok, "the store itself has no max age")
		})
	}
}

// A caller's client without transparent decompression still gets the body
// capped after decompression.
func TestScrapeGzipCallerClient(t *testing.T) {
	body := fixture(t, "vllm.prom")
	srv := newSwitchServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(gzipped(t, body))
	}))
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	s := newScraper(t, signals.Config{Client: client})
	require.NoError(t, s.SetTargets(map[string]string{"a": srv.URL}))
	o, err := s.Scrape(context.Background(), "a")
	require.NoError(t, err)
	assert.Equal(t, 12, o.Running)

	s2 := newScraper(t, signals.Config{Client: client, MaxBodyBytes: 1000})
	require.NoError(t, s2.SetTargets(map[string]string{"a": srv.URL}))
	_, err = s2.Scrape(context.Background(), "a")
	require.ErrorIs(t, err, signals.ErrBodyTooLarge)
}

func TestScrapeUnknownEndpoint(t *testing.T) {
	s := newScraper(t, signals.Config{})
	_, err := s.Scrape(context.Background(), "nope")
	require.ErrorIs(t, err, signals.ErrUnknownEndpoint)
	_, ok := s.Status("nope")
	assert.False(t, ok)
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  signals.Config
	}{
		{"negative interval", signals.Config{Interval: -1}},
		{"tiny interval", signals.Config{Interval: time.Microsecond}},
		{"negative timeout", signals.Config{Timeout: -1}},
		{"jitter 1", signals.Config{Jitter: 1}},
		{"jitter NaN", signals.Config{Jitter: nan()}},
		{"negative body cap", signals.Config{MaxBodyBytes: -1}},
		{"negative concurrency", signals.Config{MaxConcurrent: -1}},
		{"negative endpoints", signals.Config{MaxEndpoints: -1}},
		{"unknown engine", signals.Config{Engine: 99}},
		{"negative max age", signals.Config{MaxAge: -time.Second}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := signals.NewScraper(c.cfg)
			require.ErrorIs(t, err, signals.ErrInvalidConfig)
		})
	}
	_, err := signals.NewScraper(signals.Config{Jitter: -1})
	assert.NoError(t, err, "negative jitter disables it")
}

func TestTargets(t *testing.T) {
	s := newScraper(t, signals.Config{MaxEndpoints: 2})
	for _, bad := range []struct{ key, url string }{
		{"", "http://a/metrics"},
		{"a", "ftp://a/metrics"},
		{"a", "/metrics"},
		{"a", "http://%zz"},
		{"a", "http:///metrics"},
	} {
		assert.ErrorIs(t, s.SetTargets(map[string]string{bad.key: bad.url}), signals.ErrInvalidConfig, "%q %q", bad.key, bad.url)
		assert.ErrorIs(t, s.SetTargets(map[string]string{"ok": "http://ok/metrics", bad.key: bad.url}), signals.ErrInvalidConfig,
			"%q %q next to a good target", bad.key, bad.url)
		assert.Empty(t, s.Statuses(), "a failed SetTargets changes nothing")
	}
	require.NoError(t, s.SetTargets(map[string]string{"a": "http://a/metrics", "b": "http://b/metrics"}))
	assert.ErrorIs(t, s.SetTargets(map[string]string{"a": "http://a", "b": "http://b", "c": "http://c"}), signals.ErrTooManyKeys)
	assert.Len(t, s.Statuses(), 2, "a failed SetTargets changes nothing")

	// Changing a URL is not a new target, and keeps the observation.
	now := time.Now()
	require.NoError(t, s.Store().Record("a", llmlb.Load{At: now, Running: 1}))
	require.NoError(t, s.Store().Record("b", llmlb.Load{At: now, Running: 1}))
	require.NoError(t, s.SetTargets(map[string]string{"a": "http://a2/metrics", "b": "http://b/metrics"}))
	_, ok := s.Load("a")
	assert.True(t, ok, "a target whose URL changed keeps its observation")

	// Removing a target forgets its observation.
	require.NoError(t, s.SetTargets(map[string]string{"a": "http://a2/metrics"}))
	_, ok = s.Load("b")
	assert.False(t, ok)
	_, ok = s.Status("b")
	assert.False(t, ok)
	st := s.Statuses()
	require.Len(t, st, 1)
	assert.Equal(t, "http://a2/metrics", st[0].URL)
	_, ok = s.Load("a")
	assert.True(t, ok, "a kept target keeps its observation")

	// Removing every target, twice, forgets the rest.
	require.NoError(t, s.SetTargets(nil))
	require.NoError(t, s.SetTargets(nil))
	_, ok = s.Load("a")
	assert.False(t, ok)
	assert.Empty(t, s.Statuses())
}

// Scrapes and pushes merge in one store; the newest observation wins.
func TestScrapeAndPushMerge(t *testing.T) {
	clock := newFakeClock()
	store, err := signals.NewStore(signals.StoreConfig{})
	require.NoError(t, err)
	srv := newSwitchServer(t, serve(textType, fixture(t, "vllm.prom")))
	s := newScraper(t, signals.Config{Store: store, Clock: clock})
	require.NoError(t, s.SetTargets(map[string]string{"a": srv.URL}))
	_, err = s.Scrape(context.Background(), "a")
	require.NoError(t, err)

	clock.Advance(time.Second)
	require.NoError(t, store.Record("a", llmlb.Load{At: clock.Now(), Running: 99, KVUsage: 0.99}))
	l, _ := s.Load("a")
	assert.Equal(t, 99, l.Running, "a newer push replaces the scrape")

	require.NoError(t, store.Record("a", llmlb.Load{At: clock.Now().Add(-time.Hour), Running: 1}))
	l, _ = s.Load("a")
	assert.Equal(t, 99, l.Running, "an older push is ignored")

	clock.Advance(time.Second)
	_, err = s.Scrape(context.Background(), "a")
	require.NoError(t, err)
	l, _ = s.Load("a")
	assert.Equal(t, 12, l.Running, "a newer scrape replaces the push")
}

func TestRun(t *testing.T) {
	srvs := make([]*switchServer, 4)
	targets := map[string]string{}
	for i := range srvs {
		srvs[i] = newSwitchServer(t, serve(textType, fixture(t, "vllm.prom")))
		if i < 3 {
			targets[fmt.Sprint(i)] = srvs[i].URL
		}
	}
	s := newScraper(t, signals.Config{Interval: 20 * time.Millisecond})
	require.NoError(t, s.SetTargets(targets))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	waitFor(t, func() bool { return minScrapes(s) >= 2 }, "every target scraped twice")
	err := s.Run(ctx)
	require.ErrorIs(t, err, signals.ErrRunning, "Run twice at once")
	assert.Equal(t, "signals: Scraper.Run is already running", err.Error())

	delete(targets, "0")
	targets["3"] = srvs[3].URL
	require.NoError(t, s.SetTargets(targets))
	_, ok := s.Load("0")
	assert.False(t, ok, "a removed target's observation is forgotten")
	waitFor(t, func() bool { st, _ := s.Status("3"); return st.Scrapes >= 2 }, "added target scraped")
	hits := srvs[0].hits.Load()
	time.Sleep(60 * time.Millisecond)
	assert.LessOrEqual(t, srvs[0].hits.Load(), hits+1, "a removed target is no longer scraped")
	for _, k := range []string{"1", "2", "3"} {
		_, ok := s.Load(k)
		assert.True(t, ok, k)
	}
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	// Run may be called again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	assert.ErrorIs(t, s.Run(ctx2), context.DeadlineExceeded)
}

func minScrapes(s *signals.Scraper) uint64 {
	m := uint64(1 << 63)
	for _, st := range s.Statuses() {
		m = min(m, st.Scrapes)
	}
	return m
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Run staggers the first scrapes over the interval and keeps at most
// MaxConcurrent in flight.
func TestRunStaggersAndBounds(t *testing.T) {
	var mu sync.Mutex
	var first []time.Time
	var inflight, peak atomic.Int64
	body := fixture(t, "vllm.prom")
	seen := map[string]bool{}
	srv := newSwitchServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		mu.Lock()
		if !seen[r.URL.Path] {
			seen[r.URL.Path] = true
			first = append(first, time.Now())
		}
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		_, _ = w.Write(body)
	}))
	const n, interval = 20, 400 * time.Millisecond
	targets := map[string]string{}
	for i := range n {
		targets[fmt.Sprint(i)] = fmt.Sprintf("%s/%d", srv.URL, i)
	}
	s := newScraper(t, signals.Config{Interval: interval, MaxConcurrent: 2, Rand: randSource(1)})
	require.NoError(t, s.SetTargets(targets))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- s.Run(ctx) }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(first) == n }, "every target scraped")
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	lo, hi := first[0], first[0]
	for _, f := range first {
		lo, hi = minTime(lo, f), maxTime(hi, f)
	}
	t.Logf("first scrapes spread over %v (from %v after start)", hi.Sub(lo), lo.Sub(start))
	assert.Greater(t, hi.Sub(lo), interval/4, "first scrapes are staggered over the interval")
	assert.LessOrEqual(t, peak.Load(), int64(2), "at most MaxConcurrent scrapes in flight")
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func TestScrapeErrorUnwrap(t *testing.T) {
	e := &signals.ScrapeError{Key: "k", URL: "http://x", Err: signals.ErrHTTPStatus}
	assert.True(t, errors.Is(e, signals.ErrHTTPStatus))
	assert.Equal(t, "signals: scrape of k (http://x): unexpected HTTP status", e.Error())
}

// TestScrapeErrorBoundsEndpointStrings: the status line and Content-Type an
// endpoint sends go into the scrape error (which is kept in the Status and
// logged) cut to a bounded length, however long they are.
func TestScrapeErrorBoundsEndpointStrings(t *testing.T) {
	long := strings.Repeat("x", 64<<10)
	cases := []struct {
		name, head string
		want       error
	}{
		{"status", "HTTP/1.1 500 " + long + "\r\nContent-Length: 0\r\n\r\n", signals.ErrHTTPStatus},
		{"content type", "HTTP/1.1 200 OK\r\nContent-Type: text/" + long + "\r\nContent-Length: 0\r\n\r\n", signals.ErrParse},
		{"malformed content type", "HTTP/1.1 200 OK\r\nContent-Type: text/plain; " + long + "\r\nContent-Length: 0\r\n\r\n", signals.ErrParse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer l.Close()
			served := make(chan struct{})
			go func() {
				defer close(served)
				conn, err := l.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				_, _ = bufio.NewReader(conn).ReadString('\n') // the request line
				_, _ = io.WriteString(conn, c.head)
			}()
			s := newScraper(t, signals.Config{Timeout: 10 * time.Second})
			require.NoError(t, s.SetTargets(map[string]string{"ep": "http://" + l.Addr().String() + "/metrics"}))
			_, err = s.Scrape(context.Background(), "ep")
			<-served
			require.ErrorIs(t, err, c.want)
			assert.Less(t, len(err.Error()), 400, "the error: %.200s...", err)
			st, _ := s.Status("ep")
			assert.Less(t, len(st.LastError.Error()), 400)
		})
	}
}
