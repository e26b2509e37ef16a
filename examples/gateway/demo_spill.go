// The demo -demo-spill, and nothing of the gateway itself: like every demo*.go
// file, it is left out of a copy of the gateway (demo.go says why).

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/spill"
)

// The clusters of -demo-spill: spillDemoEngines small self-hosted engines
// that refuse a request (429, Retry-After: 1) when two already wait, and one
// emulated managed provider with a large batch behind a request rate limit.
const spillDemoEngines = 2

var (
	spillDemoEngine   = engine.Config{MaxRunning: 4, KVBlocks: 512, Speedup: 4, MaxWaiting: 2}
	spillDemoProvider = engine.Config{MaxRunning: 64, Speedup: 4, RequestsPerMinute: 1200}
)

// spillLoad is the load of one -demo-spill run: a burst beyond what the
// self-hosted engines take, then, once it has ended and After has passed, a
// trickle they take alone.
type spillLoad struct {
	Burst, Trickle e2e.Workload
	After          time.Duration
	Timeout        time.Duration
}

var spillDemoLoad = spillLoad{
	Burst:   e2e.Workload{Requests: 300, Rate: 60, Groups: 48, Seed: 7},
	Trickle: e2e.Workload{Requests: 10, Rate: 4, Groups: 48, Seed: 8},
	After:   2 * time.Second,
	Timeout: 2 * time.Minute,
}

// spillResult is what the clients saw in one -demo-spill run.
type spillResult struct {
	Burst, Trickle               e2e.Result
	BurstSpilled, TrickleSpilled int64
}

// countSpills counts the responses marked as spilled.
type countSpills struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (c *countSpills) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err == nil && resp.Header.Get(spill.DefaultHeader) != "" {
		c.n.Add(1)
	}
	return resp, err
}

// spillRun starts the -demo-spill clusters, the provider only if provider
// is true, and a gateway configured by o in front of them, and sends load.
func spillRun(o options, load spillLoad, provider bool) (spillResult, error) {
	o.spillTo = nil
	if provider {
		p, err := e2e.StartCluster(1, spillDemoProvider)
		if err != nil {
			return spillResult{}, err
		}
		defer p.Close()
		o.spillTo = p.URLs
	}
	_, base, stop, err := startDemo(o, spillDemoEngines, spillDemoEngine)
	if err != nil {
		return spillResult{}, err
	}
	defer stop()
	counter := &countSpills{base: &http.Transport{MaxIdleConnsPerHost: 256}}
	client := &http.Client{Transport: counter}
	defer counter.base.(*http.Transport).CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), load.Timeout)
	defer cancel()
	var res spillResult
	res.Burst = e2e.Generate(ctx, client, base, load.Burst)
	res.BurstSpilled = counter.n.Swap(0)
	timer := time.NewTimer(load.After)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	res.Trickle = e2e.Generate(ctx, client, base, load.Trickle)
	res.TrickleSpilled = counter.n.Swap(0)
	return res, nil
}

// runSpillDemo runs load without and then with the provider tier, and
// prints what the clients saw to w.
func runSpillDemo(w io.Writer, o options, load spillLoad) error {
	o.scrape = 100 * time.Millisecond
	o.slots = spillDemoEngine.MaxRunning
	fmt.Fprintf(w, "demo-spill: %d self-hosted emulated engines of %d slots refusing when %d requests wait; "+
		"a burst of %d requests at %.0f/s, then %d at %.0f/s\n\n",
		spillDemoEngines, o.slots, spillDemoEngine.MaxWaiting, load.Burst.Requests, load.Burst.Rate, load.Trickle.Requests, load.Trickle.Rate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "second tier\tphase\tcomplete\t429\tspilled\tTTFT p50\tp99\t")
	for _, provider := range []bool{false, true} {
		res, err := spillRun(o, load, provider)
		if err != nil {
			return err
		}
		tier := "none"
		if provider {
			tier = fmt.Sprintf("provider, %d rpm", spillDemoProvider.RequestsPerMinute)
		}
		for _, p := range []struct {
			name    string
			r       *e2e.Result
			spilled int64
		}{{"burst", &res.Burst, res.BurstSpilled}, {"after", &res.Trickle, res.TrickleSpilled}} {
			ms := func(q float64) string { return p.r.TTFT(q).Round(time.Millisecond).String() }
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%d\t%s\t%s\t\n", tier, p.name,
				p.r.Count((*e2e.Outcome).Complete), len(p.r.Outcomes), p.r.Count(throttled), p.spilled, ms(0.5), ms(0.99))
		}
	}
	return tw.Flush()
}

func throttled(o *e2e.Outcome) bool { return o.Status == http.StatusTooManyRequests }
