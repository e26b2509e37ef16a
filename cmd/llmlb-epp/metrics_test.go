package main

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
)

// scrapeSeries returns the series of each metric family on the picker's
// /metrics, and how many of them carry the llmlb_endpoint label.
func scrapeSeries(t *testing.T, s *server) (series, withEndpoint map[string]int) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.admin.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	require.NoError(t, err)
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

// churn replaces the replica with the addresses from to to-1 in turn, as
// rolling deploys give them, and sends two requests to each, one succeeding
// and one failing.
func churn(t *testing.T, s *server, res *fakeResolver, from, to int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < to; i++ {
		res.ips = []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)}
		require.NoError(t, s.members.refresh(ctx))
		for _, err := range []error{nil, context.DeadlineExceeded} {
			p, perr := s.b.Pick(ctx, &llmlb.Request{})
			require.NoError(t, perr)
			p.FirstToken()
			p.Done(err)
		}
	}
}

// TestEndpointChurnMetrics: with -dns the replicas' addresses churn, as
// pods' do with every rollout, and the counters and histograms keep no series
// for each address ever picked: /metrics stays the same size however many
// addresses came and went, while the load gauges name the current replica.
// With -per-endpoint-metrics they carry the address, one series each.
func TestEndpointChurnMetrics(t *testing.T) {
	const rounds = 60
	instruments := []string{"llmlb_picks_total", "gen_ai_server_time_to_first_token_seconds",
		"gen_ai_server_request_duration_seconds", "llmlb_pick_cached_tokens"}
	for _, perEndpoint := range []bool{false, true} {
		args := []string{"-dns", "vllm.default.svc:8000", "-scrape", "-1s"}
		name := "default"
		if perEndpoint {
			args, name = append(args, "-per-endpoint-metrics"), "per-endpoint-metrics"
		}
		t.Run(name, func(t *testing.T) {
			o, err := parseFlags(args, io.Discard)
			require.NoError(t, err)
			o.logOut = io.Discard
			s, err := newServer(o)
			require.NoError(t, err)
			defer s.provider.Shutdown(context.Background())
			res := &fakeResolver{}
			s.members.src.res = res

			churn(t, s, res, 0, 1)
			before, _ := scrapeSeries(t, s)
			churn(t, s, res, 1, 1+rounds)
			after, withEndpoint := scrapeSeries(t, s)
			require.Equal(t, 1, withEndpoint["llmlb_endpoint_outstanding"], "the load gauges name the current replica")
			if !perEndpoint {
				require.Equal(t, before, after, "the series grew with the addresses")
				for _, name := range instruments {
					require.NotZero(t, after[name], name)
					require.Zero(t, withEndpoint[name], name)
				}
				return
			}
			for _, name := range instruments {
				require.NotZero(t, withEndpoint[name], name)
			}
			require.Equal(t, rounds+1, withEndpoint["llmlb_picks_total"])
			// A success and a failure (with its error type) an address.
			require.Equal(t, 2*(rounds+1), withEndpoint["gen_ai_server_request_duration_seconds"])
		})
	}
}

// TestPerEndpointMetricsDefault: the counters and histograms carry the
// replica's address by default only for a fixed -endpoints list; without
// -admin there are no metrics, and the flag is refused.
func TestPerEndpointMetricsDefault(t *testing.T) {
	_, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-admin", "", "-per-endpoint-metrics=false"}, io.Discard)
	require.ErrorContains(t, err, "-per-endpoint-metrics does nothing without -admin")
	cases := []struct {
		args []string
		want bool
	}{
		{[]string{"-endpoints", "10.0.0.1:8000"}, true},
		{[]string{"-endpoints", "10.0.0.1:8000", "-per-endpoint-metrics=false"}, false},
		{[]string{"-endpoints-file", "/etc/llmlb/endpoints"}, false},
		{[]string{"-dns", "vllm.default.svc:8000"}, false},
		{[]string{"-dns", "vllm.default.svc:8000", "-per-endpoint-metrics"}, true},
	}
	for _, c := range cases {
		o, err := parseFlags(c.args, io.Discard)
		require.NoError(t, err, c.args)
		require.Equal(t, c.want, o.perEndpoint, c.args)
	}
}

// TestServiceName: the telemetry resource on /metrics (target_info) names
// the service llmlb-epp, unless OTEL_RESOURCE_ATTRIBUTES or
// OTEL_SERVICE_NAME, which takes precedence, names another, as the
// OpenTelemetry SDK reads them.
func TestServiceName(t *testing.T) {
	cases := []struct {
		name, serviceName, attributes string
		want                          map[string]string
	}{
		{"default", "", "", map[string]string{"service_name": "llmlb-epp", "telemetry_sdk_language": "go"}},
		{"OTEL_SERVICE_NAME", "picker-a", "", map[string]string{"service_name": "picker-a"}},
		{"OTEL_RESOURCE_ATTRIBUTES", "", "service.name=picker-b,deployment.environment.name=prod",
			map[string]string{"service_name": "picker-b", "deployment_environment_name": "prod"}},
		{"both", "picker-a", "service.name=picker-b,service.namespace=inference",
			map[string]string{"service_name": "picker-a", "service_namespace": "inference"}},
		{"invalid attributes", "", "service.namespace=inference,novalue",
			map[string]string{"service_name": "llmlb-epp", "service_namespace": "inference"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_SERVICE_NAME", c.serviceName)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", c.attributes)
			o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-scrape", "-1s"}, io.Discard)
			require.NoError(t, err)
			o.logOut = io.Discard
			s, err := newServer(o)
			require.NoError(t, err)
			defer s.provider.Shutdown(context.Background())

			rec := httptest.NewRecorder()
			s.admin.Handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			require.Equal(t, 200, rec.Code)
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
			require.NoError(t, err)
			info := families["target_info"]
			require.NotNil(t, info, "no target_info")
			require.Len(t, info.GetMetric(), 1)
			labels := map[string]string{}
			for _, l := range info.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range c.want {
				require.Equal(t, v, labels[k], "%s in %v", k, labels)
			}
		})
	}
}
