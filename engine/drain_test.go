package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With a ShutdownTimeout, Serve drains once its context ends: a new request
// gets 503, as does GET /health, while GET /metrics still answers; the
// stream in progress goes on, and Serve returns once it has finished, long
// before the timeout; or, if the timeout comes first, Serve breaks it then,
// as a killed server does, and not before.
func TestServeDrains(t *testing.T) {
	for _, c := range []struct {
		name      string
		timeout   time.Duration
		maxTokens int // at Speedup 1, a decode step takes about 6ms
		finishes  bool
	}{
		{"stream finishes", time.Minute, 300, true},
		{"timeout over", 300 * time.Millisecond, 4000, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, Config{Speedup: 1, ShutdownTimeout: c.timeout})
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			url := "http://" + l.Addr().String()
			ctx, signal := context.WithCancel(context.Background())
			defer signal()
			served := make(chan error, 1)
			go func() { served <- e.Serve(ctx, l) }()

			body := `{"prompt":"x","max_tokens":` + strconv.Itoa(c.maxTokens) + `,"stream":true}`
			resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			br := bufio.NewReader(resp.Body)
			_, err = br.ReadString('\n')
			require.NoError(t, err, "the first event")
			type stream struct {
				events []string
				err    error
			}
			read := make(chan stream, 1)
			go func() {
				var s stream
				for {
					line, err := br.ReadString('\n')
					if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
						s.events = append(s.events, d)
					}
					if err != nil {
						if err != io.EOF {
							s.err = err
						}
						read <- s
						return
					}
				}
			}()

			signalled := time.Now()
			signal()
			// A client of its own: the engine closes its connections
			// after each answer while it drains.
			fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			get := func(path string) (int, string, error) {
				resp, err := fresh.Get(url + path)
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b), err
			}
			require.Eventually(t, func() bool {
				code, _, err := get("/health")
				return err == nil && code == http.StatusServiceUnavailable
			}, 10*time.Second, time.Millisecond, "GET /health does not answer 503 after the signal")
			code, metrics, err := get("/metrics")
			require.NoError(t, err, "GET /metrics while draining")
			assert.Equal(t, http.StatusOK, code)
			assert.Contains(t, metrics, "vllm:num_requests_running")
			refused, err := fresh.Post(url+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"stream":true}`))
			require.NoError(t, err, "a new request while draining")
			b, err := io.ReadAll(refused.Body)
			refused.Body.Close()
			require.NoError(t, err)
			assert.Equal(t, http.StatusServiceUnavailable, refused.StatusCode)
			var answer struct{ Error map[string]any }
			require.NoError(t, json.Unmarshal(b, &answer), "%s", b)
			assert.Equal(t, map[string]any{
				"message": "The server is shutting down.", "type": "Service Unavailable", "param": nil, "code": float64(503),
			}, answer.Error)
			assert.EqualValues(t, 0, e.Stats().Finished, "the stream finished before the checks: make it longer")

			select {
			case err := <-served:
				assert.ErrorIs(t, err, context.Canceled)
			case <-time.After(20 * time.Second):
				t.Fatal("Serve still running 20s after its context ended")
			}
			stopped := time.Since(signalled)
			s := <-read
			if c.finishes {
				require.NoError(t, s.err)
				require.NotEmpty(t, s.events)
				assert.Equal(t, "[DONE]", s.events[len(s.events)-1], "the stream ends as a finished one")
				assert.Len(t, s.events, c.maxTokens, "every token after the first, then [DONE]")
				assert.EqualValues(t, 1, e.Stats().Finished)
				assert.Less(t, stopped, c.timeout/2, "Serve waited for the timeout, not for the stream")
			} else {
				assert.Error(t, s.err, "a stream cut at the timeout breaks, as a killed server's does")
				assert.NotContains(t, s.events, "[DONE]")
				assert.GreaterOrEqual(t, stopped, c.timeout, "Serve stopped before its ShutdownTimeout")
			}
			_, err = client.Get(url + "/health")
			assert.Error(t, err, "the listener is closed once Serve returns")
		})
	}
}
