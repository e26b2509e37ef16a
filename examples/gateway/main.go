// Command gateway is an OpenAI-compatible gateway in front of inference
// replicas (vLLM, SGLang, or the emulated engines of package engine), built
// on package gateway: it scrapes each replica's /metrics, routes every
// request with llmlb's default policy, streams responses as they are
// generated, retries failures before the first token on another replica,
// and ejects replicas that keep failing. It logs every upstream failure,
// refusal, ejection and scrape failure (log/slog, as JSON with -log-json),
// and serves on its admin address its own metrics (/metrics, OpenTelemetry
// through the Prometheus exporter), a JSON view of the balancer
// (/debug/llmlb) and probes: /healthz answers 200 while the process runs,
// /readyz 503 from the first SIGTERM or SIGINT on. With -drain-delay the
// gateway keeps taking requests that long after the signal, so that a
// Kubernetes Service drops the pod before it stops; then it lets streams in
// flight, and upgraded connections (a WebSocket that a replica accepts on a
// forwarded path), finish for up to -shutdown-grace.
//
//	go run ./cmd/llmlb-engine -ports 8001,8002,8003,8004 -speedup 10 &
//	go run ./examples/gateway -backends http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003,http://127.0.0.1:8004
//	go run ./examples/gateway -demo
//	go run ./examples/gateway -demo-fair
//	go run ./examples/gateway -demo-spill
//
// With -spill-to, requests the replicas cannot take (429, a full queue,
// 5xx, a context-length 400) spill to a second tier, such as a managed
// provider's deployments (package spill); the llmlb-engine's -rpm emulates
// one:
//
//	go run ./cmd/llmlb-engine -ports 8001,8002 -max-running 4 -max-waiting 2 -speedup 4 &
//	go run ./cmd/llmlb-engine -ports 8101 -rpm 600 -max-running 64 -speedup 4 &
//	go run ./examples/gateway -backends http://127.0.0.1:8001,http://127.0.0.1:8002 -spill-to http://127.0.0.1:8101
//
// Several replicas of the gateway in front of the same engines share their
// requests in flight and routed prefixes over NATS with -nats (package
// share); give each the same -backends and its own -listen and -admin:
//
//	go run ./examples/gateway -backends ... -nats nats://127.0.0.1:4222 -listen 127.0.0.1:8080 -admin 127.0.0.1:9090
//	go run ./examples/gateway -backends ... -nats nats://127.0.0.1:4222 -listen 127.0.0.1:8081 -admin 127.0.0.1:9091
//
// On /metrics, the load gauges (llmlb_endpoint_outstanding, ...) carry each
// current replica's base URL in llmlb_endpoint, and by default so do the
// counters and histograms (picks, time to first token, request duration,
// ejections, ...), since the -backends are fixed for the life of the process.
// A gateway whose replicas change, such as a copy of this one that calls
// Gateway.Update from discovery, runs with -per-endpoint-metrics=false:
// those series are cumulative, and each replica that left would keep its own
// until the gateway restarts (up to 2000 an instrument, the OpenTelemetry
// SDK's default limit, beyond which new replicas are counted together in a
// series labelled otel_metric_overflow="true").
//
// With -demo it starts 4 emulated engines in-process for each policy
// (default, least-outstanding, round-robin), sends them the same open-loop
// load through the gateway, and prints the time to first token and the prefix
// cache hit rate each policy achieved. With -demo-fair it starts 2 emulated
// engines of 4 slots, and twice, without a fair queue and then with -fair
// (by default the engines' 8 slots) and a trusted tenant header, sends them
// a heavy tenant keeping 16 requests outstanding and a light tenant sending
// its requests one at a time; it prints each tenant's completed requests,
// time to first token and share of the output tokens. With -demo-spill it
// sends a burst beyond what 2 small emulated engines take, without and then
// with an emulated rate-limited provider to spill to, and prints the
// requests completed, refused with 429 and spilled.
//
// The demos are in the files named demo*.go, and only there: they generate
// their load with this module's internal packages, which a program in
// another module cannot import. To start your own gateway from this one,
// copy the other files (main.go and, if you like, its tests) and leave the
// demo files out: the gateway builds without them, and has no demo flags.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/gateway"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/share"
	"github.com/llmlb/llmlb/spill"
	"github.com/llmlb/llmlb/telemetry"
)

type options struct {
	policy        string
	scrape        time.Duration
	attempts      int
	firstEvent    time.Duration // -first-event-timeout
	maxInFlight   int
	maxPerSession int
	slots         int
	log           *slog.Logger
	kvEvents      []string // publisher address of each backend's KV events
	kvReplay      []string // replay address of each, or none
	model         string   // the model the engines serve, which salts the events' blocks
	share         *share.Config
	fairInFlight  int      // -fair: the fair queue's concurrency cap
	tenantHeader  string   // trusted tenant header
	featureHeader string   // trusted header naming the kind of request
	predict       bool     // learn output lengths
	classHeader   string   // trusted priority-class header
	kvRelay       bool     // relay the -kv-events engines' events onto NATS
	kvFromNATS    bool     // follow the engines' events relayed on NATS
	spillTo       []string // base URLs of a managed provider's deployments to spill to
	allowPaths    []string // paths forwarded besides the inference APIs'
	loraBase      string   // the base model's name: other model names are LoRA adapters
}

func main() { os.Exit(cli(os.Args[1:], os.Stderr)) }

// usageError is a bad command line; it exits with status 2.
type usageError struct{ error }

// usagef returns a usageError of the message.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// cli runs the command with args and returns its exit status: 0 when it
// ran or printed its usage (-h), 2 for a bad command line and 1 for any
// other failure, whose error it prints on stderr.
func cli(args []string, stderr io.Writer) int {
	err := run(args, stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, errorLine(err))
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

// errorLine is the line that reports err: the command's name and err, whose
// own prefix, if it comes from package gateway, is not repeated.
func errorLine(err error) string {
	return "gateway: " + strings.TrimPrefix(err.Error(), "gateway: ")
}

// demoFlags, if not nil, adds the demos' flags to a flag set; after the
// set has parsed the command line, the function it returns runs the demo
// that the command line asks for, if any, and reports whether it did. The
// demo files set it; a copy of the gateway without them leaves it nil.
var demoFlags func(fs *flag.FlagSet) func(o options, stdout, stderr io.Writer) (bool, error)

// policies are the names -policy takes.
var policies = []string{"default", "least-outstanding", "round-robin", "peak-ewma"}

// idleTimeout is how long a client's keep-alive connection may stay idle
// before the gateway closes it: without one, each idle connection is held
// for ever.
const idleTimeout = 2 * time.Minute

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var o options
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve clients on")
	admin := fs.String("admin", "127.0.0.1:9090", "address to serve /metrics and /debug/llmlb on (\"\": none)")
	backends := fs.String("backends", "", "comma-separated base URLs of the replicas")
	grace := fs.Duration("shutdown-grace", 25*time.Second, "on SIGINT or SIGTERM, how long streams in flight and upgraded connections (WebSockets) may finish before they are cut (a second signal cuts them at once)")
	drainDelay := fs.Duration("drain-delay", 0, "on SIGINT or SIGTERM, how long the admin address's /readyz answers 503 while the gateway still takes requests, before it stops taking them: behind a Kubernetes Service, a few seconds for the endpoints to drop the pod (0: stop at once)")
	fs.StringVar(&o.policy, "policy", "default", "routing policy: default, least-outstanding, round-robin or peak-ewma (for replicas without metrics, such as a managed API's deployments)")
	fs.DurationVar(&o.scrape, "scrape", time.Second, "interval between /metrics scrapes of each replica (negative: no scraping)")
	fs.IntVar(&o.attempts, "attempts", retry.DefaultMaxAttempts, "attempts per request before the first token, the first included")
	fs.DurationVar(&o.firstEvent, "first-event-timeout", 0, "fail an attempt whose response has sent no event within this time and retry it on another replica, for replicas that take connections but never answer (0: wait as long as the client)")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 0, "answer 429 beyond this many requests in flight (0: no cap)")
	fs.IntVar(&o.maxPerSession, "max-per-session", 0, "answer 429 beyond this many requests in flight per X-Session-ID (0: no cap)")
	fs.IntVar(&o.slots, "slots", 0, "the replicas' batch slots (max_num_seqs, llama.cpp --parallel) for the default policy (0: unknown)")
	fs.IntVar(&o.fairInFlight, "fair", 0, "admit at most this many requests at once through a token-fair queue: by priority class, then by the service each tenant (else client address) has received (0: no queue)")
	fs.StringVar(&o.tenantHeader, "tenant-header", "", "take the tenant from this header; only behind a proxy that sets or strips it")
	fs.StringVar(&o.featureHeader, "feature-header", "", "append this header's value (a route or prompt template) to the kind of request whose output lengths -predict-outputs learns; only behind a proxy that sets or strips it")
	fs.BoolVar(&o.predict, "predict-outputs", false, "learn the output lengths of each kind of request (tenant, model, reasoning effort) from the streamed responses and charge them as decode work instead of a fixed allowance")
	fs.StringVar(&o.classHeader, "class-header", "", "with -fair: take the priority class (interactive, standard, batch) from this header; only behind a proxy that sets or strips it")
	logJSON := fs.Bool("log-json", false, "log as JSON lines instead of text")
	kvEvents := fs.String("kv-events", "", "comma-separated ZMQ addresses of the backends' KV-event publishers, in -backends order (tcp://host:5557,...); "+
		"prompts are then tokenized as the emulated engines (llmlb-engine) tokenize them, so against vLLM or SGLang no block matches: "+
		"there, build your gateway with httplb.ParserConfig.Tokenize set to the model's tokenizer")
	kvReplay := fs.String("kv-replay", "", "comma-separated ZMQ addresses of their replay sockets, in the same order (optional)")
	fs.StringVar(&o.model, "model", engine.DefaultModel, "with -kv-events: the model name the engines serve")
	natsURL := fs.String("nats", "", "share state with the other replicas of this gateway over the NATS server(s) at this URL (nats://host:4222)")
	shareSubject := fs.String("share-subject", share.DefaultSubject, "with -nats: the subject this gateway's replicas share on")
	shareID := fs.String("share-id", "", "with -nats: this replica's name among its peers (default: random)")
	shareInterval := fs.Duration("share-interval", share.DefaultInterval, "with -nats: the time between two batches of shared state")
	fs.BoolVar(&o.kvRelay, "kv-relay", false, "with -nats and -kv-events: publish the engines' KV events on NATS for the replicas started with -kv-events-nats (this one follows them from NATS too)")
	fs.BoolVar(&o.kvFromNATS, "kv-events-nats", false, "with -nats: follow the engines' KV events that a replica started with -kv-relay publishes on NATS")
	fs.StringVar(&o.loraBase, "lora-base", "", "the replicas' base model name: a request naming another model names a LoRA adapter, and goes to the replicas holding it (llmlb.AdapterAffinity, residency from vLLM's vllm:lora_requests_info) (\"\": no adapter routing)")
	perEndpoint := fs.Bool("per-endpoint-metrics", true, "label the counters and histograms of /metrics (picks, time to first token, duration, ejections, ...) with llmlb_endpoint, the replica's base URL, "+
		"as the load gauges llmlb_endpoint_* always are; false for replicas whose addresses change (a copy of this gateway that calls Gateway.Update from discovery), "+
		"each of which would keep its series until the gateway restarts, up to 2000 an instrument, the OpenTelemetry SDK's default limit, beyond which new ones count in one series labelled otel_metric_overflow=\"true\"")
	allowPaths := fs.String("allow-paths", "", "comma-separated request paths to forward besides the inference APIs' (a path ending in / for every path under it; / for every path): the engines' administration endpoints, such as /sleep or /v1/load_lora_adapter, are answered 404 otherwise")
	spillTo := fs.String("spill-to", "", "comma-separated base URLs of a second tier (a managed provider's deployments) that requests spill to when the replicas answer 429, a full queue, 5xx or a context-length 400; spilled responses carry X-Llmlb-Spillover-From")
	var demo func(o options, stdout, stderr io.Writer) (bool, error)
	if demoFlags != nil {
		demo = demoFlags(fs)
	}
	// The flag package's own messages are written only for -h: a parse
	// error is returned, and cli prints it once.
	var parseOut bytes.Buffer
	fs.SetOutput(&parseOut)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stderr.Write(parseOut.Bytes())
			return err
		}
		return usagef("%w (gateway -h lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (gateway -h lists the flags)", fs.Arg(0))
	}
	// Counts and durations out of range are named by their flag here,
	// rather than by the configuration field they end up in.
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"-attempts", int64(o.attempts)}, {"-max-in-flight", int64(o.maxInFlight)},
		{"-max-per-session", int64(o.maxPerSession)}, {"-slots", int64(o.slots)},
		{"-fair", int64(o.fairInFlight)},
		{"-shutdown-grace", int64(*grace)}, {"-drain-delay", int64(*drainDelay)},
		{"-first-event-timeout", int64(o.firstEvent)},
	} {
		if c.v < 0 {
			return usagef("%s must not be negative", c.name)
		}
	}
	if o.scrape > 0 && o.scrape < time.Millisecond {
		return usagef("-scrape %v is below 1ms (a negative value turns scraping off)", o.scrape)
	}
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if *logJSON {
		h = slog.NewJSONHandler(stderr, nil)
	}
	o.log = slog.New(h)
	if !slices.Contains(policies, o.policy) {
		return usagef("-policy: unknown policy %q (want one of %s)", o.policy, strings.Join(policies, ", "))
	}
	if demo != nil {
		if ran, err := demo(o, os.Stdout, stderr); ran {
			return err
		}
	}
	o.spillTo = list(*spillTo)
	o.allowPaths = list(*allowPaths)
	bases := list(*backends)
	if len(bases) == 0 {
		if demo != nil {
			return usagef("-backends is required (or use -demo, -demo-fair or -demo-spill)")
		}
		return usagef("-backends is required")
	}
	if err := checkBases(bases); err != nil {
		return usagef("-backends: %w", err)
	}
	if err := checkBases(o.spillTo); err != nil {
		return usagef("-spill-to: %w", err)
	}
	if *kvEvents != "" {
		o.kvEvents = list(*kvEvents)
		if n := len(bases); len(o.kvEvents) != n {
			return usagef("-kv-events has %d addresses for %d backends", len(o.kvEvents), n)
		}
		if *kvReplay != "" {
			o.kvReplay = list(*kvReplay)
			if len(o.kvReplay) != len(o.kvEvents) {
				return usagef("-kv-replay has %d addresses for %d publishers", len(o.kvReplay), len(o.kvEvents))
			}
		}
	}
	switch {
	case o.classHeader != "" && o.fairInFlight == 0:
		return usagef("-class-header needs -fair")
	case (o.kvRelay || o.kvFromNATS) && *natsURL == "":
		return usagef("-kv-relay and -kv-events-nats need -nats")
	case o.kvRelay && len(o.kvEvents) == 0:
		return usagef("-kv-relay needs -kv-events")
	case *kvReplay != "" && len(o.kvEvents) == 0:
		return usagef("-kv-replay needs -kv-events")
	case o.kvFromNATS && len(o.kvEvents) > 0:
		return usagef("-kv-events-nats follows the events from NATS: give -kv-events to the replica with -kv-relay only")
	}
	ctx, stop := signalContext()
	defer stop()
	if *natsURL != "" {
		// A server that cannot be reached is retried in the background: the
		// first failure to connect is logged with its cause (a later outage
		// as a disconnection), and the share Group warns while it cannot
		// publish.
		var connectFailed sync.Once
		nc, err := nats.Connect(*natsURL, nats.Name("llmlb-gateway"), nats.MaxReconnects(-1),
			nats.RetryOnFailedConnect(true),
			nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
				connectFailed.Do(func() { o.log.Warn("gateway: cannot connect to NATS; retrying", "error", err) })
			}),
			nats.ConnectHandler(func(nc *nats.Conn) { o.log.Info("gateway: NATS connected", "server", redactURL(nc.ConnectedUrl())) }),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { o.log.Warn("gateway: NATS disconnected", "error", err) }),
			nats.ReconnectHandler(func(nc *nats.Conn) { o.log.Info("gateway: NATS reconnected", "server", redactURL(nc.ConnectedUrl())) }))
		if err != nil {
			// Only a URL it cannot parse fails here, and the error quotes it.
			msg := err.Error()
			for _, u := range list(*natsURL) {
				msg = strings.ReplaceAll(msg, u, redactURL(u))
			}
			return errors.New("-nats: " + msg)
		}
		defer nc.Close()
		o.share = &share.Config{Conn: nc, Subject: *shareSubject, ID: *shareID, Interval: *shareInterval}
	}

	// OpenTelemetry metrics, exported in the Prometheus format.
	reg := prometheus.NewRegistry()
	provider, err := meterProvider(reg, *perEndpoint)
	if err != nil {
		return err
	}
	defer provider.Shutdown(context.Background())
	metrics, err := telemetry.New(provider, telemetry.Config{Policy: o.policy})
	if err != nil {
		return err
	}

	// serve runs the runners, and returns once they have ended: before the
	// NATS connection closes, for a relay's last messages tell the
	// followers to drop what nothing keeps current.
	g, runners, err := newGateway(bases, o, metrics)
	if err != nil {
		return err
	}
	switch {
	case o.kvRelay:
		o.log.Info("relaying the engines' KV events onto NATS and following them there", "publishers", strings.Join(o.kvEvents, ","))
	case o.kvFromNATS:
		o.log.Info("following the engines' KV events relayed on NATS")
	case len(o.kvEvents) > 0:
		o.log.Info("following the engines' KV events", "publishers", strings.Join(o.kvEvents, ","))
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	sd := &shutdown{grace: *grace, delay: *drainDelay}
	if *admin != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("/debug/llmlb", g.Debug())
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", sd.serveReady)
		al, err := net.Listen("tcp", *admin)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout}
		wg.Go(func() { _ = srv.Serve(al) })
		defer srv.Close()
		base := "http://" + al.Addr().String()
		o.log.Info("admin endpoints", "metrics", base+"/metrics", "debug", base+"/debug/llmlb", "liveness", base+"/healthz", "readiness", base+"/readyz")
	}
	if o.share != nil {
		o.log.Info("sharing state over NATS", "url", redactURLs(*natsURL), "subject", o.share.Subject, "id", g.State().Share.ID)
	}
	o.log.Info("gateway serving", "addr", "http://"+l.Addr().String(), "policy", o.policy, "backends", strings.Join(bases, ","))
	if len(o.spillTo) > 0 {
		o.log.Info("spilling to a second tier", "backends", strings.Join(o.spillTo, ","))
	}
	return serve(ctx, g, runners, l, sd, o.log)
}

// meterProvider returns a MeterProvider that exports to reg in the
// Prometheus format. Unless perEndpoint, views take the llmlb.endpoint
// attribute off llmlb's counters and histograms, as package telemetry
// advises where endpoint keys churn: their series are cumulative, and would
// stay, one for each endpoint ever picked, as long as the provider lives. The
// load gauges keep it: they report the current endpoints only. Its
// resource, which /metrics writes as target_info, names the service
// llmlb-gateway unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names
// another (resource.New applies its options in order, each over the ones
// before).
func meterProvider(reg prometheus.Registerer, perEndpoint bool) (*sdkmetric.MeterProvider, error) {
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	res, err := resource.New(context.Background(),
		resource.WithAttributes(semconv.ServiceName("llmlb-gateway")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, err // a bad pair in OTEL_RESOURCE_ATTRIBUTES is left out
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exporter), sdkmetric.WithResource(res)}
	if !perEndpoint {
		drop := sdkmetric.Stream{AttributeFilter: attribute.NewDenyKeysFilter(telemetry.AttrEndpoint)}
		// Only llmlb's meter: other instrumentation on the provider keeps
		// its attributes.
		scope := instrumentation.Scope{Name: telemetry.ScopeName}
		opts = append(opts, sdkmetric.WithView(
			sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindCounter, Scope: scope}, drop),
			sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Scope: scope}, drop)))
	}
	return sdkmetric.NewMeterProvider(opts...), nil
}

func policyByName(name string, slots int, ix, events *prefix.Index) (llmlb.Policy, error) {
	switch name {
	case "default":
		return llmlb.Default(llmlb.DefaultConfig{Slots: slots, Index: ix, Events: events})
	case "least-outstanding":
		return llmlb.LeastOutstanding(), nil
	case "round-robin":
		return llmlb.RoundRobin(), nil
	case "peak-ewma":
		return llmlb.PeakEWMA(llmlb.PeakEWMAConfig{})
	}
	return nil, fmt.Errorf("-policy: unknown policy %q (want one of %s)", name, strings.Join(policies, ", "))
}

// checkBases returns the error of the first base URL httplb refuses, of
// one ending in /v1 (the gateway forwards the client's /v1/... paths as
// sent), or of one listed twice.
func checkBases(bases []string) error {
	seen := make(map[string]bool, len(bases))
	for _, b := range bases {
		e, err := httplb.NewEndpoint(b)
		if err != nil {
			return err
		}
		if u, err := url.Parse(e.Key()); err == nil && strings.HasSuffix(u.Path, "/v1") {
			u.Path = strings.TrimSuffix(u.Path, "/v1")
			return fmt.Errorf("%s: give the server's base URL, %s, without /v1: the client's /v1/... path is forwarded as it was sent", e.Key(), u)
		}
		if seen[e.Key()] {
			return fmt.Errorf("%s is listed twice", e.Key())
		}
		seen[e.Key()] = true
	}
	return nil
}

// list splits a comma-separated flag value into its items, each trimmed of
// spaces; "" has none.
func list(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	items := strings.Split(s, ",")
	for i, it := range items {
		items[i] = strings.TrimSpace(it)
	}
	return items
}

// redactURLs returns the comma-separated URLs of s, each with its user
// information redacted (redactURL).
func redactURLs(s string) string {
	urls := list(s)
	for i, u := range urls {
		urls[i] = redactURL(u)
	}
	return strings.Join(urls, ",")
}

// redactURL returns u with its user information, if any, replaced by
// "redacted", for the logs: not only a password but also a user name, in
// which NATS takes a token (nats://TOKEN@host:4222).
func redactURL(u string) string {
	at := strings.LastIndex(u, "@")
	if at < 0 {
		return u
	}
	scheme := ""
	if i := strings.Index(u, "://"); i >= 0 && i < at {
		scheme = u[:i+len("://")]
	}
	return scheme + "redacted@" + u[at+1:]
}

// runner is a background task of the gateway.
type runner interface{ Run(context.Context) error }

// newGateway builds the gateway and the runners the caller runs beside it:
// with KV events, what follows them (a Subscriber; or a Subscriber
// forwarding to a Relay, and a Follower; or a Follower), and with -spill-to
// the provider tier's Gateway. metrics may be nil.
func newGateway(backends []string, o options, metrics *telemetry.Metrics) (*gateway.Gateway, []runner, error) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	if err != nil {
		return nil, nil, err
	}
	var (
		events  *prefix.Index
		runners []runner
		parser  httplb.ParserConfig
	)
	keys := make([]string, len(backends))
	for i, b := range backends {
		hep, err := httplb.NewEndpoint(b)
		if err != nil {
			return nil, nil, err
		}
		keys[i] = hep.Key()
	}
	onError := func(key string, err error) { o.log.Warn("gateway: KV events", "endpoint", key, "error", err) }
	if len(o.kvEvents) > 0 || o.kvFromNATS {
		// The engines' blocks are hashed from their token IDs, so the
		// gateway hashes prompts from token IDs too: here with the emulated
		// engines' tokenizer; in front of vLLM or SGLang, with the model's.
		parser.Tokenize = engine.Tokens
		hasher, err := prefix.NewHasher(prefix.HasherConfig{})
		if err != nil {
			return nil, nil, err
		}
		if events, err = prefix.NewIndex(prefix.IndexConfig{EventsOnly: true}); err != nil {
			return nil, nil, err
		}
		cfg := kvevents.Config{Index: events, Hasher: hasher, OnError: onError}
		eps := make(map[string]kvevents.Endpoint, len(o.kvEvents))
		for i, ev := range o.kvEvents {
			ep := kvevents.Endpoint{PubAddr: ev, Topic: "kv-events", Salt: prefix.Salt{Model: o.model}}
			if len(o.kvReplay) > 0 {
				ep.ReplayAddr = o.kvReplay[i]
			}
			eps[keys[i]] = ep
		}
		switch {
		case o.kvRelay || o.kvFromNATS:
			if o.kvRelay {
				relay, err := share.NewRelay(share.RelayConfig{Conn: o.share.Conn})
				if err != nil {
					return nil, nil, err
				}
				sub, err := kvevents.NewSubscriber(kvevents.Config{Forward: relay.Forward, OnError: onError})
				if err != nil {
					return nil, nil, err
				}
				if err := sub.SetEndpoints(eps); err != nil {
					return nil, nil, err
				}
				runners = append(runners, sub, relay) // relay: heartbeats, so followers notice its death
			}
			ap, err := kvevents.NewApplier(cfg)
			if err != nil {
				return nil, nil, err
			}
			salts := make(map[string]prefix.Salt, len(keys))
			for _, k := range keys {
				salts[k] = prefix.Salt{Model: o.model}
			}
			if err := ap.SetEndpoints(salts); err != nil {
				return nil, nil, err
			}
			f, err := share.NewFollower(share.FollowerConfig{Conn: o.share.Conn, Sink: ap, OnError: onError})
			if err != nil {
				return nil, nil, err
			}
			runners = append(runners, f)
		default:
			sub, err := kvevents.NewSubscriber(cfg)
			if err != nil {
				return nil, nil, err
			}
			if err := sub.SetEndpoints(eps); err != nil {
				return nil, nil, err
			}
			runners = append(runners, sub)
		}
	}
	policy, err := policyByName(o.policy, o.slots, ix, events)
	if err != nil {
		return nil, nil, err
	}
	if o.loraBase != "" {
		if policy, err = llmlb.AdapterAffinity(policy, llmlb.AdapterConfig{}); err != nil {
			return nil, nil, err
		}
		base := o.loraBase
		parser.Adapter = func(model string) string {
			if model == base || model == "" {
				return ""
			}
			return model
		}
	}
	parser.TrustTenantHeader, parser.FeatureHeader = o.tenantHeader, o.featureHeader
	var queue *fair.Queue
	if o.fairInFlight > 0 {
		qc := fair.Config{MaxInFlight: o.fairInFlight}
		if metrics != nil {
			qc.Observer = metrics.QueueObserver()
		}
		if queue, err = fair.New(qc); err != nil {
			return nil, nil, err
		}
		if metrics != nil {
			if _, err := metrics.WatchQueue(queue); err != nil {
				return nil, nil, err
			}
		}
	}
	cfg := gateway.Config{
		Queue:             queue,
		TrustClassHeader:  o.classHeader,
		Policy:            policy,
		Index:             ix,
		ScrapeInterval:    o.scrape,
		Retry:             retry.LoopConfig{MaxAttempts: o.attempts},
		FirstEventTimeout: o.firstEvent,
		Events:            events,
		Admission:         retry.AdmissionConfig{MaxInFlight: o.maxInFlight, MaxPerSession: o.maxPerSession},
		Parser:            parser,
		Logger:            o.log,
		Share:             o.share,
		AllowPaths:        o.allowPaths,
	}
	if o.predict {
		cfg.Outputs = &llmlb.OutputConfig{}
	}
	if metrics != nil {
		cfg.Observer, cfg.Retry.Observer = metrics.Observer(), metrics.RetryObserver()
	}
	if len(o.spillTo) > 0 {
		// A managed provider: no /metrics to scrape and no prefix cache to
		// aim at, only the latency it answers with (PeakEWMA); its
		// deployments' 429s and spent rate-limit windows cool them down
		// for the wait they ask, and the quota their answers say is left
		// spreads the requests before any window runs out.
		var provider *gateway.Gateway
		peak, err := llmlb.PeakEWMA(llmlb.PeakEWMAConfig{Headroom: func(key string) (float64, bool) {
			return provider.Headroom(key) // set below, before any request
		}})
		if err != nil {
			return nil, nil, err
		}
		provider, err = gateway.New(o.spillTo, gateway.Config{
			Policy:         peak,
			ScrapeInterval: -1,
			Parser:         parser,
			Logger:         o.log,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("-spill-to: %w", err)
		}
		runners = append(runners, provider)
		cfg.Name, cfg.SpillTo = "self-hosted", []spill.Tier{provider.Tier("provider")}
		if metrics != nil {
			cfg.SpillObserver = metrics.SpillObserver()
		}
	}
	g, err := gateway.New(backends, cfg)
	if err != nil {
		return nil, nil, err
	}
	if metrics != nil {
		if _, err := metrics.Watch(g.Balancer()); err != nil {
			return nil, nil, err
		}
	}
	return g, runners, nil
}

// signalContext returns a context that ends at the first SIGINT or SIGTERM
// (Kubernetes stops a pod with SIGTERM). Its handler goes before the
// context ends, so that a second signal, during the shutdown grace, ends the
// process at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-sigs:
		case <-ctx.Done():
		}
		signal.Stop(sigs)
		cancel()
	}()
	return ctx, cancel
}

// serve serves the gateway on l until ctx is done; then it shuts down as sd
// says, after which it cuts the requests still in flight. The gateway's own
// background work (scraping, sharing, ending ejections) and runners run
// until it has stopped serving, not only until ctx is done: through the
// drain delay and the grace period it still routes requests, on current
// state. serve returns once they have ended.
func serve(ctx context.Context, g *gateway.Gateway, runners []runner, l net.Listener, sd *shutdown, log *slog.Logger) error {
	var wg sync.WaitGroup
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		cancel()
		wg.Wait()
	}()
	wg.Go(func() { _ = g.Run(bg) })
	for _, r := range runners {
		wg.Go(func() {
			// A runner that stops early (its NATS connection closed for
			// good) leaves the gateway routing without it.
			if err := r.Run(bg); err != nil && bg.Err() == nil {
				log.Error("gateway: a background task stopped", "task", fmt.Sprintf("%T", r), "error", err)
			}
		})
	}
	srv, served := sd.serve(g, l)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sd.draining.Store(true)
	log.Info("gateway shutting down; a second signal ends it at once", "drain_delay", sd.delay, "grace", sd.grace)
	time.Sleep(sd.delay)
	return sd.stop(srv, served, log)
}
