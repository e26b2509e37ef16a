package telemetry_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/telemetry"
)

// provider is a MeterProvider that hands out meter.
type provider struct {
	embedded.MeterProvider
	meter metric.Meter
}

func (p provider) Meter(string, ...metric.MeterOption) metric.Meter { return p.meter }

// nilCounterMeter creates every Int64Counter as nil, with no error.
type nilCounterMeter struct{ noop.Meter }

func (nilCounterMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return nil, nil
}

// nilGaugeMeter creates every Int64ObservableGauge as a nil pointer, with no
// error.
type nilGaugeMeter struct{ noop.Meter }

func (nilGaugeMeter) Int64ObservableGauge(string, ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	var g *noop.Int64ObservableGauge
	return g, nil
}

// nilRegistrationMeter registers callbacks without a registration.
type nilRegistrationMeter struct{ noop.Meter }

func (nilRegistrationMeter) RegisterCallback(metric.Callback, ...metric.Observable) (metric.Registration, error) {
	return nil, nil
}

// TestBrokenMeterProvider: a MeterProvider that breaks the API's contract,
// handing out a nil Meter, nil instruments or a nil callback registration
// with no error, makes New, Watch and WatchQueue fail with ErrInvalidConfig
// rather than panic then or at the first measurement.
func TestBrokenMeterProvider(t *testing.T) {
	for _, tc := range []struct {
		name  string
		meter metric.Meter
	}{
		{"nil meter", nil},
		{"nil counter", nilCounterMeter{}},
		{"nil gauge pointer", nilGaugeMeter{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := telemetry.New(provider{meter: tc.meter}, telemetry.Config{})
			if !errors.Is(err, telemetry.ErrInvalidConfig) || m != nil {
				t.Fatalf("New = %v, %v; want ErrInvalidConfig", m, err)
			}
		})
	}

	m, err := telemetry.New(provider{meter: nilRegistrationMeter{}}, telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := llmlb.New(llmlb.RoundRobin())
	if err != nil {
		t.Fatal(err)
	}
	if reg, err := m.Watch(b); !errors.Is(err, telemetry.ErrInvalidConfig) || reg != nil {
		t.Errorf("Watch = %v, %v; want ErrInvalidConfig", reg, err)
	}
	q, err := fair.New(fair.Config{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if reg, err := m.WatchQueue(q); !errors.Is(err, telemetry.ErrInvalidConfig) || reg != nil {
		t.Errorf("WatchQueue = %v, %v; want ErrInvalidConfig", reg, err)
	}
	m.RetryObserver().Retry(2, context.Canceled) // records without a panic
}
