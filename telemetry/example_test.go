package telemetry_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/telemetry"
)

// Wiring a balancer's metrics to Prometheus: the OpenTelemetry SDK with the
// Prometheus exporter, registered on a registry that an HTTP handler
// (promhttp.HandlerFor) serves on /metrics.
func Example() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		log.Fatal(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(context.Background())

	metrics, err := telemetry.New(provider, telemetry.Config{Policy: "p2c"})
	if err != nil {
		log.Fatal(err)
	}
	b, err := llmlb.New(llmlb.P2C(nil), llmlb.WithObserver(metrics.Observer()))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := metrics.Watch(b); err != nil { // per-endpoint load gauges
		log.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{replica("10.0.0.7:8000")}); err != nil {
		log.Fatal(err)
	}
	p, err := b.Pick(context.Background(), &llmlb.Request{PromptTokens: 500})
	if err != nil {
		log.Fatal(err)
	}
	p.FirstToken()
	p.Done(nil)

	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if name := f.GetName(); strings.HasPrefix(name, "llmlb_") || strings.HasPrefix(name, "gen_ai_") {
			fmt.Println(name)
		}
	}
	// Output:
	// gen_ai_server_request_duration_seconds
	// gen_ai_server_time_to_first_token_seconds
	// llmlb_endpoint_decode_tokens
	// llmlb_endpoint_healthy_ratio
	// llmlb_endpoint_outstanding
	// llmlb_endpoint_prefill_tokens
	// llmlb_endpoint_queued
	// llmlb_pick_cached_tokens
	// llmlb_picks_total
}

type replica string

func (r replica) Key() string { return string(r) }
