package httplb

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tgiErrorStream is what Hugging Face text-generation-inference streams
// when it fails a request after its 200: one event whose data is its
// ErrorResponse, an "error" string and its "error_type", written by axum's
// Event::json_data without a space after "data:"; the stream then ends.
func tgiErrorStream(msg, errorType string) string {
	return `data:{"error":"` + msg + `","error_type":"` + errorType + "\"}\n\n"
}

// text-generation-inference's error event, whose "error" is a string,
// fails the stream, before or after its first event, and carries no token;
// an empty, null or nested "error" string does not.
func TestOutputCounterTGIErrorEvent(t *testing.T) {
	token := `data:{"index":1,"token":{"id":3,"text":"a","logprob":-0.1,"special":false}}` + "\n\n"
	cases := []struct {
		name   string
		body   string
		tokens int
		failed bool
	}{
		{"first", tgiErrorStream("Model is overloaded", "overloaded"), 0, true},
		{"after a token", token + tgiErrorStream("Request failed during generation: x", "generation"), 1, true},
		{"no error_type", `data: {"error": "failed"}` + "\n\n", 0, true},
		{"escape first", `data: {"error":"\"x\" failed"}` + "\n\n", 0, true},
		{"after other keys", `data: {"a":[1,{"b":"c"}],"error" : "x"}` + "\n\n", 0, true},
		{"empty", token + `data: {"error":"","x":1}` + "\n\n", 2, false},
		{"null", token + `data: {"error":null}` + "\n\n", 2, false},
		{"nested", token + `data: {"details":{"error":"x"}}` + "\n\n", 2, false},
		{"a string value", token + `data: {"text":"error","x":"\"error\":\"y\""}` + "\n\n", 2, false},
		{"not json", token + `data: "error":"x"` + "\n\n", 2, false},
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

// A first event that is text-generation-inference's error stands for the
// status TGI answers with for its error_type.
func TestTGIErrorEventCode(t *testing.T) {
	cases := []struct {
		stream string
		code   int
	}{
		{tgiErrorStream("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096", "validation"), http.StatusUnprocessableEntity},
		{tgiErrorStream("Template error: x", "template_error"), http.StatusUnprocessableEntity},
		{tgiErrorStream("Missing template vatiable: x", "missing_template_variable"), http.StatusUnprocessableEntity},
		{tgiErrorStream("Tool error: x", "tool_error"), http.StatusUnprocessableEntity},
		{tgiErrorStream("Model is overloaded", "overloaded"), http.StatusTooManyRequests},
		{tgiErrorStream("Request failed during generation: x", "generation"), http.StatusFailedDependency},
		{tgiErrorStream("Incomplete generation", "incomplete_generation"), http.StatusInternalServerError},
		{tgiErrorStream("Incomplete generation stream", "incomplete_generation_stream"), http.StatusInternalServerError},
		{tgiErrorStream("Stream event serialization error", "stream_serialization_error"), http.StatusInternalServerError},
		{tgiErrorStream("x", "something_new"), http.StatusInternalServerError},
		{`data: {"error":"x"}` + "\n\n", http.StatusInternalServerError},
		{`data: {"error":"x","error_type":1}` + "\n\n", http.StatusInternalServerError},
		{`data: {"error":"","error_type":"validation"}` + "\n\n", 0},
		{`data: {"x":{"error":"y","error_type":"validation"}}` + "\n\n", 0},
	}
	for _, tc := range cases {
		for _, step := range []int{1, 7, len(tc.stream)} {
			b := &body{rc: io.NopCloser(&pieces{chunk(tc.stream, step)})}
			code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
			require.NoError(t, err)
			assert.Equal(t, tc.code, code, "%q in reads of %d", tc.stream, step)
		}
	}
}

// chunk cuts s into pieces of n bytes.
func chunk(s string, n int) []string {
	var p []string
	for i := 0; i < len(s); i += n {
		p = append(p, s[i:min(i+n, len(s))])
	}
	return p
}

// A text-generation-inference stream that starts with its error event
// produced nothing: its attempt fails with the status TGI gives the error,
// retried on the other replica if that is retryable (an overloaded
// replica's 429), handed to the client as sent if not (a prompt beyond the
// context, a 422), and never a success.
func TestTGIFirstErrorEvent(t *testing.T) {
	t.Run("retried", func(t *testing.T) {
		a := newUpstream(t, sendStream(tgiErrorStream("Model is overloaded", "overloaded")))
		b := newUpstream(t, streamTokens(2))
		rec := &recorder{}
		done := &doneLog{}
		h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
		assert.EqualValues(t, 1, a.hits.Load())
		assert.EqualValues(t, 1, b.hits.Load())
		requireStatusFailure(t, done.get(a.URL), http.StatusTooManyRequests)
		requireStatusFailure(t, rec.reported(a.URL), http.StatusTooManyRequests)
		assert.Equal(t, []error{nil}, done.get(b.URL))
	})
	t.Run("not retryable", func(t *testing.T) {
		stream := tgiErrorStream("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`", "validation")
		a := newUpstream(t, sendStream(stream))
		b := newUpstream(t, streamTokens(2))
		done := &doneLog{}
		h := newObservedHarness(t, Config{}, done, nil, a, b)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, stream, body)
		assert.EqualValues(t, 1, a.hits.Load())
		assert.Zero(t, b.hits.Load())
		requireStatusFailure(t, done.get(a.URL), http.StatusUnprocessableEntity)
	})
}

// text-generation-inference's error event after the first event ends the
// pick as a failure.
func TestTGIErrorEventAfterFirstEvent(t *testing.T) {
	a := newUpstream(t, sendStream(`data:{"index":1,"token":{"id":3,"text":"a"}}`+"\n\n"+
		tgiErrorStream("Request failed during generation: CUDA out of memory", "generation")))
	done := &doneLog{}
	h := newObservedHarness(t, Config{}, done, nil, a)
	code, body := postProxy(t, h)
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, strings.HasSuffix(body, `"error_type":"generation"}`+"\n\n"), body)
	errs := done.get(a.URL)
	if assert.Len(t, errs, 1) {
		assert.ErrorIs(t, errs[0], ErrErrorEvent)
	}
}

// tgiOpenAIErrorStream is what text-generation-inference's OpenAI-compatible
// routes stream when they fail a request after their 200: one event whose
// data is InferError::into_openai_event's, the error's message and an
// http_status_code of 422 whatever the error, then "data: [DONE]".
func tgiOpenAIErrorStream(msg string) string {
	return `data:{"error":{"message":"` + msg + `","http_status_code":422}}` + "\n\ndata:[DONE]\n\n"
}

// A first event that is the error of text-generation-inference's
// OpenAI-compatible routes stands for the status TGI answers with for the
// error its message names, not for its http_status_code, 422 for every
// error, nor for 500.
func TestTGIOpenAIErrorEventCode(t *testing.T) {
	cases := []struct {
		stream string
		code   int
	}{
		{tgiOpenAIErrorStream("Model is overloaded"), http.StatusTooManyRequests},
		{tgiOpenAIErrorStream("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`"), http.StatusUnprocessableEntity},
		{tgiOpenAIErrorStream("Template error: x"), http.StatusUnprocessableEntity},
		{tgiOpenAIErrorStream("Missing template vatiable: x"), http.StatusUnprocessableEntity},
		{tgiOpenAIErrorStream("Tool error: x"), http.StatusUnprocessableEntity},
		{tgiOpenAIErrorStream("Request failed during generation: x"), http.StatusFailedDependency},
		{tgiOpenAIErrorStream("Incomplete generation"), http.StatusInternalServerError},
		{tgiOpenAIErrorStream("Incomplete generation stream"), http.StatusInternalServerError},
		{tgiOpenAIErrorStream("Stream event serialization error"), http.StatusInternalServerError},
		{tgiOpenAIErrorStream("something new"), http.StatusUnprocessableEntity},
		{`data: {"error":{"message":"x","http_status_code":503}}` + "\n\n", http.StatusServiceUnavailable},
		{`data: {"error":{"message":"x","http_status_code":"x"}}` + "\n\n", http.StatusInternalServerError},
		{`data: {"error":{"message":1,"http_status_code":422}}` + "\n\n", http.StatusUnprocessableEntity},
		{`data: {"error":{"message":"Model is overloaded","code":503}}` + "\n\n", http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		for _, step := range []int{1, 7, len(tc.stream)} {
			b := &body{rc: io.NopCloser(&pieces{chunk(tc.stream, step)})}
			code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
			require.NoError(t, err)
			assert.Equal(t, tc.code, code, "%q in reads of %d", tc.stream, step)
		}
	}
}

// A stream of text-generation-inference's OpenAI-compatible routes that
// starts with its error event produced nothing: an overloaded replica's is
// retried on the other replica, and a request it refused as invalid is
// handed to the client as sent, not retried, though both say 422.
func TestTGIOpenAIFirstErrorEvent(t *testing.T) {
	t.Run("overloaded", func(t *testing.T) {
		a := newUpstream(t, sendStream(tgiOpenAIErrorStream("Model is overloaded")))
		b := newUpstream(t, streamTokens(2))
		rec := &recorder{}
		done := &doneLog{}
		h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
		assert.EqualValues(t, 1, a.hits.Load())
		assert.EqualValues(t, 1, b.hits.Load())
		requireStatusFailure(t, done.get(a.URL), http.StatusTooManyRequests)
		requireStatusFailure(t, rec.reported(a.URL), http.StatusTooManyRequests)
		assert.Equal(t, []error{nil}, done.get(b.URL))
	})
	t.Run("invalid", func(t *testing.T) {
		stream := tgiOpenAIErrorStream("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`")
		a := newUpstream(t, sendStream(stream))
		b := newUpstream(t, streamTokens(2))
		rec := &recorder{}
		done := &doneLog{}
		h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, stream, body)
		assert.EqualValues(t, 1, a.hits.Load())
		assert.Zero(t, b.hits.Load())
		requireStatusFailure(t, done.get(a.URL), http.StatusUnprocessableEntity)
		requireStatusFailure(t, rec.reported(a.URL), http.StatusUnprocessableEntity)
	})
}
