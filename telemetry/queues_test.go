package telemetry_test

import (
	"context"
	"testing"

	"github.com/llmlb/llmlb/fair"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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
		g, ok := data[telemetry.MetricQueueInFlight].(metricdata.Gauge[int64])
		if !ok {
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
