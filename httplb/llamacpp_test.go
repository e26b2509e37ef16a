package httplb

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
)

// llamaCppErrorStream is what llama.cpp's server streams when it fails an
// OpenAI-compatible request after its 200: an "error" line, not a data
// line, with the error object, then "data: [DONE]".
func llamaCppErrorStream(code int, typ string) string {
	return `error: {"code": ` + strconv.Itoa(code) + `, "message": "failed", "type": "` + typ + "\"}\n\ndata: [DONE]\n\n"
}

// llama.cpp's error line fails the stream, before or after its first
// event, and carries no token.
func TestOutputCounterLlamaCppErrorLine(t *testing.T) {
	token := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	cases := []struct {
		name   string
		body   string
		tokens int
		failed bool
	}{
		{"first", llamaCppErrorStream(500, "server_error"), 0, true},
		{"after a token", token + llamaCppErrorStream(503, "unavailable_error"), 1, true},
		{"crlf", token + "error: {\"code\":500}\r\n\r\ndata: [DONE]\r\n\r\n", 1, true},
		{"no colon", token + "error\n\n", 1, false},
		{"other field", token + "errors: {}\n\n", 1, false},
		{"in data", token + "data: error: {}\n\n", 2, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for cut := range len(tc.body) + 1 {
				c := NewOutputCounter(sseHeader)
				n := c.Count([]byte(tc.body[:cut]))
				n += c.Count([]byte(tc.body[cut:]))
				n += c.End()
				if n != tc.tokens || c.Failed() != tc.failed {
					t.Fatalf("cut at %d: %d tokens, failed %v; want %d, %v", cut, n, c.Failed(), tc.tokens, tc.failed)
				}
			}
		})
	}
}

// A stream that starts with llama.cpp's error line produced nothing: its
// attempt fails with the line's code, retried on the other replica if that
// is retryable (a 503), handed to the client as sent if not (a 400, the
// prompt exceeding the context), and never a success that teaches a time
// to first token.
func TestLlamaCppFirstErrorLine(t *testing.T) {
	t.Run("retried", func(t *testing.T) {
		a := newUpstream(t, sendStream(llamaCppErrorStream(503, "unavailable_error")))
		b := newUpstream(t, streamTokens(2))
		rec := &recorder{}
		done := &doneLog{}
		h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
		assert.EqualValues(t, 1, a.hits.Load())
		assert.EqualValues(t, 1, b.hits.Load())
		requireStatusFailure(t, done.get(a.URL), http.StatusServiceUnavailable)
		requireStatusFailure(t, rec.reported(a.URL), http.StatusServiceUnavailable)
		assert.Equal(t, []error{nil}, done.get(b.URL))
	})
	t.Run("not retryable", func(t *testing.T) {
		stream := llamaCppErrorStream(400, "exceed_context_size_error")
		a := newUpstream(t, sendStream(stream))
		b := newUpstream(t, streamTokens(2))
		done := &doneLog{}
		h := newObservedHarness(t, Config{}, done, nil, a, b)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, stream, body)
		assert.EqualValues(t, 1, a.hits.Load())
		assert.Zero(t, b.hits.Load())
		requireStatusFailure(t, done.get(a.URL), http.StatusBadRequest)
	})
	t.Run("no data line", func(t *testing.T) {
		// llama.cpp's own /completion endpoint sends no [DONE].
		a := newUpstream(t, sendStream("error: {\"code\": 500, \"message\": \"failed\", \"type\": \"server_error\"}\n\n"))
		b := newUpstream(t, streamTokens(1))
		done := &doneLog{}
		h := newObservedHarness(t, Config{}, done, nil, a, b)
		code, _ := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		requireStatusFailure(t, done.get(a.URL), http.StatusInternalServerError)
		assert.Equal(t, []error{nil}, done.get(b.URL))
	})
}

// llama.cpp's error line after the first event ends the pick as a failure.
func TestLlamaCppErrorLineAfterFirstEvent(t *testing.T) {
	a := newUpstream(t, sendStream("data: {\"i\":0}\n\n"+llamaCppErrorStream(500, "server_error")))
	done := &doneLog{}
	h := newObservedHarness(t, Config{}, done, nil, a)
	code, _ := postProxy(t, h)
	assert.Equal(t, http.StatusOK, code)
	errs := done.get(a.URL)
	if assert.Len(t, errs, 1) {
		assert.ErrorIs(t, errs[0], ErrErrorEvent)
	}
}
