package httplb

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
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

// selfWrapper is a body whose Unwrap returns itself.
type selfWrapper struct{ io.ReadCloser }

func (w *selfWrapper) Unwrap() io.ReadCloser { return w }

// heldBody finds the Transport's body under the wrappers that strip an
// answer's trailers as it ends, httplb's own and package spill's alike, up
// to maxUnwrap-1 of them, and gives up on a wrapper that unwraps to
// itself.
func TestHeldBodyUnwrap(t *testing.T) {
	b := &body{rc: http.NoBody}
	for n := range maxUnwrap + 1 {
		resp := &http.Response{Body: b}
		for range n {
			apierror.StripTrailerAtEnd(resp)
		}
		got, ok := heldBody(resp.Body)
		if n < maxUnwrap {
			assert.True(t, ok, "under %d wrappers", n)
			assert.Same(t, b, got)
		} else {
			assert.False(t, ok, "under %d wrappers", n)
		}
	}
	_, ok := heldBody(&selfWrapper{http.NoBody})
	assert.False(t, ok)
}

// An answer that NewUpstreamErrorHandler treats twice, as two handlers in a
// chain of ModifyResponse would, reaches the client as one treatment
// leaves it: the second finds the Transport's body under the first's
// wrapper of it, but its first event was treated, and its later events
// are rewritten once, each logged once; its trailers are stripped.
func TestUpstreamErrorHandlerTwice(t *testing.T) {
	ev := `data: {"error": {"message": "` + secret + `", "type": "InternalServerError", "code": 500}}` + "\n\n"
	stream := ev + tokenEvents + ev + "data: [DONE]\n\n"
	post := func(times int) (string, string, http.Header) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Trailer", "Server, X-Checksum")
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, stream)
			w.(http.Flusher).Flush()
			w.Header().Set("Server", "uvicorn")
			w.Header().Set("X-Checksum", "crc32=1234")
		})
		h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
		var logs syncBuffer
		handle := NewUpstreamErrorHandler(slog.New(slog.NewJSONHandler(&logs, nil)))
		proxy := NewProxy(h.tr)
		proxy.ModifyResponse = func(resp *http.Response) error {
			for range times {
				if err := handle(resp); err != nil {
					return err
				}
			}
			return nil
		}
		gw := httptest.NewServer(proxy)
		defer gw.Close()
		resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		require.NoError(t, err)
		body, err := readAll(t, resp)
		require.NoError(t, err)
		id := resp.Header.Get(requestIDHeader)
		return strings.ReplaceAll(body, id, "ID"), strings.ReplaceAll(logs.String(), id, "ID"), resp.Trailer
	}
	once, onceLogs, onceTrailer := post(1)
	twice, twiceLogs, twiceTrailer := post(2)
	assert.NotContains(t, once, secret)
	assert.Equal(t, 2, strings.Count(once, "The upstream failed to answer. Request ID: ID"), once)
	assert.Equal(t, once, twice)
	assert.Equal(t, 2, strings.Count(twiceLogs, "\n"), twiceLogs)
	assert.Equal(t, strings.Count(onceLogs, "\n"), strings.Count(twiceLogs, "\n"))
	assert.Equal(t, http.Header{"X-Checksum": {"crc32=1234"}}, onceTrailer)
	assert.Equal(t, onceTrailer, twiceTrailer)
}
