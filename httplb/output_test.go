package httplb

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	sseHeader  = http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}}
	jsonHeader = http.Header{"Content-Type": {"application/json"}}
)

// countPieces counts body with a counter for header h, fed in pieces cut at
// cuts, and returns the total and what End returned.
func countPieces(t *testing.T, h http.Header, body string, cuts ...int) (total, end int) {
	t.Helper()
	c := NewOutputCounter(h)
	prev := 0
	for _, cut := range append(cuts, len(body)) {
		n := c.Count([]byte(body[prev:cut]))
		if n < 0 {
			t.Fatalf("Count returned %d", n)
		}
		total += n
		prev = cut
	}
	end = c.End()
	if again := c.End(); again != 0 {
		t.Fatalf("second End returned %d", again)
	}
	return total + end, end
}

func TestOutputCounter(t *testing.T) {
	openAI := func(events int, usage string) string {
		var b strings.Builder
		for i := range events {
			b.WriteString(`data: {"choices":[{"delta":{"content":"w` + string(rune('a'+i%26)) + `"}}],"usage":null}` + "\n\n")
		}
		if usage != "" {
			b.WriteString(`data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":` + usage +
				`,"total_tokens":99,"completion_tokens_details":{"reasoning_tokens":3}}}` + "\n\n")
		}
		b.WriteString("data: [DONE]\n\n")
		return b.String()
	}
	cases := []struct {
		name   string
		header http.Header
		body   string
		want   int
		end    int // of want, what End counts
	}{
		{name: "events", header: sseHeader, want: 3,
			body: "data: a\n\n: comment\n\ndata: b\r\n\r\nevent: x\ndata: c\n\ndata: [DONE]\n\n  data: not at line start\nid: data:\n"},
		{name: "byte-order mark", header: sseHeader, body: "\xef\xbb\xbfdata: a\n\ndata: b\n\n", want: 2},
		{name: "part of a mark", header: sseHeader, body: "\xef\xbbdata: a\n\ndata: b\n\n", want: 1},
		{name: "mark after the start", header: sseHeader, body: "data: a\n\xef\xbb\xbfdata: b\n\n", want: 1},
		// "[DON" is an array open at its line's end: it goes on to the
		// event's end, here the body's.
		{name: "done without space", header: sseHeader, body: "data:[DONE]\ndata: [DONE]x\ndata: [DON\n", want: 2, end: 1},
		{name: "usage equals events", header: sseHeader, body: openAI(5, "5"), want: 5},
		{name: "usage above events", header: sseHeader, body: openAI(5, "12"), want: 12},
		{name: "usage below events", header: sseHeader, body: openAI(5, "2"), want: 5},
		{name: "usage null", header: sseHeader, body: openAI(4, "null"), want: 5},
		{name: "running usage", header: sseHeader, want: 9,
			body: "data: {\"usage\":{\"completion_tokens\":0}}\n\ndata: {\"usage\":{\"completion_tokens\":4}}\n\ndata: {\"usage\":{\"completion_tokens\" : 9}}\n\ndata: [DONE]\n\n"},
		// The message_stop after the usage counts one more.
		{name: "anthropic", header: sseHeader, want: 16,
			body: "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
				"event: content_block_start\ndata: {\"type\":\"content_block_start\"}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hello, \\\"output_tokens\\\": 99\"}}\n\n" +
				"event: content_block_stop\ndata: {\"type\":\"content_block_stop\"}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		{name: "responses", header: sseHeader, want: 40,
			body: "event: response.created\ndata: {\"response\":{\"max_output_tokens\":null,\"usage\":null}}\n\n" +
				"event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n" +
				"event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":40,\"output_tokens_details\":{\"reasoning_tokens\":30}}}}\n\n"},
		{name: "last line unterminated", header: sseHeader, body: "data: a\n\ndata: {\"usage\":{\"completion_tokens\":7}}", want: 7, end: 6},
		{name: "huge usage", header: sseHeader, body: "data: {\"usage\":{\"completion_tokens\":99999999999999999999}}\n", want: maxCount},
		{name: "json usage", header: jsonHeader, want: 12, end: 12,
			body: `{"choices":[{"message":{"content":"\"completion_tokens\": 50"}}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`},
		{name: "pretty json usage", header: jsonHeader, want: 503, end: 503,
			body: "{\n  \"content\": [],\n  \"usage\": {\n    \"input_tokens\": 2095,\n    \"output_tokens\"\n    :\n    503\n  }\n}\n"},
		// A client's JSON echoed deep in a response (a tool's schema, a
		// connector's parameters) is not a usage count.
		{name: "echoed usage in a stream", header: sseHeader, want: 2,
			body: "event: response.created\ndata: {\"response\":{\"tools\":[{\"parameters\":{\"usage\":{\"output_tokens\":999}}}],\"usage\":null}}\n\n" +
				"event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n"},
		{name: "echoed usage in json", header: jsonHeader, want: 12, end: 12,
			body: `{"choices":[],"usage":{"completion_tokens":12},"kv_transfer_params":{"x":{"usage":{"completion_tokens":999}}}}`},
		{name: "count outside usage", header: jsonHeader, want: 48 / BytesPerToken, end: 48 / BytesPerToken,
			body: `{"completion_tokens":50,"x":{"output_tokens":60}`},
		{name: "count nested in usage", header: jsonHeader, want: 7, end: 7,
			body: `{"usage":{"completion_tokens_details":{"completion_tokens":99},"details":[{"output_tokens":98}],"completion_tokens":7}}`},
		{name: "escapes", header: jsonHeader, want: 7, end: 7,
			body: `{"choices":[{"message":{"content":"a\\\"b\\","usage":{"completion_tokens":5}}}],"x":"\\","usage":{"completion_tokens":7}}`},
		// A key is read as JSON decodes it: the last count is 900.
		{name: "escaped key", header: jsonHeader, want: 900, end: 900,
			body: `{"usage":{"completion_tokens":7,"completion\u005ftokens":900}}`},
		{name: "escaped key, not a count key", header: jsonHeader, want: 7, end: 7,
			body: `{"usage":{"completion_tokens":7,"completion\u005Ftoken\"":900,"completion\u00":9,"completion\x":8}}`},
		{name: "json without usage", header: jsonHeader, body: strings.Repeat("x", 4*25+3), want: 25, end: 25},
		{name: "json usage not a count", header: jsonHeader, body: `{"usage":{"completion_tokens":"12"},"x":"` + strings.Repeat("y", 21) + `"}`, want: 16, end: 16},
		{name: "compressed stream", header: http.Header{"Content-Type": {"text/event-stream"}, "Content-Encoding": {"gzip"}},
			body: strings.Repeat("data: x\n", 10), want: 20, end: 20},
		{name: "no header", header: http.Header{}, body: "data: 12345678\n", want: 3, end: 3},
		// A value open at the end of its data line goes on in the event's
		// next: one token, one value.
		{name: "data over lines", header: sseHeader, want: 9,
			body: "data: {\"choices\":\ndata: [{\"delta\":{}}]}\n\n" +
				"data: {\"usage\":\r\ndata: {\"completion_tokens\":\r\n: c\r\nid: 1\r\ndata: 9}}\r\n\r\n"},
		{name: "data over lines, ended by the event", header: sseHeader, body: "data: {\"a\":\n\ndata: b\n\n", want: 2},
		{name: "data lines after a value", header: sseHeader, body: "data: {\"a\":1}\ndata: {\"b\":2}\n\n", want: 2},
		{name: "blank data lines", header: sseHeader, body: "data:\ndata:  \ndata\ndata: x\n\ndata:\n\n", want: 2},
		{name: "data over lines, unterminated", header: sseHeader, body: "data: a\n\ndata: {\"usage\":\ndata: {\"completion_tokens\":7}", want: 7, end: 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			whole, end := countPieces(t, tc.header, tc.body)
			assert.Equal(t, tc.want, whole, "whole body")
			assert.Equal(t, tc.end, end, "End")
			for cut := 1; cut < len(tc.body); cut++ {
				if got, _ := countPieces(t, tc.header, tc.body, cut); got != tc.want {
					t.Fatalf("cut at %d: %d tokens, want %d", cut, got, tc.want)
				}
			}
			cuts := make([]int, 0, len(tc.body))
			for i := 1; i < len(tc.body); i++ {
				cuts = append(cuts, i)
			}
			got, _ := countPieces(t, tc.header, tc.body, cuts...)
			assert.Equal(t, tc.want, got, "byte by byte")
		})
	}
}

// An event stream fails with its first error event, whatever its keys'
// escapes and however its data spreads over lines, and with no event that
// has "error" deeper, in a string, or in another value than the event's;
// and with any event named "error", and no other name.
func TestOutputCounterFailed(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		failed bool
	}{
		{"escaped key", `data: {"\u0065rror":{}}`, true},
		{"escaped key, upper-case hex", `data: {"\u0045rror":{},"err\u006Fr":"x"}`, true},
		{"escaped type", `data: {"\u0074ype":"\u0072esponse.failed"}`, true},
		{"escaped error type", `data: {"type":"err\u006fr"}`, true},
		{"escaped quote", `data: {"text":"\"error\":{}","x":{"\"error":{}}}`, false},
		{"escaped value", `data: {"text":"\u0065rror","n":{}}`, false},
		{"escape cut short", `data: {"\u006":{},"\u00zzerror":{},"\x65rror":{}}`, false},
		{"escape of another letter", `data: {"\u0066rror":{},"e\u00e9ror":{}}`, false},
		{"data over lines", "data: {\"error\":\ndata: {\"code\":500}}\n\n", true},
		{"data over CR LF lines", "data: {\r\ndata: \"error\"\r\ndata: : \"x\"}\r\n\r\n", true},
		{"data over CR lines", "data: {\rdata: \"error\"\rdata: :{}}\r\r", true},
		{"others between", "data: {\"a\":1,\n: ping\nevent: error\nid: 1\nretry: 1\ndata: \"error\":{}}\n\n", true},
		{"data without a colon", "data\ndata: {\"error\":{}}\n\n", true},
		{"blank first line", "data:\ndata:   \ndata: {\"error\":\"x\"}\n\n", true},
		{"error deeper over lines", "data: {\"a\":{\ndata: \"error\":{}}}\n\n", false},
		{"error in a string over lines", "data: {\"a\":\"\ndata: \\\"error\\\":{}\"}\n\n", false},
		{"a value ended by its event", "data: {\"a\":{\n\ndata: {\"b\":\"error\"}\n\n", false},
		{"a value ended by its line", "data: {\"a\":1}\ndata: \"error\":{}}\n\n", false},
		// An event named "error" is an error event whatever its data,
		// or without any, as Anthropic's SDKs read it.
		{"event named error", "event: error\ndata: {\"message\":\"x\"}\n\n", true},
		{"event named error, no space", "event:error\ndata: x\n\n", true},
		{"event named error, CR LF, after a comment", ": ping\r\n\r\n: x\r\nevent: error\r\ndata: x\r\n\r\n", true},
		{"event named error, CR", "event: error\rdata: x\r\r", true},
		{"event named error without data", "data: {\"a\":1}\n\nevent: error\n\n", true},
		{"event named error at the end", "data: {\"a\":1}\n\nevent: error", true},
		{"event named error after its data", "data: {\"a\":1}\nevent: error\n\n", true},
		{"event named error with a mark", "\xef\xbb\xbfevent: error\n", true},
		{"event named errors", "event: errors\ndata: x\n\n", false},
		{"event named error cut short", "event: erro\ndata: x\n\n", false},
		{"event named with two spaces", "event:  error\ndata: x\n\n", false},
		{"event named with a trailing space", "event: error \ndata: x\n\n", false},
		{"event field in capitals", "Event: error\ndata: x\n\n", false},
		{"event name in a comment", ": event: error\ndata: x\n\n", false},
		{"event name in data", "data: event: error\n\n", false},
		{"event name after a broken mark", "\xef\xbbevent: error\ndata: x\n\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for cut := range len(tc.body) + 1 {
				for _, step := range []int{len(tc.body) + 1, 1} {
					c := NewOutputCounter(sseHeader)
					for _, p := range []string{tc.body[:cut], tc.body[cut:]} {
						for i := 0; i < len(p); i += step {
							c.Count([]byte(p[i:min(i+step, len(p))]))
						}
					}
					c.End()
					if c.Failed() != tc.failed {
						t.Fatalf("cut at %d, reads of %d: failed %v", cut, step, c.Failed())
					}
				}
			}
		})
	}
}

// Each event is counted when its line ends, as the body is read.
func TestOutputCounterCountsAsItReads(t *testing.T) {
	c := NewOutputCounter(sseHeader)
	assert.Equal(t, 0, c.Count([]byte("data: {\"a\":1}")))
	assert.Equal(t, 3, c.Count([]byte("\n\ndata: {\"a\":2}\n\ndata: {\"a\":3}\n")))
	assert.Equal(t, 0, c.Count([]byte("\ndata: {\"a\":4}")))
	assert.Equal(t, 1, c.Count([]byte("\r")))
}

func TestOutputCounterDoesNotAllocate(t *testing.T) {
	chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":{\"completion_tokens\":3}}\n\n")
	for _, h := range []http.Header{sseHeader, jsonHeader} {
		allocs := testing.AllocsPerRun(100, func() {
			c := NewOutputCounter(h)
			c.Count(chunk)
			c.End()
		})
		assert.Zero(t, allocs)
	}
}

func BenchmarkOutputCounter(b *testing.B) {
	chunk := []byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\"," +
		"\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"finish_reason\":null}],\"usage\":null}\n\n")
	c := NewOutputCounter(sseHeader)
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		c.Count(chunk)
	}
}

// reasoningUpstream streams, for a request with reasoning_effort "high", 20
// chunks of two tokens each and a usage event with the 40 tokens, and for
// any other, 5 chunks of a token and no usage.
func reasoningUpstream(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ReasoningEffort string `json:"reasoning_effort"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	chunks, usage := 5, 0
	if req.ReasoningEffort == "high" {
		chunks, usage = 20, 40
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range chunks {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}],\"usage\":null}\n\n", i)
		w.(http.Flusher).Flush()
	}
	if usage > 0 {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%d}}\n\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// A balancer that predicts output lengths learns them from what the
// Transport reports, per Feature: a request's charged decode work is what
// requests of its kind streamed, the usage count where there is one, else
// the events.
func TestTransportTeachesOutputLengths(t *testing.T) {
	up := newUpstream(t, reasoningUpstream)
	b, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithOutputPrediction(llmlb.OutputConfig{MinObservations: 3}))
	require.NoError(t, err)
	eps, err := NewEndpoints(up.URL)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := NewTransport(Config{Balancer: b, Base: base})
	require.NoError(t, err)
	body := func(effort string) string {
		return `{"model":"m","stream":true,"reasoning_effort":"` + effort + `","messages":[{"role":"user","content":"hi"}]}`
	}
	send := func(effort string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, up.URL+"/v1/chat/completions", strings.NewReader(body(effort)))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return resp
	}
	// charged returns the decode work charged to a request of effort while
	// it is in flight; it is then cancelled, which teaches nothing.
	charged := func(effort string) int64 {
		t.Helper()
		resp := send(effort)
		defer resp.Body.Close()
		return b.Stats()[0].DecodeTokens
	}
	require.Equal(t, int64(llmlb.DefaultDecodeAllowance), charged("high"), "before any completion")
	for range 3 {
		for _, effort := range []string{"high", "low"} {
			resp := send(effort)
			_, err := io.Copy(io.Discard, resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
		}
	}
	assert.Equal(t, int64(40), charged("high"))
	assert.Equal(t, int64(5), charged("low"))
	assert.Equal(t, int64(40), charged("high"), "a cancelled request taught")
	require.Eventually(t, func() bool { return b.Stats()[0].Outstanding == 0 }, 5*time.Second, time.Millisecond)
}

// An event whose data has an "error" object at its top level marks the
// stream failed and counts no token, whatever pieces it comes in; an
// "error" key elsewhere (deeper, null, or in a text) does not.
func TestOutputCounterErrorEvent(t *testing.T) {
	token := `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"
	cases := []struct {
		name   string
		body   string
		tokens int
		failed bool
	}{
		{"vllm", token + `data: {"error": {"message": "engine dead", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\ndata: [DONE]\n\n", 1, true},
		{"first event", `data: {"error":{"message":"x","code":500}}` + "\n\ndata: [DONE]\n\n", 0, true},
		{"anthropic", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n", 1, true},
		{"null", token + `data: {"choices":[],"error":null}` + "\n\n", 2, false},
		{"deeper", token + `data: {"response":{"error":{"code":"x"}}}` + "\n\n", 2, false},
		{"in text", token + `data: {"choices":[{"delta":{"content":"{\"error\": {}}"}}]}` + "\n\n", 2, false},
		{"a value", token + `data: {"choices":[{"delta":{"content":"error"}}],"x":"error"}` + "\n\n", 2, false},
		// The data of an event named "error" counts no token, whatever
		// it is, up to the event's end.
		{"named", token + "event: error\ndata: {\"message\":\"boom\"}\n\n" + token, 2, true},
		{"named, plain text over lines", token + "event:error\r\ndata: Internal\r\ndata: error\r\n\r\n" + token, 2, true},
		{"named, a value over lines", token + "event: error\ndata: {\"a\":\n: x\ndata: 1}\ndata: {\"b\":2}\n\n" + token, 2, true},
		{"named after its data", token + "data: {\"a\":1}\nevent: error\ndata: {\"b\":2}\n\n" + token, 3, true},
		{"named otherwise", token + "event: message\ndata: {\"a\":1}\n\n", 2, false},
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
	// A body that is not an event stream is judged by its status, not read
	// for errors.
	c := NewOutputCounter(jsonHeader)
	c.Count([]byte(`{"error":{"message":"x"}}`))
	c.End()
	assert.False(t, c.Failed())
}

// A stream that ends after an error event (an engine failing a request
// after its 200, as vLLM and SGLang do) finishes its pick and the Reporter
// with an error, not as a success: the replica's failures count toward its
// ejection, and what it streamed teaches no speed.
func TestErrorEventFailsTheAttempt(t *testing.T) {
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"choices":[{"text":"a"}]}`+"\n\n"+`data: {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": null, "code": 500}}`+"\n\ndata: [DONE]\n\n")
	})
	rec := &recorder{}
	var done []error
	var mu sync.Mutex
	obs := &llmlb.Observer{Done: func(d llmlb.DoneInfo) { mu.Lock(); done = append(done, d.Err); mu.Unlock() }}
	b, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithObserver(obs))
	require.NoError(t, err)
	eps, err := NewEndpoints(a.URL)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := NewTransport(Config{Balancer: b, Base: base, Retry: retry.LoopConfig{Reporter: rec}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, a.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Contains(t, string(got), "EngineCore encountered an issue.", "the client gets the stream as sent")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.errs, 1)
	assert.ErrorIs(t, rec.errs[0], ErrErrorEvent)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, done, 1)
	assert.ErrorIs(t, done[0], ErrErrorEvent)
}
