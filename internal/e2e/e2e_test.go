package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// engineConfig is the emulated replica of the policy comparison: a small
// batch and KV cache, so that requests queue and prefixes compete for cache.
func engineConfig() engine.Config {
	return engine.Config{
		MaxRunning: 4, KVBlocks: 512, Speedup: 4,
	}
}

// comparisonWorkload is the traffic of the policy comparison: arrivals at
// about 85% of the engines' capacity, with at most 12 requests in flight, so
// that a busy machine, whose engines fall behind, cannot pile up a backlog
// that hides the policies' differences. The cap is below the cluster's 16
// batch slots, so some engine always has a free slot for the next request.
func comparisonWorkload() Workload {
	return Workload{Requests: 400, Rate: 70, Groups: 48, Seed: 7, MaxInFlight: 12}
}

type policyRun struct {
	res    Result
	hit    HitRate
	waited int64 // requests sent to an engine with no free batch slot
}

// slotWatch is the gateway's transport to the engines; it counts the
// requests sent to an engine whose batch slots are all taken, which wait in
// its queue for one. The count is the engines' queueing in their own terms
// (requests, not seconds), so a busy machine does not blur it the way it
// blurs latencies measured by the wall clock.
type slotWatch struct {
	next    http.RoundTripper
	engines map[string]*engine.Engine // by host:port
	slots   int
	waited  atomic.Int64
}

func (s *slotWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	if e := s.engines[req.URL.Host]; e != nil && req.Method == http.MethodPost {
		if st := e.Stats(); st.Running+st.Waiting >= s.slots {
			s.waited.Add(1)
		}
	}
	return s.next.RoundTrip(req)
}

// runPolicies sends w through a gateway with each policy, each gateway in
// front of its own cluster, all at the same time and with the same arrivals,
// so that the policies meet the same machine: the engines emulate in real
// time, and a busy machine slows them.
func runPolicies(t *testing.T, w Workload, policies ...string) map[string]policyRun {
	t.Helper()
	type stand struct {
		c      *Cluster
		g      *gateway
		watch  *slotWatch
		client *http.Client
	}
	stands := make([]stand, len(policies))
	for i, p := range policies {
		cfg := engineConfig()
		c, err := StartCluster(4, cfg)
		require.NoError(t, err)
		t.Cleanup(c.Close)
		client := newClient()
		t.Cleanup(client.CloseIdleConnections)
		watch := &slotWatch{engines: map[string]*engine.Engine{}, slots: cfg.MaxRunning}
		for j, u := range c.URLs {
			watch.engines[strings.TrimPrefix(u, "http://")] = c.Engines[j]
		}
		g := startGateway(t, p, c.URLs, func(_ *llmlb.Balancer, cfg *httplb.Config) {
			watch.next = cfg.Base
			cfg.Base = watch
		})
		stands[i] = stand{c: c, g: g, watch: watch, client: client}
	}
	results := make([]Result, len(policies))
	var wg sync.WaitGroup
	for i, s := range stands {
		wg.Go(func() { results[i] = Generate(context.Background(), s.client, s.g.srv.URL, w) })
	}
	wg.Wait()
	runs := make(map[string]policyRun, len(policies))
	for i, p := range policies {
		s := stands[i]
		s.g.requireIdle(t)
		hit, err := s.c.ScrapeHitRate(context.Background(), s.client)
		require.NoError(t, err)
		waited := s.watch.waited.Load()
		t.Logf("%-18s %s hit=%.3f waited for a slot=%d", p, summary(&results[i]), hit.Rate(), waited)
		runs[p] = policyRun{res: results[i], hit: hit, waited: waited}
	}
	return runs
}

// Least outstanding keeps requests from waiting for a batch slot while
// another engine has one free, which is what gives it a shorter TTFT tail
// than round robin; the default policy, told the engines' slots, also keeps
// prefixes on the engines that cache them. Both are compared on counts (of
// requests that waited, of prompt tokens served from cache), since latencies
// measured by the wall clock vary with how busy the machine is.
func TestPolicies(t *testing.T) {
	w := comparisonWorkload()
	runs := runPolicies(t, w, "round-robin", "least-outstanding")
	for p, r := range runPolicies(t, w, "default+slots") {
		runs[p] = r
	}
	for p, r := range runs {
		assert.Equal(t, w.Requests, r.res.Count((*Outcome).Complete), p)
	}
	rr, lo, def := runs["round-robin"], runs["least-outstanding"], runs["default+slots"]
	assert.Less(t, lo.waited, rr.waited, "least outstanding must make fewer requests wait for a batch slot than round robin")
	assert.Greater(t, def.hit.Rate(), rr.hit.Rate(), "the default policy must beat round robin on prefix hit rate")
}

// Killing an engine mid-run: requests that had not started streaming are
// retried invisibly, and those that had started end with an error, never
// with a silent truncation or a duplicate.
func TestKillEngine(t *testing.T) {
	cfg := engineConfig()
	c, err := StartCluster(4, cfg)
	require.NoError(t, err)
	defer c.Close()
	g := startGateway(t, "least-outstanding", c.URLs, func(b *llmlb.Balancer, cfg *httplb.Config) {
		ej, err := retry.NewEjector(b, retry.EjectorConfig{})
		require.NoError(t, err)
		cfg.Retry.Reporter = ej
		cfg.Retry.MaxAttempts = 4
	})
	client := newClient()
	defer client.CloseIdleConnections()
	w := Workload{Requests: 300, Rate: 45, Groups: 8, LongShare: 0.5, Seed: 3}
	done := make(chan Result)
	go func() { done <- Generate(context.Background(), client, g.srv.URL, w) }()
	time.Sleep(2 * time.Second)
	c.Kill(0)
	res := <-done
	g.requireIdle(t)

	complete := res.Count((*Outcome).Complete)
	broken := res.Count(func(o *Outcome) bool { return o.Started && o.Err != nil })
	t.Logf("complete=%d broken mid-stream=%d %s", complete, broken, summary(&res))
	assert.Equal(t, w.Requests, complete+broken, "every request either completes or breaks mid-stream")
	assert.Zero(t, res.Count(func(o *Outcome) bool { return !o.Started && !o.Complete() }), "no request fails before streaming")
	assert.Zero(t, res.Count(func(o *Outcome) bool { return o.Truncated }), "no stream ends silently")
	assert.Zero(t, res.Count(func(o *Outcome) bool { return o.Got > o.Want }), "no duplicated tokens")
	assert.Positive(t, broken, "the killed engine was streaming")
	assert.Positive(t, c.Engines[0].Stats().Finished+int64(broken), "the killed engine had served traffic")
}

// Engines that refuse work with 429 and Retry-After: the gateway retries on
// another engine after the pushback, and when every attempt is refused the
// client gets the 429 with its Retry-After, never a 502.
func TestOverloadedEngines(t *testing.T) {
	c, err := StartCluster(2, engine.Config{MaxRunning: 1, MaxWaiting: 1, Speedup: 2})
	require.NoError(t, err)
	defer c.Close()
	g := startGateway(t, "least-outstanding", c.URLs, func(b *llmlb.Balancer, cfg *httplb.Config) { cfg.Retry.MaxAttempts = 3 })
	client := newClient()
	defer client.CloseIdleConnections()
	w := Workload{Requests: 16, Rate: 1000, Groups: 1, Short: [2]int{30, 30}, LongShare: -1, Seed: 5}
	res := Generate(context.Background(), client, g.srv.URL, w)
	g.requireIdle(t)
	refused := c.Engines[0].Stats().Refused + c.Engines[1].Stats().Refused
	complete := res.Count((*Outcome).Complete)
	limited := res.Count(func(o *Outcome) bool { return o.Status == http.StatusTooManyRequests && o.RetryAfter == "1" })
	t.Logf("complete=%d 429=%d engine refusals=%d", complete, limited, refused)
	assert.Equal(t, w.Requests, complete+limited)
	assert.Greater(t, complete, 4, "retries after the pushback found room")
	assert.Positive(t, refused)
}

// Clients that disconnect mid-stream release their load in the balancer and
// in the engines.
func TestClientDisconnect(t *testing.T) {
	c, err := StartCluster(2, engine.Config{Speedup: 1})
	require.NoError(t, err)
	defer c.Close()
	g := startGateway(t, "default", c.URLs, nil)
	client := newClient()
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	started := make(chan struct{}, 20)
	for i := range 20 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"prompt":"request %d","max_tokens":2000,"stream":true}`, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.srv.URL+"/v1/completions", strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				started <- struct{}{}
				return
			}
			defer resp.Body.Close()
			_, _ = bufio.NewReader(resp.Body).ReadString('\n')
			started <- struct{}{}
			_, _ = io.Copy(io.Discard, resp.Body)
		})
	}
	for range 20 {
		<-started
	}
	out := 0
	for _, s := range g.b.Stats() {
		out += int(s.Outstanding)
	}
	assert.Equal(t, 20, out)
	cancel()
	wg.Wait()
	g.requireIdle(t)
	require.Eventually(t, func() bool {
		for _, e := range c.Engines {
			if st := e.Stats(); st.Running+st.Waiting != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "engines still busy")
	var cancelled int64
	for _, e := range c.Engines {
		cancelled += e.Stats().Cancelled
	}
	assert.EqualValues(t, 20, cancelled)
}

// Memory and goroutines stay bounded across many streamed requests: the heap
// after them is close to the heap before, and (TestMain) no goroutine leaks.
func TestManyStreams(t *testing.T) {
	total := 10000
	if testing.Short() {
		total = 2000
	}
	c, err := StartCluster(4, engine.Config{Speedup: 50})
	require.NoError(t, err)
	defer c.Close()
	g := startGateway(t, "default", c.URLs, nil)
	client := newClient()
	defer client.CloseIdleConnections()
	url := g.srv.URL + "/v1/chat/completions"
	run := func(n int) int {
		var ok atomic.Int64
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for i := next.Add(1); i <= int64(n); i = next.Add(1) {
					body := fmt.Sprintf(`{"model":"emulated","stream":true,"max_tokens":2,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"question %d"}]}`, i)
					o := send(context.Background(), client, url, body, fmt.Sprintf("s%d", i%100), 2)
					if o.Complete() {
						ok.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return int(ok.Load())
	}
	require.Equal(t, 500, run(500)) // warm up connections and caches
	heapBefore := heap()
	goroutinesBefore := runtime.NumGoroutine()
	start := time.Now()
	assert.Equal(t, total, run(total))
	elapsed := time.Since(start)
	g.requireIdle(t)
	heapAfter := heap()
	t.Logf("%d streams in %v; heap %d KiB -> %d KiB; goroutines %d -> %d",
		total, elapsed.Round(time.Millisecond), heapBefore>>10, heapAfter>>10, goroutinesBefore, runtime.NumGoroutine())
	assert.Less(t, int64(heapAfter)-int64(heapBefore), int64(16<<20), "heap grew by more than 16 MiB")
	assert.Less(t, runtime.NumGoroutine(), goroutinesBefore+64, "goroutines grew")
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
