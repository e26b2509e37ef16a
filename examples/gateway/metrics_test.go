package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/telemetry"
)

// TestEndpointChurnMetrics: with -per-endpoint-metrics=false the counters
// and histograms keep no series for each replica ever picked: a gateway
// whose replicas change (Gateway.Update, as a copy of this one fed by
// discovery calls it) exports as many series after any number of them as
// after the first, while the load gauges name the current replica. With
// -per-endpoint-metrics, the default for the fixed -backends, each replica
// has its own.
func TestEndpointChurnMetrics(t *testing.T) {
	const rounds = 40
	instruments := []string{"llmlb_picks_total", "gen_ai_server_time_to_first_token_seconds",
		"gen_ai_server_request_duration_seconds", "llmlb_pick_cached_tokens", "llmlb_ejections_total", "llmlb_cooldowns_total"}
	for _, perEndpoint := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-endpoint-metrics=%v", perEndpoint), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			provider, err := meterProvider(reg, perEndpoint)
			if err != nil {
				t.Fatal(err)
			}
			defer provider.Shutdown(context.Background())
			metrics, err := telemetry.New(provider, telemetry.Config{Policy: "round-robin"})
			if err != nil {
				t.Fatal(err)
			}
			backend := func(i int) string { return fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1) }
			o := options{policy: "round-robin", scrape: -1, attempts: 1, log: slog.New(slog.DiscardHandler)}
			g, _, err := newGateway([]string{backend(0)}, o, metrics)
			if err != nil {
				t.Fatal(err)
			}
			// churn moves the gateway to the replicas from to to-1 in turn,
			// and records on each what a request that succeeds and one that
			// fails, ejecting it, would.
			churn := func(from, to int) {
				t.Helper()
				for i := from; i < to; i++ {
					if err := g.Update([]string{backend(i)}); err != nil {
						t.Fatal(err)
					}
					for _, done := range []error{nil, errors.New("upstream failed")} {
						p, err := g.Balancer().Pick(context.Background(), &llmlb.Request{})
						if err != nil {
							t.Fatal(err)
						}
						p.FirstToken()
						p.Done(done)
					}
					metrics.RetryObserver().Eject(backend(i), time.Second)
					metrics.RetryObserver().Cooldown(backend(i), time.Second)
				}
			}
			churn(0, 1)
			before, _ := scrape(t, reg)
			churn(1, 1+rounds)
			after, withEndpoint := scrape(t, reg)
			if name := serviceName(t, reg); name != "llmlb-gateway" {
				t.Errorf("target_info service_name %q, want llmlb-gateway", name)
			}
			if n := withEndpoint["llmlb_endpoint_outstanding"]; n != 1 {
				t.Errorf("llmlb_endpoint_outstanding: %d series with llmlb_endpoint, want 1, the current replica's", n)
			}
			for _, name := range instruments {
				switch {
				case after[name] == 0:
					t.Errorf("%s: no series", name)
				case !perEndpoint && withEndpoint[name] != 0:
					t.Errorf("%s: %d series with llmlb_endpoint, want none", name, withEndpoint[name])
				case !perEndpoint && after[name] != before[name]:
					t.Errorf("%s: %d series after %d replicas, %d after the first", name, after[name], 1+rounds, before[name])
				case perEndpoint && withEndpoint[name] < 1+rounds:
					t.Errorf("%s: %d series with llmlb_endpoint, want one or more for each of %d replicas", name, withEndpoint[name], 1+rounds)
				}
			}
		})
	}
}

// scrape returns the series of each metric family reg exports on /metrics,
// and how many of them carry the llmlb_endpoint label.
func scrape(t *testing.T, reg *prometheus.Registry) (series, withEndpoint map[string]int) {
	t.Helper()
	families := metricFamilies(t, reg)
	series, withEndpoint = map[string]int{}, map[string]int{}
	for name, f := range families {
		series[name] = len(f.GetMetric())
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "llmlb_endpoint" {
					withEndpoint[name]++
				}
			}
		}
	}
	return series, withEndpoint
}

// serviceName returns the service_name label of the target_info reg
// exports on /metrics.
func serviceName(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	for _, m := range metricFamilies(t, reg)["target_info"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "service_name" {
				return l.GetValue()
			}
		}
	}
	return ""
}

// metricFamilies returns the metric families reg exports on /metrics.
func metricFamilies(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return families
}
