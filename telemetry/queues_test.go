package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"

	"github.com/llmlb/llmlb/telemetry"
)

// Two queues watched through one Metrics are reported together, their
// counts summed, rather than one's points overwriting the other's; a queue
// watched twice counts once, and a queue unregistered stops counting.
func TestWatchQueuesSum(t *testing.T) {
	m, reader := setup(t)
	ctx := context.Background()
	newQueue := func(inFlight int) *fair.Queue {
		t.Helper()
		q, err := fair.New(fair.Config{MaxInFlight: 8})
		if err != nil {
			t.Fatal(err)
		}
		for range inFlight {
			if _, err := q.Admit(ctx, fair.Request{Principal: "p", PromptTokens: 10}); err != nil {
				t.Fatal(err)
			}
		}
		return q
	}
	a, b := newQueue(1), newQueue(2)
	regA, err := m.WatchQueue(a)
	if err != nil {
		t.Fatal(err)
	}
	regB, err := m.WatchQueue(b)
	if err != nil {
		t.Fatal(err)
	}
	regB2, err := m.WatchQueue(b)
	if err != nil {
		t.Fatal(err)
	}
	inFlight := func() []int64 {
		t.Helper()
		data := collect(t, reader)
		g, ok := data[telemetry.MetricQueueInFlight].(metricdata.Sum[int64])
		if !ok || g.IsMonotonic {
			return nil
		}
		var vs []int64
		for _, p := range g.DataPoints {
			vs = append(vs, p.Value)
		}
		return vs
	}
	if got := inFlight(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("in flight over both queues: points %v, want one of 3", got)
	}
	if err := regB.Unregister(); err != nil {
		t.Fatal(err)
	}
	if err := regB.Unregister(); err != nil { // a second call does nothing
		t.Fatal(err)
	}
	if got := inFlight(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("b still watched once: points %v, want one of 3", got)
	}
	if err := regB2.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("a alone: points %v, want one of 1", got)
	}
	if err := regA.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(); len(got) != 0 {
		t.Fatalf("no queue watched: points %v", got)
	}
}

// The counts that add up across endpoints and queues are asynchronous
// UpDownCounters (non-monotonic sums), as OpenTelemetry's semantic
// conventions make http.server.active_requests; health is a gauge.
func TestCountsAreUpDownCounters(t *testing.T) {
	m, reader := setup(t)
	q, err := fair.New(fair.Config{MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.WatchQueue(q); err != nil {
		t.Fatal(err)
	}
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithObserver(m.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{ep("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Watch(b); err != nil {
		t.Fatal(err)
	}
	data := collect(t, reader)
	for _, name := range []string{telemetry.MetricOutstanding, telemetry.MetricQueued, telemetry.MetricPrefillTokens,
		telemetry.MetricDecodeTokens, telemetry.MetricQueueWaiting, telemetry.MetricQueueInFlight, telemetry.MetricQueueTokens} {
		s, ok := data[name].(metricdata.Sum[int64])
		if !ok || s.IsMonotonic || s.Temporality != metricdata.CumulativeTemporality {
			t.Errorf("%s: %T, want a cumulative non-monotonic sum", name, data[name])
		}
	}
	if _, ok := data[telemetry.MetricHealthy].(metricdata.Gauge[int64]); !ok {
		t.Errorf("%s: %T, want a gauge", telemetry.MetricHealthy, data[telemetry.MetricHealthy])
	}
}
