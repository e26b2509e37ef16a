package httplb

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/apierror"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// No answer through NewProxy passes on, as a trailer, what it may not as
// a header: the upstream's account headers and its own, whether its
// Trailer header announced them or it sent them unannounced (which
// httputil.ReverseProxy forwards with http.TrailerPrefix), over HTTP/1.1
// or HTTP/2, when the stream has been read to its end before the proxy
// got the answer or after. Its other trailers reach the client; an answer
// whose body is replaced with a generic one sends none.
func TestProxyDropsAccountTrailers(t *testing.T) {
	names := make([]string, 0, len(accountHeaders)+len(upstreamOwnHeaders))
	for k := range accountHeaders {
		names = append(names, k)
	}
	for k := range upstreamOwnHeaders {
		names = append(names, k)
	}
	cases := []struct {
		name        string
		status      int
		contentType string
		body        string
		kept        bool // the upstream's other trailers reach the client
	}{
		{"200 stream", http.StatusOK, "text/event-stream", tokenEvents + "data: [DONE]\n\n", true},
		{"200 stream read whole while waiting", http.StatusOK, "text/event-stream", `data: {"choices":[]}`, true},
		{"200", http.StatusOK, "application/json", `{"id":"chatcmpl-1","choices":[]}`, true},
		{"400", http.StatusBadRequest, "application/json", `{"error":{"message":"bad temperature"}}`, true},
		{"500", http.StatusInternalServerError, "text/plain", "boom", false},
	}
	for _, h2 := range []bool{false, true} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/http2=%v", c.name, h2), func(t *testing.T) {
				up := &upstream{}
				up.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					up.hits.Add(1)
					// Half of them announced, half not.
					announced := append([]string{"X-Checksum"}, names[:len(names)/2]...)
					w.Header().Set("Trailer", strings.Join(announced, ", "))
					w.Header().Set("Content-Type", c.contentType)
					w.WriteHeader(c.status)
					fmt.Fprint(w, c.body)
					// Flushed, the body has no length, and so the proxy's
					// answer may carry trailers.
					w.(http.Flusher).Flush()
					w.Header().Set("X-Checksum", "crc32=1234")
					for i, k := range names {
						v := accountHeaders[k] + upstreamOwnHeaders[k]
						if i < len(names)/2 {
							w.Header().Set(k, v)
						} else {
							w.Header().Set(http.TrailerPrefix+k, v)
						}
					}
				}))
				if h2 {
					up.EnableHTTP2 = true
					up.StartTLS()
				} else {
					up.Start()
				}
				t.Cleanup(up.Close)
				h := newObservedHarness(t, Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, &doneLog{},
					func(http.RoundTripper) http.RoundTripper { return up.Client().Transport }, up)
				resp, body, _ := postLogged(t, h)
				assert.Equal(t, c.status, resp.StatusCode)
				if c.status < 500 {
					assert.Equal(t, c.body, body)
				}
				for _, k := range names {
					// Not even its name, announced before the body.
					assert.NotContains(t, resp.Trailer, http.CanonicalHeaderKey(k), "%s reached the client as a trailer", k)
				}
				announced := strings.Join(resp.Header.Values("Trailer"), ",")
				for _, k := range names {
					assert.NotContains(t, announced, http.CanonicalHeaderKey(k))
				}
				if c.kept {
					assert.Equal(t, "crc32=1234", resp.Trailer.Get("X-Checksum"), "a trailer that names nothing is kept")
				} else {
					assert.Empty(t, resp.Trailer, "a replaced body's trailers are the upstream body's")
					assert.Empty(t, announced)
				}
			})
		}
	}
}

// An answer whose body package spill replaced with a generic one, which
// NewUpstreamErrorHandler passes as it is, loses the upstream body's
// trailers too.
func TestSpilledAnswerLosesTrailers(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "http://a:1/v1/chat/completions", nil)
	resp := &http.Response{
		StatusCode: http.StatusServiceUnavailable,
		Header:     http.Header{"Trailer": {"X-Checksum"}},
		Trailer:    http.Header{"X-Checksum": {"crc32=1234"}, "Server": {"uvicorn"}},
		Body:       apierror.NewReplaced([]byte(`{"error":{"message":"generic"}}`)),
		Request:    req,
	}
	require.NoError(t, NewUpstreamErrorHandler(discardLog)(resp))
	assert.Empty(t, resp.Trailer)
}
