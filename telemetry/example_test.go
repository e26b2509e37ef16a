package telemetry_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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

// Dropping the endpoint attribute from the per-request instruments, for a
// fleet whose endpoint keys churn: a view on the provider keeps one series
// of llmlb.picks however many endpoints come and go, while the load gauges
// (Metrics.Watch) still report each current member.
func ExampleMetrics_endpointChurn() {
	reader := sdkmetric.NewManualReader()
	dropEndpoint := sdkmetric.Stream{AttributeFilter: attribute.NewDenyKeysFilter(telemetry.AttrEndpoint)}
	llmlbScope := instrumentation.Scope{Name: telemetry.ScopeName}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader),
		sdkmetric.WithView(
			// Every counter and histogram (picks, cached tokens, signal
			// age, time to first token, duration, ejections, cooldowns);
			// not the load counts, which report the current members.
			// Only this package's meter: other instrumentation on the
			// provider keeps its attributes.
			sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindCounter, Scope: llmlbScope}, dropEndpoint),
			sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Scope: llmlbScope}, dropEndpoint),
		))
	defer provider.Shutdown(context.Background())

	metrics, err := telemetry.New(provider, telemetry.Config{})
	if err != nil {
		log.Fatal(err)
	}
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithObserver(metrics.Observer()))
	if err != nil {
		log.Fatal(err)
	}
	for i := range 100 { // a new pod address each time
		if err := b.Update([]llmlb.Endpoint{replica(fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250))}); err != nil {
			log.Fatal(err)
		}
		p, err := b.Pick(context.Background(), &llmlb.Request{})
		if err != nil {
			log.Fatal(err)
		}
		p.Done(nil)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == telemetry.MetricPicks {
				fmt.Printf("%s: %d series, %d picks\n", m.Name, len(sum.DataPoints), sum.DataPoints[0].Value)
			}
			if h, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == "llmlb.pick.cached_tokens" {
				fmt.Printf("%s: %d series\n", m.Name, len(h.DataPoints))
			}
		}
	}
	// Unordered output:
	// llmlb.picks: 1 series, 100 picks
	// llmlb.pick.cached_tokens: 1 series
}
