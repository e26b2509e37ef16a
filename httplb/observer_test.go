package httplb

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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

// The Retry observer counts the retries sent, not those given up during
// their back-off: the client leaving, or no endpoint left to pick.
func TestObserverRetryCountsSentOnly(t *testing.T) {
	const hedgeDelay = time.Hour // marks the hedge timer, which never fires
	cases := []struct {
		name  string
		hedge bool
		wait  string // what happens during the back-off: "", "cancel" or "empty"
		want  []int  // the attempts the observer was told of
	}{
		{"sent", false, "", []int{2}},
		{"cancelled during the back-off", false, "cancel", nil},
		{"no endpoint after the back-off", false, "empty", nil},
		{"hedging, sent", true, "", []int{2}},
		{"hedging, cancelled during the back-off", true, "cancel", nil},
		{"hedging, no endpoint after the back-off", true, "empty", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var ev events
			var h *harness
			cfg := Config{Retry: retry.LoopConfig{
				Budget:   unlimited{},
				Observer: ev.observer(),
				After: func(d time.Duration) <-chan time.Time {
					switch {
					case d == hedgeDelay:
						return nil
					case c.wait == "cancel":
						cancel()
						return nil
					case c.wait == "empty":
						require.NoError(t, h.b.Update(nil))
					}
					return closedTime
				},
			}}
			if c.hedge {
				cfg.Retry.Hedge.Delay = hedgeDelay
			}
			h = newMemHarness(t, cfg, func(r *http.Request) (*http.Response, error) {
				if r.URL.Host == "a.test" {
					return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{},
						Body: io.NopCloser(strings.NewReader("busy")), Request: r}, nil
				}
				return sseResponse(r, "data: x\n\n"), nil
			}, 2)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			resp, err := h.tr.RoundTrip(req)
			if c.wait == "" {
				require.NoError(t, err)
				_, err = readAll(t, resp)
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
			ev.mu.Lock()
			defer ev.mu.Unlock()
			assert.Equal(t, c.want, ev.retries, "retries observed")
		})
	}
}
