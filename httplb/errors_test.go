package httplb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type openAIError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// A connection failure reaches the client as a generic 502 with a request
// id; its details (the upstream's address) reach only the operator's log,
// under the same id.
func TestProxyErrorHidesDetails(t *testing.T) {
	const upstream = "10.9.8.7:8443"
	b, err := llmlb.New(llmlb.RoundRobin())
	require.NoError(t, err)
	eps, err := NewEndpoints("http://" + upstream)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: &net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 8443}, Err: syscall.ECONNREFUSED}
	}}
	tr, err := NewTransport(Config{Balancer: b, Base: base, Retry: retry.LoopConfig{MaxAttempts: 2, After: func(time.Duration) <-chan time.Time { return closedTime }}})
	require.NoError(t, err)
	var logs syncBuffer
	proxy := NewProxy(tr)
	proxy.ErrorHandler = NewErrorHandler(slog.New(slog.NewJSONHandler(&logs, nil)))
	gw := httptest.NewServer(proxy)
	defer gw.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	cases := []struct {
		name   string
		id     string // the client's X-Request-Id
		reused bool
	}{
		{"no id", "", false},
		{"client id", "0f8fad5b-d9cb-469f-a165-70867728950e", true},
		{"bad id", "x\"; injected=1", false},
		{"long id", strings.Repeat("a", maxRequestIDLen+1), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			if c.id != "" {
				req.Header.Set("X-Request-Id", c.id)
			}
			before := len(logs.String())
			resp, err := client.Do(req)
			require.NoError(t, err)
			raw, err := readAll(t, resp)
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			for _, leak := range []string{"10.9.8.7", "8443", "dial", "refused", "httplb", "retry"} {
				assert.NotContains(t, raw, leak, "the client sees no detail")
			}
			var body openAIError
			require.NoError(t, json.Unmarshal([]byte(raw), &body), raw)
			assert.Equal(t, "upstream_error", body.Error.Type)
			assert.Equal(t, http.StatusBadGateway, body.Error.Code)
			id := resp.Header.Get("X-Request-Id")
			require.NotEmpty(t, id)
			assert.True(t, validRequestID(id), id)
			if c.reused {
				assert.Equal(t, c.id, id)
			} else {
				assert.NotEqual(t, c.id, id)
			}
			assert.Contains(t, body.Error.Message, id)

			var rec struct {
				Level     string `json:"level"`
				RequestID string `json:"request_id"`
				Status    int    `json:"status"`
				Error     string `json:"error"`
				Path      string `json:"path"`
			}
			require.NoError(t, json.Unmarshal([]byte(logs.String()[before:]), &rec), logs.String()[before:])
			assert.Equal(t, "ERROR", rec.Level)
			assert.Equal(t, id, rec.RequestID)
			assert.Equal(t, http.StatusBadGateway, rec.Status)
			assert.Equal(t, "/v1/chat/completions", rec.Path)
			assert.Contains(t, rec.Error, upstream, "the operator sees the detail")
			assert.Contains(t, rec.Error, "connection refused")
		})
	}
}

// An upstream's own error answer: a 5xx reaches the client with its status
// and Retry-After but a generic body and a request id, its body only the
// log; so do a 401, 403 and 429, about the upstream's credentials, account
// or capacity, without the upstream's other headers and logged at Info;
// another 4xx reaches the client as it is, with a request id, and is logged
// at Info.
func TestProxyUpstreamErrors(t *testing.T) {
	const secret = "Traceback: /srv/model/worker.py line 7, 10.1.2.3"
	cases := []struct {
		status   int
		hidden   bool
		level    string
		clientID string
	}{
		{http.StatusServiceUnavailable, true, "ERROR", ""},
		{http.StatusInternalServerError, true, "ERROR", "client-7"},
		{http.StatusBadRequest, false, "INFO", ""},
		{http.StatusTooManyRequests, true, "INFO", "client-8"},
		{http.StatusUnauthorized, true, "INFO", ""},
		{http.StatusForbidden, true, "INFO", ""},
		// text-generation-inference's failure of its model shard,
		// "Request failed during generation: " and the shard's error.
		{http.StatusFailedDependency, true, "ERROR", ""},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.status), func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "3")
				w.Header().Set("Content-Type", "text/plain")
				w.Header().Set("Openai-Organization", "org-secret")
				w.WriteHeader(c.status)
				fmt.Fprint(w, secret)
			})
			h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
			var logs syncBuffer
			proxy := NewProxy(h.tr)
			proxy.ModifyResponse = NewUpstreamErrorHandler(slog.New(slog.NewJSONHandler(&logs, nil)))
			gw := httptest.NewServer(proxy)
			defer gw.Close()
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			if c.clientID != "" {
				req.Header.Set("X-Request-Id", c.clientID)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			raw, err := readAll(t, resp)
			require.NoError(t, err)
			assert.Equal(t, c.status, resp.StatusCode)
			assert.Equal(t, "3", resp.Header.Get("Retry-After"))
			id := resp.Header.Get("X-Request-Id")
			require.True(t, validRequestID(id), id)
			if c.clientID != "" {
				assert.Equal(t, c.clientID, id)
			}
			var rec struct {
				Level     string `json:"level"`
				RequestID string `json:"request_id"`
				Status    int    `json:"status"`
				Upstream  string `json:"upstream"`
				Body      string `json:"body"`
			}
			require.NoError(t, json.Unmarshal([]byte(logs.String()), &rec), logs.String())
			assert.Equal(t, c.level, rec.Level)
			assert.Equal(t, id, rec.RequestID)
			assert.Equal(t, c.status, rec.Status)
			assert.Equal(t, strings.TrimPrefix(up.URL, "http://"), rec.Upstream)
			if !c.hidden {
				assert.Equal(t, secret, raw, "a 4xx describes the client's request: passed on")
				return
			}
			assert.NotContains(t, raw, "Traceback")
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var body openAIError
			require.NoError(t, json.Unmarshal([]byte(raw), &body), raw)
			assert.Equal(t, c.status, body.Error.Code)
			assert.Contains(t, body.Error.Message, id)
			assert.Equal(t, secret, rec.Body, "the operator sees the upstream's body")
			if c.status < 500 {
				assert.Empty(t, resp.Header.Get("Openai-Organization"), "a refusal's headers name the upstream's account")
			}
		})
	}
}

// The statuses a client sees, each with a generic message and a request id,
// and the log level of each.
func TestErrorHandlerStatuses(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		code       int
		typ        string
		retryAfter string
		level      slog.Level
	}{
		{"unauthenticated", fmt.Errorf("%w: %w", ErrUnauthenticated, errors.New("token expired for key sk-123")), http.StatusUnauthorized, "authentication_error", "", slog.LevelInfo},
		{"body too large", ErrBodyTooLarge, http.StatusRequestEntityTooLarge, "invalid_request_error", "", slog.LevelInfo},
		{"admission", &retry.OverloadError{RetryAfter: 1500 * time.Millisecond}, http.StatusTooManyRequests, "rate_limit_error", "2", slog.LevelInfo},
		{"overloaded", fmt.Errorf("spill: every tier cooling: %w", retry.ErrOverloaded), http.StatusTooManyRequests, "rate_limit_error", "1", slog.LevelInfo},
		{"fair queue shed", &retry.OverloadError{Scope: "queue", RetryAfter: 3 * time.Second}, http.StatusTooManyRequests, "rate_limit_error", "3", slog.LevelInfo},
		// No endpoint at all is an outage or a misconfiguration, not a load
		// to back off from: OpenAI clients would retry a 429 forever.
		{"no endpoints", llmlb.ErrNoEndpoints, http.StatusServiceUnavailable, "service_unavailable", "", slog.LevelError},
		{"no endpoints on retry", fmt.Errorf("httplb: pick for retry 1: %w", llmlb.ErrNoEndpoints), http.StatusServiceUnavailable, "service_unavailable", "", slog.LevelError},
		{"no candidates", llmlb.ErrNoCandidates, http.StatusServiceUnavailable, "service_unavailable", "", slog.LevelError},
		{"no URL", fmt.Errorf("%w: endpoint %q", ErrNoURL, "http://10.0.0.1:8000"), http.StatusInternalServerError, "server_error", "", slog.LevelError},
		{"URL ends in /v1", fmt.Errorf("%w: http://10.0.0.1:8000/v1", ErrInvalidConfig), http.StatusInternalServerError, "server_error", "", slog.LevelError},
		{"invalid request", fmt.Errorf("%w: MaxTokens -1 out of range", llmlb.ErrInvalidRequest), http.StatusInternalServerError, "server_error", "", slog.LevelError},
		{"given up", &retry.GiveUpError{Attempts: 3, Reason: "attempts", Err: errors.New("tls: handshake failure with 10.0.0.1")}, http.StatusBadGateway, "upstream_error", "", slog.LevelError},
		{"first event timeout", &retry.GiveUpError{Attempts: 3, Reason: "attempts", Err: ErrFirstEventTimeout}, http.StatusBadGateway, "upstream_error", "", slog.LevelError},
		{"body read deadline", fmt.Errorf("%w: %w", ErrBodyRead, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), http.StatusRequestTimeout, "invalid_request_error", "", slog.LevelInfo},
		{"body read", fmt.Errorf("%w: %w", ErrBodyRead, errors.New("malformed chunked encoding from 10.0.0.1")), http.StatusBadRequest, "invalid_request_error", "", slog.LevelInfo},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs syncBuffer
			w := httptest.NewRecorder()
			NewErrorHandler(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))(w, httptest.NewRequest(http.MethodPost, "/v1/completions", nil), c.err)
			assert.Equal(t, c.code, w.Code)
			assert.Equal(t, c.retryAfter, w.Header().Get("Retry-After"))
			var body openAIError
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
			assert.Equal(t, c.typ, body.Error.Type)
			assert.Equal(t, c.code, body.Error.Code)
			assert.NotContains(t, body.Error.Message, c.err.Error())
			assert.NotContains(t, w.Body.String(), "httplb")
			assert.NotContains(t, w.Body.String(), "10.0.0.1")
			id := w.Header().Get("X-Request-Id")
			assert.Contains(t, body.Error.Message, "Request ID: "+id)
			assert.Contains(t, logs.String(), "level="+c.level.String())
			assert.Contains(t, logs.String(), "request_id="+id)
		})
	}
}

func TestErrorHandlerClientGone(t *testing.T) {
	var logs syncBuffer
	h := NewErrorHandler(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx)
	w := httptest.NewRecorder()
	h(w, r, context.Canceled)
	assert.Zero(t, w.Body.Len())
	assert.Contains(t, logs.String(), "level=DEBUG")

	// The handler NewProxy installs logs with slog.Default.
	var def syncBuffer
	oldDefault, oldWriter, oldFlags := slog.Default(), log.Writer(), log.Flags()
	t.Cleanup(func() {
		slog.SetDefault(oldDefault)
		log.SetOutput(oldWriter)
		log.SetFlags(oldFlags)
	})
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, nil)))
	w = httptest.NewRecorder()
	NewProxy(nil).ErrorHandler(w, httptest.NewRequest(http.MethodPost, "/", nil), errors.New("x"))
	assert.Equal(t, http.StatusBadGateway, w.Code)
	assert.Contains(t, def.String(), "status=502")
}

// TestProxyClientGoneMidBody: a client that goes away while sending its
// body has no one to answer: the proxy logs it at level Debug, not as a
// 502 at level Error.
func TestProxyClientGoneMidBody(t *testing.T) {
	a := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{}, a)
	var logs syncBuffer
	p := NewProxy(h.tr)
	p.ErrorHandler = NewErrorHandler(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	handled := make(chan struct{})
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handled)
		p.ServeHTTP(w, r)
	}))
	defer gw.Close()
	conn, err := net.Dial("tcp", gw.Listener.Addr().String())
	require.NoError(t, err)
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	<-handled
	assert.NotContains(t, logs.String(), "level=ERROR", "a client gone was logged as an error")
	assert.NotContains(t, logs.String(), "status=502")
	assert.Contains(t, logs.String(), "level=DEBUG")
	assert.Zero(t, a.hits.Load())
}

// An upstream's error answer to a retry, or to a request a layer between
// the proxy and the Transport sent on with another id (as package spill
// does for a later tier), names the request by the id its client knows,
// in the X-Request-Id header and in the message; the id the upstream was
// sent goes to the log beside it.
func TestProxyUpstreamErrorNamesClientRequestID(t *testing.T) {
	cases := []struct {
		name     string
		clientID string // "" sends none: the proxy makes one
		suffix   string // appended to the id by a layer in front of the Transport
		last     int    // the status of the answer the client gets
		wantSent string // the id the answering upstream was sent, after the client's
	}{
		{name: "5xx after a retry", clientID: "client-9", last: http.StatusServiceUnavailable, wantSent: "-2"},
		{name: "4xx after a retry", clientID: "client-9", last: http.StatusBadRequest, wantSent: "-2"},
		{name: "new id, 5xx after a retry", last: http.StatusBadGateway, wantSent: "-2"},
		{name: "5xx in a later tier", clientID: "client-9", suffix: ".p", last: http.StatusServiceUnavailable, wantSent: ".p-2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var firstSeen atomic.Value
			a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				firstSeen.Store(r.Header.Get("X-Request-Id"))
				status(http.StatusServiceUnavailable)(w, r)
			})
			b := newUpstream(t, status(c.last))
			h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{MaxAttempts: 2}}, a, b)
			var logs syncBuffer
			proxy := NewProxy(h.tr)
			proxy.ModifyResponse = NewUpstreamErrorHandler(slog.New(slog.NewJSONHandler(&logs, nil)))
			if c.suffix != "" {
				proxy.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
					r = r.Clone(r.Context())
					r.Header.Set("X-Request-Id", r.Header.Get("X-Request-Id")+c.suffix)
					return h.tr.RoundTrip(r)
				})
			}
			gw := httptest.NewServer(proxy)
			defer gw.Close()
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			if c.clientID != "" {
				req.Header.Set("X-Request-Id", c.clientID)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			raw, err := readAll(t, resp)
			require.NoError(t, err)
			require.Equal(t, c.last, resp.StatusCode)
			require.EqualValues(t, 1, a.hits.Load())
			require.EqualValues(t, 1, b.hits.Load())
			want := c.clientID
			if want == "" {
				want = strings.TrimSuffix(firstSeen.Load().(string), c.suffix)
				require.True(t, validRequestID(want), want)
			}
			assert.Equal(t, want, resp.Header.Get("X-Request-Id"))
			if c.last >= 500 {
				var body openAIError
				require.NoError(t, json.Unmarshal([]byte(raw), &body), raw)
				assert.True(t, strings.HasSuffix(body.Error.Message, "Request ID: "+want), body.Error.Message)
			}
			var rec struct {
				RequestID         string `json:"request_id"`
				UpstreamRequestID string `json:"upstream_request_id"`
			}
			require.NoError(t, json.Unmarshal([]byte(logs.String()), &rec), logs.String())
			assert.Equal(t, want, rec.RequestID)
			assert.Equal(t, want+c.wantSent, rec.UpstreamRequestID)
		})
	}
}

// A Transport used without NewProxy names the request by the id it was
// given, too, for the error handlers of any ReverseProxy.
func TestUpstreamErrorHandlerNamesTransportRequestID(t *testing.T) {
	a := newUpstream(t, status(http.StatusServiceUnavailable))
	b := newUpstream(t, status(http.StatusInternalServerError))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{MaxAttempts: 2}}, a, b)
	req, err := http.NewRequest(http.MethodPost, "http://gateway.invalid/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	req.Header.Set("X-Request-Id", "abc")
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	require.NoError(t, NewUpstreamErrorHandler(slog.New(slog.DiscardHandler))(resp))
	raw, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, "abc", resp.Header.Get("X-Request-Id"))
	assert.Contains(t, raw, "Request ID: abc\"")
}

// A 407 from a forward proxy on the gateway's way upstream asks for the
// gateway's credentials, not the client's: the client gets a generic 502,
// without the proxy's page or challenge, and the operator the 407 and its
// page.
func TestUpstreamProxyAuthRequiredIsBadGateway(t *testing.T) {
	const page = "ERR_CACHE_ACCESS_DENIED generated by egress-proxy.corp.internal (squid/5.7)"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="corp egress"`)
		w.Header().Set("Via", "1.1 egress-proxy.corp.internal (squid/5.7)")
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusProxyAuthRequired)
		fmt.Fprint(w, page)
	})
	h := newHarness(t, llmlb.RoundRobin(), Config{}, up)
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	check := func(t *testing.T, resp *http.Response) {
		t.Helper()
		raw, err := readAll(t, resp)
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assert.Empty(t, resp.Header.Get("Proxy-Authenticate"))
		assert.Empty(t, resp.Header.Get("Via"))
		assert.True(t, validRequestID(resp.Header.Get("X-Request-Id")))
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.NotContains(t, raw, "squid")
		var body openAIError
		require.NoError(t, json.Unmarshal([]byte(raw), &body), raw)
		assert.Equal(t, http.StatusBadGateway, body.Error.Code)
		assert.Equal(t, "upstream_error", body.Error.Type)
		var rec struct {
			Level  string `json:"level"`
			Status int    `json:"status"`
			Body   string `json:"body"`
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &rec), logs.String())
		assert.Equal(t, "ERROR", rec.Level)
		assert.Equal(t, http.StatusProxyAuthRequired, rec.Status)
		assert.Equal(t, page, rec.Body)
	}
	t.Run("proxy", func(t *testing.T) {
		proxy := NewProxy(h.tr)
		proxy.ModifyResponse = NewUpstreamErrorHandler(log)
		gw := httptest.NewServer(proxy)
		defer gw.Close()
		client := &http.Client{Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
		resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		require.NoError(t, err)
		check(t, resp)
	})
	t.Run("handler", func(t *testing.T) {
		resp, err := do(t, h, chatBody)
		require.NoError(t, err)
		require.NoError(t, NewUpstreamErrorHandler(log)(resp))
		check(t, resp)
	})
}

// A redirect an upstream builds from the address it was sent (a trailing
// slash's, say) reaches the client relative to the gateway, without the
// upstream's address; a redirect elsewhere is left as it is.
func TestProxyRedirectHidesUpstreamAddress(t *testing.T) {
	cases := []struct {
		name     string
		location func(r *http.Request) string
		want     string
	}{
		{"own address", func(r *http.Request) string { return "http://" + r.Host + "/v1/chat/completions?x=1" },
			"/v1/chat/completions?x=1"},
		{"own host, default port", func(r *http.Request) string {
			host, _, _ := net.SplitHostPort(r.Host)
			return "http://" + host + "/v1/models"
		}, "/v1/models"},
		{"scheme-relative", func(r *http.Request) string { return "//" + r.Host }, "/"},
		{"own address, path of another host", func(r *http.Request) string { return "http://" + r.Host + "//evil.example/x?y=1" },
			"/evil.example/x?y=1"},
		{"own address, path of slashes", func(r *http.Request) string { return "http://" + r.Host + "///" }, "/"},
		{"relative", func(*http.Request) string { return "/v1/other" }, "/v1/other"},
		{"elsewhere", func(*http.Request) string { return "https://login.example.com/auth" },
			"https://login.example.com/auth"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, c.location(r), http.StatusTemporaryRedirect)
			})
			h := newHarness(t, llmlb.RoundRobin(), Config{}, up)
			gw := h.proxy(t)
			client := &http.Client{
				Transport:     &http.Transport{},
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}
			defer client.CloseIdleConnections()
			resp, err := client.Post(gw.URL+"/v1/chat/completions/", "application/json", strings.NewReader(chatBody))
			require.NoError(t, err)
			_, err = readAll(t, resp)
			require.NoError(t, err)
			assert.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
			assert.Equal(t, c.want, resp.Header.Get("Location"))
		})
	}
}

// The Location of an answer that is no redirect (a 201 Created, a 503, a
// 400) reaches the client without the upstream's address too.
func TestProxyLocationHidesUpstreamAddress(t *testing.T) {
	for _, code := range []int{http.StatusCreated, http.StatusAccepted, http.StatusBadRequest, http.StatusServiceUnavailable} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "http://"+r.Host+"/v1/files/file-1")
				w.Header().Set("Content-Location", "http://"+r.Host+"/v1/files/file-1/content")
				w.Header().Add("Link", `<http://`+r.Host+`/v1/files?after=file-1>; rel="next"; title="<http://`+r.Host+`/x>", <https://docs.example.com/files>; rel="help"`)
				w.Header().Add("Link", "</v1/files>; rel=\"first\"")
				w.WriteHeader(code)
			})
			h := newHarness(t, llmlb.RoundRobin(), Config{}, up)
			gw := h.proxy(t)
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			resp, err := client.Post(gw.URL+"/v1/files", "application/json", strings.NewReader(chatBody))
			require.NoError(t, err)
			_, err = readAll(t, resp)
			require.NoError(t, err)
			assert.Equal(t, code, resp.StatusCode)
			assert.Equal(t, "/v1/files/file-1", resp.Header.Get("Location"))
			assert.Equal(t, "/v1/files/file-1/content", resp.Header.Get("Content-Location"))
			// The URI of the upstream's host becomes a path; a quoted
			// parameter, another host's URI and a relative one stay.
			assert.Equal(t, []string{
				`</v1/files?after=file-1>; rel="next"; title="<http://` + up.Listener.Addr().String() + `/x>", <https://docs.example.com/files>; rel="help"`,
				`</v1/files>; rel="first"`,
			}, resp.Header.Values("Link"))
		})
	}
}

// FuzzRelativeLinks checks that relativeLinks never panics, that it leaves
// a value it does not rewrite as it was, and that a value it rewrites
// names the upstream's host in no URI.
func FuzzRelativeLinks(f *testing.F) {
	for _, s := range [][2]string{
		{`<http://up:8080/v1/x?after=2>; rel="next"`, "up:8080"},
		{`<http://up/a>; rel="next", <http://up/b>; rel="prev"`, "up"},
		{`<http://up/a>; title="a \" <http://up/b>"`, "up"},
		{`<http://up//evil.example/x>; rel=next`, "up"},
		{`<http://elsewhere/>; rel=help`, "up"},
		{`<http://up/unterminated`, "up"},
		{`"<http://up/quoted>`, "up"},
		{`<>; rel=x`, "up"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, v, host string) {
		got, ok := relativeLinks(v, host)
		if !ok {
			if got != v {
				t.Fatalf("relativeLinks(%q, %q) = %q, false", v, host, got)
			}
			return
		}
		if got == v || host == "" {
			t.Fatalf("relativeLinks(%q, %q) = %q, true", v, host, got)
		}
		again, _ := relativeLinks(got, host)
		if again != got {
			t.Fatalf("relativeLinks(%q, %q) = %q, rewritten again to %q", v, host, got, again)
		}
	})
}

// FuzzRelativeLocation checks that relativeLocation never panics, and that a
// Location it rewrites names neither the upstream's host nor any other: it
// is a path on the gateway.
func FuzzRelativeLocation(f *testing.F) {
	for _, s := range [][2]string{
		{"http://up:8080/v1/x?y=1", "up:8080"},
		{"http://up//evil.example/x", "up:8080"},
		{"//UP/a", "up"},
		{"https://user@up:1///", "up"},
		{"http://[::1]:80/x", "[::1]:8080"},
		{"http://up", "up"},
		{"http://up?x", "up"},
		{"http://up/%2F%2Fevil", "up"},
		{"http://up/./", "up"},
		{"http://up#//evil", "up"},
		{"/relative", "up"},
		{"http://elsewhere/", "up"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, loc, host string) {
		h := http.Header{}
		h.Set("Location", loc)
		relativeLocation(h, host)
		got := h.Get("Location")
		if got == loc {
			return
		}
		u, err := url.Parse(got)
		if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(got, "/") || strings.HasPrefix(got, "//") {
			t.Fatalf("relativeLocation(%q, %q) = %q", loc, host, got)
		}
	})
}

// A managed provider's 429 reaches the client with its error's type and
// code, plain tokens, but not its message, which names the operator's
// organisation, nor its headers but Retry-After.
func TestProxyUpstreamRefusalKeepsTypeAndCode(t *testing.T) {
	const org = "org-Zx81secret"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Openai-Organization", org)
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached for gpt-4o in organization `+org+` on requests per min (RPM): Limit 500.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
	})
	h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
	resp, raw, _ := postLogged(t, h)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "7", resp.Header.Get("Retry-After"))
	assert.NotContains(t, raw, org)
	assert.NotContains(t, fmt.Sprint(resp.Header), org)
	assert.Empty(t, resp.Header.Get("X-Ratelimit-Remaining-Requests"))
	var body struct {
		Error struct {
			Type string `json:"type"`
			Code any    `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &body), raw)
	assert.Equal(t, "requests", body.Error.Type)
	assert.Equal(t, "rate_limit_exceeded", body.Error.Code)
}
