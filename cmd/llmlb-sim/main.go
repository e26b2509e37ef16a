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
// first policy listed. The -json and -svg files are opened before the
// simulation, so that a bad path fails at once, and a file the command
// created is removed again if the run fails.
//
// A request larger than a replica's whole KV cache is rejected under every
// policy and never completes; when there are any, a warning on standard
// error counts them.
//
// A bad command line or trace, including a -trace or output path that
// cannot be opened, exits with status 2; any other failure with 1. A trace
// request longer than sim.MaxPromptTokens prompt tokens (2^24) or
// sim.MaxOutputTokens output tokens (2^20) makes a bad trace, and the
// error names its line and field.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
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

func runErr(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var scenarioNames, kvDefaults []string
	for _, s := range sim.Scenarios() {
		scenarioNames = append(scenarioNames, s.Name)
		kv := s.Config.Engine.KVBlocks
		if kv == 0 {
			kv = sim.DefaultKVBlocks
		}
		kvDefaults = append(kvDefaults, fmt.Sprintf("%s %d", s.Name, kv))
	}
	fs := flag.NewFlagSet("llmlb-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scenario  = fs.String("scenario", "default", "preset: "+strings.Join(scenarioNames, ", "))
		policies  = fs.String("policies", "", "comma-separated policies (default: the scenario's list; \"all\" for every policy)")
		trace     = fs.String("trace", "", "replay a trace file instead of the synthetic workload")
		format    = fs.String("format", "", "trace format: "+sim.FormatMooncake+" or "+sim.FormatAzure+" (default: from the -trace file's extension or content)")
		rateScale = fs.Float64("rate-scale", 1, "multiply the arrival rate")
		replicas  = fs.Int("replicas", 0, "number of replicas (default: the scenario's)")
		routers   = fs.Int("routers", 0, "number of routers (default: the scenario's)")
		scrape    = fs.Duration("scrape", 0, "engine metrics scrape interval (default: the scenario's)")
		stagger   = fs.Bool("stagger", false, "stagger the routers' scrapes")
		requests  = fs.Int("requests", 0, "number of requests (default: the scenario's, or the whole trace)")
		seed      = fs.Uint64("seed", 1, "random seed")
		seeds     = fs.Int("seeds", 1, "run this many seeds, from -seed on, and pool their results")
		kvBlocks  = fs.Int("kv-blocks", 0, fmt.Sprintf("KV capacity per replica in %d-token blocks (default: the scenario's: %s; for a trace the larger of %d and twice its largest request)",
			sim.DefaultBlockSize, strings.Join(kvDefaults, ", "), sim.DefaultKVBlocks))
		sloTTFT  = fs.Duration("slo-ttft", 2*time.Second, "TTFT objective")
		sloTPOT  = fs.Duration("slo-tpot", 50*time.Millisecond, "TPOT objective")
		jsonPath = fs.String("json", "", "write results as JSON to this file (- for stdout)")
		svgPath  = fs.String("svg", "", "write TTFT CDFs and per-replica outstanding requests to this SVG file")
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
	if *seed > math.MaxUint64-uint64(*seeds-1) {
		return usageError{fmt.Errorf("-seed %d with -seeds %d overflows: the last seed, -seed + -seeds - 1, must be at most %d", *seed, *seeds, uint64(math.MaxUint64))}
	}
	for _, f := range []struct {
		name     string
		negative bool
	}{
		{"replicas", *replicas < 0},
		{"routers", *routers < 0},
		{"requests", *requests < 0},
		{"scrape", *scrape < 0},
		{"kv-blocks", *kvBlocks < 0},
	} {
		if f.negative {
			return usageError{fmt.Errorf("-%s %s must not be negative", f.name, fs.Lookup(f.name).Value)}
		}
	}
	if !(*rateScale > 0) || math.IsInf(*rateScale, 0) {
		return usageError{fmt.Errorf("-rate-scale %v must be a positive finite number", *rateScale)}
	}
	if *sloTTFT <= 0 {
		return usageError{fmt.Errorf("-slo-ttft %v must be positive", *sloTTFT)}
	}
	if *sloTPOT <= 0 {
		return usageError{fmt.Errorf("-slo-tpot %v must be positive", *sloTPOT)}
	}
	if *format != "" && *trace == "" {
		return usageError{errors.New("-format needs -trace")}
	}
	switch *format {
	case "", sim.FormatMooncake, sim.FormatAzure:
	default:
		return usageError{fmt.Errorf("-format %q: want %s or %s", *format, sim.FormatMooncake, sim.FormatAzure)}
	}
	if *jsonPath != "" && *jsonPath != "-" && *jsonPath == *svgPath {
		return usageError{fmt.Errorf("-json and -svg both name %s", *jsonPath)}
	}

	sc, err := sim.LookupScenario(*scenario)
	if err != nil {
		return usageError{fmt.Errorf("-scenario: unknown scenario %q (known: %s)", *scenario, strings.Join(scenarioNames, ", "))}
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
				return usageError{fmt.Errorf("-policies: unknown policy %q (known: %s)", names[i], strings.Join(known, ", "))}
			}
		}
	}

	// Open the outputs before the run, so that a bad path does not waste
	// it; a file created here is removed again if the run fails.
	var jsonOut, svgOut *output
	defer func() {
		for _, o := range []*output{jsonOut, svgOut} {
			if err != nil && o != nil {
				o.abort()
			}
		}
	}()
	if *jsonPath != "" {
		if jsonOut, err = openOutput("json", *jsonPath); err != nil {
			return err
		}
	}
	if *svgPath != "" {
		if svgOut, err = openOutput("svg", *svgPath); err != nil {
			return err
		}
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
		fmtName := *format
		if fmtName == "" {
			fmtName = formatOf(*trace)
		}
		if reqs, err = readTrace(*trace, fmtName, sim.TraceOptions{RateScale: *rateScale, Requests: *requests}); err != nil {
			return err
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
	if jsonOut != nil {
		if err := jsonOut.write(stdout, rep.WriteJSON); err != nil {
			return err
		}
	}
	if svgOut != nil {
		if err := svgOut.write(stdout, func(w io.Writer) error { return rep.WriteSVG(w, "") }); err != nil {
			return err
		}
	}
	// Rejected requests are the same for every policy: those larger than
	// one replica's KV cache.
	var worst *sim.Result
	for _, r := range results {
		if r.Rejected > 0 && (worst == nil || r.Rejected > worst.Rejected) {
			worst = r
		}
	}
	if worst != nil {
		blocks := "blocks"
		if info.KVBlocks == 1 {
			blocks = "block"
		}
		fmt.Fprintf(stderr, "llmlb-sim: warning: %d of %d requests do not fit one replica's KV cache (%d %s of %d tokens) and were rejected; raise -kv-blocks\n",
			worst.Rejected, worst.Requests, info.KVBlocks, blocks, info.BlockSize)
	}
	return nil
}

// readTrace reads the trace file at path in format, detected from the
// content when format is empty. A path that cannot be opened or is a
// directory is a usage error; a read error is reported as such, not as a
// malformed trace.
func readTrace(path, format string, opt sim.TraceOptions) ([]sim.Request, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("-trace: %w", err)}
	}
	if fi.IsDir() {
		return nil, usageError{fmt.Errorf("-trace %s is a directory", path)}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("-trace: %w", err)}
	}
	defer f.Close()
	r := &errReader{r: f}
	reqs, err := sim.ReadTrace(r, format, opt)
	if r.err != nil {
		return nil, fmt.Errorf("-trace: %w", r.err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// formatOf is the trace format that path's extension names, or "" if it
// names none.
func formatOf(path string) string {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl", ".json":
		return sim.FormatMooncake
	case ".csv":
		return sim.FormatAzure
	}
	return ""
}

// errReader is a reader that records the first error of r other than
// [io.EOF].
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
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

// output is the destination of -json or -svg: standard output for "-",
// else a file opened before the run and written after it.
type output struct {
	flag, path string
	f          *os.File // nil for standard output, and once written or aborted
	created    bool     // openOutput created the file and it is not yet written
}

// openOutput opens the destination path of flag -name. An existing file
// keeps its contents until [output.write].
func openOutput(name, path string) (*output, error) {
	o := &output{flag: name, path: path}
	if path == "-" {
		return o, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	o.created = err == nil
	if errors.Is(err, os.ErrExist) {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
	}
	if err != nil {
		return nil, usageError{fmt.Errorf("-%s: %w", name, err)}
	}
	o.f = f
	return o, nil
}

// write replaces the destination's contents with what write writes and
// closes it. On failure it aborts the output.
func (o *output) write(stdout io.Writer, write func(io.Writer) error) error {
	if o.path == "-" {
		return write(stdout)
	}
	err := o.fill(write)
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	o.f = nil
	if err != nil {
		o.abort()
		return fmt.Errorf("-%s: %w", o.flag, err)
	}
	o.created = false
	return nil
}

// fill empties the file, if it is a regular one, and writes to it with
// write; a device or pipe is written as it is.
func (o *output) fill(write func(io.Writer) error) error {
	if fi, err := o.f.Stat(); err != nil {
		return err
	} else if fi.Mode().IsRegular() {
		if err := o.f.Truncate(0); err != nil {
			return err
		}
	}
	return write(o.f)
}

// abort closes an output that has not been written successfully, and
// removes its file if openOutput created it.
func (o *output) abort() {
	if o.f != nil {
		o.f.Close()
		o.f = nil
	}
	if o.created {
		os.Remove(o.path)
		o.created = false
	}
}
