// Command llmlb-sim compares llmlb's routing policies on the same traffic in
// a deterministic discrete-event simulation of continuous-batching replicas.
//
// Usage:
//
//	llmlb-sim [flags]
//
// With no flags it runs the default scenario (8 replicas, heavy-tailed
// lengths, three requests in four the next turn of a conversation paced by
// its replies) under every policy and prints a table about 110 characters
// wide, then a legend that says what to compare first (SLO attainment and
// missed requests, goodput, the TTFT p99) and defines every column; -wide
// adds the TTFT p95 and maximum, the median E2E latency, the output token
// throughput and the completed requests. docs/results.md describes the
// model. -seeds N runs N seeds (each its
// own synthetic workload, or the same trace with different randomness in
// the policies and the simulation) and pools them into one table, so that
// small differences between policies can be told from noise. -svg writes
// one SVG file holding two plots: the TTFT CDF of every policy and the
// outstanding requests of each replica over time under the first policy
// listed (in the first seed's run when -seeds pools several).
//
// -sweep 0.5,0.75,1,1.25,1.5 is a load sweep: it runs every policy at each
// rate scale (as -rate-scale would, pooling -seeds as above) and prints
// three tables, goodput, missed requests and TTFT p99, with a row per
// policy and a column per rate scale headed by its offered load in
// requests per second. With -sweep, -json writes {"scenario": ...,
// "sweep": [{"rate_scale": x, "arrival_rate_rps": r, "results": [...]}]},
// each results list in the schema of the plain run's, and -svg plots
// goodput and TTFT p99 against the offered load, a line per policy.
//
// -outputs allowance,predict,true compares what the routers know of output
// lengths, each under every policy, in an outputs column: the fixed decode
// allowance, the lengths each router learns per route from the requests
// that completed (llmlb.WithOutputPrediction; -output-quantile charges a
// quantile instead of the mean), or the true lengths, as a caller that
// knew them would pass. The routes scenario, whose requests are of four
// routes with outputs of very different lengths, compares all three by
// default.
//
// -speeds 2x1,6x0.5 sets each replica's speed relative to the engine, one
// per replica (a run of equal ones as count x speed), for any scenario or
// -trace: replica i's iterations take 1/speed as long. -declare-weights has
// each replica declare its starting speed to the routers as its weight, as
// an operator who knows the hardware would; without it a policy must find
// the speeds itself, as llmlb.Default does unless
// DefaultConfig.DisableLearning is set (the default-nolearn policy).
//
// -iter-time mocker-fused changes the engines' iteration time: an
// iteration that prefills and decodes pays the prefill's fixed 16.5 ms only
// where its decode part is shorter, instead of both phases in full as the
// default mocker model charges (internal/model.MockerFusedIterTime). A real
// engine runs such an iteration as one forward pass, which costs less than
// the sum, by how much depending on the engine and the batch; the header
// names the model when it is not the default.
//
// -routers R -share D has the R routers share their requests in flight and
// the prefixes they routed through package github.com/llmlb/llmlb/share:
// every D, each router's share.Group builds a batch, which reaches the
// other routers at once (the simulated network has no delay; NATS adds
// well under a millisecond). It needs at least two routers.
//
// -scenario agentic, rag and diurnal are workload families on the default
// scenario's cluster that no constant of llmlb.Default was chosen on: agents
// whose every step fans out into parallel branches of one history, prompts
// made of documents retrieved from a shared corpus, and a daily rate cycle
// with bursts. With -seed 9 -seeds 8 they are part of the test set that
// docs/results.md reports.
//
// -scenario pd and pd-long compare co-located serving with prefill/decode
// disaggregation at equal GPU count: the disaggregated policies (pd-*) run
// with the first replicas as prefill workers and the rest as decode
// workers, once per count of prefill workers in -prefill (default: the
// scenario's, 2,3 for pd, 3,4 for pd-long), and the table gains a split
// column (co-located, or 2P+6D) and a local column (the requests prefilled
// on their decode worker). A load sweep, whose tables have no split
// column, takes one count.
//
// -scenario providers, spill and spill-queue8 model deployments behind
// APIs (rate limits, latency spikes, 429s with Retry-After) instead of
// engines, and compare ways of routing to them, tiers and cooldowns
// included (sim.PoolScenarios); they take only -seed and -seeds.
//
// -json - or -svg - writes the JSON or the SVG document to standard output
// instead of the table; only one of them can. The -json and -svg files are
// opened before the simulation, so that a bad path fails at once, and a
// file the command created is removed again if the run fails. An output
// that is the -trace file or the other output, under whatever name, is
// refused rather than overwritten. A duration flag without a unit, such as
// -slo-ttft 2, is an error that asks for one (2s, 500ms), and one beyond
// what a duration holds, such as -slo-ttft 9999999h, an error that gives
// the flag's range. Every error of a flag names the flag.
//
// A request larger than a replica's whole KV cache is rejected under every
// policy and never completes; when there are any, a warning on standard
// error counts them.
//
// A bad command line or trace, including a -trace or output path that
// cannot be opened, exits with status 2; any other failure with 1. A trace
// request longer than sim.MaxPromptTokens prompt tokens (2^24) or
// sim.MaxOutputTokens output tokens (2^20) makes a bad trace, and the
// error names its line and field. A trace is read once, as it streams in:
// with -requests N the command holds only the N earliest requests, however
// long the trace, though it still checks every line; without, every
// request. A trace longer than 1 GiB is refused as a bad trace. An interrupt
// (Ctrl-C) or SIGTERM stops the run, even one waiting for a trace on
// standard input, and exits with status 1, removing an output file the
// command created; a second one ends a run that is slow to stop at once.
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/llmlb/llmlb/internal/model"
	"github.com/llmlb/llmlb/internal/sim"
	"golang.org/x/sync/errgroup"
)

func main() {
	ctx, stop := interruptContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// interruptContext returns a context that an interrupt or SIGTERM
// cancels, with a cause that names the signal, as [signal.NotifyContext]
// does; but the signal first restores its default effect, so that a run
// slow to stop ends at a second Ctrl-C. stop releases the signals.
func interruptContext() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-c:
			signal.Stop(c)
			cancel(fmt.Errorf("%v signal received", sig))
		case <-ctx.Done():
			signal.Stop(c)
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// usageError is a bad command line; it exits with status 2.
type usageError struct{ error }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdout, stderr)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		err = context.Cause(ctx) // what ended the run: an interrupt, in main
	}
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
	scenarioNames = append(scenarioNames, poolScenarioNames()...)
	fs := flag.NewFlagSet("llmlb-sim", flag.ContinueOnError)
	var (
		badDuration error          // the error of the duration flag that failed to parse
		durations   []durationFlag // every duration flag, in order
	)
	// durationVar defines a duration flag accepting lo to hi, or 0 for
	// what zero says if it is not "".
	durationVar := func(name string, value, lo, hi time.Duration, zero, usage string) *time.Duration {
		d := value
		f := durationFlag{name: name, d: &d, min: lo, max: hi, zero: zero, bad: &badDuration}
		durations = append(durations, f)
		fs.Var(f, name, usage)
		return &d
	}
	var (
		scenario  = fs.String("scenario", "default", "preset: "+strings.Join(scenarioNames, ", "))
		policies  = fs.String("policies", "", "comma-separated policies (default: the scenario's list; \"all\" for every policy)")
		trace     = fs.String("trace", "", "replay a trace file instead of the synthetic workload (- for standard input)")
		format    = fs.String("format", "", "trace format: "+sim.FormatMooncake+" or "+sim.FormatAzure+" (default: from the -trace file's extension or content)")
		rateScale = fs.Float64("rate-scale", 1, "multiply the arrival rate")
		sweepList = fs.String("sweep", "", fmt.Sprintf("load sweep: run at each of these comma-separated, increasing `rate-scales` (at most %d, such as 0.5,1,1.5) and print goodput, missed requests and TTFT p99 against the offered load", maxSweepPoints))
		replicas  = fs.Int("replicas", 0, "number of replicas (default: the scenario's)")
		routers   = fs.Int("routers", 0, "number of routers (default: the scenario's)")
		scrape    = durationVar("scrape", 0, time.Millisecond, maxInterval, "the scenario's", "engine metrics scrape interval, a `duration` such as 500ms, of the policies whose preset has none of its own (default: the scenario's)")
		signalIv  = durationVar("signal-interval", 0, time.Millisecond, maxInterval, "each preset's own", "run every policy, presets with their own interval included, on engine signals refreshed at this `duration` (default: each preset's own)")
		stagger   = fs.Bool("stagger", false, "stagger the routers' scrapes, router k scraping k/routers of an interval after the first (needs -routers 2 or more)")
		shareIv   = durationVar("share", 0, time.Millisecond, maxShare, "", "routers share their requests in flight and routed prefixes every `duration`, each batch reaching the others at once, the simulated network having no delay (needs -routers 2 or more)")
		requests  = fs.Int("requests", 0, "number of requests (default: the scenario's, or the whole trace); of a -trace, the earliest, and the only ones held in memory")
		seed      = fs.Uint64("seed", 1, "random seed")
		seeds     = fs.Int("seeds", 1, "run this many seeds, from -seed on, and pool their results")
		kvBlocks  = fs.Int("kv-blocks", 0, fmt.Sprintf("KV capacity per replica in %d-token blocks (default: the scenario's: %s; for a trace the larger of %d, the default scenario's 512k tokens, and twice its largest request)",
			sim.DefaultBlockSize, strings.Join(kvDefaults, ", "), sim.DefaultScenarioKVBlocks))
		adSlots  = fs.Int("adapter-slots", 0, fmt.Sprintf("LoRA adapters each replica serves at once, as vLLM's --max-loras (default: the scenario's: %d for lora, none for the others, whose requests name no adapter)", sim.LoRASlots))
		adLoad   = durationVar("adapter-load", 0, time.Nanosecond, maxAdapterLoad, fmt.Sprintf("the default (%v)", sim.DefaultAdapterLoad), fmt.Sprintf("stall of loading a LoRA adapter into a slot, a `duration`, for replicas with adapter slots (default: %v)", sim.DefaultAdapterLoad))
		sloTTFT  = durationVar("slo-ttft", 2*time.Second, time.Nanosecond, maxDuration, "", "TTFT objective, a `duration`")
		sloTPOT  = durationVar("slo-tpot", 50*time.Millisecond, time.Nanosecond, maxDuration, "", "TPOT objective, a `duration`")
		wide     = fs.Bool("wide", false, "print every column of the results table (TTFT p95 and max, E2E p50, tok/s, done)")
		jsonPath = fs.String("json", "", "write results as JSON to this file (- for stdout, instead of the table)")
		svgPath  = fs.String("svg", "", "write TTFT CDFs and per-replica outstanding requests to this SVG file (- for stdout, instead of the table); with -sweep, goodput and TTFT p99 against the offered load")
		admitArg = fs.String("admission", "", "comma-separated admission controls in front of the routers to compare, each under every policy, from those the scenario defines "+
			"(the tenants scenario: none, every request at once; rate, per-tenant limits on requests and tokens per minute that refuse the excess, as API gateways do; "+
			"vtc, a token-fair queue, package fair's Virtual Token Counter, capping the requests in flight; "+
			"the classes scenario: none; fifo, the queue ignoring priority classes; priority, the queue ordering by class with aging; priority-no-aging, without aging) "+
			"(default: the scenario's list, none for the other scenarios)")
		outputsArg = fs.String("outputs", "", "comma-separated knowledge of output lengths to compare, each under every policy: "+
			"allowance, every request charged a fixed decode allowance; predict, the output length each router learns per route from completed requests; "+
			"true, the true output length, as a caller that knows it exactly (default: the scenario's list, allowance, predict, true for the routes scenario; "+
			"for the others one run charging the allowance, without the outputs column)")
		outQuant = fs.Float64("output-quantile", 0, "with -outputs predict, charge this quantile of the learned output lengths, in [0, 1), instead of their mean (0)")
		speedArg = fs.String("speeds", "", "each replica's `speeds` relative to the engine, from 0.001 to 1000, one per replica in order, a run of equal speeds as count x speed: 1,1,0.5,0.5 or 2x1,2x0.5; "+
			"replaces the scenario's starting speeds, for a scenario or a -trace (default: the scenario's, 2x1,6x0.5 for mixed and mixed-slowdown, 1 for every replica of the others)")
		prefillArg = fs.String("prefill", "", "comma-separated `counts` of prefill workers, each compared under every disaggregated policy (pd-*), the other replicas decoding; "+
			"co-located policies run once on all the replicas (default: the scenario's list, 2,3 for pd, 3,4 for pd-long; a quarter of the replicas for the others)")
		iterTime = fs.String("iter-time", "mocker", "the engines' iteration-time model: mocker, NVIDIA Dynamo's mocker polynomials, an iteration that prefills and decodes costing both phases in full; "+
			"or mocker-fused, the same polynomials with such an iteration paying the prefill's fixed 16.5 ms only where the decode part is below it; a real engine's mixed forward pass costs less than the sum, by how much depends on the engine and the batch")
		declare = fs.Bool("declare-weights", false, "every replica declares its starting speed to the routers as its weight, as an operator who knows the hardware would configure; "+
			"policies that read weights (default) use it, the others ignore it (default: no weights, so a policy must find the speeds itself)")
	)
	// The flag package's own messages are written only for -h: a parse
	// error is returned, and run prints it once.
	var parseOut bytes.Buffer
	fs.SetOutput(&parseOut)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			stderr.Write(parseOut.Bytes())
			return err
		}
		if badDuration != nil {
			return usageError{badDuration}
		}
		return usageError{fmt.Errorf("%w (llmlb-sim -h lists the flags)", err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *seeds < 1 || *seeds > maxSeeds {
		return usageError{fmt.Errorf("-seeds %d out of range [1, %d]", *seeds, maxSeeds)}
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
		{"signal-interval", *signalIv < 0},
		{"kv-blocks", *kvBlocks < 0},
		{"adapter-slots", *adSlots < 0},
		{"adapter-load", *adLoad < 0},
	} {
		if f.negative {
			return usageError{fmt.Errorf("-%s %s must not be negative", f.name, fs.Lookup(f.name).Value)}
		}
	}
	for _, f := range []struct {
		name       string
		value, max int
	}{
		{"replicas", *replicas, maxSpeedReplicas},
		{"routers", *routers, maxRouters},
		{"requests", *requests, maxRequests},
		{"kv-blocks", *kvBlocks, maxKVBlocks},
		{"adapter-slots", *adSlots, maxAdapterSlots},
	} {
		if f.value > f.max {
			return usageError{fmt.Errorf("-%s %d exceeds the simulator's limit of %d", f.name, f.value, f.max)}
		}
	}
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["share"] && (*shareIv < time.Millisecond || *shareIv > maxShare) {
		return usageError{fmt.Errorf("-share %v must be from 1ms to %s", *shareIv, shortDuration(maxShare))}
	}
	for _, f := range durations {
		if *f.d > f.max {
			return usageError{fmt.Errorf("-%s %v exceeds the simulator's limit of %s", f.name, *f.d, shortDuration(f.max))}
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"scrape", *scrape}, {"signal-interval", *signalIv}} {
		if f.d > 0 && f.d < time.Millisecond {
			return usageError{fmt.Errorf("-%s %v must be at least 1ms", f.name, f.d)}
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
	iterFunc, ok := model.IterTimes[*iterTime]
	if !ok {
		return usageError{fmt.Errorf("-iter-time %q: want mocker or mocker-fused", *iterTime)}
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
	if *jsonPath == "-" && *svgPath == "-" {
		return usageError{errors.New("-json - and -svg - both write to standard output: send one to a file")}
	}
	for _, f := range []struct{ name, path string }{{"json", *jsonPath}, {"svg", *svgPath}} {
		if *wide && f.path == "-" {
			return usageError{fmt.Errorf("-wide widens the results table, which -%s - replaces", f.name)}
		}
	}
	scales := []float64{*rateScale}
	sweeping := set["sweep"]
	if sweeping {
		if scales, err = parseSweep(*sweepList); err != nil {
			return usageError{err}
		}
		if set["rate-scale"] {
			return usageError{errors.New("-sweep and -rate-scale both set the rate scale: list every rate scale in -sweep")}
		}
		if *wide {
			return usageError{errors.New("-wide widens the results table, which -sweep does not print")}
		}
	}

	if ps, ok := sim.LookupPoolScenario(*scenario); ok {
		return runPool(ctx, fs, ps, *seed, *seeds, stdout)
	}
	sc, err := sim.LookupScenario(*scenario)
	if err != nil {
		return usageError{fmt.Errorf("-scenario: unknown scenario %q (known: %s)", *scenario, strings.Join(scenarioNames, ", "))}
	}
	var admissions []sim.Admission // none: one run without admission control
	admissions = sc.Admissions
	if set["admission"] {
		if admissions, err = parseAdmission(*admitArg, sc); err != nil {
			return usageError{err}
		}
	}
	if sweeping && len(admissions) > 1 {
		return usageError{fmt.Errorf("-sweep compares policies under one admission control, and the %s scenario compares %d: choose one with -admission", sc.Name, len(admissions))}
	}
	outputs := sc.Outputs // none: one run with the scenario's Config.Outputs
	if set["outputs"] {
		if outputs, err = parseOutputs(*outputsArg); err != nil {
			return usageError{err}
		}
	}
	if set["output-quantile"] {
		switch {
		case !(*outQuant >= 0 && *outQuant < 1):
			return usageError{fmt.Errorf("-output-quantile %v must be in [0, 1)", *outQuant)}
		case !slices.Contains(outputs, sim.OutputsPredicted):
			return usageError{errors.New("-output-quantile needs -outputs predict (or a scenario that compares it)")}
		}
	}
	if sweeping && len(outputs) > 1 {
		return usageError{fmt.Errorf("-sweep compares policies under one knowledge of output lengths, and %d are compared: choose one with -outputs", len(outputs))}
	}
	if *adLoad > 0 && *adSlots == 0 && sc.Config.Engine.AdapterSlots == 0 {
		return usageError{fmt.Errorf("-adapter-load %v: the %s scenario's replicas serve no LoRA adapters: give them slots with -adapter-slots, or use the lora scenario", *adLoad, sc.Name)}
	}
	var speeds []float64 // nil: the scenario's
	if set["speeds"] {
		n := sc.Config.Replicas
		if *replicas > 0 {
			n = *replicas
		}
		if speeds, err = parseSpeeds(*speedArg, n); err != nil {
			return usageError{err}
		}
	}
	names := sc.Policies
	switch *policies {
	case "":
		if set["policies"] {
			return usageError{errors.New(`-policies "": want comma-separated policy names, or all`)}
		}
	case "all":
		names = nil
		for _, p := range sim.Policies() {
			names = append(names, p.Name)
		}
	default:
		names = strings.Split(*policies, ",")
		for i := range names {
			names[i] = strings.TrimSpace(names[i])
			if names[i] == "" {
				return usageError{fmt.Errorf("-policies %q: want comma-separated policy names, or all", *policies)}
			}
			if _, ok := sim.LookupPolicy(names[i]); !ok {
				var known []string
				for _, p := range sim.Policies() {
					known = append(known, p.Name)
				}
				return usageError{fmt.Errorf("-policies: unknown policy %q (known: %s)", names[i], strings.Join(known, ", "))}
			}
			if slices.Contains(names[:i], names[i]) {
				return usageError{fmt.Errorf("-policies %q lists %s twice", *policies, names[i])}
			}
		}
	}

	splits := sc.Prefill // none: one run of the disaggregated policies with Config.Prefill
	if set["prefill"] {
		n := sc.Config.Replicas
		if *replicas > 0 {
			n = *replicas
		}
		if splits, err = parsePrefill(*prefillArg, n); err != nil {
			return usageError{err}
		}
	}
	// The rows of the table, in groups compared together: the co-located
	// policies, then the disaggregated ones under each split.
	type group struct {
		names []string
		split int // prefill workers; 0 for the scenario's
		first int // the group's first row
	}
	var groups []group
	var colo, pd []string
	for _, name := range names {
		if spec, _ := sim.LookupPolicy(name); spec.Decode != nil {
			pd = append(pd, name)
		} else {
			colo = append(colo, name)
		}
	}
	if len(colo) > 0 {
		groups = append(groups, group{names: colo})
	}
	if set["prefill"] && len(pd) == 0 {
		return usageError{fmt.Errorf("-prefill %q splits the replicas for the disaggregated policies (pd-*), and none is compared: list one in -policies", *prefillArg)}
	}
	if len(pd) > 0 {
		n := sc.Config.Replicas
		if *replicas > 0 {
			n = *replicas
		}
		switch {
		case n < 2:
			return usageError{fmt.Errorf("-replicas %d: the disaggregated policies (%s) need at least 2 replicas, a prefill and a decode worker", n, strings.Join(pd, ", "))}
		case set["share"]:
			return usageError{fmt.Errorf("-share: the disaggregated policies (%s) do not share routing state; list only co-located policies in -policies", strings.Join(pd, ", "))}
		}
		if sweeping && len(splits) > 1 {
			counts := make([]string, len(splits))
			for i, split := range splits {
				counts[i] = strconv.Itoa(split)
			}
			return usageError{fmt.Errorf("-sweep compares the disaggregated policies under one count of prefill workers, and %d are compared (%s): choose one with -prefill", len(splits), strings.Join(counts, ", "))}
		}
		if len(splits) == 0 {
			splits = []int{0}
		}
		most := 0 // prefill workers; 0 for a quarter of the replicas
		for _, split := range splits {
			most = max(most, cmp.Or(split, sc.Config.Prefill))
			groups = append(groups, group{names: pd, split: split})
		}
		if most >= n { // only the scenario's counts: parsePrefill bounds -prefill's
			return usageError{fmt.Errorf("-replicas %d leaves no decode worker beside the %s scenario's %d prefill workers: want -replicas %d or more, or fewer prefill workers with -prefill", n, sc.Name, most, most+1)}
		}
	}
	rows := 0
	for i := range groups {
		groups[i].first = rows
		rows += len(groups[i].names)
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
	if err = checkOutputs(*trace, jsonOut, svgOut); err != nil {
		return err
	}

	cfg := sc.Config
	cfg.Seed = *seed
	cfg.SLO = sim.SLO{TTFT: *sloTTFT, TPOT: *sloTPOT}
	cfg.Stagger = cfg.Stagger || *stagger
	cfg.Prediction.Quantile = *outQuant
	if *replicas > 0 {
		cfg.Replicas = *replicas
	}
	if speeds != nil {
		cfg.Speed = speeds
	}
	cfg.DeclareWeights = cfg.DeclareWeights || *declare
	if *routers > 0 {
		cfg.Routers = *routers
	}
	if *signalIv > 0 {
		cfg.SignalInterval = *signalIv
	}
	if *scrape > 0 {
		cfg.Scrape = *scrape
	}
	// The flag that sets the scrape interval of some policy's runs, if
	// any: -signal-interval every policy's, else -scrape that of the
	// policies whose preset has no interval of its own. At 0 neither
	// does: the scenario's or the preset's interval stands.
	var ivFlag string
	var iv time.Duration
	switch {
	case *signalIv > 0:
		ivFlag, iv = "signal-interval", *signalIv
	case *scrape > 0 && slices.ContainsFunc(names, func(name string) bool {
		spec, _ := sim.LookupPolicy(name)
		return spec.Scrape == 0
	}):
		ivFlag, iv = "scrape", *scrape
	}
	// Staggered, router k first scrapes at k intervals over the routers,
	// and those k intervals must not overflow.
	if n := max(cfg.Routers, 1); cfg.Stagger && n > 1 && iv > maxDuration/time.Duration(n-1) {
		return usageError{fmt.Errorf("-%s %v with -stagger and %d routers exceeds the simulator's limit of %s", ivFlag, iv, n, shortDuration(maxDuration/time.Duration(n-1)))}
	}
	if *stagger {
		switch n := max(cfg.Routers, 1); {
		case n < 2 && set["routers"]:
			return usageError{fmt.Errorf("-stagger needs -routers 2 or more to stagger, not %d", n)}
		case n < 2:
			return usageError{fmt.Errorf("-stagger needs -routers 2 or more to stagger; the %s scenario has %d router", sc.Name, n)}
		}
	}
	if set["share"] {
		switch n := max(cfg.Routers, 1); {
		case n < 2 && set["routers"]:
			return usageError{fmt.Errorf("-share needs -routers 2 or more to share between, not %d", n)}
		case n < 2:
			return usageError{fmt.Errorf("-share needs -routers 2 or more to share between; the %s scenario has %d router", sc.Name, n)}
		}
		// A router trusts an observation for three scrape intervals, over
		// which its share.Group describes its picks; package share bounds
		// that span.
		if iv > maxShareSignalAge/3 {
			return usageError{fmt.Errorf("-%s %v with -share: a router trusts the engine signals for three intervals, %s, and its share.Group describes its picks over at most %s: want -%s at most %s",
				ivFlag, iv, shortDuration(3*iv), shortDuration(maxShareSignalAge), ivFlag, shortDuration(maxShareSignalAge/3))}
		}
		cfg.Share = *shareIv
	}
	base := sim.ScenarioInfo{Name: sc.Name, Herding: sc.Herding}
	w := sc.Workload
	if *requests > 0 {
		w.Requests = *requests
	}
	fmtName := *format
	if *trace != "" {
		if fmtName == "" {
			fmtName = formatOf(*trace)
		}
		// Valid UTF-8, which the SVG's XML must be (JSON output replaces
		// invalid bytes itself).
		base.Name, base.Trace = "trace", strings.ToValidUTF8(filepath.Base(*trace), "\uFFFD")
		if *trace == "-" {
			base.Trace = "stdin"
		}
	}
	if *kvBlocks > 0 {
		cfg.Engine.KVBlocks = *kvBlocks
	}
	if *adSlots > 0 {
		cfg.Engine.AdapterSlots = *adSlots
	}
	if *adLoad > 0 {
		cfg.Engine.AdapterLoad = *adLoad
	}
	if *iterTime != "mocker" {
		cfg.Engine.IterTime = iterFunc
		base.IterTime = *iterTime
	}

	start := time.Now()
	var mu sync.Mutex // serializes progress output and protects done
	printed := false
	done := 0
	nadm, nout := max(len(admissions), 1), max(len(outputs), 1)
	nvar := nadm * nout // the runs of each policy under one seed, admission-major
	total := len(scales) * *seeds * rows * nvar
	progress := func(last string) {
		mu.Lock()
		defer mu.Unlock()
		done++
		if el := time.Since(start); el > 2*time.Second {
			fmt.Fprintf(stderr, "\rllmlb-sim: %d/%d policies simulated (last: %s) in %.1fs ", done, total, last, el.Seconds())
			printed = true
		}
	}
	// at runs every policy at rate scale x under every seed, unless only
	// describe, and pools the results. The runs of all seeds, and the
	// description of each seed's workload, share one pool of GOMAXPROCS
	// workers, so that no processor waits for the last run of a seed.
	rateFlag := "-rate-scale"
	if sweeping {
		rateFlag = "-sweep rate scale"
	}
	// The trace is read once, and replayed at each rate scale: a pipe's
	// contents are gone once read, and opening a named pipe again waits
	// for a writer.
	var tr *sim.Trace
	if *trace != "" {
		var err error
		if tr, fmtName, err = readTrace(ctx, *trace, fmtName, *requests); err != nil {
			return err
		}
		base.Format = fmtName
	}
	at := func(x float64, describe bool) (sim.ScenarioInfo, []*sim.Result, error) {
		info := base
		var reqs []sim.Request
		if *trace != "" {
			var err error
			if reqs, err = tr.Requests(x); err != nil {
				err = traceError(*trace, err)
				// A trace that reads at its own rate is not malformed:
				// the rate scale spreads its arrivals too far. Only a
				// scale below 1 spreads them beyond the trace's own.
				if x < 1 && errors.Is(err, sim.ErrMalformedTrace) {
					if _, err1 := tr.Requests(1); err1 == nil {
						err = fmt.Errorf("%s %g spreads the trace's arrivals beyond the simulator's limit: %w", rateFlag, x, err)
					}
				}
				return info, nil, err
			}
			info.RateScale = x
			if *kvBlocks == 0 {
				cfg.Engine.KVBlocks = traceKVBlocks(reqs)
			}
		}
		w := w
		w.Rate *= x
		n := *seeds
		runs := make([][]*sim.Result, rows*nvar) // row-major, then by seed
		for j := range runs {
			runs[j] = make([]*sim.Result, n)
		}
		infos := make([]sim.ScenarioInfo, n)
		last := func(policy string) string { return policy }
		if sweeping {
			last = func(policy string) string { return fmt.Sprintf("%s at x%g", policy, x) }
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(runtime.GOMAXPROCS(0))
		cfg := cfg
		var genErr error
		for k := range n {
			cfg.Seed = *seed + uint64(k)
			reqs := reqs
			if *trace == "" {
				if reqs, genErr = w.Generate(cfg.Seed); genErr != nil {
					genErr = fmt.Errorf("%s %g: %w", rateFlag, x, genErr)
					break
				}
			}
			cfg := cfg
			g.Go(func() error {
				infos[k] = info
				return infos[k].Describe(cfg, reqs)
			})
			if describe {
				continue
			}
			for v := range nvar {
				cfg := cfg
				if len(admissions) > 0 {
					cfg.Admission = admissions[v/nout]
				}
				if len(outputs) > 0 {
					cfg.Outputs = outputs[v%nout]
				}
				for _, gr := range groups {
					cfg := cfg
					if gr.split > 0 {
						cfg.Prefill = gr.split
					}
					for i, name := range gr.names {
						j := (gr.first+i)*nvar + v
						g.Go(func() error {
							r, err := sim.Simulate(gctx, cfg, reqs, name)
							if err != nil {
								return err
							}
							runs[j][k] = r
							progress(last(name))
							return nil
						})
					}
				}
			}
		}
		if err := cmp.Or(g.Wait(), genErr); err != nil {
			return info, nil, err
		}
		var sum sim.ScenarioInfo // the per-run figures of the header, summed
		for k, one := range infos {
			if k == 0 {
				info = one
			}
			sum.Requests += one.Requests
			sum.ArrivalRate += one.ArrivalRate
			sum.InfiniteCacheHitRate += one.InfiniteCacheHitRate
			sum.PooledCacheHitRate += one.PooledCacheHitRate
		}
		if n > 1 {
			info.Seeds = n
			info.Requests = sum.Requests / n
			info.ArrivalRate = sum.ArrivalRate / float64(n)
			info.InfiniteCacheHitRate = sum.InfiniteCacheHitRate / float64(n)
			info.PooledCacheHitRate = sum.PooledCacheHitRate / float64(n)
		}
		if describe {
			return info, nil, nil
		}
		results := make([]*sim.Result, len(runs))
		for i := range runs {
			var err error
			if results[i], err = sim.Merge(runs[i]...); err != nil {
				return info, nil, err
			}
		}
		return info, results, nil
	}

	var (
		rep     *sim.Report
		sw      *sim.Sweep
		results []*sim.Result // of the last point, for the warning below
		info    sim.ScenarioInfo
	)
	if !sweeping {
		info, results, err = at(scales[0], false)
		rep = &sim.Report{Scenario: info, Results: results}
	} else {
		sw = &sim.Sweep{}
		for _, x := range scales {
			var pi sim.ScenarioInfo
			if pi, results, err = at(x, false); err != nil {
				break
			}
			if x == 1 {
				sw.Scenario = pi
			}
			sw.Points = append(sw.Points, sim.SweepPoint{RateScale: x, ArrivalRate: pi.ArrivalRate, Results: results})
			info = pi
		}
		if err == nil && !slices.Contains(scales, 1) {
			sw.Scenario, _, err = at(1, true)
		}
	}
	if printed {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return err
	}

	var table, writeJSON, writeSVG func(io.Writer) error
	switch {
	case sweeping:
		table, writeJSON, writeSVG = sw.WriteTable, sw.WriteJSON, sw.WriteSVG
	default:
		table, writeJSON = rep.WriteTable, rep.WriteJSON
		if *wide {
			table = rep.WriteWideTable
		}
		writeSVG = func(w io.Writer) error { return rep.WriteSVG(w, "") }
	}
	if *jsonPath != "-" && *svgPath != "-" { // the table would precede the document
		if err := table(stdout); err != nil {
			return err
		}
	}
	if jsonOut != nil {
		if err := jsonOut.write(stdout, writeJSON); err != nil {
			return err
		}
	}
	if svgOut != nil {
		if err := svgOut.write(stdout, writeSVG); err != nil {
			return err
		}
	}
	// Rejected requests are the same for every policy, and at every rate
	// scale: those larger than one replica's KV cache.
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
	if w := preemptionWarning(results, info.KVBlocks, info.BlockSize); w != "" {
		fmt.Fprint(stderr, w)
	}
	return nil
}

// parseAdmission parses the value of -admission: comma-separated names of
// the admission controls sc defines, without repeats.
func parseAdmission(list string, sc sim.Scenario) ([]sim.Admission, error) {
	var known []string
	for _, a := range sc.Admissions {
		known = append(known, a.Name)
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("-admission %q: the %s scenario defines no admission controls (the tenants and classes scenarios do)", list, sc.Name)
	}
	idx, err := parseNameList("-admission", list, known, func(name string) error {
		return fmt.Errorf("-admission: unknown admission control %q (the %s scenario defines %s)", name, sc.Name, strings.Join(known, ", "))
	})
	if err != nil {
		return nil, err
	}
	out := make([]sim.Admission, len(idx))
	for j, i := range idx {
		out[j] = sc.Admissions[i]
	}
	return out, nil
}

// parseNameList parses list, the value of flag: comma-separated names from
// known, without repeats. It returns their indexes in known, in order;
// unknown describes the error of a name not in known.
func parseNameList(flag, list string, known []string, unknown func(name string) error) ([]int, error) {
	var out []int
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.Index(known, name)
		switch {
		case name == "":
			return nil, fmt.Errorf("%s %q: want comma-separated names from %s", flag, list, strings.Join(known, ", "))
		case i < 0:
			return nil, unknown(name)
		case slices.Contains(out, i):
			return nil, fmt.Errorf("%s %q lists %s twice", flag, list, name)
		}
		out = append(out, i)
	}
	return out, nil
}

// parseOutputs parses the value of -outputs: comma-separated names of
// kinds of knowledge of output lengths, without repeats.
func parseOutputs(list string) ([]sim.OutputKnowledge, error) {
	known := []sim.OutputKnowledge{sim.OutputsAllowance, sim.OutputsPredicted, sim.OutputsTrue}
	var names []string
	for _, k := range known {
		names = append(names, k.String())
	}
	idx, err := parseNameList("-outputs", list, names, func(name string) error {
		return fmt.Errorf("-outputs: unknown knowledge of output lengths %q (known: %s)", name, strings.Join(names, ", "))
	})
	if err != nil {
		return nil, err
	}
	out := make([]sim.OutputKnowledge, len(idx))
	for j, i := range idx {
		out[j] = known[i]
	}
	return out, nil
}

// parsePrefill parses the value of -prefill for replicas replicas:
// comma-separated counts of prefill workers, each from 1 to replicas-1,
// without repeats.
func parsePrefill(list string, replicas int) ([]int, error) {
	var out []int
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		n, err := strconv.Atoi(p)
		switch {
		case p == "":
			return nil, fmt.Errorf("-prefill %q: want comma-separated counts of prefill workers, such as 2,3", list)
		case err != nil:
			return nil, fmt.Errorf("-prefill %q: %q is not a whole number", list, p)
		case replicas < 2:
			return nil, fmt.Errorf("-prefill %q needs -replicas 2 or more, a prefill and a decode worker, not %d", list, replicas)
		case n < 1 || n >= replicas:
			return nil, fmt.Errorf("-prefill %q: %d prefill workers of %d replicas: want 1 to %d, leaving at least one decode worker", list, n, replicas, replicas-1)
		case slices.Contains(out, n):
			return nil, fmt.Errorf("-prefill %q lists %d twice", list, n)
		}
		out = append(out, n)
	}
	return out, nil
}

// maxSweepPoints bounds the rate scales of -sweep.
const maxSweepPoints = 20

// parseSweep parses the value of -sweep: comma-separated rate scales, each
// a positive finite number, in increasing order, at most maxSweepPoints.
func parseSweep(list string) ([]float64, error) {
	parts := strings.Split(list, ",")
	if len(parts) > maxSweepPoints {
		return nil, fmt.Errorf("-sweep %q: %d rate scales, at most %d", list, len(parts), maxSweepPoints)
	}
	scales := make([]float64, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		x, err := strconv.ParseFloat(p, 64)
		switch {
		case p == "":
			return nil, fmt.Errorf("-sweep %q: want comma-separated rate scales, such as 0.5,1,1.5", list)
		case errors.Is(err, strconv.ErrRange):
			return nil, fmt.Errorf("-sweep %q: rate scale %s out of range: want a positive finite number", list, p)
		case err != nil:
			return nil, fmt.Errorf("-sweep %q: rate scale %q is not a number", list, p)
		case !(x > 0) || math.IsInf(x, 0):
			return nil, fmt.Errorf("-sweep %q: rate scale %s must be a positive finite number", list, p)
		case i > 0 && x <= scales[i-1]:
			return nil, fmt.Errorf("-sweep %q: rate scales must increase, but %s follows %g", list, p, scales[i-1])
		}
		scales[i] = x
	}
	return scales, nil
}

// Limits of a run: the prefix index's endpoint limit for replicas, and
// bounds that keep a mistyped flag from exhausting the machine's memory.
const (
	maxSpeedReplicas = 4096
	maxRouters       = 1024
	maxRequests      = 10_000_000
	maxSeeds         = 1000
)

// parseSpeeds parses the value of -speeds for replicas replicas:
// comma-separated speeds, each from sim.MinSpeed to sim.MaxSpeed, or count x speed
// for a run of count equal ones, one speed per replica in all.
func parseSpeeds(list string, replicas int) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		count, speed := 1, p
		if c, s, ok := strings.Cut(p, "x"); ok {
			c = strings.TrimSpace(c)
			n, err := strconv.Atoi(c)
			switch {
			case errors.Is(err, strconv.ErrRange) || err == nil && n > maxSpeedReplicas:
				return nil, fmt.Errorf("-speeds %q lists more than %d speeds", list, maxSpeedReplicas)
			case err != nil || n < 1:
				return nil, fmt.Errorf("-speeds %q: in %q, the count %q is not a positive whole number", list, p, c)
			}
			count, speed = n, strings.TrimSpace(s)
		}
		v, err := strconv.ParseFloat(speed, 64)
		switch {
		case p == "":
			return nil, fmt.Errorf("-speeds %q: want comma-separated speeds, one per replica, such as 1,1,0.5,0.5 or 2x1,2x0.5", list)
		case errors.Is(err, strconv.ErrRange):
			return nil, fmt.Errorf("-speeds %q: speed %s out of range [%g, %g]", list, speed, sim.MinSpeed, sim.MaxSpeed)
		case err != nil:
			return nil, fmt.Errorf("-speeds %q: speed %q is not a number", list, speed)
		case !(v > 0) || math.IsInf(v, 0):
			return nil, fmt.Errorf("-speeds %q: speed %s must be a positive finite number", list, speed)
		case v < sim.MinSpeed || v > sim.MaxSpeed:
			return nil, fmt.Errorf("-speeds %q: speed %s out of range [%g, %g]", list, speed, sim.MinSpeed, sim.MaxSpeed)
		case count > maxSpeedReplicas-len(out):
			return nil, fmt.Errorf("-speeds %q lists more than %d speeds", list, maxSpeedReplicas)
		}
		for range count {
			out = append(out, v)
		}
	}
	if len(out) != replicas {
		return nil, fmt.Errorf("-speeds %q lists %d speeds for %d replicas: give one per replica (-replicas sets their number)", list, len(out), replicas)
	}
	return out, nil
}

// stdin is what -trace - reads: standard input, or a test's input.
var stdin io.Reader = os.Stdin

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

// traceKVBlocks is the default KV capacity for a trace: the default
// scenario's 512k tokens per replica (what an 80 GB GPU holds for an 8B
// model), or twice the largest request's blocks, whichever is larger. A
// capacity sized from the trace alone makes every policy thrash on the
// public traces, which is not what they measure.
func traceKVBlocks(reqs []sim.Request) int {
	largest := 0
	for i := range reqs {
		largest = max(largest, reqs[i].PromptTokens+reqs[i].OutputTokens)
	}
	return max(sim.DefaultScenarioKVBlocks, 2*((largest+sim.DefaultBlockSize-1)/sim.DefaultBlockSize))
}

// preemptionWarning returns a warning naming the policies whose replicas
// preempted more than one request in a hundred, or "" if none did: the KV
// cache is then too small for the load, and the run measures recomputation
// more than routing.
func preemptionWarning(results []*sim.Result, kvBlocks, blockSize int) string {
	var names []string
	worst := 0.0
	for _, r := range results {
		if r.Requests > 0 && r.Preemptions*100 > r.Requests {
			names = append(names, r.Policy)
			worst = max(worst, float64(r.Preemptions)/float64(r.Requests))
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("llmlb-sim: warning: preemptions exceed 1%% of requests (up to %.0f%%) under %s: %d blocks of %d tokens per replica are too few for this load; raise -kv-blocks\n",
		100*worst, strings.Join(names, ", "), kvBlocks, blockSize)
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

// checkOutputs refuses an output that is the same regular file as the
// trace at path trace (if not "") or as an earlier output, whatever their
// names: writing it would overwrite the other.
func checkOutputs(trace string, outs ...*output) error {
	type file struct {
		flag string
		fi   os.FileInfo
	}
	var files []file
	if trace != "" {
		if fi, err := os.Stat(trace); err == nil && fi.Mode().IsRegular() {
			files = append(files, file{"trace", fi})
		}
	}
	for _, o := range outs {
		if o == nil || o.f == nil {
			continue
		}
		fi, err := o.f.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		for _, f := range files {
			if os.SameFile(f.fi, fi) {
				return usageError{fmt.Errorf("-%s %s is the -%s file", o.flag, o.path, f.flag)}
			}
		}
		files = append(files, file{o.flag, fi})
	}
	return nil
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
