package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamChunk is the part of a stream's event the tests read.
type streamChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// streamChunks posts body to path and returns the stream's events before
// "data: [DONE]", which must end it.
func streamChunks(t *testing.T, url, path, body string) []streamChunk {
	t.Helper()
	resp := post(t, url+path, body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := events(t, resp.Body)
	require.NotEmpty(t, ev)
	require.Equal(t, "[DONE]", ev[len(ev)-1])
	var out []streamChunk
	for _, d := range ev[:len(ev)-1] {
		var c streamChunk
		require.NoError(t, json.Unmarshal([]byte(d), &c), "%s", d)
		out = append(out, c)
	}
	return out
}

// TestStreamUsage: as vLLM, a stream reports usage only when
// stream_options ask, include_usage being true unless set otherwise: then a
// last chunk, with no choices, carries it, and with continuous_usage_stats
// every chunk carries the usage so far (a chat stream's role chunk none
// yet).
func TestStreamUsage(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	const prompt = `"prompt":"hello world!"` // 12 bytes: 3 tokens
	const messages = `"messages":[{"role":"user","content":"hello world!"}]`
	for _, ep := range []struct {
		path, input, id, object string
		role                    int // chunks before the first token's
	}{
		{"/v1/completions", prompt, "cmpl-", "text_completion", 0},
		{"/v1/chat/completions", messages, "chatcmpl-", "chat.completion.chunk", 1},
	} {
		promptTokens := 3
		if ep.input == messages {
			promptTokens = 5 // "user\nhello world!\n" is 18 bytes
		}
		body := func(opts string) string {
			return fmt.Sprintf(`{%s,"max_tokens":4,"stream":true%s}`, ep.input, opts)
		}
		n := ep.role + 4 // the chunks of a stream without usage
		t.Run(ep.path+" without usage", func(t *testing.T) {
			for _, opts := range []string{"", `,"stream_options":null`, `,"stream_options":{"include_usage":false}`, `,"stream_options":{"include_usage":null}`, `,"stream_options":{"include_usage":false,"continuous_usage_stats":true}`} {
				chunks := streamChunks(t, url, ep.path, body(opts))
				require.Equal(t, n, len(chunks), "%s: one chunk a token and no usage chunk", opts)
				for _, c := range chunks {
					assert.Nil(t, c.Usage, opts)
					assert.Len(t, c.Choices, 1, opts)
				}
			}
		})
		t.Run(ep.path+" include_usage", func(t *testing.T) {
			for _, opts := range []string{`,"stream_options":{"include_usage":true}`, `,"stream_options":{"include_usage":"yes","other":1}`, `,"stream_options":{}`, `,"stream_options":{"other":1}`} {
				chunks := streamChunks(t, url, ep.path, body(opts))
				require.Equal(t, n+1, len(chunks), "%s: one chunk a token, then the usage chunk", opts)
				for _, c := range chunks[:n] {
					assert.Nil(t, c.Usage, opts)
				}
				last := chunks[n]
				assert.Empty(t, last.Choices, opts)
				assert.Equal(t, chunks[0].ID, last.ID, opts)
				assert.Equal(t, ep.object, last.Object, opts)
				require.NotNil(t, last.Usage, opts)
				assert.Equal(t, promptTokens, last.Usage.PromptTokens, opts)
				assert.Equal(t, 4, last.Usage.CompletionTokens, opts)
				assert.Equal(t, promptTokens+4, last.Usage.TotalTokens, opts)
			}
		})
		t.Run(ep.path+" continuous_usage_stats", func(t *testing.T) {
			for _, opts := range []string{`,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, `,"stream_options":{"continuous_usage_stats":true}`} {
				chunks := streamChunks(t, url, ep.path, body(opts))
				require.Equal(t, n+1, len(chunks), "%s: one chunk a token, then the usage chunk", opts)
				for i, c := range chunks {
					tokens := min(i+1-ep.role, 4)
					require.NotNil(t, c.Usage, "%s: chunk %d", opts, i)
					assert.Equal(t, promptTokens, c.Usage.PromptTokens, "%s: chunk %d", opts, i)
					assert.Equal(t, tokens, c.Usage.CompletionTokens, "%s: chunk %d", opts, i)
					assert.Equal(t, promptTokens+tokens, c.Usage.TotalTokens, "%s: chunk %d", opts, i)
				}
				assert.Empty(t, chunks[n].Choices, opts)
			}
		})
	}
}

// TestStreamOptionsRefused: as vLLM, stream_options that ask anything need
// "stream": true, and must be an object of booleans.
func TestStreamOptionsRefused(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	for _, c := range []struct {
		body string
		code int
		msg  string
	}{
		{`{"prompt":"x","max_tokens":1,"stream_options":{"include_usage":true}}`, http.StatusBadRequest, "Stream options can only be defined when `stream=True`."},
		{`{"prompt":"x","max_tokens":1,"stream":false,"stream_options":{"include_usage":false}}`, http.StatusBadRequest, "Stream options can only be defined when `stream=True`."},
		{`{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"stream_options":{"include_usage":true}}`, http.StatusBadRequest, "Stream options can only be defined when `stream=True`."},
		{`{"prompt":"x","max_tokens":1,"stream":true,"stream_options":"include_usage"}`, http.StatusBadRequest, "stream_options: an object is required"},
		{`{"prompt":"x","max_tokens":1,"stream":true,"stream_options":[]}`, http.StatusBadRequest, "stream_options: an object is required"},
		{`{"prompt":"x","max_tokens":1,"stream":true,"stream_options":{"include_usage":2}}`, http.StatusBadRequest, "stream_options.include_usage: a boolean is required"},
		{`{"prompt":"x","max_tokens":1,"stream":true,"stream_options":{"continuous_usage_stats":"maybe"}}`, http.StatusBadRequest, "stream_options.continuous_usage_stats: a boolean is required"},
		// Empty or null options ask nothing: vLLM takes them without a stream.
		{`{"prompt":"x","max_tokens":1,"stream_options":{}}`, http.StatusOK, ""},
		{`{"prompt":"x","max_tokens":1,"stream_options":null}`, http.StatusOK, ""},
	} {
		path := "/v1/completions"
		if strings.Contains(c.body, `"messages"`) {
			path = "/v1/chat/completions"
		}
		resp := post(t, url+path, c.body)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, c.code, resp.StatusCode, c.body)
		assert.Contains(t, string(b), c.msg, c.body)
	}
}

func TestLaxBool(t *testing.T) {
	for _, c := range []struct {
		raw   string
		v, ok bool
	}{
		{"", false, true}, {"null", false, true}, {"false", false, true}, {"true", true, true},
		{"0", false, true}, {"1", true, true}, {"1.0", true, true}, {"0e3", false, true},
		{`"yes"`, true, true}, {`"ON"`, true, true}, {`"t"`, true, true}, {`"1"`, true, true},
		{`"no"`, false, true}, {`"Off"`, false, true}, {`"f"`, false, true}, {`"0"`, false, true},
		{"2", false, false}, {"0.5", false, false}, {`""`, false, false}, {`" true"`, false, false},
		{"[]", false, false}, {"{}", false, false},
	} {
		v, ok := laxBool(json.RawMessage(c.raw))
		assert.Equal(t, c.ok, ok, "%s", c.raw)
		assert.Equal(t, c.v, v, "%s", c.raw)
	}
}

// choices returns the members of each choice of the JSON answer or event
// data.
func choices(t *testing.T, data string) []map[string]json.RawMessage {
	t.Helper()
	var v struct {
		Choices []map[string]json.RawMessage `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(data), &v), "%s", data)
	return v.Choices
}

// requireMembers requires that obj has exactly the members of want, each
// with the value want gives as JSON ("" for any value).
func requireMembers(t *testing.T, want map[string]string, obj map[string]json.RawMessage, msgAndArgs ...any) {
	t.Helper()
	var names []string
	for name := range obj {
		names = append(names, name)
	}
	var wantNames []string
	for name := range want {
		wantNames = append(wantNames, name)
	}
	require.ElementsMatch(t, wantNames, names, msgAndArgs...)
	for name, v := range want {
		if v != "" {
			assert.JSONEq(t, v, string(obj[name]), append([]any{name}, msgAndArgs...)...)
		}
	}
}

// TestStreamChatRole: as vLLM's, a chat stream opens with a chunk whose
// delta is the role and empty content, sent with the first token: just
// before it, at the end of the prefill, not earlier.
func TestStreamChatRole(t *testing.T) {
	// 100 times slower than a GPU: a prefill lasts some 1.65 s, a decode
	// iteration some 0.57 s.
	e := newEngine(t, Config{Speedup: 0.01})
	url, _ := serve(t, e)
	start := time.Now()
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	var data []string
	var at []time.Duration
	for {
		line, err := br.ReadString('\n')
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, strings.TrimSpace(d))
			at = append(at, time.Since(start))
		}
		if err != nil {
			break
		}
	}
	require.Len(t, data, 4, "the role chunk, a chunk a token, [DONE]")
	role := choices(t, data[0])
	require.Len(t, role, 1)
	requireMembers(t, map[string]string{
		"index": "0", "delta": `{"role":"assistant","content":""}`, "logprobs": "null", "finish_reason": "null",
	}, role[0], "the role chunk")
	requireMembers(t, map[string]string{
		"index": "0", "delta": `{"content":" tok"}`, "logprobs": "null", "finish_reason": "null", "token_ids": "null",
	}, choices(t, data[1])[0], "the first token's chunk")
	assert.Greater(t, at[0], time.Second, "the role chunk waits for the prefill")
	assert.Less(t, at[1]-at[0], 300*time.Millisecond, "the first token follows the role chunk at once")
	assert.Greater(t, at[2]-at[1], 300*time.Millisecond, "the second token a decode iteration later")
}

// TestChoiceMembers: every choice has the members vLLM writes for a
// request without logprobs or token IDs: logprobs and stop_reason null
// among them (stop_reason in a chat stream only where it finishes), and a
// non-streaming answer every member of vLLM's choice model.
func TestChoiceMembers(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	const messages = `"messages":[{"role":"user","content":"hi"}]`
	const prompt = `"prompt":"hi"`

	t.Run("chat stream", func(t *testing.T) {
		ev := events(t, post(t, url+"/v1/chat/completions", `{`+messages+`,"max_tokens":2,"stream":true}`).Body)
		require.Len(t, ev, 4)
		requireMembers(t, map[string]string{"index": "0", "delta": `{"role":"assistant","content":""}`, "logprobs": "null", "finish_reason": "null"}, choices(t, ev[0])[0])
		requireMembers(t, map[string]string{"index": "0", "delta": `{"content":" tok"}`, "logprobs": "null", "finish_reason": "null", "token_ids": "null"}, choices(t, ev[1])[0])
		requireMembers(t, map[string]string{"index": "0", "delta": `{"content":" tok"}`, "logprobs": "null", "finish_reason": `"length"`, "stop_reason": "null", "token_ids": "null"}, choices(t, ev[2])[0])
	})
	t.Run("completions stream", func(t *testing.T) {
		ev := events(t, post(t, url+"/v1/completions", `{`+prompt+`,"max_tokens":2,"stream":true}`).Body)
		require.Len(t, ev, 3)
		for i, finish := range []string{"null", `"length"`} {
			requireMembers(t, map[string]string{
				"index": "0", "text": `" tok"`, "logprobs": "null", "finish_reason": finish, "stop_reason": "null",
				"prompt_token_ids": "null", "token_ids": "null",
			}, choices(t, ev[i])[0], "chunk %d", i)
		}
	})
	t.Run("chat", func(t *testing.T) {
		b, err := io.ReadAll(post(t, url+"/v1/chat/completions", `{`+messages+`,"max_tokens":2}`).Body)
		require.NoError(t, err)
		c := choices(t, string(b))
		require.Len(t, c, 1)
		requireMembers(t, map[string]string{
			"index": "0", "message": "", "logprobs": "null", "finish_reason": `"length"`, "stop_reason": "null",
			"token_ids": "null", "routed_experts": "null",
		}, c[0])
		var msg map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(c[0]["message"], &msg))
		requireMembers(t, map[string]string{
			"role": `"assistant"`, "content": `" tok tok"`, "refusal": "null", "annotations": "null", "audio": "null",
			"function_call": "null", "reasoning": "null",
		}, msg)
	})
	t.Run("completions", func(t *testing.T) {
		b, err := io.ReadAll(post(t, url+"/v1/completions", `{`+prompt+`,"max_tokens":2}`).Body)
		require.NoError(t, err)
		c := choices(t, string(b))
		require.Len(t, c, 1)
		requireMembers(t, map[string]string{
			"index": "0", "text": `" tok tok"`, "logprobs": "null", "finish_reason": `"length"`, "stop_reason": "null",
			"token_ids": "null", "prompt_logprobs": "null", "prompt_token_ids": "null", "routed_experts": "null",
		}, c[0])
	})
}

// TestStreamEngineStopped: a chat or completions stream in progress when
// the engine's Run returns ends as vLLM's does when its engine dies: the
// chunks sent so far, then vLLM's error event, then "data: [DONE]", and the
// body ends cleanly, not with a broken connection.
func TestStreamEngineStopped(t *testing.T) {
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1000,"stream":true}`},
		{"/v1/completions", `{"prompt":"hi","max_tokens":1000,"stream":true}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			e := newEngine(t, Config{Speedup: 1})
			url := startHandlerOnly(t, e)
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- e.Run(ctx) }()
			resp := post(t, url+c.path, c.body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(line, "data: {"), line)
			cancel()
			require.ErrorIs(t, <-ran, context.Canceled)
			rest, err := io.ReadAll(br)
			require.NoError(t, err, "the stream ends, not breaks")
			ev := events(t, strings.NewReader(line+string(rest)))
			require.GreaterOrEqual(t, len(ev), 3)
			assert.Equal(t, "[DONE]", ev[len(ev)-1])
			assert.Equal(t, `{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", "type": "InternalServerError", "param": null, "code": 500}}`,
				ev[len(ev)-2], "vLLM's event, as json.dumps writes it")
			for _, d := range ev[:len(ev)-2] {
				assert.NotContains(t, d, `"error"`, "only the last event before [DONE] is the error")
			}
			assert.True(t, strings.HasSuffix(line+string(rest), "\n\ndata: [DONE]\n\n"))
		})
	}
}

// TestStreamHeaders: as vLLM's, a stream's only header of its own is its
// Content-Type: no Cache-Control.
func TestStreamHeaders(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`},
		{"/v1/completions", `{"prompt":"hi","max_tokens":2,"stream":true}`},
		{"/v1/responses", `{"input":"hi","max_output_tokens":2,"stream":true}`},
	} {
		resp := post(t, url+c.path, c.body)
		_, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode, c.path)
		assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"), c.path)
		assert.NotContains(t, resp.Header, "Cache-Control", c.path)
	}
}

// TestAnswerMembers: a non-streaming answer has every member of vLLM's
// answer model, those the engine does not fill null, and its usage vLLM's
// prompt_tokens_details null.
func TestAnswerMembers(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	answer := func(path, body string) map[string]json.RawMessage {
		t.Helper()
		resp := post(t, url+path, body)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(b, &m), "%s", b)
		return m
	}
	usage := map[string]string{"prompt_tokens": "1", "completion_tokens": "2", "total_tokens": "3", "prompt_tokens_details": "null"}
	t.Run("chat", func(t *testing.T) {
		m := answer("/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
		requireMembers(t, map[string]string{
			"id": "", "object": `"chat.completion"`, "created": "", "model": `"emulated"`, "choices": "",
			"service_tier": "null", "system_fingerprint": "null", "usage": "",
			"prompt_logprobs": "null", "prompt_token_ids": "null", "prompt_text": "null", "kv_transfer_params": "null", "metrics": "null",
		}, m)
		var u map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(m["usage"], &u))
		chatUsage := map[string]string{}
		for k, v := range usage {
			chatUsage[k] = v
		}
		// "user" and "hi": 6 bytes, 2 tokens.
		chatUsage["prompt_tokens"], chatUsage["total_tokens"] = "2", "4"
		requireMembers(t, chatUsage, u)
	})
	t.Run("completions", func(t *testing.T) {
		m := answer("/v1/completions", `{"prompt":"hi","max_tokens":2}`)
		requireMembers(t, map[string]string{
			"id": "", "object": `"text_completion"`, "created": "", "model": `"emulated"`, "choices": "",
			"service_tier": "null", "system_fingerprint": "null", "usage": "",
			"kv_transfer_params": "null", "metrics": "null",
		}, m)
		var u map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(m["usage"], &u))
		requireMembers(t, usage, u)
	})
}
