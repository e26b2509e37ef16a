package share_test

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/internal/natstest"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/share"
	"github.com/llmlb/llmlb/signals"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The end-to-end comparison: two gateway replicas in front of one cluster
// of emulated engines, each replica receiving every other request (as
// behind a round-robin load balancer), with and without sharing over NATS.
const (
	e2eScrape   = 250 * time.Millisecond // each replica's scrape interval
	e2eInterval = 25 * time.Millisecond  // the sharing interval
	e2eSlots    = 16                     // batch slots per engine
	e2eKVBlocks = 2048                   // KV blocks of 16 tokens per engine
)

func e2eEngine() engine.Config {
	return engine.Config{MaxRunning: e2eSlots, KVBlocks: e2eKVBlocks, Speedup: 4}
}

// slotWatch counts the requests sent to an engine whose batch slots are all
// taken: they wait in its queue for a slot to free. The count is the
// policy's doing in the engines' own terms, so a busy machine does not blur
// it the way it blurs latencies.
type slotWatch struct {
	next    http.RoundTripper
	engines map[string]*engine.Engine // by host:port
	waited  atomic.Int64
}

func (s *slotWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	if e := s.engines[req.URL.Host]; e != nil && req.Method == http.MethodPost {
		if st := e.Stats(); st.Running+st.Waiting >= e2eSlots {
			s.waited.Add(1)
		}
	}
	return s.next.RoundTrip(req)
}

// alternate sends each request to the next of several gateway replicas.
type alternate struct {
	hosts []string
	n     atomic.Uint64
	next  http.RoundTripper
}

func (a *alternate) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Host = a.hosts[(a.n.Add(1)-1)%uint64(len(a.hosts))]
	return a.next.RoundTrip(req)
}

// stand is a cluster with two gateway replicas in front.
type stand struct {
	cluster *e2e.Cluster
	watch   *slotWatch
	client  *http.Client
	base    string
	groups  []*share.Group
	bals    []*llmlb.Balancer
}

func startStand(t *testing.T, natsURL string) *stand {
	t.Helper()
	c, err := e2e.StartCluster(4, e2eEngine())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	upstream := &http.Transport{MaxIdleConnsPerHost: 512}
	t.Cleanup(upstream.CloseIdleConnections)
	s := &stand{cluster: c, watch: &slotWatch{next: upstream, engines: map[string]*engine.Engine{}}}
	for i, u := range c.URLs {
		s.watch.engines[strings.TrimPrefix(u, "http://")] = c.Engines[i]
	}
	var hosts []string
	for range 2 {
		srv := s.startReplica(t, natsURL)
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		hosts = append(hosts, u.Host)
	}
	front := &http.Transport{MaxIdleConnsPerHost: 512}
	t.Cleanup(front.CloseIdleConnections)
	s.client = &http.Client{Transport: &alternate{hosts: hosts, next: front}}
	s.base = "http://" + hosts[0]
	return s
}

// startReplica starts one gateway replica: llmlb's Default policy told the
// engines' slots, over a scraper of their /metrics and, if natsURL is set,
// a Group sharing with the other replica.
func (s *stand) startReplica(t *testing.T, natsURL string) *httptest.Server {
	t.Helper()
	scraper, err := signals.NewScraper(signals.Config{Interval: e2eScrape})
	require.NoError(t, err)
	targets := map[string]string{}
	for _, u := range s.cluster.URLs {
		targets[u] = u + "/metrics"
	}
	require.NoError(t, scraper.SetTargets(targets))
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	require.NoError(t, err)
	policy, err := llmlb.Default(llmlb.DefaultConfig{Index: ix, Slots: e2eSlots})
	require.NoError(t, err)
	var signal llmlb.Signal = scraper
	var opts []llmlb.Option
	var g *share.Group
	if natsURL != "" {
		g, err = share.New(share.Config{Conn: natstest.Connect(t, natsURL), Signal: scraper, MaxSignalAge: 3 * e2eScrape, Index: ix, Interval: e2eInterval,
			Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		signal = g
		opts = append(opts, llmlb.WithObserver(g.Observer(nil)))
		s.groups = append(s.groups, g)
	}
	b, err := llmlb.New(policy, append(opts, llmlb.WithSignal(signal, 3*e2eScrape))...)
	require.NoError(t, err)
	s.bals = append(s.bals, b)
	eps, err := httplb.NewEndpoints(s.cluster.URLs...)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	tr, err := httplb.NewTransport(httplb.Config{Balancer: b, Base: s.watch})
	require.NoError(t, err)
	proxy := httplb.NewProxy(tr)
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	srv := httptest.NewServer(proxy)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = scraper.Run(ctx) })
	if g != nil {
		wg.Go(func() { _ = g.Run(ctx) })
	}
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
	})
	return srv
}

type standRun struct {
	res    e2e.Result
	hit    e2e.HitRate
	waited int64
}

// Two gateway replicas that share their in-flight work and routed prefixes
// over NATS route the same traffic better than two that do not: more prompt
// tokens are served from the engines' caches, and the TTFT tail is shorter.
// Both stands run at once, with the same arrivals, so they meet the same
// machine. The engines are busy enough (about three quarters of their
// prefill capacity with the isolated stand's hit rate) for the prefill
// that sharing saves to show in the queueing delay. Under the race detector
// the emulated engines and the gateways starve for CPU and every latency
// is the machine's, so only the hit rate is asserted there.
func TestE2ESharingBeatsIsolatedReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end comparison")
	}
	srv := natstest.Start(t, -1)
	stands := map[string]*stand{
		"shared":   startStand(t, srv.ClientURL()),
		"isolated": startStand(t, ""),
	}
	// 32 shared heads of 4,096 tokens: each engine caches 8 of them. The
	// TTFT p90 is compared over 1,200 requests, so that one stall of the
	// machine does not decide it.
	w := e2e.Workload{Requests: 1200, Rate: 75, Groups: 32, PrefixBytes: 16384, Seed: 7, MaxInFlight: 64}
	if share.RaceDetector {
		w.Requests = 400
	}
	// Let the scrapers and the groups see each other before the load.
	require.Eventually(t, func() bool {
		for _, g := range stands["shared"].groups {
			if g.Stats().Peers != 1 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	results := map[string]*standRun{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, s := range stands {
		wg.Go(func() {
			res := e2e.Generate(context.Background(), s.client, s.base, w)
			mu.Lock()
			results[name] = &standRun{res: res}
			mu.Unlock()
		})
	}
	wg.Wait()
	for name, s := range stands {
		r := results[name]
		for _, b := range s.bals {
			require.Eventually(t, func() bool {
				for _, st := range b.Stats() {
					if st.Outstanding != 0 {
						return false
					}
				}
				return true
			}, 10*time.Second, 5*time.Millisecond)
		}
		hit, err := s.cluster.ScrapeHitRate(context.Background(), &http.Client{})
		require.NoError(t, err)
		r.hit, r.waited = hit, s.watch.waited.Load()
		assert.Equal(t, w.Requests, r.res.Count((*e2e.Outcome).Complete), name)

		t.Logf("%-8s complete=%d ttft p50=%v p90=%v p99=%v hit=%.3f waited for a slot=%d elapsed=%v",
			name, r.res.Count((*e2e.Outcome).Complete), r.res.TTFT(0.5).Round(time.Millisecond), r.res.TTFT(0.9).Round(time.Millisecond), r.res.TTFT(0.99).Round(time.Millisecond),
			r.hit.Rate(), r.waited, r.res.Elapsed.Round(time.Millisecond))
	}
	for _, g := range stands["shared"].groups {
		st := g.Stats()
		t.Logf("group %s: %+v", g.ID(), st)
		// A batch built late, as on a starved machine, may find its block
		// buffer full and drop a few picks, by design; a routine loss would
		// not be a few.
		assert.Less(t, st.Dropped, uint64(w.Requests/20), "picks dropped instead of shared")
	}
	sh, iso := results["shared"], results["isolated"]
	assert.Greater(t, sh.hit.Rate(), iso.hit.Rate(), "sharing must serve more prompt tokens from the engines' caches")
	if !share.RaceDetector {
		// The 90th percentile: on a quiet machine sharing cuts it about
		// threefold (38 ms against 113), and the 99th too (74 ms against
		// 303), but the 99th is the machine's when other tests run beside
		// this one (275 ms against 268 seen under go test ./... with other
		// work), where the 90th keeps its margin.
		assert.Less(t, sh.res.TTFT(0.9), iso.res.TTFT(0.9), "sharing must shorten the TTFT tail")
	}
}
