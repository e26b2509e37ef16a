package retry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// logReporter logs the failed attempts and passes every outcome on to an
// Ejector, with its age.
type logReporter struct{ e *retry.Ejector }

// The Loop finds ReportElapsed by this interface: without the method, the
// Ejector would not know how old each attempt is.
var _ retry.ElapsedReporter = logReporter{}

func (r logReporter) Report(key string, err error) { r.ReportElapsed(key, 0, err) }

func (r logReporter) ReportElapsed(key string, elapsed time.Duration, err error) {
	if err != nil {
		fmt.Printf("%s: %v\n", key, err)
	}
	r.e.ReportElapsed(key, elapsed, err)
}

// ExampleElapsedReporter wraps an Ejector in a Reporter that logs: it
// forwards ReportElapsed, so that the Ejector still tells a long stream sent
// before an endpoint's ejection from an attempt sent after its return.
func ExampleElapsedReporter() {
	b, _ := llmlb.New(llmlb.RoundRobin())
	_ = b.Update([]llmlb.Endpoint{backend{"replica-a", ""}})
	ejector, _ := retry.NewEjector(b, retry.EjectorConfig{})
	loop, _ := retry.NewLoop(b, retry.LoopConfig{Reporter: logReporter{ejector}, MaxAttempts: 1})

	err := loop.Do(context.Background(), nil, func(ctx context.Context, a *retry.Attempt) error {
		return &retry.StatusError{Code: 502}
	})
	fmt.Println("error:", err != nil)
	// Output:
	// replica-a: retry: upstream HTTP status 502
	// error: true
}
