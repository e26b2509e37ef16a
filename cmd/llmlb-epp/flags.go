package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/token"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/share"
	"github.com/llmlb/llmlb/signals"
)

// options is the command's configuration.
type options struct {
	grpcAddr, healthAddr, adminAddr string
	secure                          bool
	certPath                        string

	endpoints     []string // static "ip:port" list
	endpointsFile string
	dns           string // "name:port"
	refresh       time.Duration

	policy        string
	slots         int
	cacheWeight   float64
	sampled       int
	score         string
	fallbacks     int
	decode        int
	predict       bool
	featureHeader string
	slowStart     time.Duration
	maxInFlight   int
	maxPerSession int
	retryAfter    time.Duration

	maxBody       int64
	maxBuffered   int64
	bodyTimeout   time.Duration
	reqMode       filterv3.ProcessingMode_BodySendMode // for a data plane that announces none
	respMode      filterv3.ProcessingMode_BodySendMode
	maxStreams    int64
	sessionHeader string
	tenantHeader  string

	scrape       time.Duration
	signalMaxAge time.Duration
	metricsPath  string
	metricsTLS   bool
	engine       signals.Engine

	kvPort, kvReplayPort int
	kvTopic              string
	model                string
	tokenizer            string

	natsURL       string // "": no sharing
	shareSubject  string
	shareID       string
	shareInterval time.Duration

	perEndpoint bool // llmlb.endpoint on the counters and histograms

	drainDelay, drainTimeout time.Duration
	logJSON                  bool
	logLevel                 slog.Level
	logOut                   io.Writer // nil: stderr (not a flag)
}

// policies lists the names -policy accepts.
var policies = []string{"default", "least-outstanding", "least-tokens", "least-kv", "p2c", "round-robin", "random",
	"consistent-hash", "prefix-hash", "prefix-aware", "sglang-cache-aware", "dynamo-kv", "gie-default"}

// defaultMaxStreams is the default -max-concurrent-streams: the default
// limit of requests in flight that Envoy's circuit breakers put on a cluster
// (max_requests), so that a data plane at its defaults never meets it, while
// the goroutines and gRPC buffers of one connection's streams stay bounded.
const defaultMaxStreams = 1024

// minRefresh is the least -refresh.
const minRefresh = 10 * time.Millisecond

// parseFlags reads the command line into options, or returns an error
// (flag.ErrHelp for -h, after writing the usage to out). It writes nothing
// else: the caller reports the error, once.
func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("llmlb-epp", flag.ContinueOnError)
	// The flag package writes a parse error and the usage before returning
	// the error; the caller writes the error alone, and the usage is for -h.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&o.grpcAddr, "grpc-addr", ":9002", "address of the ext_proc gRPC server (the InferencePool's endpointPickerRef port)")
	fs.StringVar(&o.healthAddr, "grpc-health-addr", ":9003", "address of the gRPC health server for probes (\"\": none; health is also served on -grpc-addr)")
	fs.StringVar(&o.adminAddr, "admin", "127.0.0.1:9090", "address of /metrics and /debug/llmlb (\"\": none); the debug view names replicas: keep it private")
	fs.BoolVar(&o.secure, "secure-serving", true, "serve ext_proc over TLS, as the reference EPP does (gateways connect with TLS and do not verify)")
	fs.StringVar(&o.certPath, "cert-path", "", "directory with tls.crt and tls.key, reloaded when they change (\"\": a self-signed certificate)")

	endpoints := fs.String("endpoints", "", "comma-separated replica addresses, ip:port (for a DNS name, -dns)")
	fs.StringVar(&o.endpointsFile, "endpoints-file", "", "file of replica addresses, one ip:port per line ('#' comments), re-read when it changes")
	fs.StringVar(&o.dns, "dns", "", "name:port whose A records (AAAA records if it has none: one address per pod of a dual-stack Service) are the replicas (a headless Service), re-resolved every -refresh")
	fs.DurationVar(&o.refresh, "refresh", 5*time.Second, "how often -endpoints-file and -dns are re-read (at least 10ms)")

	fs.StringVar(&o.policy, "policy", "default", "routing policy: "+strings.Join(policies, ", "))
	fs.IntVar(&o.slots, "slots", 0, "default: the replicas' batch slots (vLLM --max-num-seqs; 0: unknown)")
	fs.Float64Var(&o.cacheWeight, "cache-weight", 0, "default: credit per cached prompt token, in prefill tokens (0: the policy's default)")
	fs.IntVar(&o.sampled, "sampled", 0, "default: score only the prefix holders and this many random candidates (0: every candidate up to 64, 16 beyond; negative: every candidate)")
	fs.StringVar(&o.score, "score", "requests", "p2c: the score, requests, tokens or kv")
	fs.IntVar(&o.fallbacks, "fallbacks", 0, fmt.Sprintf("endpoints listed after the picked one for the data plane to retry on (0-%d); only for a data plane that reads the list (Envoy's override_host load balancing policy), not an ORIGINAL_DST cluster, which takes one address", extproc.MaxFallbacks))
	fs.IntVar(&o.decode, "decode-allowance", 0, "expected output tokens of a request that does not say (0: llmlb's default)")
	fs.BoolVar(&o.predict, "predict-outputs", false, "learn the output lengths of each kind of request (tenant, model, reasoning effort) from the streamed responses and charge them instead of the decode allowance")
	fs.StringVar(&o.featureHeader, "feature-header", "", "append this header's value (a route or prompt template) to the kind of request whose output lengths -predict-outputs learns; only behind a proxy that sets or strips it")
	fs.DurationVar(&o.slowStart, "slow-start", 0, "ramp traffic into new replicas over this window (0: off)")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 0, "answer 429 beyond this many requests in flight (0: no cap)")
	fs.IntVar(&o.maxPerSession, "max-per-session", 0, "answer 429 beyond this many requests in flight per session (0: no cap)")
	fs.DurationVar(&o.retryAfter, "retry-after", retry.DefaultAdmissionRetryAfter, "Retry-After suggested with a 429")

	fs.Int64Var(&o.maxBody, "max-body-bytes", httplb.DefaultMaxBodyBytes, "largest request body read, at most 1 GiB (a larger value means 1 GiB); a longer one is answered 413 (0: the default)")
	fs.Int64Var(&o.maxBuffered, "max-buffered-bytes", extproc.DefaultMaxBufferedBytes, "most bytes of request bodies held at once, over all streams and connections; a request beyond it is answered 429 (0: the default; at least -max-body-bytes)")
	fs.DurationVar(&o.bodyTimeout, "body-timeout", extproc.DefaultBodyTimeout, "answer 408 to a request whose body is not received this long after its headers, and let the body go (0: the default; negative: no deadline)")
	reqMode := fs.String("request-body-mode", "full-duplex-streamed", "the ext_proc filter's request_body_mode, for an Envoy before v1.34 that does not announce it: "+strings.Join(bodyModeNames, ", "))
	respMode := fs.String("response-body-mode", "full-duplex-streamed", "the ext_proc filter's response_body_mode, for an Envoy before v1.34 that does not announce it: "+strings.Join(bodyModeNames, ", "))
	fs.Int64Var(&o.maxStreams, "max-concurrent-streams", defaultMaxStreams, "most ext_proc streams (requests) open at once on one data plane connection, advertised in HTTP/2 SETTINGS; Envoy opens another connection beyond it (0: no limit)")
	fs.StringVar(&o.sessionHeader, "session-header", httplb.DefaultSessionHeader, "header carrying the session (affinity) key; the body's \"user\" otherwise")
	fs.StringVar(&o.tenantHeader, "tenant-header", "", "header taken as the tenant, e.g. x-llm-d-inference-fairness-id (formerly x-gateway-inference-fairness-id); only if the gateway sets or strips it (\"\": no tenant)")

	fs.DurationVar(&o.scrape, "scrape", time.Second, "interval between /metrics scrapes of each replica (negative: off); a replica whose vLLM engine is asleep is not picked while its scrape says so, and while every replica sleeps requests are answered 503")
	fs.DurationVar(&o.signalMaxAge, "signal-max-age", 0, "ignore engine observations older than this (0: three scrape intervals)")
	fs.StringVar(&o.metricsPath, "metrics-path", "/metrics", "path of the replicas' Prometheus metrics")
	fs.BoolVar(&o.metricsTLS, "metrics-https", false, "scrape the replicas' metrics over https")
	engineName := fs.String("engine", "auto", "the replicas' metrics dialect: auto, vllm, sglang, trtllm, triton, llamacpp")

	fs.IntVar(&o.kvPort, "kv-events-port", 0, "port of each replica's ZMQ KV-event publisher (vLLM/SGLang --kv-events-config; 0: off)")
	fs.IntVar(&o.kvReplayPort, "kv-replay-port", 0, "port of each replica's KV-event replay socket (0: none)")
	fs.StringVar(&o.kvTopic, "kv-topic", "", "topic of the KV events (the engines' --kv-events-config topic; \"\", the default, receives every topic, which also follows engines left at their default topic)")
	fs.StringVar(&o.natsURL, "nats", "", "share requests in flight and routed prefixes with the other replicas of this picker over the NATS server(s) at this URL (nats://host:4222)")
	fs.StringVar(&o.shareSubject, "share-subject", share.DefaultSubject, "with -nats: the subject the replicas of this picker share on")
	fs.StringVar(&o.shareID, "share-id", "", "with -nats: this replica's name among its peers (default: random)")
	fs.DurationVar(&o.shareInterval, "share-interval", share.DefaultInterval, "with -nats: the time between two batches of shared state")
	fs.StringVar(&o.model, "model", engine.DefaultModel, "with -kv-events-port: the model the replicas serve, which salts the events' blocks")
	fs.StringVar(&o.tokenizer, "tokenizer", "", "token IDs for prefix hashing, needed to match KV events: \"engine\" (llmlb-engine's emulated engines) or \"\" (byte mode)")

	fs.DurationVar(&o.drainDelay, "drain-delay", 5*time.Second, "on SIGTERM, how long to report NOT_SERVING before refusing new streams")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 120*time.Second, "on SIGTERM, how long streams in flight may take to finish (a second SIGTERM ends the process at once)")
	fs.BoolVar(&o.perEndpoint, "per-endpoint-metrics", false, "label the counters and histograms of /metrics (picks, time to first token, duration, ...) with llmlb_endpoint, the replica's address, "+
		"as the load gauges llmlb_endpoint_* always are (default: true with -endpoints; false with -endpoints-file and -dns, whose addresses change with every rollout: "+
		"each address would keep its series until the picker restarts, up to 2000 an instrument, the OpenTelemetry SDK's default limit, beyond which new addresses count in one series labelled otel_metric_overflow=\"true\")")
	fs.BoolVar(&o.logJSON, "log-json", false, "log as JSON lines")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(out)
			fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// A flag that only qualifies another one does nothing without it: a
	// typo or a forgotten flag, not a setting to accept silently.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, dep := range []struct{ flag, needs string }{
		{"kv-replay-port", "kv-events-port"}, {"kv-topic", "kv-events-port"}, {"model", "kv-events-port"},
		{"share-subject", "nats"}, {"share-id", "nats"}, {"share-interval", "nats"},
	} {
		if set[dep.flag] && !set[dep.needs] {
			return o, fmt.Errorf("-%s does nothing without -%s", dep.flag, dep.needs)
		}
	}
	if !set["per-endpoint-metrics"] {
		// A fixed list keeps its series bounded; discovered addresses
		// do not.
		o.perEndpoint = *endpoints != ""
	}
	if *endpoints != "" {
		for _, e := range strings.Split(*endpoints, ",") {
			o.endpoints = append(o.endpoints, strings.TrimSpace(e))
		}
	}
	sources := 0
	for _, set := range []bool{*endpoints != "", o.endpointsFile != "", o.dns != ""} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return o, errors.New("give exactly one of -endpoints, -endpoints-file and -dns")
	}
	if o.dns != "" {
		if err := checkAddr(o.dns); err != nil {
			return o, fmt.Errorf("-dns: %w", err)
		}
	}
	if o.refresh < minRefresh {
		// Below it, re-reading the file or the name is a busy loop.
		return o, fmt.Errorf("-refresh %v is below %v", o.refresh, minRefresh)
	}
	if !contains(policies, o.policy) {
		return o, fmt.Errorf("unknown -policy %q (want one of %s)", o.policy, strings.Join(policies, ", "))
	}
	// The path is appended to each replica's address when the replicas
	// are read, which for -endpoints-file and -dns is after the picker
	// started: a bad one must fail here, not leave it never ready.
	if !strings.HasPrefix(o.metricsPath, "/") {
		return o, fmt.Errorf("-metrics-path %q must begin with /", o.metricsPath)
	}
	if _, err := url.Parse("http://127.0.0.1:1" + o.metricsPath); err != nil {
		return o, fmt.Errorf("-metrics-path %q is not a URL path", o.metricsPath)
	}
	e, err := signals.ParseEngine(*engineName)
	if err != nil {
		return o, fmt.Errorf("-engine: %w", err)
	}
	o.engine = e
	var ok bool
	if o.reqMode, ok = bodyModes[*reqMode]; !ok {
		return o, fmt.Errorf("unknown -request-body-mode %q (want one of %s)", *reqMode, strings.Join(bodyModeNames, ", "))
	}
	if o.respMode, ok = bodyModes[*respMode]; !ok {
		return o, fmt.Errorf("unknown -response-body-mode %q (want one of %s)", *respMode, strings.Join(bodyModeNames, ", "))
	}
	if err := o.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return o, fmt.Errorf("-log-level: %w", err)
	}
	if o.tokenizer != "" && o.tokenizer != "engine" {
		return o, fmt.Errorf("unknown -tokenizer %q (want \"engine\" or \"\")", o.tokenizer)
	}
	if o.kvPort != 0 && o.tokenizer == "" {
		return o, errors.New("-kv-events-port needs -tokenizer: the engines' blocks are hashed from token IDs")
	}
	if o.kvPort < 0 || o.kvPort > 65535 || o.kvReplayPort < 0 || o.kvReplayPort > 65535 {
		return o, errors.New("-kv-events-port and -kv-replay-port must be ports")
	}
	if o.drainDelay < 0 || o.drainTimeout < 0 {
		return o, errors.New("-drain-delay and -drain-timeout must not be negative")
	}
	// A stream holds at most the body cap, and never more than 1 GiB, the
	// default budget: the budget must hold one such body.
	if o.maxBuffered < 0 || o.maxBuffered != 0 && o.maxBuffered < min(cmp.Or(o.maxBody, httplb.DefaultMaxBodyBytes), extproc.DefaultMaxBufferedBytes) {
		return o, fmt.Errorf("-max-buffered-bytes %d must be at least -max-body-bytes, or 0", o.maxBuffered)
	}
	if o.maxStreams < 0 || o.maxStreams > math.MaxUint32 {
		return o, fmt.Errorf("-max-concurrent-streams %d is outside [0, %d]", o.maxStreams, uint32(math.MaxUint32))
	}
	if o.retryAfter < 0 {
		return o, fmt.Errorf("-retry-after %v must not be negative", o.retryAfter)
	}
	// A header name that no request can carry would never match: a typo,
	// not a setting to accept silently.
	for _, h := range []struct{ flag, name string }{
		{"session-header", o.sessionHeader}, {"tenant-header", o.tenantHeader}, {"feature-header", o.featureHeader},
	} {
		if h.name != "" && !token.Valid(h.name) {
			return o, fmt.Errorf("-%s %q is not an HTTP header name", h.flag, h.name)
		}
	}
	// A flag of one policy given with another, or one that only a
	// setting it is given without would read, is refused as well.
	for _, dep := range []struct {
		flag, needs string
		ok          bool
	}{
		{"score", "-policy p2c", o.policy == "p2c"},
		{"slots", "-policy default", o.policy == "default"},
		{"cache-weight", "-policy default", o.policy == "default"},
		{"sampled", "-policy default", o.policy == "default"},
		{"cert-path", "-secure-serving", o.secure},
		{"feature-header", "-predict-outputs", o.predict},
		{"retry-after", "-max-in-flight or -max-per-session", o.maxInFlight != 0 || o.maxPerSession != 0},
		{"metrics-path", "scraping (-scrape is negative)", o.scrape >= 0},
		{"metrics-https", "scraping (-scrape is negative)", o.scrape >= 0},
		{"engine", "scraping (-scrape is negative)", o.scrape >= 0},
		{"per-endpoint-metrics", "-admin", o.adminAddr != ""},
	} {
		if set[dep.flag] && !dep.ok {
			return o, fmt.Errorf("-%s does nothing without %s", dep.flag, dep.needs)
		}
	}
	return o, nil
}

// bodyModes are the values of -request-body-mode and -response-body-mode,
// Envoy's BodySendMode names in lower case with dashes.
var bodyModes = map[string]filterv3.ProcessingMode_BodySendMode{
	"full-duplex-streamed": filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	"buffered":             filterv3.ProcessingMode_BUFFERED,
	"buffered-partial":     filterv3.ProcessingMode_BUFFERED_PARTIAL,
	"streamed":             filterv3.ProcessingMode_STREAMED,
	"none":                 filterv3.ProcessingMode_NONE,
}

var bodyModeNames = []string{"full-duplex-streamed", "buffered", "buffered-partial", "streamed", "none"}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// newPolicy builds the policy o names over ix (the prefix index it records
// into) and events (KV events; nil: none).
func newPolicy(o options, ix, events *prefix.Index) (llmlb.Policy, error) {
	switch o.policy {
	case "default":
		return llmlb.Default(llmlb.DefaultConfig{Index: ix, Events: events, Slots: o.slots, CacheWeight: o.cacheWeight, Sampled: o.sampled})
	case "least-outstanding":
		return llmlb.LeastOutstanding(), nil
	case "least-tokens":
		return llmlb.LeastTokens(), nil
	case "least-kv":
		return llmlb.LeastKV(), nil
	case "p2c":
		switch o.score {
		case "requests":
			return llmlb.P2C(llmlb.RequestsScore), nil
		case "tokens":
			return llmlb.P2C(llmlb.TokensScore), nil
		case "kv":
			return llmlb.P2C(llmlb.KVScore), nil
		}
		return nil, fmt.Errorf("unknown -score %q (want requests, tokens or kv)", o.score)
	case "round-robin":
		return llmlb.RoundRobin(), nil
	case "random":
		return llmlb.Random(), nil
	case "consistent-hash":
		return llmlb.ConsistentHash(llmlb.HashConfig{})
	case "prefix-hash":
		return llmlb.PrefixHash(llmlb.PrefixHashConfig{})
	case "prefix-aware":
		return llmlb.PrefixAware(llmlb.PrefixAwareConfig{Index: ix})
	case "sglang-cache-aware":
		return llmlb.SGLangCacheAware(llmlb.PrefixAwareConfig{Index: ix})
	case "dynamo-kv":
		kc := llmlb.DynamoKVCostConfig()
		kc.Index = ix
		if events != nil {
			kc.Index = events
		}
		// Dynamo's router tracks its active sequences' blocks by default.
		active, err := llmlb.NewActiveBlocks(kc.Index.BlockSize())
		if err != nil {
			return nil, err
		}
		kc.Active = active
		return llmlb.KVCost(kc)
	case "gie-default":
		return llmlb.GIEDefault(llmlb.GIEConfig{Index: ix})
	}
	return nil, fmt.Errorf("unknown policy %q", o.policy)
}
