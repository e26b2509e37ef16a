package engine

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request that does not stream, in progress when the engine's Run
// returns, gets vLLM's answer for a dead engine: 500, of type
// "InternalServerError", with the EngineDeadError's message, not a 503. So
// does every request after it, streaming or not, on every endpoint, as vLLM
// refuses every request once its engine is dead; only GET /health answers
// 503.
func TestEngineDeadAnswers(t *testing.T) {
	e := newEngine(t, Config{Speedup: 1})
	url := startHandlerOnly(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()

	type answer struct {
		code int
		body []byte
		err  error
	}
	inFlight := make(chan answer, 1)
	go func() {
		resp, err := client.Post(url+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"x","max_tokens":1000}`))
		if err != nil {
			inFlight <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		inFlight <- answer{resp.StatusCode, b, err}
	}()
	require.Eventually(t, func() bool { st := e.Stats(); return st.Running+st.Waiting > 0 },
		10*time.Second, time.Millisecond, "the request never reached the engine")
	cancel()
	require.ErrorIs(t, <-ran, context.Canceled)

	assertDead := func(t *testing.T, code int, b []byte) {
		t.Helper()
		require.Equal(t, http.StatusInternalServerError, code, "%s", b)
		var got struct{ Error map[string]any }
		require.NoError(t, json.Unmarshal(b, &got), "%s", b)
		assert.Equal(t, map[string]any{
			"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
			"type":    "InternalServerError",
			"param":   nil,
			"code":    float64(500),
		}, got.Error)
	}
	a := <-inFlight
	require.NoError(t, a.err)
	assertDead(t, a.code, a.body)

	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"x","max_tokens":1}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":true}`},
		{"/v1/responses", `{"input":"x"}`},
		{"/v1/responses", `{"input":"x","stream":true}`},
	} {
		resp := post(t, url+c.path, c.body)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assertDead(t, resp.StatusCode, b)
	}
	resp, err := client.Get(url + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}
