// Command llmlb-sim compares llmlb's routing policies on the same traffic in
// a deterministic discrete-event simulation of continuous-batching replicas.
//
// Usage:
//
//	llmlb-sim [flags]
//
// With no flags it runs the default scenario (8 replicas, heavy-tailed
// lengths, three requests in four the next turn of a conversation paced by
// its replies) under every policy and prints a table. See
// package github.com/llmlb/llmlb/sim for the model and the meaning of each
// column. -seeds N runs N seeds (each its own synthetic workload, or the same
// trace with different randomness in the policies and the simulation) and
// pools them into one table, so that small differences between policies
// can be told from noise. -svg writes one SVG file holding two plots: the TTFT CDF of every
// policy and the outstanding requests of each replica over time under the
// first policy listed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a bad command line; it exits with status 2.
type usageError struct{ error }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue), errors.Is(err, sim.ErrMalformedTrace), errors.Is(err, sim.ErrInvalidConfig),
		errors.Is(err, sim.ErrUnknownPolicy), errors.Is(err, sim.ErrInvalidWorkload):
		fmt.Fprintln(stderr, "llmlb-sim:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "llmlb-sim:", err)
		return 1
	}
}

func runErr(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmlb-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scenario  = fs.String("scenario", "default", "preset: default, prefixes, herding or slots")
		policies  = fs.String("policies", "", "comma-separated policies (default: the scenario's list; \"all\" for every policy)")
		trace     = fs.String("trace", "", "replay a trace file instead of the synthetic workload")
		format    = fs.String("format", "", "trace format: mooncake or azure (detected when empty)")
		rateScale = fs.Float64("rate-scale", 1, "multiply the arrival rate")
		replicas  = fs.Int("replicas", 0, "number of replicas (default: the scenario's)")
		routers   = fs.Int("routers", 0, "number of routers (default: the scenario's)")
		scrape    = fs.Duration("scrape", 0, "engine metrics scrape interval (default: the scenario's)")
		stagger   = fs.Bool("stagger", false, "stagger the routers' scrapes")
		requests  = fs.Int("requests", 0, "number of requests (default: the scenario's, or the whole trace)")
		seed      = fs.Uint64("seed", 1, "random seed")
		seeds     = fs.Int("seeds", 1, "run this many seeds, from -seed on, and pool their results")
		kvBlocks  = fs.Int("kv-blocks", 0, "KV capacity per replica in 16-token blocks (default: 8192, or for a trace twice its largest request)")
		sloTTFT   = fs.Duration("slo-ttft", 2*time.Second, "TTFT objective")
		sloTPOT   = fs.Duration("slo-tpot", 50*time.Millisecond, "TPOT objective")
		jsonPath  = fs.String("json", "", "write results as JSON to this file (- for stdout)")
		svgPath   = fs.String("svg", "", "write TTFT CDFs and per-replica outstanding requests to this SVG file")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *seeds < 1 {
		return usageError{fmt.Errorf("-seeds %d must be at least 1", *seeds)}
	}
	if *replicas < 0 || *routers < 0 || *requests < 0 || *scrape < 0 || *kvBlocks < 0 {
		return usageError{errors.New("-replicas, -routers, -requests, -scrape and -kv-blocks must not be negative")}
	}
	if !(*rateScale > 0) {
		return usageError{fmt.Errorf("-rate-scale %v must be positive", *rateScale)}
	}

	sc, err := sim.LookupScenario(*scenario)
	if err != nil {
		return usageError{err}
	}
	cfg := sc.Config
	cfg.Seed = *seed
	cfg.SLO = sim.SLO{TTFT: *sloTTFT, TPOT: *sloTPOT}
	cfg.Stagger = cfg.Stagger || *stagger
	if *replicas > 0 {
		cfg.Replicas = *replicas
	}
	if *routers > 0 {
		cfg.Routers = *routers
	}
	if *scrape > 0 {
		cfg.Scrape = *scrape
	}
	info := sim.ScenarioInfo{Name: sc.Name, Herding: sc.Herding}

	var reqs []sim.Request
	if *trace != "" {
		f, err := os.Open(*trace)
		if err != nil {
			return usageError{err}
		}
		fmtName := *format
		if fmtName == "" {
			switch strings.ToLower(filepath.Ext(*trace)) {
			case ".jsonl", ".json":
				fmtName = sim.FormatMooncake
			case ".csv":
				fmtName = sim.FormatAzure
			}
		}
		reqs, err = sim.ReadTrace(f, fmtName, sim.TraceOptions{RateScale: *rateScale, Requests: *requests})
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *trace, err)
		}
		info.Name, info.Trace, info.Format, info.RateScale = "trace", filepath.Base(*trace), fmtName, *rateScale
		if info.Format == "" {
			info.Format = "detected"
		}
		if *kvBlocks == 0 {
			cfg.Engine.KVBlocks = traceKVBlocks(reqs)
		}
	}
	w := sc.Workload
	w.Rate *= *rateScale
	if *requests > 0 {
		w.Requests = *requests
	}
	// workload returns the requests of the run with seed s: a trace's, or
	// the scenario's synthetic workload generated from s.
	workload := func(s uint64) ([]sim.Request, error) {
		if *trace != "" {
			return reqs, nil
		}
		return w.Generate(s)
	}
	if *kvBlocks > 0 {
		cfg.Engine.KVBlocks = *kvBlocks
	}
	names := sc.Policies
	switch *policies {
	case "":
	case "all":
		names = nil
		for _, p := range sim.Policies() {
			names = append(names, p.Name)
		}
	default:
		names = strings.Split(*policies, ",")
		for i := range names {
			names[i] = strings.TrimSpace(names[i])
			if _, ok := sim.LookupPolicy(names[i]); !ok {
				var known []string
				for _, p := range sim.Policies() {
					known = append(known, p.Name)
				}
				return usageError{fmt.Errorf("unknown policy %q (known: %s)", names[i], strings.Join(known, ", "))}
			}
		}
	}

	start := time.Now()
	var mu sync.Mutex // serializes progress output
	printed := false
	progress := func(done, total int, policy string) {
		mu.Lock()
		defer mu.Unlock()
		if el := time.Since(start); el > 2*time.Second {
			fmt.Fprintf(stderr, "\rllmlb-sim: %d/%d policies simulated (last: %s) in %.1fs ", done, total, policy, el.Seconds())
			printed = true
		}
	}
	runs := make([][]*sim.Result, len(names))
	var sum sim.ScenarioInfo // the per-run figures of the header, summed
	for k := range *seeds {
		cfg.Seed = *seed + uint64(k)
		reqs, err := workload(cfg.Seed)
		if err != nil {
			return err
		}
		one := info
		if err := one.Describe(cfg, reqs); err != nil {
			return err
		}
		if k == 0 {
			info = one
		}
		sum.Requests += one.Requests
		sum.ArrivalRate += one.ArrivalRate
		sum.InfiniteCacheHitRate += one.InfiniteCacheHitRate
		sum.PooledCacheHitRate += one.PooledCacheHitRate
		results, err := sim.Compare(ctx, cfg, reqs, names, func(done, total int, policy string) {
			progress(k*total+done, *seeds*total, policy)
		})
		if err != nil {
			if printed {
				fmt.Fprintln(stderr)
			}
			return err
		}
		for i, r := range results {
			runs[i] = append(runs[i], r)
		}
	}
	if printed {
		fmt.Fprintln(stderr)
	}
	results := make([]*sim.Result, len(names))
	for i := range runs {
		var err error
		if results[i], err = sim.Merge(runs[i]...); err != nil {
			return err
		}
	}
	if n := *seeds; n > 1 {
		info.Seeds = n
		info.Requests = sum.Requests / n
		info.ArrivalRate = sum.ArrivalRate / float64(n)
		info.InfiniteCacheHitRate = sum.InfiniteCacheHitRate / float64(n)
		info.PooledCacheHitRate = sum.PooledCacheHitRate / float64(n)
	}
	rep := &sim.Report{Scenario: info, Results: results}
	if *jsonPath != "-" {
		if err := rep.WriteTable(stdout); err != nil {
			return err
		}
	}
	if *jsonPath != "" {
		if err := writeTo(*jsonPath, stdout, rep.WriteJSON); err != nil {
			return err
		}
	}
	if *svgPath != "" {
		if err := writeTo(*svgPath, stdout, func(w io.Writer) error { return rep.WriteSVG(w, "") }); err != nil {
			return err
		}
	}
	return nil
}

// traceKVBlocks is the default KV capacity for a trace: the default, or
// twice the largest request's blocks, whichever is larger.
func traceKVBlocks(reqs []sim.Request) int {
	largest := 0
	for i := range reqs {
		largest = max(largest, reqs[i].PromptTokens+reqs[i].OutputTokens)
	}
	return max(sim.DefaultKVBlocks, 2*((largest+sim.DefaultBlockSize-1)/sim.DefaultBlockSize))
}

func writeTo(path string, stdout io.Writer, write func(io.Writer) error) error {
	if path == "-" {
		return write(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
