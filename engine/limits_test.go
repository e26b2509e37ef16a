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

// completionTokens posts body to path and returns the answer's status, its
// usage's completion_tokens if it is 200, else its error message.
func completionTokens(t *testing.T, url, path, body string) (int, int, string) {
	t.Helper()
	resp := post(t, url+path, body)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var answer struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &answer), "%s", b)
	return resp.StatusCode, answer.Usage.CompletionTokens, answer.Error.Message
}

// A request that sets no output length (here a completions request whose
// max_tokens is null) generates the default output as far as its context
// has room, as vLLM does; only a prompt that fills the context, or an
// explicit max_tokens beyond it, is refused, each with vLLM's message.
func TestOutputBoundedByContext(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 16}) // 256 tokens of context
	url, _ := serve(t, e)
	prompt := func(tokens int) string { return strings.Repeat("abcd", tokens) }
	cases := []struct {
		name   string
		body   string
		code   int
		tokens int    // completion tokens, if 200
		msg    string // part of the error's message, if not 200
	}{
		{"default output fits", fmt.Sprintf(`{"prompt":%q,"max_tokens":null}`, prompt(100)), http.StatusOK, DefaultMaxTokens, ""},
		{"default output cut to the context", fmt.Sprintf(`{"prompt":%q,"max_tokens":null}`, prompt(200)), http.StatusOK, 56, ""},
		{"one token of room", fmt.Sprintf(`{"prompt":%q,"max_tokens":null}`, prompt(255)), http.StatusOK, 1, ""},
		{"prompt fills the context", fmt.Sprintf(`{"prompt":%q,"max_tokens":null}`, prompt(256)), http.StatusBadRequest, 0,
			"This model's maximum context length is 256 tokens. However, your request has 256 input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=256)"},
		// The prompt is checked first, whatever max_tokens asks.
		{"prompt fills the context, with max_tokens", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt(300)), http.StatusBadRequest, 0,
			"This model's maximum context length is 256 tokens. However, your request has 300 input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=300)"},
		{"max_tokens beyond the context", fmt.Sprintf(`{"prompt":%q,"max_tokens":100}`, prompt(200)), http.StatusBadRequest, 0,
			"'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context length is 256 tokens and your request has 200 input tokens (100 > 256 - 200). (parameter=max_tokens, value=100)"},
		{"max_tokens within the context", fmt.Sprintf(`{"prompt":%q,"max_tokens":56}`, prompt(200)), http.StatusOK, 56, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, tokens, msg := completionTokens(t, url, "/v1/completions", c.body)
			require.Equal(t, c.code, code, msg)
			if code == http.StatusOK {
				assert.Equal(t, c.tokens, tokens)
			} else {
				assert.Contains(t, msg, c.msg)
			}
		})
	}
}

// TestDefaultOutputLength: as vLLM, a completions request without
// max_tokens asks for 16 tokens (CompletionRequest's default), checked
// against the context as if asked, and reads no max_completion_tokens; a
// chat request without an output length, or a completions request whose
// max_tokens is null, gets the default output.
func TestDefaultOutputLength(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 16, DefaultMaxTokens: 40}) // 256 tokens of context
	url, _ := serve(t, e)
	prompt := func(tokens int) string { return strings.Repeat("abcd", tokens) }
	for _, c := range []struct {
		name, path, body string
		code, tokens     int
		msg              string
	}{
		{"completions", "/v1/completions", `{"prompt":"hi"}`, http.StatusOK, 16, ""},
		{"completions, max_completion_tokens ignored", "/v1/completions", `{"prompt":"hi","max_completion_tokens":3}`, http.StatusOK, 16, ""},
		{"completions, a key in another case ignored", "/v1/completions", `{"prompt":"hi","Max_Tokens":3}`, http.StatusOK, 16, ""},
		{"completions, null", "/v1/completions", `{"prompt":"hi","max_tokens":null}`, http.StatusOK, 40, ""},
		{"completions, asked", "/v1/completions", `{"prompt":"hi","max_tokens":3}`, http.StatusOK, 3, ""},
		{"completions, 16 fit", "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, prompt(240)), http.StatusOK, 16, ""},
		{"completions, 16 do not fit", "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, prompt(241)), http.StatusBadRequest, 0,
			"'max_tokens' or 'max_completion_tokens' is too large: 16. This model's maximum context length is 256 tokens and your request has 241 input tokens (16 > 256 - 241). (parameter=max_tokens, value=16)"},
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, http.StatusOK, 40, ""},
		{"chat, null", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":null,"max_completion_tokens":null}`, http.StatusOK, 40, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, tokens, msg := completionTokens(t, url, c.path, c.body)
			require.Equal(t, c.code, code, msg)
			if code == http.StatusOK {
				assert.Equal(t, c.tokens, tokens)
			} else {
				assert.Equal(t, c.msg, msg)
			}
		})
	}
	// A stream too.
	ev := events(t, post(t, url+"/v1/completions", `{"prompt":"hi","stream":true}`).Body)
	assert.Len(t, ev, 16+1)
}

// The context is checked against the max_tokens asked for, as vLLM checks
// it; the emulator's MaxTokensCap only bounds what it then generates.
func TestContextCheckedBeforeTheCap(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 16, MaxTokensCap: 8}) // 256 tokens of context
	url, _ := serve(t, e)
	prompt := strings.Repeat("abcd", 200)
	code, _, msg := completionTokens(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":100}`, prompt))
	require.Equal(t, http.StatusBadRequest, code, msg)
	assert.Contains(t, msg, "'max_tokens' or 'max_completion_tokens' is too large: 100.")
	code, tokens, msg := completionTokens(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":50}`, prompt))
	require.Equal(t, http.StatusOK, code, msg)
	assert.Equal(t, 8, tokens, "the cap bounds the output")
}

// However large MaxModelLen, the KV cache and MaxTokensCap, a request
// beyond the longest context the engine models gets 400 in vLLM's words,
// not a 503 in the emulator's.
func TestLongestContext(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 1 << 20, BlockSize: 64, MaxTokensCap: 1 << 25, MaxModelLen: 1 << 26})
	url, _ := serve(t, e)
	code, _, msg := completionTokens(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":"x","max_tokens":%d}`, 1<<25))
	assert.Equal(t, http.StatusBadRequest, code, msg)
	assert.Contains(t, msg, "This model's maximum context length is 16777216 tokens")
	code, tokens, msg := completionTokens(t, url, "/v1/completions", `{"prompt":"x","max_tokens":2}`)
	assert.Equal(t, http.StatusOK, code, msg)
	assert.Equal(t, 2, tokens)
}

// A chat request's max_completion_tokens wins over its max_tokens, as in
// vLLM; a completions request reads max_tokens first. A bad value is named
// by its field.
func TestOutputLengthFields(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	cases := []struct {
		name, path, body string
		code, tokens     int
		msg              string
	}{
		{"chat, both", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"max_completion_tokens":3}`, http.StatusOK, 3, ""},
		{"chat, max_tokens only", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, http.StatusOK, 2, ""},
		{"chat, null max_completion_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"max_completion_tokens":null}`, http.StatusOK, 2, ""},
		{"completions, both", "/v1/completions", `{"prompt":"hi","max_tokens":2,"max_completion_tokens":3}`, http.StatusOK, 2, ""},
		{"completions, huge", "/v1/completions", `{"prompt":"hi","max_tokens":3e9}`, http.StatusBadRequest, 0, "max_tokens must be an integer from 1 to 2147483647"},
		{"chat, bad max_completion_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"max_completion_tokens":0.5}`, http.StatusBadRequest, 0, "max_completion_tokens must be an integer from 1 to 2147483647"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, tokens, msg := completionTokens(t, url, c.path, c.body)
			require.Equal(t, c.code, code, msg)
			if code == http.StatusOK {
				assert.Equal(t, c.tokens, tokens)
			} else {
				assert.Equal(t, c.msg, msg)
			}
		})
	}
}

// TestOutputLengthBelowOne: as vLLM's, an output length below 1, of any of
// the fields that ask for one, is refused with SamplingParams' error of
// parameter max_tokens, after the prompt's own check against the context.
func TestOutputLengthBelowOne(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 16}) // 256 tokens of context
	url, _ := serve(t, e)
	long := strings.Repeat("abcd", 256)
	cases := []struct {
		name, path, body string
		param, msg       string
	}{
		{"completions, zero", "/v1/completions", `{"prompt":"hi","max_tokens":0}`,
			"max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"},
		{"completions, negative", "/v1/completions", `{"prompt":"hi","max_tokens":-46771}`,
			"max_tokens", "max_tokens must be at least 1, got -46771. (parameter=max_tokens, value=-46771)"},
		{"chat, max_completion_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":-1}`,
			"max_tokens", "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)"},
		{"chat, max_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":-2.0}`,
			"max_tokens", "max_tokens must be at least 1, got -2. (parameter=max_tokens, value=-2)"},
		{"responses, max_output_tokens", "/v1/responses", `{"input":"hi","max_output_tokens":0}`,
			"max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"},
		{"prompt filling the context first", "/v1/completions", `{"prompt":"` + long + `","max_tokens":-1}`,
			"input_tokens", "This model's maximum context length is 256 tokens. However, your request has 256 input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=256)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, url+c.path, c.body)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
			var answer struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   string `json:"param"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(b, &answer), "%s", b)
			assert.Equal(t, c.msg, answer.Error.Message)
			assert.Equal(t, "BadRequestError", answer.Error.Type)
			assert.Equal(t, c.param, answer.Error.Param)
		})
	}
	assert.Zero(t, e.Stats().Running+e.Stats().Waiting)
}
