package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/share"
	"github.com/llmlb/llmlb/signals"
	"github.com/llmlb/llmlb/telemetry"
)

// Health services, as the reference EPP names them (cmd/epp/runner/health.go
// and config/charts/epplib/templates/_deployment.yaml, v1.5.0): the chart's
// probes ask for "inference-extension" (one replica) or "liveness" and
// "readiness", Envoy's health check of the ext_proc cluster for the
// ExternalProcessor service.
var readyServices = []string{"", "readiness", "inference-extension", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

const livenessService = "liveness"

// server is the assembled endpoint picker.
type server struct {
	o         options
	log       *slog.Logger
	b         *llmlb.Balancer
	ix        *prefix.Index
	events    *prefix.Index // nil without KV events
	scraper   *signals.Scraper
	sub       *kvevents.Subscriber
	nc        *nats.Conn   // nil without -nats
	group     *share.Group // nil without -nats
	admission *retry.Admission
	members   *membership
	sleep     *sleeping     // nil without scraping
	maxAge    time.Duration // the age past which the balancer trusts no observation
	health    *health.Server
	grpc      *grpc.Server // ext_proc and health
	healthSrv *grpc.Server // health only
	admin     *http.Server
	provider  *sdkmetric.MeterProvider

	grpcL, healthL, adminL net.Listener
	stopWatches            chan struct{} // closed when the ext_proc listener stops: ends its health Watch streams

	readyMu  sync.Mutex // serializes the readiness changes; protects draining
	draining bool       // the picker is shutting down: never ready again
}

// run serves until ctx ends, then drains. started, if not nil, is called
// once the listeners are open.
func run(ctx context.Context, o options, started func(*server)) error {
	s, err := newServer(o)
	if err != nil {
		return err
	}
	if err := s.listen(); err != nil {
		s.closeListeners()
		return err
	}
	if started != nil {
		started(s)
	}
	return s.serve(ctx)
}

// newServer assembles the picker. It starts nothing.
func newServer(o options) (_ *server, err error) {
	s := &server{o: o}
	defer func() {
		if err != nil && s.nc != nil {
			s.nc.Close()
		}
	}()
	var out io.Writer = os.Stderr
	if o.logOut != nil {
		out = o.logOut
	}
	hopts := &slog.HandlerOptions{Level: o.logLevel}
	if o.logJSON {
		s.log = slog.New(slog.NewJSONHandler(out, hopts))
	} else {
		s.log = slog.New(slog.NewTextHandler(out, hopts))
	}

	// OpenTelemetry metrics, exported in the Prometheus format.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	res, err := telemetryResource(context.Background(), s.log)
	if err != nil {
		return nil, err
	}
	popts := []sdkmetric.Option{sdkmetric.WithReader(exporter), sdkmetric.WithResource(res)}
	if !o.perEndpoint {
		// The views take the llmlb.endpoint attribute off llmlb's
		// counters and histograms (-per-endpoint-metrics=false), as
		// package telemetry advises where endpoint keys churn: their
		// series are cumulative and would stay, one per address ever
		// picked, for as long as the provider lives. The load gauges keep
		// it: they report the current replicas only.
		popts = append(popts, sdkmetric.WithView(dropEndpointViews()...))
	}
	s.provider = sdkmetric.NewMeterProvider(popts...)
	metrics, err := telemetry.New(s.provider, telemetry.Config{Policy: o.policy})
	if err != nil {
		return nil, err
	}

	var hasher *prefix.Hasher
	parser := httplb.ParserConfig{MaxBodyBytes: o.maxBody, SessionHeader: o.sessionHeader, TrustTenantHeader: o.tenantHeader, FeatureHeader: o.featureHeader}
	if o.tokenizer == "engine" {
		parser.Tokenize = engine.Tokens
	}
	if hasher, err = prefix.NewHasher(prefix.HasherConfig{}); err != nil {
		return nil, err
	}
	parser.Hasher = hasher
	if s.ix, err = prefix.NewIndex(prefix.IndexConfig{BlockSize: hasher.BlockTokens()}); err != nil {
		return nil, err
	}
	if o.kvPort != 0 {
		if s.events, err = prefix.NewIndex(prefix.IndexConfig{BlockSize: hasher.BlockTokens(), EventsOnly: true}); err != nil {
			return nil, err
		}
		s.sub, err = kvevents.NewSubscriber(kvevents.Config{Index: s.events, Hasher: hasher, OnError: func(key string, err error) {
			s.log.Warn("llmlb-epp: KV events", "endpoint", key, "error", err)
		}})
		if err != nil {
			return nil, err
		}
	}
	policy, err := newPolicy(o, s.ix, s.events)
	if err != nil {
		return nil, err
	}
	var (
		opts     []llmlb.Option
		signal   llmlb.Signal
		maxAge   = o.signalMaxAge
		observer = metrics.Observer()
	)
	if o.scrape >= 0 {
		interval := o.scrape
		if interval == 0 {
			interval = signals.DefaultInterval
		}
		s.scraper, err = signals.NewScraper(signals.Config{Interval: interval, Engine: o.engine, OnResult: s.scraped})
		if err != nil {
			return nil, err
		}
		if maxAge == 0 {
			maxAge = 3 * interval
			if maxAge/3 != interval {
				maxAge = math.MaxInt64 // an interval of a century or more
			}
		}
		signal = s.scraper
	}
	if maxAge == 0 {
		maxAge = llmlb.DefaultMaxSignalAge
	}
	s.maxAge = maxAge
	if o.natsURL != "" {
		// The connection keeps retrying in the background: a picker
		// starts, and routes on its own state, while NATS is away.
		s.nc, err = nats.Connect(o.natsURL, nats.Name("llmlb-epp"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { s.log.Warn("llmlb-epp: NATS disconnected", "error", err) }),
			nats.ReconnectHandler(func(nc *nats.Conn) { s.log.Info("llmlb-epp: NATS reconnected", "server", nc.ConnectedUrlRedacted()) }))
		if err != nil {
			return nil, fmt.Errorf("-nats: %w", err)
		}
		s.group, err = share.New(share.Config{Conn: s.nc, Subject: o.shareSubject, ID: o.shareID, Interval: o.shareInterval,
			Signal: signal, MaxSignalAge: maxAge, Index: s.ix, Logger: s.log})
		if err != nil {
			return nil, err
		}
		signal, observer = s.group, s.group.Observer(observer)
	}
	opts = append(opts, llmlb.WithObserver(observer))
	if signal != nil {
		opts = append(opts, llmlb.WithSignal(signal, maxAge))
	}
	if o.decode != 0 {
		opts = append(opts, llmlb.WithDecodeAllowance(o.decode))
	}
	if o.predict {
		opts = append(opts, llmlb.WithOutputPrediction(llmlb.OutputConfig{}))
	}
	if o.slowStart != 0 {
		opts = append(opts, llmlb.WithSlowStart(llmlb.SlowStart{Window: o.slowStart}))
	}
	if s.b, err = llmlb.New(policy, opts...); err != nil {
		return nil, err
	}
	if s.scraper != nil {
		s.sleep = &sleeping{b: s.b}
	}
	if _, err := metrics.Watch(s.b); err != nil {
		return nil, err
	}
	if o.maxInFlight != 0 || o.maxPerSession != 0 {
		obs := metrics.RetryObserver()
		s.admission, err = retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: o.maxInFlight, MaxPerSession: o.maxPerSession,
			RetryAfter: o.retryAfter, Observer: obs})
		if err != nil {
			return nil, err
		}
	}
	p, err := httplb.NewParser(parser)
	if err != nil {
		return nil, err
	}
	picker, err := extproc.NewServer(extproc.Config{Balancer: s.b, Parser: p, Admission: s.admission, Fallbacks: o.fallbacks, Logger: s.log,
		MaxBufferedBytes: o.maxBuffered, BodyTimeout: o.bodyTimeout,
		Protocol: &extprocv3.ProtocolConfiguration{RequestBodyMode: o.reqMode, ResponseBodyMode: o.respMode}})
	if err != nil {
		return nil, err
	}

	scheme := "http"
	if o.metricsTLS {
		scheme = "https"
	}
	s.members = &membership{
		src:     source{static: o.endpoints, file: o.endpointsFile, dns: o.dns, res: net.DefaultResolver},
		b:       s.b,
		scraper: s.scraper,
		sleep:   s.sleep,
		sub:     s.sub,
		scheme:  scheme,
		path:    o.metricsPath,
		kvPort:  o.kvPort, kvReplay: o.kvReplayPort, kvTopic: o.kvTopic,
		salt:  prefix.Salt{Model: o.model},
		log:   s.log,
		ready: s.setReady,
	}

	s.health = health.NewServer()
	s.health.SetServingStatus(livenessService, healthpb.HealthCheckResponse_SERVING)
	for _, svc := range readyServices {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	gopts := []grpc.ServerOption{
		// Envoy keeps its ext_proc connections alive with pings; allow them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// A BUFFERED body comes in one message: room for a body up to
		// the parser's cap (-max-body-bytes, or its default for 0) and
		// then some, so that one over it gets 413 and not a failed stream
		// (up to recvHeadroom over); see recvLimit.
		grpc.MaxRecvMsgSize(recvLimit(p.MaxBodyBytes())),
		// Each stream holds a goroutine and gRPC's buffers: bound them per
		// connection (0: grpc-go's default, no limit). The request bodies
		// are bounded over all connections by -max-buffered-bytes.
		grpc.MaxConcurrentStreams(uint32(o.maxStreams)),
	}
	if o.secure {
		tc, err := tlsConfig(o.certPath)
		if err != nil {
			if o.certPath != "" {
				return nil, fmt.Errorf("-cert-path: %w", err)
			}
			return nil, err
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.grpc = grpc.NewServer(gopts...)
	extprocv3.RegisterExternalProcessorServer(s.grpc, picker)
	s.stopWatches = make(chan struct{})
	healthpb.RegisterHealthServer(s.grpc, drainingHealth{Server: s.health, stop: s.stopWatches})
	if o.healthAddr != "" {
		s.healthSrv = grpc.NewServer()
		healthpb.RegisterHealthServer(s.healthSrv, s.health)
	}
	if o.adminAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("/debug/llmlb", http.HandlerFunc(s.debug))
		s.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

// listen opens the listeners.
func (s *server) listen() error {
	var err error
	if s.grpcL, err = net.Listen("tcp", s.o.grpcAddr); err != nil {
		return err
	}
	if s.healthSrv != nil {
		if s.healthL, err = net.Listen("tcp", s.o.healthAddr); err != nil {
			return err
		}
	}
	if s.admin != nil {
		if s.adminL, err = net.Listen("tcp", s.o.adminAddr); err != nil {
			return err
		}
	}
	return nil
}

func (s *server) closeListeners() {
	for _, l := range []net.Listener{s.grpcL, s.healthL, s.adminL} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// setReady reports the picker ready: it knows its replicas. It does nothing
// once the picker drains, which may begin before the replicas are first read.
func (s *server) setReady() {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if s.draining {
		return
	}
	for _, svc := range readyServices {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
}

// serve serves until ctx ends or a listener fails, then drains.
func (s *server) serve(ctx context.Context) error {
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stopBG()
		wg.Wait()
		if s.scraper != nil {
			s.scraper.Close()
		}
		if s.nc != nil {
			s.nc.Close()
		}
		_ = s.provider.Shutdown(context.Background())
	}()
	failing := 0 // the reads of the replicas failed in a row
	if err := s.members.refresh(ctx); err != nil {
		if s.o.endpointsFile == "" && s.o.dns == "" {
			s.closeListeners()
			return err // a bad -endpoints list does not get better
		}
		s.log.Warn("llmlb-epp: reading the replicas failed; not ready until it succeeds", "error", err)
		failing = 1 // warned about: the watch does not warn again for the next read
	}
	wg.Go(func() { s.members.watch(bg, s.o.refresh, failing) })
	if s.scraper != nil {
		wg.Go(func() { _ = s.scraper.Run(bg) })
	}
	if s.sub != nil {
		wg.Go(func() { _ = s.sub.Run(bg) })
	}
	if s.group != nil {
		wg.Go(func() {
			if err := s.group.Run(bg); err != nil && bg.Err() == nil {
				s.log.Error("llmlb-epp: sharing stopped", "error", err)
			}
		})
	}

	failed := make(chan error, 3)
	var servers sync.WaitGroup
	servers.Go(func() { failed <- s.grpc.Serve(s.grpcL) })
	if s.healthSrv != nil {
		servers.Go(func() { failed <- s.healthSrv.Serve(s.healthL) })
	}
	if s.admin != nil {
		servers.Go(func() {
			if err := s.admin.Serve(s.adminL); !errors.Is(err, http.ErrServerClosed) {
				failed <- err
			}
		})
	}
	s.log.Info("llmlb-epp serving", "ext_proc", s.grpcL.Addr().String(), "tls", s.o.secure, "policy", s.o.policy,
		"protocol", extproc.ProtocolVersion)
	var err error
	select {
	case <-ctx.Done():
	case err = <-failed:
	}
	s.drain()
	servers.Wait()
	return err
}

// drain reports NOT_SERVING so that probes and the data plane's health
// checks move traffic away, waits the drain delay, stops accepting streams
// and lets those in flight finish within the drain timeout; the rest are
// cancelled, which finishes their picks.
func (s *server) drain() {
	s.readyMu.Lock()
	s.draining = true
	for _, svc := range readyServices {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	s.readyMu.Unlock()
	s.log.Info("llmlb-epp draining; a second signal ends it at once", "delay", s.o.drainDelay, "timeout", s.o.drainTimeout)
	time.Sleep(s.o.drainDelay)
	close(s.stopWatches) // a health watcher must not hold the graceful stop
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(s.o.drainTimeout):
		s.log.Warn("llmlb-epp: drain timed out; cancelling the streams left")
		s.grpc.Stop()
		<-stopped
	}
	if s.healthSrv != nil {
		s.healthSrv.Stop()
	}
	if s.admin != nil {
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.admin.Shutdown(shutdown)
	}
	s.log.Info("llmlb-epp stopped")
}

// scraped logs a replica's scrape failures (the first, then each power of
// ten in a row) and its recovery, and keeps the replica out of picks while
// the observation the balancer trusts (one no older than the maximum signal
// age) says its engine is asleep ([sleeping]). A failed scrape leaves the
// last good observation in place until it is older than that: a replica
// that went to sleep and stopped answering its scrapes is then picked
// again.
func (s *server) scraped(prev, cur signals.Status) {
	switch n := cur.ConsecutiveFailures; {
	case n > 0 && isPowerOfTen(n):
		s.log.Warn("llmlb-epp: scrape failed", "endpoint", cur.Key, "consecutive_failures", n, "error", cur.LastError)
	case n == 0 && prev.ConsecutiveFailures > 0:
		s.log.Info("llmlb-epp: scrape recovered", "endpoint", cur.Key, "failures", prev.ConsecutiveFailures)
	}
	if s.sleep == nil {
		return
	}
	o, ok := s.scraper.Observation(cur.Key)
	asleep := ok && o.Asleep && time.Since(o.At) <= s.maxAge
	if s.sleep.set(cur.Key, asleep) {
		if asleep {
			s.log.Info("llmlb-epp: engine asleep, not picked while another replica is awake", "endpoint", cur.Key)
		} else {
			s.log.Info("llmlb-epp: engine awake", "endpoint", cur.Key)
		}
	}
}

// dropEndpointViews are the views that take [telemetry.AttrEndpoint] off
// every counter and histogram of package telemetry (-per-endpoint-metrics
// =false): picks, cached tokens, signal age, time to first token, request
// duration, ejections and cooldowns. The load counts and the health gauge
// keep it: they are asynchronous, which the views leave alone, and report
// the current replicas only. The views match the instruments of the
// telemetry package's meter ([telemetry.ScopeName]) alone, so other
// instrumentation on the provider keeps its attributes.
func dropEndpointViews() []sdkmetric.View {
	drop := sdkmetric.Stream{AttributeFilter: attribute.NewDenyKeysFilter(telemetry.AttrEndpoint)}
	scope := instrumentation.Scope{Name: telemetry.ScopeName}
	return []sdkmetric.View{
		sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindCounter, Scope: scope}, drop),
		sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Scope: scope}, drop),
	}
}

func isPowerOfTen(n int) bool {
	for n%10 == 0 {
		n /= 10
	}
	return n == 1
}

// recvLimit is the largest gRPC message received with a body cap of
// maxBody: recvHeadroom over the cap, or over 1 GiB (maxHeldBody) for a
// larger cap, since extproc holds no body over that whatever the cap, and
// a message grpc-go accepts is read whole into memory first.
func recvLimit(maxBody int64) int {
	return int(min(maxBody, maxHeldBody) + recvHeadroom)
}

// maxHeldBody is the largest body extproc holds, whatever the parser's cap
// (see extproc.Config.Parser).
const maxHeldBody = 1 << 30

// recvHeadroom is how far over -max-body-bytes a gRPC message may be: a
// BUFFERED body that much over the cap still gets its 413, and headers and
// metadata fit beside a body at the cap.
const recvHeadroom = 1 << 20
