package httplb

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/retry"
)

// events records a retry.Observer's calls.
type events struct {
	mu      sync.Mutex
	retries []int
	hedges  []int
	denied  int
}

func (e *events) observer() *retry.Observer {
	return &retry.Observer{
		Retry:  func(n int, _ error) { e.mu.Lock(); e.retries = append(e.retries, n); e.mu.Unlock() },
		Hedge:  func(n int) { e.mu.Lock(); e.hedges = append(e.hedges, n); e.mu.Unlock() },
		Denied: func() { e.mu.Lock(); e.denied++; e.mu.Unlock() },
	}
}

func TestObserverRetryAndDenied(t *testing.T) {
	var ev events
	a := newUpstream(t, status(http.StatusServiceUnavailable))
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Observer: ev.observer()}}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, ev.retries, "one retry, the request's second attempt")
	assert.Zero(t, ev.denied)

	var ev2 events
	h2 := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Observer: ev2.observer(), Budget: &denyAll{}}}, a, b)
	resp, err = do(t, h2, chatBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the upstream's own answer when no retry is allowed")
	_, _ = readAll(t, resp)
	assert.Empty(t, ev2.retries)
	assert.Equal(t, 1, ev2.denied)
}
