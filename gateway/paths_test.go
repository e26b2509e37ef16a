package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pathRecorder is a replica that records the paths it is sent and answers
// 200 to each.
type pathRecorder struct {
	mu    sync.Mutex
	paths []string
}

func (p *pathRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.paths = append(p.paths, r.URL.Path)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{}`))
}

func (p *pathRecorder) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.paths...)
}

// A Gateway forwards the inference APIs' paths and answers 404 for the
// engines' administration endpoints, which a client could otherwise use to
// put a replica to sleep or change what it serves, dot segments or not.
func TestGatewayRefusesAdministrationPaths(t *testing.T) {
	rec := &pathRecorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	log, logs := newLogger()
	g, err := New([]string{srv.URL}, Config{ScrapeInterval: -1, Logger: log})
	require.NoError(t, err)

	for _, p := range []string{
		"/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache",
		"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/update_weights_from_disk",
		"/flush_cache", "/get_server_info", "/slots/0", "/props", "/metrics", "/",
		"/v1/../sleep", "/v1/completions/../../sleep", "/v1/responses/../../wake_up",
		"/v1/responses/x/../../../sleep", "//sleep",
	} {
		req := httptest.NewRequest(http.MethodPost, "http://gw.invalid/", strings.NewReader(`{}`))
		req.URL.Path = p
		w := httptest.NewRecorder()
		g.ServeHTTP(w, req)
		assert.Equal(t, http.StatusNotFound, w.Code, p)
		var body struct {
			Error struct {
				Type string `json:"type"`
				Code int    `json:"code"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body), p)
		assert.Equal(t, "not_found_error", body.Error.Type, p)
		assert.Equal(t, http.StatusNotFound, body.Error.Code, p)
	}
	assert.Empty(t, rec.seen(), "no refused path may reach a replica")
	assert.Len(t, logs.records(t, "gateway: path not forwarded"), 19)

	for _, p := range []string{
		"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/responses/resp_1/cancel",
		"/v1/models", "/v1/models/m", "/v1/embeddings", "/health", "/tokenize", "/generate",
		"/v1/completions/",
	} {
		req := httptest.NewRequest(http.MethodGet, "http://gw.invalid"+p, nil)
		w := httptest.NewRecorder()
		g.ServeHTTP(w, req)
		assert.Equal(t, http.StatusOK, w.Code, p)
	}
	assert.Len(t, rec.seen(), 11)
}

// Config.AllowPaths adds paths, and "/" forwards every path.
func TestGatewayAllowPaths(t *testing.T) {
	rec := &pathRecorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	for _, tc := range []struct {
		allow   []string
		path    string
		forward bool
	}{
		{[]string{"/v1/load_lora_adapter"}, "/v1/load_lora_adapter", true},
		{[]string{"/v1/load_lora_adapter"}, "/v1/unload_lora_adapter", false},
		{[]string{"/admin/"}, "/admin/x/y", true},
		{[]string{"/admin/"}, "/admin", true},
		{[]string{"/admin/"}, "/administrator", false},
		{[]string{"/"}, "/sleep", true},
		{nil, "/sleep", false},
	} {
		g, err := New([]string{srv.URL}, Config{ScrapeInterval: -1, AllowPaths: tc.allow})
		require.NoError(t, err)
		before := len(rec.seen())
		req := httptest.NewRequest(http.MethodPost, "http://gw.invalid"+tc.path, strings.NewReader(`{}`))
		w := httptest.NewRecorder()
		g.ServeHTTP(w, req)
		if tc.forward {
			assert.Equal(t, http.StatusOK, w.Code, "%v %s", tc.allow, tc.path)
			assert.Len(t, rec.seen(), before+1, "%v %s", tc.allow, tc.path)
		} else {
			assert.Equal(t, http.StatusNotFound, w.Code, "%v %s", tc.allow, tc.path)
			assert.Len(t, rec.seen(), before, "%v %s", tc.allow, tc.path)
		}
	}
	for _, bad := range []string{"", "v1/x", "/v1/../x", "/v1//x", "/v1/./x"} {
		_, err := New([]string{srv.URL}, Config{ScrapeInterval: -1, AllowPaths: []string{bad}})
		assert.True(t, errors.Is(err, ErrInvalidConfig), "%q: %v", bad, err)
	}
}

// Checking a clean path, as clients send, allocates nothing.
func TestPathSetAllowsAllocatesNothing(t *testing.T) {
	s, err := newPathSet(nil)
	require.NoError(t, err)
	for _, p := range []string{"/v1/chat/completions", "/v1/responses/resp_1", "/sleep"} {
		assert.Zero(t, testing.AllocsPerRun(100, func() { s.allows(p) }), p)
	}
	assert.True(t, s.allows("v1/completions"), "a path without its leading slash")
	assert.False(t, s.allows(""), "the root")
}
