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
// stream_options.include_usage asks: then a last chunk, with no choices,
// carries it, and with continuous_usage_stats every chunk carries the usage
// so far.
func TestStreamUsage(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	const prompt = `"prompt":"hello world!"` // 12 bytes: 3 tokens
	const messages = `"messages":[{"role":"user","content":"hello world!"}]`
	for _, ep := range []struct{ path, input, id, object string }{
		{"/v1/completions", prompt, "cmpl-", "text_completion"},
		{"/v1/chat/completions", messages, "chatcmpl-", "chat.completion.chunk"},
	} {
		promptTokens := 3
		if ep.input == messages {
			promptTokens = 5 // "user\nhello world!\n" is 18 bytes
		}
		body := func(opts string) string {
			return fmt.Sprintf(`{%s,"max_tokens":4,"stream":true%s}`, ep.input, opts)
		}
		t.Run(ep.path+" without stream_options", func(t *testing.T) {
			for _, opts := range []string{"", `,"stream_options":null`, `,"stream_options":{}`, `,"stream_options":{"include_usage":false}`, `,"stream_options":{"continuous_usage_stats":true}`} {
				chunks := streamChunks(t, url, ep.path, body(opts))
				require.Equal(t, 4, len(chunks), "%s: one chunk a token and no usage chunk", opts)
				for _, c := range chunks {
					assert.Nil(t, c.Usage, opts)
					assert.Len(t, c.Choices, 1, opts)
				}
			}
		})
		t.Run(ep.path+" include_usage", func(t *testing.T) {
			for _, opts := range []string{`,"stream_options":{"include_usage":true}`, `,"stream_options":{"include_usage":"yes","other":1}`} {
				chunks := streamChunks(t, url, ep.path, body(opts))
				require.Equal(t, 5, len(chunks), "%s: one chunk a token, then the usage chunk", opts)
				for _, c := range chunks[:4] {
					assert.Nil(t, c.Usage, opts)
				}
				last := chunks[4]
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
			chunks := streamChunks(t, url, ep.path, body(`,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`))
			require.Equal(t, 5, len(chunks), "one chunk a token, then the usage chunk")
			for i, c := range chunks {
				require.NotNil(t, c.Usage, "chunk %d", i)
				assert.Equal(t, promptTokens, c.Usage.PromptTokens, "chunk %d", i)
				assert.Equal(t, min(i+1, 4), c.Usage.CompletionTokens, "chunk %d", i)
				assert.Equal(t, promptTokens+min(i+1, 4), c.Usage.TotalTokens, "chunk %d", i)
			}
			assert.Empty(t, chunks[4].Choices)
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
