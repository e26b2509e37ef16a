package engine

import (
	"bufio"
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

// decodeJSON decodes r's body into a map.
func decodeJSON(t *testing.T, r io.Reader) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.NewDecoder(r).Decode(&m))
	return m
}

// TestResponsesAnswer: POST /v1/responses answers a response object as
// vLLM's, every member written, the output one assistant message of one
// output_text part, and the usage in the Responses API's names; the
// request ends at its output limit, so that its status is "incomplete".
func TestResponsesAnswer(t *testing.T) {
	e := newEngine(t, Config{Model: "m"})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/responses", `{"model":"m","instructions":"be brief","input":"hello","max_output_tokens":3,"temperature":0.5,"metadata":{"k":"v"},"user":"ann"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	m := decodeJSON(t, resp.Body)

	assert.True(t, strings.HasPrefix(m["id"].(string), "resp_"), m["id"])
	assert.Equal(t, "response", m["object"])
	assert.Equal(t, "m", m["model"])
	assert.Equal(t, "incomplete", m["status"])
	assert.Equal(t, map[string]any{"reason": "max_output_tokens"}, m["incomplete_details"])
	assert.Equal(t, "be brief", m["instructions"])
	assert.Equal(t, map[string]any{"k": "v"}, m["metadata"])
	assert.Equal(t, "ann", m["user"])
	assert.Equal(t, 0.5, m["temperature"])
	assert.Equal(t, 1.0, m["top_p"])
	assert.Equal(t, 3.0, m["max_output_tokens"])
	assert.Equal(t, "auto", m["tool_choice"])
	assert.Equal(t, []any{}, m["tools"])
	assert.Equal(t, true, m["parallel_tool_calls"])
	assert.Equal(t, false, m["background"])
	assert.Equal(t, "disabled", m["truncation"])
	assert.NotZero(t, m["created_at"])
	for _, k := range []string{"previous_response_id", "prompt", "reasoning", "text", "top_logprobs", "max_tool_calls"} {
		v, ok := m[k]
		assert.True(t, ok, k)
		assert.Nil(t, v, k)
	}

	output := m["output"].([]any)
	require.Len(t, output, 1)
	msg := output[0].(map[string]any)
	assert.True(t, strings.HasPrefix(msg["id"].(string), "msg_"), msg["id"])
	assert.Equal(t, "message", msg["type"])
	assert.Equal(t, "assistant", msg["role"])
	assert.Equal(t, "completed", msg["status"])
	assert.Equal(t, []any{map[string]any{"type": "output_text", "text": " tok tok tok", "annotations": []any{}, "logprobs": nil}}, msg["content"])

	// The prompt is the chat prompt "system\nbe brief\nuser\nhello\n".
	prompt := float64((len("system\nbe brief\nuser\nhello\n") + BytesPerToken - 1) / BytesPerToken)
	assert.Equal(t, map[string]any{
		"input_tokens": prompt,
		"input_tokens_details": map[string]any{
			"cached_tokens": 0.0, "input_tokens_per_turn": []any{}, "cached_tokens_per_turn": []any{},
		},
		"output_tokens": 3.0,
		"output_tokens_details": map[string]any{
			"reasoning_tokens": 0.0, "tool_output_tokens": 0.0, "output_tokens_per_turn": []any{}, "tool_output_tokens_per_turn": []any{},
		},
		"total_tokens": prompt + 3,
	}, m["usage"])
	assert.Equal(t, int64(1), e.Stats().Finished)
}

// sse is one server-sent event: its event line and its data.
type sse struct {
	event string
	data  map[string]any
}

// readEvents reads the events of a response stream, failing on a data line
// that is not JSON or an event without its event line.
func readEvents(t *testing.T, r io.Reader) []sse {
	t.Helper()
	var (
		out   []sse
		event string
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			event = v
			continue
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			require.NotEmpty(t, event, "data without an event line: %s", v)
			var d map[string]any
			require.NoError(t, json.Unmarshal([]byte(v), &d), v)
			out = append(out, sse{event, d})
			event = ""
			continue
		}
		require.Empty(t, line)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestResponsesStream: a streamed response sends vLLM's events in vLLM's
// order, each numbered by its sequence_number from 0 and named by its event
// line as by its type, then ends without "data: [DONE]".
func TestResponsesStream(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/responses", `{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":3,"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	evs := readEvents(t, resp.Body)

	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed",
	}
	var got []string
	for i, ev := range evs {
		got = append(got, ev.event)
		assert.Equal(t, ev.event, ev.data["type"], "event %d", i)
		assert.Equal(t, float64(i), ev.data["sequence_number"], "event %d", i)
	}
	require.Equal(t, want, got)

	created := evs[0].data["response"].(map[string]any)
	assert.Equal(t, "in_progress", created["status"])
	assert.Equal(t, []any{}, created["output"])
	assert.Nil(t, created["usage"])
	assert.Nil(t, created["incomplete_details"])
	assert.Equal(t, created, evs[1].data["response"])

	item := evs[2].data["item"].(map[string]any)
	id := item["id"].(string)
	assert.True(t, strings.HasPrefix(id, "msg_"), id)
	assert.Equal(t, map[string]any{"id": id, "content": []any{}, "role": "assistant", "status": "in_progress", "type": "message"}, item)
	assert.Equal(t, 0.0, evs[2].data["output_index"])
	assert.Equal(t, map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}}, evs[3].data["part"])
	for _, ev := range evs[3:10] {
		if ev.event == "response.output_item.done" {
			continue
		}
		assert.Equal(t, id, ev.data["item_id"], ev.event)
		assert.Equal(t, 0.0, ev.data["output_index"], ev.event)
		assert.Equal(t, 0.0, ev.data["content_index"], ev.event)
	}
	for _, ev := range evs[4:7] {
		assert.Equal(t, " tok", ev.data["delta"])
		assert.Equal(t, []any{}, ev.data["logprobs"])
	}
	assert.Equal(t, " tok tok tok", evs[7].data["text"])
	assert.Equal(t, " tok tok tok", evs[8].data["part"].(map[string]any)["text"])
	done := evs[9].data["item"].(map[string]any)
	assert.Equal(t, "completed", done["status"])
	assert.Equal(t, id, done["id"])

	final := evs[10].data["response"].(map[string]any)
	assert.Equal(t, created["id"], final["id"])
	assert.Equal(t, "incomplete", final["status"])
	assert.Equal(t, []any{done}, final["output"])
	usage := final["usage"].(map[string]any)
	assert.Equal(t, 3.0, usage["output_tokens"])
	assert.Equal(t, float64((len("user\nhi\n")+BytesPerToken-1)/BytesPerToken), usage["input_tokens"])
}

// TestResponsesSameAsChat: a Responses API request costs and caches as the
// chat request of the same messages, its instructions the system message:
// the same prompt tokens and the same prefix hashes; and a responses
// request after that chat request finds the chat request's prompt in the
// prefix cache, and reports it as cached_tokens.
func TestResponsesSameAsChat(t *testing.T) {
	e := newEngine(t, Config{})
	long := strings.Repeat("a shared system prompt ", 20)
	cases := []struct {
		name, responses, chat string
	}{
		{"string input", `{"instructions":"` + long + `","input":"question"}`,
			`{"messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"question"}]}`},
		{"no instructions", `{"input":"question","instructions":""}`,
			`{"messages":[{"role":"user","content":"question"}]}`},
		{"items", `{"input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"u"},{"type":"input_text","text":"b"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"c","annotations":[]}],"status":"completed","id":"msg_1"}]}`,
			`{"messages":[{"role":"developer","content":"d"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"}]}`},
		{"tool call", `{"input":[{"role":"user","content":"q"},{"type":"reasoning","id":"rs_1","summary":[]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"42"},{"role":"assistant","content":"done"}]}`,
			`{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"tool","content":"42"},{"role":"assistant","content":"done"}]}`},
		{"function call then its text", `{"input":[{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"role":"assistant","content":"x"}]}`,
			`{"messages":[{"role":"assistant","content":"x"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, _, _, ref := e.parseResponses([]byte(c.responses))
			require.Zero(t, ref.code, ref.msg)
			cs, _, code, msg := e.parse([]byte(c.chat), true)
			require.Zero(t, code, msg)
			assert.Equal(t, cs.PromptTokens, rs.PromptTokens)
			assert.Equal(t, cs.Prefix, rs.Prefix)
			assert.Equal(t, cs.OutputTokens, rs.OutputTokens)
		})
	}

	url, _ := serve(t, e)
	resp := post(t, url+"/v1/chat/completions", cases[0].chat[:len(cases[0].chat)-1]+`,"max_tokens":1}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, _ = io.Copy(io.Discard, resp.Body)
	hits := e.Stats().PrefixHits
	resp = post(t, url+"/v1/responses", `{"instructions":"`+long+`","input":"another question","max_output_tokens":1}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	usage := decodeJSON(t, resp.Body)["usage"].(map[string]any)
	cached := usage["input_tokens_details"].(map[string]any)["cached_tokens"].(float64)
	// The system message fills whole blocks: all but the last one cached.
	assert.GreaterOrEqual(t, cached, float64((len("system\n"+long)/BytesPerToken/DefaultBlockSize-1)*DefaultBlockSize))
	assert.Equal(t, float64(e.Stats().PrefixHits-hits), cached)
}

// TestResponsesInput: the engine reads the inputs vLLM reads, and refuses
// with 400 those it refuses, naming the item at fault.
func TestResponsesInput(t *testing.T) {
	e := newEngine(t, Config{})
	cases := []struct {
		name, body string
		text       string // the prompt text; "" if refused
		msg        string // a part of the refusal
	}{
		{"string", `{"input":"hi"}`, "user\nhi\n", ""},
		{"empty string", `{"input":""}`, "user\n\n", ""},
		{"instructions", `{"input":"hi","instructions":"sys"}`, "system\nsys\nuser\nhi\n", ""},
		{"null instructions", `{"input":"hi","instructions":null}`, "user\nhi\n", ""},
		{"message without type", `{"input":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`, "system\ns\nuser\nu\n", ""},
		{"parts joined", `{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`, "user\na\nb\n", ""},
		{"output parts", `{"input":[{"role":"assistant","content":[{"type":"output_text","text":"a"},{"type":"refusal","refusal":"no"}]}]}`, "assistant\na\nno\n", ""},
		{"reasoning alone", `{"input":[{"type":"reasoning","summary":[]},{"type":"reasoning","summary":[]}]}`, "assistant\n\nassistant\n\n", ""},
		{"tool output parts", `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"r"}]}]}`, "tool\nr\n", ""},
		{"instructions alone", `{"input":[],"instructions":"sys"}`, "system\nsys\n", ""},

		{"no input", `{"instructions":"x"}`, "", "input: a string or a list of items is required"},
		{"null input", `{"input":null}`, "", "input: a string or a list"},
		{"number input", `{"input":5}`, "", "input: a string or a list"},
		{"object input", `{"input":{"role":"user","content":"x"}}`, "", "input: a string or a list"},
		{"number instructions", `{"input":"x","instructions":1}`, "", "instructions must not be a JSON number"},
		{"string item", `{"input":["hi"]}`, "", "input[0]: an item must be an object"},
		{"null item", `{"input":[{"role":"user","content":"x"},null]}`, "", "input[1]: an item must be an object"},
		{"no type or role", `{"input":[{"content":"x"}]}`, "", `input[0]: an item needs a "type" or a "role"`},
		{"number type", `{"input":[{"type":1,"role":"user","content":"x"}]}`, "", "input[0].type: a string is required"},
		{"unknown type", `{"input":[{"type":"item_reference","id":"x"}]}`, "", `input[0].type: unsupported item type "item_reference"`},
		{"unknown role", `{"input":[{"role":"tool","content":"x"}]}`, "", "input[0].role:"},
		{"number role", `{"input":[{"type":"message","role":1,"content":"x"}]}`, "", "input[0].role:"},
		{"no content", `{"input":[{"role":"user"}]}`, "", "input[0].content: a string or a list of content parts is required"},
		{"null content", `{"input":[{"role":"assistant","content":null}]}`, "", "input[0].content: a string or a list"},
		{"number content", `{"input":[{"role":"user","content":1}]}`, "", "input[0].content: a string or a list"},
		{"bad part", `{"input":[{"role":"user","content":[{"type":"input_text"}]}]}`, "", `input[0].content[0]: a "input_text" part needs a string "text"`},
		{"unknown part", `{"input":[{"role":"user","content":"x"},{"role":"user","content":[{"type":"bogus"}]}]}`, "", `input[1].content[0]: unsupported content part type "bogus"`},
		{"function call without name", `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, "", "input[0].name: a string is required"},
		{"function call output without call id", `{"input":[{"type":"function_call_output","output":"x"}]}`, "", "input[0].call_id: a string is required"},
		{"function call output without output", `{"input":[{"type":"function_call_output","call_id":"c"}]}`, "", "input[0].output: a string or a list"},
		{"function call output of a number", `{"input":[{"type":"function_call_output","call_id":"c","output":3}]}`, "", "input[0].output: a string or a list"},
		{"encrypted reasoning", `{"input":[{"type":"reasoning","summary":[],"encrypted_content":"xyz"}]}`, "", "input[0]: encrypted reasoning content is not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _, _, ref := e.parseResponses([]byte(c.body))
			if c.msg != "" {
				assert.Equal(t, http.StatusBadRequest, ref.code)
				assert.Equal(t, typeInvalid, ref.typ)
				assert.Contains(t, ref.msg, c.msg)
				assert.Nil(t, s)
				return
			}
			require.Zero(t, ref.code, ref.msg)
			want := e.hasher.AppendString(nil, e.root, c.text)
			assert.Equal(t, want, s.Prefix, "prompt text %q", c.text)
			assert.Equal(t, (len(c.text)+BytesPerToken-1)/BytesPerToken, s.PromptTokens)
		})
	}
}

// TestResponsesErrors: a Responses API request is refused with the error
// bodies of vLLM's: the chat endpoint's for a model not served, a context
// too long, a malformed body; vLLM's Responses handler's own for background
// mode and a previous response, which the engine does not store.
func TestResponsesErrors(t *testing.T) {
	e := newEngine(t, Config{KVBlocks: 16, MaxBodyBytes: 4096})
	url, _ := serve(t, e)
	cases := []struct {
		name, body string
		code       int
		typ, param string
		msg        string // a part of the message
	}{
		{"unknown model", `{"model":"other","input":"x"}`, 404, "NotFoundError", "model", "The model `other` does not exist."},
		{"model of another type", `{"model":1,"input":"x"}`, 400, "Bad Request", "", "model"},
		{"malformed", `{"input":`, 400, "Bad Request", "", "malformed JSON"},
		{"not an object", `[1]`, 400, "Bad Request", "", "malformed JSON"},
		{"no input", `{}`, 400, "Bad Request", "", "input: a string or a list of items is required"},
		{"bad item before the model", `{"model":"other","input":[1]}`, 400, "Bad Request", "", "input[0]"},
		{"prompt too long", `{"input":"` + strings.Repeat("x", 1100) + `"}`, 400, "BadRequestError", "input_tokens", "This model's maximum context length is 256 tokens. However, your request has 277 input tokens."},
		{"max_output_tokens too large", `{"input":"x","max_output_tokens":300}`, 400, "BadRequestError", "max_output_tokens", "'max_output_tokens' is too large: 300."},
		{"max_output_tokens zero", `{"input":"x","max_output_tokens":0}`, 400, "BadRequestError", "max_tokens", "max_tokens must be at least 1, got 0."},
		{"max_output_tokens fractional", `{"input":"x","max_output_tokens":0.5}`, 400, "BadRequestError", "max_output_tokens", "max_output_tokens must be an integer"},
		{"max_output_tokens a string", `{"input":"x","max_output_tokens":"3"}`, 400, "Bad Request", "", "max_output_tokens must not be a JSON string"},
		{"empty prompt", `{"input":[]}`, 400, "BadRequestError", "", "the prompt is empty"},
		{"background", `{"input":"x","background":true}`, 400, "invalid_request_error", "background", "does not support the background mode"},
		{"background without store", `{"input":"x","background":true,"store":false}`, 400, "Bad Request", "", "background can only be used when `store` is true"},
		{"previous response", `{"input":"x","previous_response_id":"resp_1"}`, 404, "invalid_request_error", "response_id", "Response with id 'resp_1' not found."},
		{"prompt template", `{"input":"x","prompt":{"id":"p"}}`, 400, "Bad Request", "prompt", "prompt template is not supported"},
		{"metadata not an object", `{"input":"x","metadata":[]}`, 400, "Bad Request", "", "metadata: an object is required"},
		{"stream not a boolean", `{"input":"x","stream":"yes"}`, 400, "Bad Request", "", "stream must not be a JSON string"},
		{"body too large", `{"input":"` + strings.Repeat("x", 5000) + `"}`, 413, "Request Entity Too Large", "", "body too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, url+"/v1/responses", c.body)
			require.Equal(t, c.code, resp.StatusCode)
			m := decodeJSON(t, resp.Body)["error"].(map[string]any)
			assert.Equal(t, c.typ, m["type"])
			assert.Equal(t, float64(c.code), m["code"])
			if c.param == "" {
				assert.Nil(t, m["param"])
			} else {
				assert.Equal(t, c.param, m["param"])
			}
			assert.Contains(t, m["message"], c.msg)
		})
	}
	resp, err := client.Get(url + "/v1/responses")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodPost, resp.Header.Get("Allow"))
	assert.Zero(t, e.Stats().Finished, "no refused request ran")
}

// TestResponsesRequestID: a response's id is the body's request_id, as
// vLLM's, or else "resp_" and a random UUID in hex.
func TestResponsesRequestID(t *testing.T) {
	e := newEngine(t, Config{})
	_, a, _, ref := e.parseResponses([]byte(`{"input":"x","request_id":"mine"}`))
	require.Zero(t, ref.code, ref.msg)
	assert.Equal(t, `"mine"`, a.id)
	_, a, _, ref = e.parseResponses([]byte(`{"input":"x"}`))
	require.Zero(t, ref.code, ref.msg)
	assert.Regexp(t, `^"resp_[0-9a-f]{32}"$`, a.id)
	assert.Regexp(t, `^"msg_[0-9a-f]{32}"$`, a.msgID)
	_, _, _, ref = e.parseResponses([]byte(`{"input":"x","request_id":5}`))
	assert.Equal(t, http.StatusBadRequest, ref.code)
}

func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"input":"hello","max_output_tokens":4,"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}],"instructions":"s"}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}]}`,
		`{"input":[{"type":"reasoning","summary":[]},{"role":"assistant","content":"a"}]}`,
		`{"input":"x","background":"yes","store":0}`,
		`{"input":"x","previous_response_id":"r","model":"emulated"}`,
		`{"input":"x","metadata":{},"tools":[],"tool_choice":"none","parallel_tool_calls":false,"request_id":"q"}`,
		`{"input":[1]}`,
		`{"input":`,
	} {
		f.Add([]byte(s))
	}
	e, err := New(Config{KVBlocks: 64})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, body []byte) {
		s, a, _, ref := e.parseResponses(body)
		if ref.code != 0 {
			if s != nil {
				t.Fatal("refused request returned a sequence")
			}
			return
		}
		if s.PromptTokens < 1 || s.OutputTokens < 1 || s.OutputTokens > e.maxCap || !e.rep.Fits(&s.Sequence) {
			t.Fatalf("accepted out-of-range request %+v", s)
		}
		// The answer's members are JSON: the object they make decodes.
		a.created = "0"
		var b strings.Builder
		a.write(&b, "incomplete", a.message("x", "null"), "null")
		if !json.Valid([]byte(b.String())) {
			t.Fatalf("invalid answer %s", b.String())
		}
	})
}

// TestResponsesStreamOutlastsReadTimeout: ReadTimeout bounds a responses
// request's body only: a stream many times longer runs to its end.
func TestResponsesStreamOutlastsReadTimeout(t *testing.T) {
	e := newEngine(t, Config{ReadTimeout: 20 * time.Millisecond, Speedup: 1})
	url, _ := serve(t, e)
	start := time.Now()
	resp := post(t, url+"/v1/responses", `{"input":"x","max_output_tokens":40,"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := readEvents(t, resp.Body)
	require.Len(t, evs, 2+2+40+3+1)
	assert.Equal(t, "response.completed", evs[len(evs)-1].event)
	assert.Greater(t, time.Since(start), 10*20*time.Millisecond, "the stream outlasted the read timeout")
}

// TestResponsesEngineStopped: a responses stream in progress when the
// engine's Run returns breaks with an error, as a chat stream does, and a
// request after it gets 500, as from vLLM once its engine is dead.
func TestResponsesEngineStopped(t *testing.T) {
	e := newEngine(t, Config{Speedup: 1})
	url := startHandlerOnly(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- e.Run(ctx) }()
	resp := post(t, url+"/v1/responses", `{"input":"x","max_output_tokens":1000,"stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "event: response.created\n", line)
	cancel()
	require.ErrorIs(t, <-ran, context.Canceled)
	_, err = io.ReadAll(br)
	assert.Error(t, err, "a stopped engine's stream must end with an error")
	resp = post(t, url+"/v1/responses", `{"input":"x"}`)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
}
