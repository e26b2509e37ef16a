package httplb

import (
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// earlyHints answers 103 Early Hints with the upstream's own headers (its
// Server, a Link to its own host, an account header), then calls next.
func earlyHints(up **upstream, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Link", "<"+(*up).URL+"/internal/style.css>; rel=preload")
		h.Set("Server", "vllm/0.9 on gpu-node-17")
		h.Set("Openai-Organization", "org-secret")
		w.WriteHeader(http.StatusEarlyHints)
		clear(h)
		next(w, r)
	}
}

// TestInterimAnswersNotForwarded: a client of NewProxy never gets an
// upstream's 1xx answer, whose headers are the upstream's own, whether the
// attempt that sent it then answers or fails and is retried elsewhere. The
// proxy (httputil.ReverseProxy) forwards every 1xx its transport reports.
func TestInterimAnswersNotForwarded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(up **upstream) http.HandlerFunc // the endpoint picked first
	}{
		{"103 then 200", func(up **upstream) http.HandlerFunc { return earlyHints(up, streamTokens(2)) }},
		{"103 then 503, retried", func(up **upstream) http.HandlerFunc {
			return earlyHints(up, status(http.StatusServiceUnavailable))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a, b *upstream
			a = newUpstream(t, tc.first(&a))
			b = newUpstream(t, streamTokens(2))
			h := newHarness(t, fixed{}, Config{}, a, b)
			proxy := h.proxy(t)
			var (
				mu      sync.Mutex
				interim []textproto.MIMEHeader
			)
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
				mu.Lock()
				defer mu.Unlock()
				interim = append(interim, hdr)
				return nil
			}}
			req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace),
				http.MethodPost, proxy.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			resp, err := proxy.Client().Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Contains(t, string(body), "[DONE]")
			assert.EqualValues(t, 1, a.hits.Load())
			mu.Lock()
			defer mu.Unlock()
			assert.Empty(t, interim, "the client got the upstream's interim answers")
		})
	}
}

// TestInterimTraceHooksKept: a Transport caller's client trace still sees
// its other hooks for each attempt, only not the attempts' 1xx answers.
func TestInterimTraceHooksKept(t *testing.T) {
	var up *upstream
	up = newUpstream(t, earlyHints(&up, streamTokens(1)))
	h := newHarness(t, llmlb.LeastOutstanding(), Config{}, up)
	var conns, interim, firstBytes int
	trace := &httptrace.ClientTrace{
		GotConn:              func(httptrace.GotConnInfo) { conns++ },
		Got1xxResponse:       func(int, textproto.MIMEHeader) error { interim++; return nil },
		GotFirstResponseByte: func() { firstBytes++ },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace),
		http.MethodPost, "http://gateway.invalid/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, 1, conns)
	assert.Equal(t, 1, firstBytes)
	assert.Zero(t, interim)
}
