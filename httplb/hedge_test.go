package httplb

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slow never sends a first event; it counts the requests it saw cancelled.
func slow(cancelled *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			cancelled.Add(1)
		case <-time.After(10 * time.Second):
		}
	}
}

func TestHedgeWins(t *testing.T) {
	var cancelled atomic.Int64
	a := newUpstream(t, slow(&cancelled))
	b := newUpstream(t, sse(2))
	budget := &denyAll{}
	h := newHarness(t, fixed{}, Config{HedgeDelay: time.Millisecond, Budget: unlimitedFinish{budget}}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
	// The first attempt may be cancelled before its request reaches a (the
	// hedge fires after 1 ms and can win first on a loaded machine); if it
	// did reach a, a must see it cancelled.
	assert.LessOrEqual(t, a.hits.Load(), int64(1))
	assert.EqualValues(t, 1, b.hits.Load())
	require.Eventually(t, func() bool { return cancelled.Load() == a.hits.Load() }, 5*time.Second, time.Millisecond, "the losing attempt is cancelled")
	assert.EqualValues(t, 2, budget.finished.Load())
}

// Two attempts that both receive a first event: only the first commits, the
// other is closed, and both are finished.
func TestHedgeBothCommit(t *testing.T) {
	a := newUpstream(t, sse(1))
	b := newUpstream(t, sse(1))
	h := newHarness(t, llmlb.RoundRobin(), Config{HedgeDelay: time.Millisecond}, a, b)
	for range 20 {
		resp, err := do(t, h, chatBody)
		require.NoError(t, err)
		body, err := readAll(t, resp)
		require.NoError(t, err)
		assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body)
	}
	assert.Greater(t, a.hits.Load()+b.hits.Load(), int64(20), "some requests were hedged")
}

func TestHedgeFailuresThenRetry(t *testing.T) {
	a := newUpstream(t, status(http.StatusServiceUnavailable))
	b := newUpstream(t, status(http.StatusServiceUnavailable))
	c := newUpstream(t, sse(1))
	h := newHarness(t, fixed{}, Config{HedgeDelay: time.Millisecond, MaxAttempts: 3, Budget: unlimited{}}, a, b, c)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 1, c.hits.Load())
}

// With one endpoint there is nowhere to hedge to: the attempt just goes on.
func TestHedgeNowhere(t *testing.T) {
	a := newUpstream(t, sse(1))
	h := newHarness(t, fixed{}, Config{HedgeDelay: time.Millisecond}, a)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 1, a.hits.Load())
}

func TestHedgeCancelled(t *testing.T) {
	var cancelled atomic.Int64
	a := newUpstream(t, slow(&cancelled))
	b := newUpstream(t, slow(&cancelled))
	h := newHarness(t, fixed{}, Config{HedgeDelay: time.Millisecond, Budget: unlimited{}}, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	_, err = h.tr.RoundTrip(req)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 1, b.hits.Load())
}
