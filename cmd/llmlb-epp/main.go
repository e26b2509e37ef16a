// Command llmlb-epp is an endpoint picker (EPP) for Gateway API Inference
// Extension gateways: it serves Envoy's external processing protocol
// (package extproc) and routes each inference request to a model server
// replica with an llmlb policy, as the inference extension's reference
// EPP does for an InferencePool.
//
//	llmlb-epp -endpoints 10.0.0.7:8000,10.0.0.8:8000
//	llmlb-epp -endpoints-file /etc/llmlb/endpoints
//	llmlb-epp -dns vllm-headless.default.svc.cluster.local:8000
//
// The replicas come from a list, from a file it re-reads when it changes (one
// "ip:port" per line), or from the addresses a DNS name resolves to (a
// headless Service), re-resolved periodically. Their /metrics are scraped as
// the policy's signal and, with -kv-events-port, their KV events followed.
//
// A replica whose vLLM engine was put to sleep (POST /sleep; the gauge
// vllm:engine_sleep_state{sleep_state="awake"} 0 on every engine) reports no
// requests, yet serves none until it wakes: while its last scrape, no older
// than -signal-max-age, says so, it is marked unhealthy and picked no more,
// and a scrape that finds it awake puts it back. While every replica that
// may take a request is asleep, the picker answers 503 with
// x-llm-d-request-dropped-reason: rejected-no-endpoints, as when none is
// ready, rather than send requests to an engine that would hold them until
// it wakes.
//
// It listens, as the reference EPP does, for ext_proc on :9002 (TLS with a
// self-signed certificate unless -secure-serving=false or -cert-path names a
// tls.crt and tls.key, which are reloaded when they change) and for gRPC
// health checks on :9003: the services "liveness", "readiness",
// "inference-extension" and envoy.service.ext_proc.v3.ExternalProcessor,
// which are also served on the ext_proc port. The admin listener (-admin)
// serves /metrics (OpenTelemetry through the Prometheus exporter; its
// target_info names the service llmlb-epp unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES names another) and /debug/llmlb (a JSON view of
// the endpoints). The request bodies held at
// once, over all streams, are bounded by -max-buffered-bytes (beyond it a
// request is answered 429), a body not received within -body-timeout is
// answered 408, and the streams open at once on one connection
// by -max-concurrent-streams. On SIGTERM it reports NOT_SERVING,
// waits -drain-delay for the data plane to notice, stops accepting streams and
// lets those in flight finish for up to -drain-timeout. A second SIGTERM or
// interrupt during the drain ends the process at once. A usage error (a
// flag unknown, unparsable or refused) exits with status 2, a picker that
// fails to start or to serve with status 1.
//
// On /metrics, the load gauges (llmlb_endpoint_outstanding, ..._queued,
// ..._healthy_ratio and the token gauges) carry each current replica's
// address in llmlb_endpoint. The counters and histograms (picks, time to
// first token, request duration, cached tokens) carry it only with
// -per-endpoint-metrics, on by default for an -endpoints list and off for
// -endpoints-file and -dns, whose addresses change with every rollout: those
// series are cumulative, and each address gone would keep its own until the
// picker restarts (up to 2000 an instrument, the OpenTelemetry SDK's default
// limit, beyond which new addresses are counted together in a series
// labelled otel_metric_overflow="true").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// The first signal starts the drain. The handler goes before the drain
	// begins, so that a second signal ends the process, as an operator who
	// sends it expects.
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
	code := command(ctx, os.Args[1:], os.Stderr)
	cancel()
	os.Exit(code)
}

// command runs llmlb-epp with the command-line arguments args, writing its
// usage and errors to stderr, and returns its exit status: 0 when it ends
// well or after -h; 2 for a usage error (a flag the command does not know,
// a value it cannot parse or refuses), as the flag package's ExitOnError
// exits, with one line naming the error and no usage; 1 when the picker
// fails to start or fails while serving.
func command(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0 // -h: the usage is written, and asking for it is no failure
	}
	if err != nil {
		fmt.Fprintf(stderr, "llmlb-epp: %v\nRun 'llmlb-epp -h' for the flags.\n", err)
		return 2
	}
	if err := run(ctx, o, nil); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "llmlb-epp:", err)
		return 1
	}
	return 0
}
