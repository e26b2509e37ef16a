package engine

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// As vLLM's, an answer's id is "cmpl-" or "chatcmpl-" and the request's
// X-Request-Id, in the one JSON answer and in every chunk of a stream;
// without the header it is a random UUID in hex, so that two engines, or
// one engine before and after a restart, never answer with the same id.
func TestAnswerIDs(t *testing.T) {
	url, _ := serve(t, newEngine(t, Config{DefaultMaxTokens: 2}))
	url2, _ := serve(t, newEngine(t, Config{DefaultMaxTokens: 2}))
	do := func(url, path, body, requestID string, header bool) []string {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
		require.NoError(t, err)
		if header {
			req.Header.Set("X-Request-Id", requestID)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var answers []string
		if strings.Contains(body, `"stream":true`) {
			ev := events(t, resp.Body)
			answers = ev[:len(ev)-1]
		} else {
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			answers = []string{string(b)}
		}
		var ids []string
		for _, a := range answers {
			var out struct{ ID string }
			require.NoError(t, json.Unmarshal([]byte(a), &out), "%s", a)
			ids = append(ids, out.ID)
		}
		return ids
	}
	const prompt = `{"prompt":"hello"`
	const chat = `{"messages":[{"role":"user","content":"hello"}]`
	for _, c := range []struct{ path, body, prefix string }{
		{"/v1/completions", prompt + `}`, "cmpl-"},
		{"/v1/completions", prompt + `,"stream":true,"stream_options":{"include_usage":true}}`, "cmpl-"},
		{"/v1/chat/completions", chat + `}`, "chatcmpl-"},
		{"/v1/chat/completions", chat + `,"stream":true,"stream_options":{"include_usage":true}}`, "chatcmpl-"},
	} {
		for _, rid := range []string{"req-42", `a"b\c é`, ""} {
			ids := do(url, c.path, c.body, rid, true)
			for _, id := range ids {
				assert.Equal(t, c.prefix+rid, id, "%s %s", c.path, c.body)
			}
		}
		a, b := do(url, c.path, c.body, "", false), do(url2, c.path, c.body, "", false)
		assert.Regexp(t, "^"+c.prefix+"[0-9a-f]{32}$", a[0])
		// An id that every chunk would repeat is bounded.
		long := do(url, c.path, c.body, strings.Repeat("x", maxRequestIDBytes+1), true)
		assert.Regexp(t, "^"+c.prefix+"[0-9a-f]{32}$", long[0])
		assert.Equal(t, c.prefix+strings.Repeat("x", maxRequestIDBytes), do(url, c.path, c.body, strings.Repeat("x", maxRequestIDBytes), true)[0])
		for _, id := range a {
			assert.Equal(t, a[0], id, "one id in every chunk")
		}
		assert.NotEqual(t, a[0], b[0], "two engines answered with one id")
	}
}

// GET /v1/models lists the served model as vLLM's ModelCard does, with
// the context length.
func TestModelsList(t *testing.T) {
	url, _ := serve(t, newEngine(t, Config{Model: `m "1"`, KVBlocks: 16, MaxModelLen: 100}))
	resp, err := client.Get(url + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var list struct {
		Object string
		Data   []map[string]any
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	assert.Equal(t, "list", list.Object)
	require.Len(t, list.Data, 1)
	m := list.Data[0]
	assert.Greater(t, m["created"], float64(0))
	delete(m, "created")
	assert.Equal(t, map[string]any{"id": `m "1"`, "object": "model", "owned_by": "vllm", "root": `m "1"`, "parent": nil, "max_model_len": float64(100)}, m)
}

// As vLLM's, /health and /v1/models answer GET only (not even HEAD): any
// other method gets 405 with Allow: GET; the completions endpoints answer
// POST only.
func TestMethods(t *testing.T) {
	url, _ := serve(t, newEngine(t, Config{}))
	for _, c := range []struct {
		method, path, allow string
		code                int
	}{
		{http.MethodGet, "/health", "", http.StatusOK},
		{http.MethodHead, "/health", http.MethodGet, http.StatusMethodNotAllowed},
		{http.MethodPost, "/health", http.MethodGet, http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/models", "", http.StatusOK},
		{http.MethodHead, "/v1/models", http.MethodGet, http.StatusMethodNotAllowed},
		{http.MethodDelete, "/v1/models", http.MethodGet, http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/completions", http.MethodPost, http.StatusMethodNotAllowed},
		{http.MethodPut, "/v1/chat/completions", http.MethodPost, http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequest(c.method, url+c.path, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, c.code, resp.StatusCode, "%s %s", c.method, c.path)
		assert.Equal(t, c.allow, resp.Header.Get("Allow"), "%s %s", c.method, c.path)
	}
}
