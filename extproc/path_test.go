package extproc_test

import (
	"bufio"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
)

// TestEscapedPath: a request whose :path escapes some of its bytes is
// parsed and routed as the same request with the plain path, since the
// parser is given the decoded path, as net/http gives it to httplb and as
// the engines' routers (Starlette's) serve it. Here the tenant, read from
// the path, salts the prefix hashes and scopes the session key: they are
// the plain path's. A :path net/http refuses reaches the parser raw, as
// it always did.
func TestEscapedPath(t *testing.T) {
	pol := &recordingPolicy{Policy: llmlb.LeastOutstanding()}
	b := newBalancer(t, 2, pol)
	p, err := httplb.NewParser(httplb.ParserConfig{Tenant: func(r *http.Request) (string, error) {
		// A gateway that serves each tenant under a path of its own.
		tenant, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if tenant == "" || rest != "v1/chat/completions" {
			return "", errors.New("not an inference route")
		}
		return tenant, nil
	}})
	require.NoError(t, err)
	h := start(t, extproc.Config{Balancer: b, Parser: p})
	body := chatBody(2000, false)
	// route sends a chat request to path and returns what it was routed
	// with, or the status of the immediate response that refused it.
	route := func(path string) (llmlb.Request, typev3.StatusCode) {
		e := h.open(t, fullDuplex, fullDuplex)
		defer e.cancel()
		e.send(requestHeaders(path, false, "x-session-id", "s1"))
		e.send(requestBody(body, true))
		m := e.recv()
		if ir := m.GetImmediateResponse(); ir != nil {
			return llmlb.Request{}, ir.GetStatus().GetCode()
		}
		require.NotNil(t, m.GetRequestHeaders(), "got %v", m)
		pol.mu.Lock()
		defer pol.mu.Unlock()
		return pol.reqs[len(pol.reqs)-1], typev3.StatusCode_OK
	}
	plain, code := route("/acme/v1/chat/completions")
	require.Equal(t, typev3.StatusCode_OK, code)
	require.Equal(t, "acme", plain.Tenant)
	require.NotEmpty(t, plain.Prefix)
	require.NotZero(t, plain.PromptTokens)
	for _, path := range []string{
		"/acme/v1/chat%2Fcompletions",
		"/acme/v1/chat%2fcompletions",
		"/acme/v1/%63hat/completions",
		"/ac%6De/v1/chat/completions",
		"/acme/v1/chat/completions?x=%zz",
		"/acme/v1/chat/completions?",
	} {
		got, code := route(path)
		require.Equal(t, typev3.StatusCode_OK, code, path)
		require.Equal(t, plain, got, path)
	}
	other, code := route("/other/v1/chat/completions")
	require.Equal(t, typev3.StatusCode_OK, code)
	require.NotEqual(t, plain.Prefix, other.Prefix, "the tenant salts the prefix hashes")

	for _, path := range []string{"/acme/v1/chat%zzcompletions", "/acme/v1/chat/completions%", "/acme/v1/chat/completions%2"} {
		_, code := route(path)
		require.Equal(t, typev3.StatusCode_Unauthorized, code, "%s reaches the parser raw", path)
	}
	waitIdle(t, b)
}

// TestParserRequestURL: the URL the parser is given for a :path is the one
// net/http reads from the same request line (Path decoded, RawPath set when
// the escapes are not the default ones, RawQuery as sent), and its
// RequestURI is the :path as sent, as net/http's server sets it; a :path
// net/http refuses, or one not in origin form, is given as it always was:
// Path the :path less its query, RawQuery the query. Such a path, and an
// empty one, addresses no stored response.
func TestParserRequestURL(t *testing.T) {
	for _, path := range []string{
		"/v1/chat/completions",
		"/v1/chat%2Fcompletions",
		"/v1/%63hat/completions",
		"/v1/chat/completions?a=1&b=%zz",
		"/v1/chat/completions?",
		"/v1/responses/r%C3%A9sp?stream=true",
		"/v1/responses/a+b%2Bc",
		"/v1/a;b,c=d",
		"//v1/chat/completions",
		"/v1/x#y",
	} {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("POST " + path + " HTTP/1.1\r\nHost: gw\r\n\r\n")))
		require.NoError(t, err, path)
		got := extproc.ParserRequest(http.MethodPost, path)
		require.Equal(t, req.URL, got.URL, path)
		require.Equal(t, req.URL.EscapedPath(), got.URL.EscapedPath(), path)
		require.Equal(t, req.RequestURI, got.RequestURI, path)
		require.Equal(t, http.MethodPost, got.Method)
	}
	for _, path := range []string{
		"",
		"*",
		"%",
		"v1/chat/completions",
		"http://gw/v1/responses/resp_1",
		"/v1/chat%zz/completions?a=b",
		"/v1/chat/completions%2",
		"/v1/responses/resp%zz",
		"/v1/responses/resp_1?\x01",
		"/v1/responses/resp\x7f1",
	} {
		got := extproc.ParserRequest(http.MethodGet, path)
		raw, query, _ := strings.Cut(path, "?")
		require.Equal(t, &url.URL{Path: raw, RawQuery: query}, got.URL, "%q", path)
		require.Equal(t, path, got.RequestURI, "%q", path)
		id, ok := extproc.StoredResponseID(http.MethodGet, path)
		require.False(t, ok, "%q: id %q", path, id)
	}
}
