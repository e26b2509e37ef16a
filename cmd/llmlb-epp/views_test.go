package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/telemetry"
)

// TestDropEndpointViews: the views take llmlb.endpoint off package telemetry's
// counters and histograms, keep it on the load counts and the health gauge,
// and leave another meter's instruments on the same provider alone.
func TestDropEndpointViews(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithView(dropEndpointViews()...))
	defer provider.Shutdown(context.Background())
	m, err := telemetry.New(provider, telemetry.Config{})
	require.NoError(t, err)
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithObserver(m.Observer()))
	require.NoError(t, err)
	_, err = m.Watch(b)
	require.NoError(t, err)
	require.NoError(t, b.Update([]llmlb.Endpoint{ep("10.0.0.1:8000"), ep("10.0.0.2:8000")}))
	for range 4 {
		p, err := b.Pick(context.Background(), &llmlb.Request{PromptTokens: 10})
		require.NoError(t, err)
		p.FirstToken()
		p.Done(nil)
	}
	other, err := provider.Meter("other").Int64Counter("other.requests")
	require.NoError(t, err)
	other.Add(context.Background(), 1, metric.WithAttributes(telemetry.AttrEndpoint.String("10.0.0.1:8000")))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	withEndpoint := map[string]int{} // series carrying llmlb.endpoint, by instrument
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			seen[mt.Name] = true
			for _, set := range dataPointSets(mt.Data) {
				if _, ok := set.Value(telemetry.AttrEndpoint); ok {
					withEndpoint[mt.Name]++
				}
			}
		}
	}
	for _, name := range []string{telemetry.MetricPicks, telemetry.MetricTimeToFirstToken, telemetry.MetricRequestDuration} {
		require.True(t, seen[name], name)
		require.Zero(t, withEndpoint[name], "%s keeps llmlb.endpoint", name)
	}
	for _, name := range []string{telemetry.MetricOutstanding, telemetry.MetricHealthy} {
		require.Equal(t, 2, withEndpoint[name], "%s names each current endpoint", name)
	}
	require.Equal(t, 1, withEndpoint["other.requests"], "another meter's counter is left alone")
}

// dataPointSets returns the attribute sets of the data points of d.
func dataPointSets(d metricdata.Aggregation) []attribute.Set {
	var sets []attribute.Set
	switch d := d.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	}
	return sets
}

// ep is an endpoint named by its key.
type ep string

func (e ep) Key() string { return string(e) }
