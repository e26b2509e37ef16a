package httplb

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/sse"
	"github.com/llmlb/llmlb/prefix"
	"github.com/stretchr/testify/require"
)

// FuzzParse checks that Parse never panics, returns counts in range, restores
// the body, and agrees with the encoding/json reference (ref_test.go) on
// every body without repeated or case-variant keys: the body itself, and the
// body embedded as a string in a chat and a completion request.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":16,"stream":true}`,
		`{"prompt":["a","b"]}`,
		`{"prompt":[1,2,3]}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"prompt":[[1,2],null,[3]]}`,
		`{"prompt":[null]}`,
		`{"prompt":[]}`,
		`{"prompt":null}`,
		`{"prompt":[1,-2,4294967296]}`,
		`{"prompt":[1.5]}`,
		`{"prompt":[1e2]}`,
		`{"prompt":[-0]}`,
		`{"prompt":[9223372036854775807,-9223372036854775808]}`,
		`{"prompt":[9223372036854775808]}`,
		`{"messages":[{"role":"user","content":"hi"}],"user":"u"}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":null},null,{"text":null}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":5,"text":"hi"}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`,
		`{"messages":[{"role":"assistant","tool_calls":null},{"role":7,"content":{"a":1}}]}`,
		`{"messages":[1,"x",[],null,{}]}`,
		`{"messages":"x","prompt":"y"}`,
		"{\"messages\" : [ { \"role\" : \"user\" , \"content\" : [ { \"text\" : \"a\" } , { \"image_url\" : { \"u\" : [ 1 , 2 ] } } ] } ] }\n",
		`{"prompt":"\u00e9\ud83d\ude00\ud83d\u0041\ude00\"\\\/\b\f\n\r\t"}`,
		"{\"prompt\":\"\xff\xfe\xed\xa0\x80\xef\xbf\xbd\"}",
		`{"pr\u006fmpt":"x","m\u006fdel":"m\u00e9","\u0075ser":"\ud800"}`,
		`{"max_tokens":"12"}`,
		`{"max_tokens":null,"max_completion_tokens":3}`,
		`{"max_tokens":1e400}`,
		`{"max_tokens":-0.0}`,
		`{"model":["m"],"user":{"u":1},"prompt":"abc"}`,
		`{"model":"o3","reasoning_effort":"high","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-5","reasoning":{"effort":"minimal","summary":"auto"},"input":"hi"}`,
		`{"model":"c","thinking":{"type":"enabled","budget_tokens":3000},"output_config":{"effort":"max"},"messages":[]}`,
		`{"thinking":{"type":"adaptive"},"reasoning_effort":"High","reasoning":{"effort":"low"}}`,
		`{"thinking":{"type":"disabled","budget_tokens":1024}}`,
		`{"thinking":{"budget_tokens":1e3},"reasoning":"high","output_config":{"effort":"\u006cow"}}`,
		`{"thinking":{"budget_tokens":-5,"type":7},"reasoning_effort":null,"output_config":[]}`,
		`{"thinking":{"budget_tokens":2147483647},"reasoning_effort":"xhigh"}`,
		`{"thinking":"on","reasoning_effort":"mediummediummediummediummediummedium"}`,
		`{"system":7,"messages":[{"role":"user","content":"x"}]}`,
		`{"system":[{"text":1}],"messages":[{}]}`,
		`{"input":[],"prompt":"x","instructions":[]}`,
		`{"input":["a",{"role":"user"}],"instructions":"be brief"}`,
		`{"input":"hi","previous_response_id":"resp_1","store":true}`,
		`{"previous_response_id":"resp_\u0031","store":false}`,
		`{"previous_response_id":7,"previous_response_id":"resp_2"}`,
		`{"previous_response_id":"resp_2","previous_response_id":null}`,
		`{"previous_response_id":""}`,
		`{`,
		``,
		`null`,
		`"x"`,
		`[{"prompt":"x"}]`,
		`{"prompt":"x"}{}`,
		`hello \u00e9 \ud83d\ude00 world`,
		`a "quoted" \\ string`,
		"control \x01 char",
		`\`,
	} {
		f.Add([]byte(s))
	}
	p := newParser(f, ParserConfig{MaxBodyBytes: 1 << 16})
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockBytes: 8, BlockTokens: 2, MaxTokens: 4})
	require.NoError(f, err)
	small := newParser(f, ParserConfig{Hasher: h})
	counted := newParser(f, ParserConfig{Hasher: h, CountTokens: func(s string) int { return len(strings.Fields(s)) }})
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
		got, err := p.Parse(r)
		if err != nil {
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if got.PromptTokens < 0 || got.PromptTokens > maxCount || got.MaxTokens < 0 || got.MaxTokens > maxCount ||
			len(got.Prefix) > p.hasher.MaxBlocks() || len(got.Feature) > len(body)+len("|effort=minimal|thinking<=2147483648") {
			t.Fatalf("out of range: %+v", got)
		}
		rest, err := io.ReadAll(r.Body)
		if err != nil || !slices.Equal(rest, body) {
			t.Fatalf("body not restored: %q, %v", rest, err)
		}
		s := string(body)
		for _, b := range []string{
			s,
			`{"model":"` + s + `","user":"` + s + `","messages":[{"role":"user","content":"` + s + `"},` +
				`{"role":"` + s + `","content":[{"type":"text","text":"` + s + `"}]}]}`,
			`{"prompt":["` + s + `","` + s + `"]}`,
			`{"system":"` + s + `","messages":[{"role":"user","content":"` + s + `"}]}`,
			`{"system":[{"type":"text","text":"` + s + `"}],"messages":[{"role":"user","content":"x"}]}`,
			`{"instructions":"` + s + `","input":"` + s + `"}`,
			`{"instructions":"` + s + `","input":[{"role":"user","content":[{"type":"input_text","text":"` + s + `"}]}]}`,
		} {
			for _, p := range []*Parser{p, small, counted} {
				checkReference(t, p, []byte(b))
			}
		}
	})
}

// checkReference fails t if p and the reference parse body differently, for
// a body without repeated or case-variant keys.
func checkReference(t *testing.T, p *Parser, body []byte) {
	t.Helper()
	if !plainJSON(body) {
		return
	}
	var got, want llmlb.Request
	var info bodyInfo
	gotUser := p.parseBody(body, &got, "", &info)
	wantUser := refParseBody(p, body, &want)
	if gotUser != wantUser {
		t.Fatalf("%q: user %q, want %q", body, gotUser, wantUser)
	}
	if wantID := refPrevID(body); string(info.prevID) != wantID || (info.prevID == nil) != (wantID == "") {
		t.Fatalf("%q: previous_response_id %q, want %q", body, info.prevID, wantID)
	}
	if got.PromptTokens != want.PromptTokens || got.MaxTokens != want.MaxTokens ||
		!slices.Equal(got.Prefix, want.Prefix) || (got.Prefix == nil) != (want.Prefix == nil) || got.Feature != want.Feature {
		t.Fatalf("%q:\n got %+v\nwant %+v", body, got, want)
	}
}

// fieldNames are the keys the parser reads.
var fieldNames = []string{
	"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "user",
	"role", "content", "tool_calls", "type", "text", "image_url",
	"reasoning_effort", "reasoning", "effort", "output_config", "thinking", "budget_tokens",
	"system", "instructions", "input",
}

// plainJSON reports whether body, if it is JSON, has no object with a
// repeated key or with a key that equals a field name but for case: the
// bodies on which encoding/json and the in-place parser agree.
func plainJSON(body []byte) bool {
	if !json.Valid(body) {
		return true
	}
	type frame struct {
		keys    map[string]bool // nil in an array
		wantKey bool
	}
	var stack []*frame
	d := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := d.Token()
		if err != nil {
			return true
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.keys != nil && top.wantKey {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return false
				}
				top.keys[k] = true
				for _, name := range fieldNames {
					if k != name && strings.EqualFold(k, name) {
						return false
					}
				}
				top.wantKey = false
				continue
			}
		}
		if top != nil && top.keys != nil {
			top.wantKey = true // the value read now ends the member
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
	}
}

// FuzzOutputCounter checks that an OutputCounter counts the same tokens
// however a body is cut, never a negative number, never more than maxCount,
// and nothing before the end of a body that is not an event stream.
func FuzzOutputCounter(f *testing.F) {
	for _, s := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: x\ndata: {\"usage\":{\"completion_tokens\":12}}\r\n\r\ndata:[DONE]",
		"data: {\"usage\":{\"output_tokens\" :\t99999999999999999999}}\n",
		"data: {\"x\":\"\\\"output_tokens\\\": 5\"}\n",
		`{"usage":{"completion_tokens":7,"completion_tokens_details":{"reasoning_tokens":3}}}`,
		"\"completion_tokens\"\n:\n12",
		`""""completion_tokens""output_tokens":-1`,
		`{"a":[{"usage":{"output_tokens":5}}],"b":{"usage":{"output_tokens":6,"x":{"output_tokens":7}}}}`,
		`[{"usage":{"completion_tokens":12.5e1}},{"c":{"usage":{"output_tokens":1}}}]`,
		"data: {\"error\": {\"code\": 500}}\n\ndata: [DONE]\n\n",
		"data: {\"a\":{\"error\":{}},\"error\":null}\n",
		"event: response.created\ndata: {\"response\":{\"error\":null,\"usage\":null},\"type\":\"response.created\"}\n\n" +
			"data: {\"delta\":\"error\",\"type\":\"response.output_text.delta\"}\n\n" +
			"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"output_tokens\":3}}}\n\n",
		"data: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\"}\n",
		"data: {\"type\" : \"response.failed\",\"response\":{\"error\":{\"code\":\"x\"}}}",
		"data: {\"x\":{\"type\":\"error\"},\"type\":\"response.function_call_arguments.delta\"}\n",
		"data: {\"type\":\"response.in_progress\",\"response\":{\"type\":\"response.created\"}}",
		"data: {\"type\":\"response.queued\",\"type\":\"response.in_progresz\"}",
		"data: {\"type\":\"response.created\",\"error\":{}}",
		"data",
		"data: {\"a\":1}\n\nerror: {\"code\": 500, \"message\": \"x\", \"type\": \"server_error\"}\n\ndata: [DONE]\n\n",
		"data:{\"error\":\"Model is overloaded\",\"error_type\":\"overloaded\"}",
		"data: {\"error\":\"\",\"x\":{\"error\":\"y\"}}",
		`data: {"\u0065rror": {"code": 500}}`,
		`data: {"t\u0079pe":"response.f\u0061iled"}`,
		`data: {"text":"\"error\":{}","x":"\u0065rror","\u0065rro":{}}`,
		`data: {"\u0065rror\u0000":{},"\u0065rro\u0072":""}`,
		`{"usage":{"output\u005Ftokens":3,"\u006futput_tokens":4}}`,
		"data: {\"error\":\ndata: {\"code\":500}}\n\n",
		"data: {\r\n: c\r\nevent: error\r\ndata: \"error\"\r\ndata: :\"x\"}\r\n\r\ndata: [DONE]\r\n",
		"data\ndata:\rdata: {\"type\":\r\ndata: \"response.failed\"}\r\rdata: {\"a\":\"\ndata: \\\"error\\\":{}\"}\n\n",
		"data: {\"a\":{\n\ndata: {\"b\":\"error\"}\n\ndata: {\"a\":1}\ndata: \"error\":{}}\n",
		"event: error\ndata: {\"message\":\"x\"}\n\ndata: {\"a\":1}\n\n",
		": c\r\nevent:error\r\ndata: Internal\r\ndata: error\r\n\r\ndata: [DONE]\r\n\r\n",
		"event: errors\nevent:  error\nevent: error \nEvent: error\ndata: x\n\nevent: erro",
		"data: {\"a\":\nevent: error\rdata: 1}\r\revent: error",
		// The last "event:" line of an event names it.
		"event: error\nevent: message\ndata: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: message\nevent: error\ndata: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: error\r\ndata: {\"a\":1}\r\nevent\r\n\r\nevent:error\r\nevent:\r\n\r\n",
		"data: {\"a\":1}\nevent: error\n\ndata: {\"b\":2}\nevent: error\nevent: errors\n\n",
		"event: error\nevent: error2\nevent:  error\ndata: x\n\nevent: error\nevent: e",
		"",
	} {
		f.Add([]byte(s), uint16(len(s)/2), true)
		f.Add([]byte(s), uint16(len(s)/3), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, split uint16, sse bool) {
		h := jsonHeader
		if sse {
			h = sseHeader
		}
		count := func(pieces ...[]byte) (int, bool) {
			c := NewOutputCounter(h)
			total := 0
			for _, p := range pieces {
				n := c.Count(p)
				if n < 0 || (!sse && n != 0) {
					t.Fatalf("Count returned %d", n)
				}
				total += n
			}
			n := c.End()
			if n < 0 || c.End() != 0 {
				t.Fatalf("End returned %d", n)
			}
			if total += n; total > maxCount {
				t.Fatalf("%d tokens", total)
			}
			if !sse && c.Failed() {
				t.Fatal("a body that is not an event stream read as failed")
			}
			return total, c.Failed()
		}
		cut := int(split) % (len(body) + 1)
		whole, failed := count(body)
		if got, gotFailed := count(body[:cut], body[cut:]); got != whole || gotFailed != failed {
			t.Fatalf("cut at %d: %d tokens, failed %v; whole: %d, %v", cut, got, gotFailed, whole, failed)
		}
		// An event whose data is one line of JSON against a decoder's
		// reading of what an error event is.
		if sse && bytes.HasPrefix(body, []byte("data:")) && !bytes.ContainsAny(body, "\r\n") {
			if doc := body[len("data:"):]; json.Valid(doc) && failed != errorEventReference(doc) {
				t.Fatalf("%q: failed %v, want %v", body, failed, !failed)
			}
			if doc := body[len("data:"):]; json.Valid(doc) && preambleEvent(doc) != preambleReference(doc) {
				t.Fatalf("%q: preamble %v, want %v", body, !preambleReference(doc), preambleReference(doc))
			}
		}
		// Each event whose data (its data lines joined, as the
		// event-stream format joins them) is JSON against a decoder's
		// reading of what an error event is.
		if want, ok := eventsErrorReference(body, true); sse && ok && failed != want {
			t.Fatalf("%q: failed %v, want %v", body, failed, want)
		}
		// An event named "error" fails the stream, whatever its data;
		// one named so and then otherwise does not, unless its data does.
		if named := namedErrorReference(body, true); sse && named && !failed {
			t.Fatalf("%q: an event named \"error\" did not fail the stream", body)
		} else if dataFailed, ok := dataErrorReference(body, true); sse && ok && !named && !dataFailed && failed {
			t.Fatalf("%q: failed, but no event is named \"error\" nor is an error by its data", body)
		}
		// A JSON body against a decoder's reading of the same rule.
		if !sse && json.Valid(body) {
			want := len(body) / BytesPerToken
			if n, ok := usageReference(body); ok {
				want = n
			}
			if whole != want {
				t.Fatalf("%q: %d tokens, want %d", body, whole, want)
			}
		}
	})
}

// namedErrorReference reports whether an event of the event stream body
// (after a byte-order mark at its start, if mark is set), its lines up to
// a blank line or to the body's end, is named "error", as the event-stream
// format's interpretation names it: by its last line whose field, split at
// its first colon (or the whole line, without one), is "event", and whose
// value, less one leading space, is then "error".
func namedErrorReference(body []byte, mark bool) bool {
	if mark {
		body = bytes.TrimPrefix(body, []byte(sse.ByteOrderMark))
	}
	norm := strings.ReplaceAll(strings.ReplaceAll(string(body), "\r\n", "\n"), "\r", "\n")
	named := false // the current event is
	for line := range strings.SplitSeq(norm, "\n") {
		if line == "" {
			if named {
				return true
			}
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		if name == "event" {
			named = strings.TrimPrefix(value, " ") == "error"
		}
	}
	return named
}

// eventsErrorReference reports whether an event of the event stream body
// (after a byte-order mark at its start, if mark is set) is an error event,
// its data read with encoding/json (see errorEventReference) or its name
// "error" (see namedErrorReference), and ok if the data of each of its
// events is a JSON document, or whitespace, and no line is llama.cpp's
// error line.
func eventsErrorReference(body []byte, mark bool) (failed, ok bool) {
	failed, ok = dataErrorReference(body, mark)
	return failed || namedErrorReference(body, mark), ok
}

// dataErrorReference is eventsErrorReference by the events' data alone.
func dataErrorReference(body []byte, mark bool) (failed, ok bool) {
	if mark {
		body = bytes.TrimPrefix(body, []byte(sse.ByteOrderMark))
	}
	var event []byte // the current event's lines
	for rest := body; ; {
		line, after, ended := sse.Line(rest)
		if bytes.HasPrefix(line, []byte(errorField)) {
			return false, false
		}
		if len(line) > 0 {
			event = append(append(event, line...), '\n')
		}
		if len(line) == 0 || !ended || len(after) == 0 {
			// The event's end.
			if data := sse.AppendData(nil, event); len(bytes.TrimSpace(data)) > 0 {
				if !json.Valid(data) {
					return false, false
				}
				failed = failed || errorEventReference(data)
			}
			event = event[:0]
		}
		if !ended || len(after) == 0 {
			return failed, true
		}
		rest = after
	}
}

// errorEventReference reports whether the valid JSON document doc is the
// data of an error event, as OutputCounter reads it, with encoding/json: an
// object with, at its top level, an "error" key whose value is an object
// or a string other than "", or a "type" key whose value is "error" or
// "response.failed".
func errorEventReference(doc []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	failed := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return failed
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return failed
		}
		switch tok {
		case errorKey:
			failed = failed || v[0] == '{' || v[0] == '"' && string(v) != `""`
		case typeKey:
			var typ string
			failed = failed || json.Unmarshal(v, &typ) == nil && (typ == errorType || typ == failedType)
		}
	}
	return failed
}

// preambleReference reports whether the valid JSON document doc is the
// data of a preamble event, as preambleEvent reads it, with encoding/json:
// an object that is no error event (see errorEventReference) and whose last
// top-level "type" with a string value is response.created,
// response.in_progress or response.queued.
func preambleReference(doc []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	preamble := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return false
		}
		var typ string
		if tok == typeKey && json.Unmarshal(v, &typ) == nil {
			preamble = typ == createdType || typ == inProgressType || typ == queuedType
		}
	}
	return preamble && !errorEventReference(doc)
}

// usageReference returns the last usage count of a valid JSON document as
// OutputCounter reads it, with encoding/json: the leading digits of a
// completion_tokens or output_tokens number directly inside the object of a
// "usage" key at depth 1 or 2.
func usageReference(doc []byte) (count int, found bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	type level struct {
		object bool
		key    bool   // the next token of the object is a key
		name   string // the key of the value being read
		usage  bool   // the object is a usage object
	}
	var stack []level
	for {
		tok, err := dec.Token()
		if err != nil {
			return count, found
		}
		var top *level
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		if top != nil && top.object && top.key {
			if d, ok := tok.(json.Delim); !ok || d != '}' {
				top.name, _ = tok.(string)
				top.key = false
				continue
			}
		}
		name := ""
		if top != nil && top.object {
			name = top.name
			top.key = true
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				usage := v == '{' && name == usageKey && len(stack) <= maxUsageDepth && !top.usage
				stack = append(stack, level{object: v == '{', key: true, usage: usage})
			default:
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if top == nil || !top.usage || name != completionKey && name != outputKey {
				continue
			}
			digits := v.String()
			if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
				digits = digits[:i]
			}
			if digits == "" {
				continue
			}
			n := 0
			for _, d := range digits {
				n = min(n*10+int(d-'0'), maxCount)
			}
			count, found = n, true
		}
	}
}

// FuzzGenericErrorEvent checks that the generic form of any error event's
// value is one JSON value, without the message it was given in place of
// the upstream's, whatever the upstream sent.
func FuzzGenericErrorEvent(f *testing.F) {
	f.Add([]byte(`{"error": {"message": "boom", "type": "InternalServerError", "param": null, "code": 500}}`), 500)
	f.Add([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"boom"}}`), 503)
	f.Add([]byte(`{"error":"Incomplete generation","error_type":"incomplete_generation"}`), 500)
	f.Add([]byte(`{"type":"error","code":"server_error","message":"boom","param":null,"sequence_number":0}`), 500)
	f.Add([]byte(`{"type":"response.failed","response":{"error":{"code":"server_error","message":"boom"}}}`), 500)
	f.Add([]byte(`{"code":500,"message":"boom","type":"server_error"}`), 500)
	f.Add([]byte(`{"type":"response.failed","response":7}`), 500)
	f.Add([]byte(`not json`), 502)
	f.Fuzz(func(t *testing.T, value []byte, status int) {
		const message = "The upstream failed to answer. Request ID: req_1"
		out := genericErrorEvent(value, status, "upstream_error", message)
		if !json.Valid(out) {
			t.Fatalf("%q: not JSON: %q", value, out)
		}
		if !bytes.Contains(out, []byte(message)) {
			t.Fatalf("%q: the generic message is missing: %q", value, out)
		}
	})
}
