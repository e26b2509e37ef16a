package telemetry_test

import (
	"context"
	"strconv"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/telemetry"
)

// BenchmarkPick measures Pick, FirstToken and Done with P2C on 64
// endpoints, without an observer and with this package's metrics recorded
// by the OpenTelemetry SDK: the difference is the cost of the telemetry.
func BenchmarkPick(b *testing.B) {
	for _, withMetrics := range []bool{false, true} {
		name := "telemetry=off"
		if withMetrics {
			name = "telemetry=sdk"
		}
		b.Run(name+"/endpoints=64", func(b *testing.B) {
			var opts []llmlb.Option
			if withMetrics {
				provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				defer provider.Shutdown(context.Background())
				m, err := telemetry.New(provider, telemetry.Config{Policy: "p2c"})
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, llmlb.WithObserver(m.Observer()))
			}
			bal, err := llmlb.New(llmlb.P2C(nil), opts...)
			if err != nil {
				b.Fatal(err)
			}
			eps := make([]llmlb.Endpoint, 64)
			for i := range eps {
				eps[i] = replica("10.0.0." + strconv.Itoa(i) + ":8000")
			}
			if err := bal.Update(eps); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			req := &llmlb.Request{PromptTokens: 1000, MaxTokens: 256}
			b.ReportAllocs()
			for b.Loop() {
				p, err := bal.Pick(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				p.FirstToken()
				p.Done(nil)
			}
		})
	}
}
