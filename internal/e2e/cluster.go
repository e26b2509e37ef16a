package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/signals"
)

// Cluster is a set of emulated engines, each serving on its own loopback
// port.
type Cluster struct {
	// URLs holds each engine's base URL, such as "http://127.0.0.1:40123".
	URLs    []string
	Engines []*engine.Engine
	cancels []context.CancelFunc
	done    []chan struct{}
}

// StartCluster starts n engines configured by cfg on free loopback ports.
// Close stops them.
func StartCluster(n int, cfg engine.Config) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("e2e: a cluster needs at least one engine")
	}
	c := &Cluster{}
	for range n {
		e, err := engine.New(cfg)
		if err != nil {
			c.Close()
			return nil, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.Close()
			return nil, err
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = e.Serve(ctx, l)
		}()
		c.URLs = append(c.URLs, "http://"+l.Addr().String())
		c.Engines = append(c.Engines, e)
		c.cancels = append(c.cancels, cancel)
		c.done = append(c.done, done)
	}
	return c, nil
}

// Kill stops engine i at once: its listener and connections close, streams
// in progress break. It returns when the engine has stopped.
func (c *Cluster) Kill(i int) {
	c.cancels[i]()
	<-c.done[i]
}

// Close stops every engine.
func (c *Cluster) Close() {
	for i := range c.cancels {
		c.Kill(i)
	}
}

// HitRate is the measured prefix-cache hit rate of a cluster: prompt tokens
// served from cache over prompt tokens looked up, summed over the engines
// that answered.
type HitRate struct {
	// Hits and Queries are the prompt tokens served from cache and looked
	// up.
	Hits, Queries float64
}

// Rate returns Hits/Queries, or 0 with no queries.
func (h HitRate) Rate() float64 {
	if h.Queries == 0 {
		return 0
	}
	return h.Hits / h.Queries
}

// ScrapeHitRate reads every live engine's /metrics with package signals and
// sums vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total.
// Engines that do not answer are skipped.
func (c *Cluster) ScrapeHitRate(ctx context.Context, client *http.Client) (HitRate, error) {
	var h HitRate
	answered := 0
	for _, u := range c.URLs {
		s, err := signals.NewScraper(signals.Config{Client: client, Timeout: 5 * time.Second})
		if err != nil {
			return h, err
		}
		if err := s.SetTargets(map[string]string{u: u + "/metrics"}); err != nil {
			return h, err
		}
		obs, err := s.Scrape(ctx, u)
		s.Close()
		if err != nil {
			continue
		}
		answered++
		h.Hits += obs.PrefixHits
		h.Queries += obs.PrefixQueries
	}
	if answered == 0 {
		return h, fmt.Errorf("e2e: no engine answered")
	}
	return h, nil
}
