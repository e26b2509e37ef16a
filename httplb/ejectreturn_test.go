package httplb

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// A stream sent to an endpoint before its ejection that breaks after the
// endpoint came back is not the half-open probe: the Transport tells its
// Ejector how long ago the attempt was picked, so the endpoint stays in.
func TestStreamBeforeEjectionDoesNotReeject(t *testing.T) {
	release := make(chan struct{})
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		<-release
		panic(http.ErrAbortHandler) // the stream breaks
	})
	h := newHarness(t, llmlb.RoundRobin(), Config{}, a)
	clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ej, err := retry.NewEjector(h.b, retry.EjectorConfig{Clock: clk, MaxEjectionPercent: 100})
	require.NoError(t, err)
	h.tr.reporter, h.tr.elapsed = ej, elapsedReporter(ej)

	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	// While the stream runs, the endpoint fails other requests, is
	// ejected, and comes back half-open.
	for range retry.DefaultConsecutiveFailures {
		ej.Report(a.URL, &retry.StatusError{Code: http.StatusBadGateway})
	}
	require.Equal(t, []string{a.URL}, ej.Ejected())
	clk.Advance(retry.DefaultBaseEjectionTime)
	ej.Sweep()
	require.Empty(t, ej.Ejected())
	time.Sleep(time.Millisecond) // the stream's age, read on the Transport's clock
	close(release)
	_, err = readAll(t, resp)
	require.Error(t, err, "the stream did not break")
	assert.Empty(t, ej.Ejected(), "the break of a stream sent before the ejection re-ejected the endpoint that came back")
}
