// This file, demo_fair.go and demo_spill.go are the demos (-demo, -demo-fair,
// -demo-spill) and nothing else: they start emulated engines in-process and
// send them load with this module's internal load generator, which a program
// in another module cannot import. A copy of the gateway leaves them out;
// the gateway builds without them, and has no demo flags.

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
)

// init gives the command its demo flags (main.go's demoFlags).
func init() { demoFlags = addDemoFlags }

// addDemoFlags adds -demo, -demo-fair, -demo-spill and their -requests and
// -rate to fs. After fs has parsed the command line, the function it
// returns runs the demo the command line asks for, with the gateway
// configured by o, its tables written to stdout and its gateways' errors
// logged to stderr, and reports whether it ran one.
func addDemoFlags(fs *flag.FlagSet) func(o options, stdout, stderr io.Writer) (bool, error) {
	demo := fs.Bool("demo", false, "compare the policies on emulated engines and exit")
	demoSpill := fs.Bool("demo-spill", false, "send a burst to 2 small emulated engines, without and then with an emulated rate-limited provider to spill to, and exit")
	demoFair := fs.Bool("demo-fair", false, "compare a heavy and a light tenant's service on emulated engines, without and with -fair (default: the engines' slots), and exit")
	requests := fs.Int("requests", 400, "demo: requests per policy")
	rate := fs.Float64("rate", 70, "demo: arrivals per second")
	return func(o options, stdout, stderr io.Writer) (bool, error) {
		if !*demo && !*demoSpill && !*demoFair {
			return false, nil
		}
		// The demo prints its own results: its gateways log only errors.
		o.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
		switch {
		case *demo:
			switch {
			case *requests <= 0:
				return true, usagef("-requests must be positive, not %d", *requests)
			case !(*rate > 0) || math.IsInf(*rate, 1):
				return true, usagef("-rate must be a positive number of arrivals per second, not %v", *rate)
			}
			return true, runDemo(stdout, o, *requests, *rate)
		case *demoSpill:
			return true, runSpillDemo(stdout, o, spillDemoLoad)
		default:
			load := fairDemoLoad
			if o.tenantHeader != "" {
				load.Header = o.tenantHeader
			}
			return true, runFairDemo(stdout, o, load, o.fairInFlight)
		}
	}
}

// runDemo compares the policies, each on a fresh cluster of 4 emulated
// engines with the same workload, and prints the table to out.
func runDemo(out io.Writer, o options, requests int, rate float64) error {
	engines := engine.Config{
		// A small batch and KV cache, four times faster than the model's
		// real time: requests queue, and 48 shared prompt heads compete
		// for the cache.
		MaxRunning: 4, KVBlocks: 512, Speedup: 4,
	}
	w := e2e.Workload{Requests: requests, Rate: rate, Groups: 48, Seed: 7}
	fmt.Fprintf(out, "demo: %d requests at %.0f/s (Poisson), 48 shared prompt heads, 4 emulated engines per policy\n\n", requests, rate)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tcomplete\tTTFT p50\tp90\tp99\tmax\tprefix hit rate\t")
	for _, p := range []string{"default", "least-outstanding", "round-robin"} {
		o.policy = p
		o.scrape = 100 * time.Millisecond
		o.slots = engines.MaxRunning
		res, hit, err := demoRun(o, engines, w)
		if err != nil {
			return err
		}
		ms := func(q float64) string { return res.TTFT(q).Round(time.Millisecond).String() }
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\t%.1f%%\t\n", p,
			res.Count((*e2e.Outcome).Complete), len(res.Outcomes), ms(0.5), ms(0.9), ms(0.99), ms(1), 100*hit.Rate())
	}
	return tw.Flush()
}

// demoRun sends w through a gateway configured by o in front of a fresh
// cluster of 4 engines configured by engines, and returns what the clients
// saw and the engines' prefix hit rate.
func demoRun(o options, engines engine.Config, w e2e.Workload) (e2e.Result, e2e.HitRate, error) {
	c, base, stop, err := startDemo(o, 4, engines)
	if err != nil {
		return e2e.Result{}, e2e.HitRate{}, err
	}
	defer stop()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	// Bound the run: the load's own length plus a generous drain.
	limit := time.Duration(float64(w.Requests)/w.Rate*float64(time.Second)) + 30*time.Second
	runCtx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	res := e2e.Generate(runCtx, client, base, w)
	hit, err := c.ScrapeHitRate(context.Background(), client)
	return res, hit, err
}

// startDemo starts n emulated engines configured by engines and a gateway
// configured by o in front of them, serving on a loopback port; it returns
// the cluster, the gateway's base URL and a function that stops them.
func startDemo(o options, n int, engines engine.Config) (c *e2e.Cluster, base string, stop func(), err error) {
	if c, err = e2e.StartCluster(n, engines); err != nil {
		return nil, "", nil, err
	}
	g, runners, err := newGateway(c.URLs, o, nil)
	if err != nil {
		c.Close()
		return nil, "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close()
		return nil, "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, g, runners, l, &shutdown{grace: time.Second}, o.log) }()
	return c, "http://" + l.Addr().String(), func() {
		cancel()
		<-served
		c.Close()
	}, nil
}
