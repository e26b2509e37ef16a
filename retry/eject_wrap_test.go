package retry

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// forwarding wraps an Ejector to count reports, forwarding both methods.
type forwarding struct {
	e *Ejector
	n atomic.Int64
}

var _ ElapsedReporter = (*forwarding)(nil)

func (f *forwarding) Report(key string, err error) {
	f.n.Add(1)
	f.e.Report(key, err)
}

func (f *forwarding) ReportElapsed(key string, elapsed time.Duration, err error) {
	f.n.Add(1)
	f.e.ReportElapsed(key, elapsed, err)
}

// reportOnly wraps an Ejector with Report only, as [ElapsedReporter]
// warns against.
type reportOnly struct{ e *Ejector }

func (r reportOnly) Report(key string, err error) { r.e.Report(key, err) }

// TestLoopWrappedEjectorLongStream: a Loop gives the age of each attempt to
// a Reporter that wraps an Ejector and is an [ElapsedReporter], so that a
// long stream sent before its endpoint's ejection, failing once the
// endpoint is back, does not re-eject it; a wrapper with Report only loses
// the age, and the endpoint is re-ejected, as the documentation warns.
func TestLoopWrappedEjectorLongStream(t *testing.T) {
	cases := []struct {
		name      string
		wrap      func(*Ejector) Reporter
		reejected bool
	}{
		{"ElapsedReporter", func(e *Ejector) Reporter { return &forwarding{e: e} }, false},
		{"embedded Ejector", func(e *Ejector) Reporter { return struct{ *Ejector }{e} }, false},
		{"Report only", func(e *Ejector) Reporter { return reportOnly{e} }, true},
		{"embedded Reporter", func(e *Ejector) Reporter { return struct{ Reporter }{e} }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			b := newBalancer(t, "a")
			e, err := NewEjector(b, EjectorConfig{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			r := c.wrap(e)
			l, err := NewLoop(b, LoopConfig{Reporter: r, MaxAttempts: 1, Backoff: noBackoff{}, Budget: unlimited{}, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			broken := &StatusError{Code: 502}
			err = l.Do(context.Background(), nil, func(ctx context.Context, a *Attempt) error {
				a.FirstToken()
				// While the stream runs, a is ejected and comes back.
				clk.Advance(time.Minute)
				for i := 0; i < DefaultConsecutiveFailures; i++ {
					e.Report("a", broken)
				}
				clk.Advance(DefaultBaseEjectionTime)
				e.Sweep()
				if !healthy(b, "a") {
					t.Error("a not back after its ejection")
				}
				return broken // the stream breaks after the return
			})
			if err == nil {
				t.Fatal("Do succeeded")
			}
			if f, ok := r.(*forwarding); ok && f.n.Load() != 1 {
				t.Fatalf("the wrapper heard of %d attempts, want 1", f.n.Load())
			}
			if got := !healthy(b, "a"); got != c.reejected {
				t.Fatalf("a re-ejected by the failure of a stream sent before its ejection: %v, want %v", got, c.reejected)
			}
		})
	}
}
