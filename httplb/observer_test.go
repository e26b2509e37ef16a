package httplb

import (
	"net/http"
	"strings"
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

// The cause a Retry observer is given names the endpoint that failed and
// the request's id: the client's, or the one NewProxy gave the request,
// which the upstream and the error handler see too.
func TestObserverRetryCauseNamesEndpointAndRequest(t *testing.T) {
	var refused, served sync.Map // request ids each upstream received
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		refused.Store(r.Header.Get("X-Request-Id"), true)
		status(http.StatusTooManyRequests)(w, r)
	})
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		served.Store(r.Header.Get("X-Request-Id"), true)
		streamTokens(1)(w, r)
	})
	var (
		mu     sync.Mutex
		causes []error
	)
	obs := &retry.Observer{Retry: func(_ int, err error) { mu.Lock(); causes = append(causes, err); mu.Unlock() }}
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Observer: obs, Budget: unlimited{}}}, a, b)
	gw := h.proxy(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	only := func(m *sync.Map) string {
		t.Helper()
		var ids []string
		m.Range(func(k, _ any) bool { ids = append(ids, k.(string)); m.Delete(k); return true })
		require.Len(t, ids, 1)
		return ids[0]
	}
	for _, clientID := range []string{"client-42", ""} {
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		require.NoError(t, err)
		if clientID != "" {
			req.Header.Set("X-Request-Id", clientID)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, err = readAll(t, resp)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)

		mu.Lock()
		require.Len(t, causes, 1)
		cause := causes[0]
		causes = nil
		mu.Unlock()
		var se *retry.StatusError
		require.ErrorAs(t, cause, &se, "the cause still wraps the attempt's error")
		assert.Equal(t, http.StatusTooManyRequests, se.Code)
		assert.ErrorContains(t, cause, "endpoint "+a.URL)
		// The first attempt carries the request's id, the client's or a
		// new one; the retry its own, so that an engine holding the first
		// does not refuse it as a duplicate.
		id := only(&refused)
		if clientID != "" {
			assert.Equal(t, clientID, id, "the client's id reaches the upstream")
		} else {
			assert.True(t, validRequestID(id), id)
		}
		assert.Equal(t, id+"-2", only(&served), "the retry's id")
		assert.ErrorContains(t, cause, "request "+id+",")
	}
}
