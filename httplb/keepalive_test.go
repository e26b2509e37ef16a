package httplb

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type connRequestsKey struct{}

// The HTTP/1.1 keep-alive race: a server closes a kept-alive connection
// just as the next request arrives on it. net/http does not resend a POST
// on another connection (it is not idempotent), so the attempt fails
// before its first token; httplb retries it, on the same endpoint when it
// is the only one, and the caller gets the whole answer.
func TestKeepAliveRaceRetried(t *testing.T) {
	var hits, conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		n := r.Context().Value(connRequestsKey{}).(*atomic.Int64).Add(1)
		if n == 2 {
			// The second request on a connection: it is closed unanswered,
			// as an idle timeout closes it while the request is in flight.
			_, _ = io.Copy(io.Discard, r.Body)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				panic(err)
			}
			_ = conn.Close()
			return
		}
		streamTokens(1)(w, r)
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		conns.Add(1)
		return context.WithValue(ctx, connRequestsKey{}, new(atomic.Int64))
	}
	srv.Start()
	t.Cleanup(srv.Close)
	rec := &recorder{}
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Reporter: rec}}, &upstream{Server: srv})

	for i := range 2 {
		resp, err := do(t, h, chatBody)
		require.NoError(t, err, "request %d", i)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d", i)
		body, err := readAll(t, resp)
		require.NoError(t, err, "request %d", i)
		assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body, "request %d", i)
	}
	// The second request's first attempt went on the kept-alive
	// connection and failed; its retry opened a second one.
	assert.EqualValues(t, 3, hits.Load())
	assert.EqualValues(t, 2, conns.Load())
	var failed int
	for _, err := range rec.reported(srv.URL) {
		if err != nil {
			failed++
		}
	}
	assert.Equal(t, 1, failed, "failures reported: %v", rec.reported(srv.URL))
}
