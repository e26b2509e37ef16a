package httplb

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// event returns an event of an OpenAI Responses stream, as vLLM sends it:
// its type as the event's name and in its data, after the fields of data.
func event(typ, data string) string {
	if data != "" {
		data += ","
	}
	return "event: " + typ + "\ndata: {" + data + `"type":"` + typ + "\"}\n\n"
}

// responsesStream returns the events of an OpenAI Responses stream (as
// vLLM sends them) with the text deltas given, and then end: the last
// event, or events, such as a response.completed.
func responsesStream(deltas []string, end string) string {
	const resp = `"response":{"id":"resp_1","error":null,"incomplete_details":null,"metadata":{"usage":{"output_tokens":999}},` +
		`"model":"m","object":"response","output":[],"status":"in_progress","tools":[],"usage":null}`
	var b strings.Builder
	b.WriteString(event("response.created", resp+`,"sequence_number":0`))
	b.WriteString(event("response.in_progress", resp+`,"sequence_number":1`))
	b.WriteString(event("response.output_item.added", `"item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0`))
	b.WriteString(event("response.content_part.added", `"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"}`))
	for _, d := range deltas {
		b.WriteString(event("response.output_text.delta", `"content_index":0,"delta":`+d+`,"item_id":"msg_1","logprobs":[],"output_index":0`))
	}
	b.WriteString(end)
	return b.String()
}

// completed returns the events that end a Responses stream whose usage
// counts n output tokens.
func completed(n int) string {
	return event("response.output_text.done", `"content_index":0,"item_id":"msg_1","text":"..."`) +
		event("response.content_part.done", `"content_index":0,"item_id":"msg_1","part":{"text":"...","type":"output_text"}`) +
		event("response.output_item.done", `"item":{"id":"msg_1","status":"completed","type":"message"},"output_index":0`) +
		event("response.completed", fmt.Sprintf(`"response":{"id":"resp_1","error":null,"status":"completed","usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`, n, n+5))
}

// In an OpenAI Responses stream only the deltas carry tokens, and the
// usage of its response.completed (or response.incomplete) makes the count
// exact; an "error" or a "response.failed" event fails the stream, as an
// "error" object does, but an "error" elsewhere (in a text, or deeper)
// does not. A type written with escapes is what JSON decodes it to.
func TestOutputCounterResponses(t *testing.T) {
	five := []string{`"Hello"`, `","`, `" error"`, `"\"type\":\"error\""`, `"{\"error\": {}}"`}
	cases := []struct {
		name   string
		body   string
		tokens int
		failed bool
	}{
		{"completed", responsesStream(five, completed(5)), 5, false},
		{"completed, several tokens a delta", responsesStream(five, completed(12)), 12, false},
		{"cut off", responsesStream(five, ""), 5, false},
		{"incomplete", responsesStream(five, event("response.incomplete", `"response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"output_tokens":7}}`)), 7, false},
		{"reasoning and tool call deltas", responsesStream(nil,
			event("response.reasoning_text.delta", `"delta":"hm"`)+
				event("response.reasoning_summary_text.delta", `"delta":"hm"`)+
				event("response.function_call_arguments.delta", `"delta":"{\"type\":\"error\"}"`)+
				event("response.refusal.delta", `"delta":"no"`)+
				event("response.function_call_arguments.done", `"arguments":"{}"`)), 4, false},
		{"openai error", responsesStream(five, event("error", `"code":"server_error","message":"The server had an error.","param":null,"sequence_number":9`)), 5, true},
		{"openai nested error", responsesStream(five, event("error", `"error":{"type":"server_error","code":"server_error","message":"x","param":null},"sequence_number":9`)), 5, true},
		{"response failed", responsesStream(five, event("response.failed", `"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"x"},"usage":null},"sequence_number":9`)), 5, true},
		{"first event", event("error", `"code":"rate_limit_exceeded","message":"x","param":null,"sequence_number":0`), 0, true},
		{"type spaced", "data: { \"type\" :\t\"response.failed\" , \"response\": {}}\n\n", 0, true},
		{"nested type", responsesStream(five, event("response.output_item.added", `"item":{"type":"error","error":{}}`)), 5, false},
		// "errors", "x.delta" and "response." are no Responses events and
		// count a token each; "response.failed.x" and "response.error" are
		// Responses events, but no error events, without a token.
		{"other types", responsesStream(five, "data: {\"type\":\"errors\"}\n\ndata: {\"type\":\"response.failed.x\"}\n\ndata: {\"type\":\"response.error\"}\n\ndata: {\"type\":\"x.delta\"}\n\ndata: {\"type\":\"response.\"}\n\n"), 8, false},
		{"escaped type", responsesStream(five, "data: {\"type\":\"response.output_text.\\u0064elta\"}\n\ndata: {\"type\":\"\\u0065rror\"}\n\n"), 6, true},
		{"escaped type, not an error", responsesStream(five, "data: {\"type\":\"\\u0065rrors\"}\n\ndata: {\"type\":\"\\\"error\"}\n\n"), 7, false},
		{"long type", responsesStream(five, event("response.code_interpreter_call_code.delta", `"delta":"x"`)+event("response.code_interpreter_call_code.done", `"code":"x"`)), 6, false},
		{"type not a string", responsesStream(five, "data: {\"type\":[\"error\"]}\n\ndata: {\"type\":null,\"x\":\"error\"}\n\n"), 7, false},
		{"anthropic", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n", 2, false},
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

// The status a first event that is an error stands for: its code if it is
// an HTTP status, wherever the API puts it, else 500; 0 for any other
// event.
func TestErrorEventCode(t *testing.T) {
	cases := []struct {
		name, value string
		code        int
	}{
		{"vllm", `{"error": {"message": "x", "type": "BadRequestError", "param": null, "code": 400}}`, 400},
		{"openai", `{"type":"error","code":"server_error","message":"x","param":null,"sequence_number":0}`, 500},
		{"openai, rate limited", `{"type":"error","code":"rate_limit_exceeded","message":"x","param":null,"sequence_number":0}`, 429},
		{"openai, out of quota", `{"type":"error","error":{"code":"insufficient_quota","message":"x"}}`, 429},
		{"openai, a status code", `{"type":"error","code":429,"message":"x","sequence_number":0}`, 429},
		{"anthropic overloaded", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, 503},
		{"anthropic rate limited", `{"type": "error", "error": {"type": "rate_limit_error", "message": "x"}}`, 429},
		{"anthropic bad request", `{"type":"error","error":{"type":"invalid_request_error","message":"x"}}`, 400},
		{"anthropic unknown type", `{"type":"error","error":{"type":"new_error","message":"x"}}`, 500},
		{"code before type", `{"type":"error","error":{"type":"overloaded_error","code":502}}`, 502},
		{"openai context length", `{"error":{"message":"x","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, 400},
		{"openai word code, server type", `{"error":{"message":"x","type":"server_error","code":"internal"}}`, 500},
		{"openai nested", `{"type":"error","error":{"code":503,"message":"x"},"code":429}`, 503},
		{"not an error's code", `{"type":"response.failed","code":429,"response":{"error":{"code":"server_error"}}}`, 500},
		{"response failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":503,"message":"x"}}}`, 503},
		{"response failed, no error", `{"type":"response.failed","response":"x"}`, 500},
		{"created", `{"type":"response.created","response":{"error":null,"status":"in_progress"},"sequence_number":0}`, 0},
		{"delta with error text", `{"type":"response.output_text.delta","delta":"\"type\":\"error\" \"response.failed\""}`, 0},
		{"nested failed", `{"type":"response.output_item.added","item":{"type":"response.failed","error":{"code":500}}}`, 0},
	}
	for _, c := range cases {
		assert.Equal(t, c.code, errorEventCode([]byte("event: x\n"), false, false, []byte(c.value)), c.name)
	}
}

// A Responses stream that fails after its response.created ends its pick
// and the Reporter with ErrErrorEvent; the client gets the stream as sent
// up to the error event, whose message is generic.
func TestResponsesErrorEventFailsThePick(t *testing.T) {
	for _, end := range []string{
		event("error", `"code":"server_error","message":"The server had an error.","param":null,"sequence_number":6`),
		event("response.failed", `"response":{"status":"failed","error":{"code":"server_error","message":"The server had an error."}},"sequence_number":6`),
	} {
		stream := responsesStream([]string{`"a"`, `"b"`}, end)
		a := newUpstream(t, sendStream(stream))
		rec := &recorder{}
		done := &doneLog{}
		h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a)
		code, body := postProxy(t, h)
		assert.Equal(t, http.StatusOK, code)
		before, _, _ := strings.Cut(end, "\ndata: ")
		head, _, ok := strings.Cut(stream, before)
		require.True(t, ok)
		assert.True(t, strings.HasPrefix(body, head+before+"\ndata: "), body)
		assert.NotContains(t, body, "The server had an error.")
		assert.Contains(t, body, `"message":"The upstream failed to answer. Request ID: req_`)
		assert.True(t, strings.HasSuffix(body, "}\n\n"), body)
		require.Len(t, rec.reported(a.URL), 1)
		assert.ErrorIs(t, rec.reported(a.URL)[0], ErrErrorEvent)
		require.Len(t, done.get(a.URL), 1)
		assert.ErrorIs(t, done.get(a.URL)[0], ErrErrorEvent)
	}
}

// A Responses stream whose first event is an error produced nothing: its
// attempt fails like a 500 answer and is retried on the other replica.
func TestResponsesFirstEventErrorRetried(t *testing.T) {
	a := newUpstream(t, sendStream(event("error", `"code":"server_error","message":"x","param":null,"sequence_number":0`)))
	b := newUpstream(t, streamTokens(2))
	rec := &recorder{}
	done := &doneLog{}
	h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
	code, body := postProxy(t, h)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
	requireStatusFailure(t, rec.reported(a.URL), http.StatusInternalServerError)
	requireStatusFailure(t, done.get(a.URL), http.StatusInternalServerError)
	assert.Equal(t, []error{nil}, done.get(b.URL))
}

// Counting a Responses stream allocates nothing, and holding back its
// preamble and first output no more than holding back as many bytes of a
// chat stream's first event (the buffer grows as it fills).
func TestResponsesAllocs(t *testing.T) {
	stream := responsesStream([]string{`"a"`}, completed(1))
	p := []byte(stream)
	allocs := testing.AllocsPerRun(100, func() {
		c := NewOutputCounter(sseHeader)
		c.Count(p)
		c.End()
	})
	assert.Zero(t, allocs)
	resp := &http.Response{Header: sseHeader}
	peekAllocs := func(stream string) float64 {
		r := strings.NewReader(stream)
		bd := &body{}
		return testing.AllocsPerRun(100, func() {
			r.Reset(stream)
			*bd = body{rc: readCloser{r}}
			if code, err := bd.peek(resp, DefaultMaxPeekBytes); code != 0 || err != nil {
				t.Fatal(code, err)
			}
		})
	}
	held := strings.Index(stream, firstOutput) + len(firstOutput)
	held = strings.Index(stream[held:], "\n") + held + 1 // the first output's data line
	chat := "data: {\"x\":\"" + strings.Repeat("a", held-len("data: {\"x\":\"\"}\n")) + "\"}\n\n"
	require.Len(t, chat, held+1)
	assert.LessOrEqual(t, peekAllocs(stream), peekAllocs(chat))
}

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }
