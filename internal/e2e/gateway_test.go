package e2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/signals"
	"github.com/stretchr/testify/require"
)

// gateway is the system under test: an httplb proxy over a Balancer fed by a
// scraper of the engines' /metrics.
type gateway struct {
	b      *llmlb.Balancer
	tr     *httplb.Transport
	base   *http.Transport
	srv    *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func newPolicy(t testing.TB, name string) llmlb.Policy {
	t.Helper()
	switch name {
	case "default":
		p, err := llmlb.Default(llmlb.DefaultConfig{})
		require.NoError(t, err)
		return p
	case "default+slots": // told the batch slots of the comparison's engines
		p, err := llmlb.Default(llmlb.DefaultConfig{Slots: engineConfig().MaxRunning})
		require.NoError(t, err)
		return p
	case "least-outstanding":
		return llmlb.LeastOutstanding()
	case "round-robin":
		return llmlb.RoundRobin()
	}
	t.Fatalf("unknown policy %q", name)
	return nil
}

// startGateway starts a gateway with policy in front of urls; setup, if not
// nil, may adjust the transport's configuration once the balancer exists
// (cfg.Base, which it may wrap, is the transport to the engines).
func startGateway(t testing.TB, policy string, urls []string, setup func(b *llmlb.Balancer, cfg *httplb.Config)) *gateway {
	t.Helper()
	scraper, err := signals.NewScraper(signals.Config{Interval: 100 * time.Millisecond})
	require.NoError(t, err)
	targets := make(map[string]string, len(urls))
	for _, u := range urls {
		targets[u] = u + "/metrics"
	}
	require.NoError(t, scraper.SetTargets(targets))
	b, err := llmlb.New(newPolicy(t, policy), llmlb.WithSignal(scraper, time.Second))
	require.NoError(t, err)
	eps, err := httplb.NewEndpoints(urls...)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{MaxIdleConnsPerHost: 512}
	cfg := httplb.Config{Balancer: b, Base: base}
	if setup != nil {
		setup(b, &cfg)
	}
	if cfg.Retry.Budget == nil {
		budget, err := retry.NewPercentBudget(retry.PercentConfig{TTL: retry.DefaultBudgetTTL, MinRetriesPerSec: 100, PercentCanRetry: retry.DefaultPercentCanRetry})
		require.NoError(t, err)
		cfg.Retry.Budget = budget
	}
	tr, err := httplb.NewTransport(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = scraper.Run(ctx)
	}()
	proxy := httplb.NewProxy(tr)
	proxy.ErrorLog = log.New(io.Discard, "", 0) // broken streams are expected in some tests
	g := &gateway{b: b, tr: tr, base: base, srv: httptest.NewServer(proxy), cancel: cancel, done: done}
	t.Cleanup(g.close)
	return g
}

func (g *gateway) close() {
	g.srv.Close()
	g.cancel()
	<-g.done
	g.base.CloseIdleConnections()
}

// idle reports whether the balancer's accounting is back to zero.
func (g *gateway) idle() bool {
	for _, s := range g.b.Stats() {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			return false
		}
	}
	return true
}

func (g *gateway) requireIdle(t testing.TB) {
	t.Helper()
	require.Eventually(t, g.idle, 10*time.Second, 5*time.Millisecond, "accounting not released: %+v", g.b.Stats())
}

func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
}

func summary(r *Result) string {
	return fmt.Sprintf("n=%d complete=%d ttft p50=%v p99=%v elapsed=%v",
		len(r.Outcomes), r.Count((*Outcome).Complete), r.TTFT(0.5).Round(time.Millisecond), r.TTFT(0.99).Round(time.Millisecond), r.Elapsed.Round(time.Millisecond))
}
