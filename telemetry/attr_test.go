package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/spill"
	"github.com/llmlb/llmlb/telemetry"
)

// promMetrics returns Metrics exported to a Prometheus registry.
func promMetrics(t *testing.T) (*prometheus.Registry, *telemetry.Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	m, err := telemetry.New(provider, telemetry.Config{Policy: "round-robin"})
	if err != nil {
		t.Fatal(err)
	}
	return reg, m
}

// TestHostileKeysExport scrapes, through the Prometheus exporter, a
// balancer whose endpoint keys are invalid UTF-8 or a mebibyte long: the
// scrape must succeed, every label value must be valid and short, and two
// long keys with the same head must stay distinct series.
func TestHostileKeysExport(t *testing.T) {
	reg, m := promMetrics(t)
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithObserver(m.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Watch(b); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a character
	// The two bad keys differ only in their invalid bytes, which the same
	// replacement character stands for.
	keys := []ep{"ok:8000", "bad\xff\xfe:8000", "bad\xfe:8000", ep(long + "a"), ep(long + "b")}
	eps := make([]llmlb.Endpoint, len(keys))
	for i, k := range keys {
		eps[i] = k
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	for range 2 * len(keys) {
		p, err := b.Pick(context.Background(), &llmlb.Request{PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		p.FirstToken()
		p.Done(nil)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("scrape failed: %v", err)
	}
	seen := map[string]bool{}
	bad := 0
	for _, f := range families {
		if f.GetName() != "llmlb_picks_total" {
			continue
		}
		for _, mm := range f.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() != "llmlb_endpoint" {
					continue
				}
				v := l.GetValue()
				if !utf8.ValidString(v) || len(v) > 256 {
					t.Errorf("label value of %d bytes, valid UTF-8 %v", len(v), utf8.ValidString(v))
				}
				seen[v] = true
				if strings.HasPrefix(v, "bad\uFFFD:8000~") {
					bad++
				}
			}
		}
	}
	if len(seen) != len(keys) || !seen["ok:8000"] || bad != 2 {
		t.Errorf("%d endpoint series, want %d (ok:8000 and two bad\\uFFFD:8000~hash among them, not %d)", len(seen), len(keys), bad)
	}
}

// TestHostileSpillReasonExport: a spill reason from a custom Spill function
// that is not valid UTF-8 is exported, replaced, instead of failing every
// scrape.
func TestHostileSpillReasonExport(t *testing.T) {
	reg, m := promMetrics(t)
	m.SpillObserver()(spill.Event{From: "a", To: "b", Reason: "upstream said \xff"})
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("scrape failed: %v", err)
	}
	found := false
	for _, f := range families {
		for _, mm := range f.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "llmlb_spill_reason" {
					found = found || strings.HasPrefix(l.GetValue(), "upstream said \uFFFD~")
				}
			}
		}
	}
	if !found {
		t.Error("no spill series with the replaced reason")
	}
}
