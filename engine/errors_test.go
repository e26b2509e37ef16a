package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every error answer has the shape of vLLM's ErrorResponse, with the type
// vLLM gives that refusal: "Bad Request" for a body its request models do
// not validate, "BadRequestError" (with the field at fault) for one its
// handler refuses, "NotFoundError" for an unknown model, and the reason
// phrase for what it answers as an HTTP exception (an unknown path, a
// method not allowed); never OpenAI's "invalid_request_error".
func TestErrorTypes(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 16, MaxBodyBytes: 2 << 10})
	url, _ := serve(t, e)
	long := strings.Repeat("abcd", 600)
	cases := []struct {
		name, method, path, body string
		code                     int
		typ                      string
		param                    any // nil for null
	}{
		{"malformed JSON", "POST", "/v1/completions", `{"prompt":`, 400, "Bad Request", nil},
		{"missing prompt", "POST", "/v1/completions", `{"max_tokens":1}`, 400, "Bad Request", nil},
		{"stream options without a stream", "POST", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "Bad Request", nil},
		{"bad message", "POST", "/v1/chat/completions", `{"messages":[{"role":1}]}`, 400, "Bad Request", nil},
		{"prompt beyond the context", "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, long[:1100]), 400, "BadRequestError", "input_tokens"},
		{"max_tokens beyond the context", "POST", "/v1/completions", `{"prompt":"x","max_tokens":300}`, 400, "BadRequestError", "max_tokens"},
		{"max_tokens out of range", "POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError", "max_tokens"},
		{"unknown model", "POST", "/v1/completions", `{"prompt":"x","model":"other"}`, 404, "NotFoundError", "model"},
		{"unknown path", "GET", "/v2/whatever", "", 404, "Not Found", nil},
		{"method not allowed", "GET", "/v1/completions", "", 405, "Method Not Allowed", nil},
		{"body too large", "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, long), http.StatusRequestEntityTooLarge, http.StatusText(http.StatusRequestEntityTooLarge), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, err := http.NewRequest(c.method, url+c.path, body)
			require.NoError(t, err)
			resp, err := client.Do(req)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, c.code, resp.StatusCode, "%s", b)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var got struct{ Error map[string]any }
			require.NoError(t, json.Unmarshal(b, &got), "%s", b)
			assert.Equal(t, c.typ, got.Error["type"], "%s", b)
			assert.Contains(t, got.Error, "param", "%s", b)
			assert.Equal(t, c.param, got.Error["param"], "%s", b)
			assert.Equal(t, float64(c.code), got.Error["code"], "%s", b)
			assert.NotEmpty(t, got.Error["message"], "%s", b)
		})
	}
}
