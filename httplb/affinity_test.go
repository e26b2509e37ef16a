package httplb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// prefer picks the member at position want when it is a candidate, else
// the first candidate, so that a test says where a request routed normally
// goes.
type prefer struct{ want *atomic.Int32 }

func (p prefer) Choose(c *llmlb.Candidates) int {
	for i := range c.Len() {
		if c.Member(i) == int(p.want.Load()) {
			return i
		}
	}
	return 0
}

// responsesServer answers Responses requests as vLLM does, with an id of
// its own (name and a count) for each response: a stream when the request
// asks for one, a JSON body otherwise. It answers fail, if not 0, to
// requests that continue a response.
func responsesServer(name string, fail int) http.HandlerFunc {
	var n atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if fail != 0 && bytes.Contains(body, []byte("previous_response_id")) {
			status(fail)(w, r)
			return
		}
		id := fmt.Sprintf("resp_%s_%d", name, n.Add(1))
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"created_at":1,"instructions":null,"model":"m","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"status":"completed","usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`, id)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		resp := `"response":{"id":"` + id + `","model":"m","object":"response","output":[],"status":"in_progress","usage":null}`
		fmt.Fprint(w, event("response.created", resp+`,"sequence_number":0`))
		fmt.Fprint(w, event("response.in_progress", resp+`,"sequence_number":1`))
		w.(http.Flusher).Flush()
		fmt.Fprint(w, event("response.output_text.delta", `"content_index":0,"delta":"hi","item_id":"msg_1","output_index":0`))
		fmt.Fprint(w, event("response.completed", `"response":{"id":"`+id+`","status":"completed","usage":{"output_tokens":1}}`))
	}
}

// respond sends a Responses request with body through h's Transport, or
// through a proxy over it if proxy is set, and returns the response's
// status and id (the top-level "id" of a JSON body, or the one of a
// stream's response.created event).
func respond(t *testing.T, h *harness, proxy *httptest.Server, body string) (int, string) {
	t.Helper()
	url := "http://gateway.invalid/v1/responses"
	if proxy != nil {
		url = proxy.URL + "/v1/responses"
	}
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	var resp *http.Response
	if proxy != nil {
		resp, err = proxy.Client().Do(req)
	} else {
		resp, err = h.tr.RoundTrip(req)
	}
	require.NoError(t, err)
	got, err := readAll(t, resp)
	require.NoError(t, err)
	id := heldResponseID([]byte(got), strings.HasPrefix(got, "event:"))
	return resp.StatusCode, string(id)
}

func responsesBody(stream bool, prev string) string {
	b := `{"model":"m","input":"hello","stream":` + fmt.Sprint(stream)
	if prev != "" {
		b += `,"previous_response_id":` + prev
	}
	return b + "}"
}

// A request continuing a response goes to the endpoint that produced it,
// every time, though the policy prefers the other, whether the response
// was streamed or not and whether it passes through a proxy.
func TestResponseAffinity(t *testing.T) {
	for _, stream := range []bool{false, true} {
		for _, proxied := range []bool{false, true} {
			t.Run(fmt.Sprintf("stream=%t/proxy=%t", stream, proxied), func(t *testing.T) {
				a, b := newUpstream(t, responsesServer("a", 0)), newUpstream(t, responsesServer("b", 0))
				var want atomic.Int32
				want.Store(1)
				h := newHarness(t, prefer{&want}, Config{}, a, b)
				var proxy *httptest.Server
				if proxied {
					proxy = h.proxy(t)
				}
				code, id := respond(t, h, proxy, responsesBody(stream, ""))
				require.Equal(t, http.StatusOK, code)
				require.Equal(t, "resp_b_1", id)
				want.Store(0) // the policy now sends everything to a
				prev := id
				for i := range 50 {
					code, id := respond(t, h, proxy, responsesBody(stream, `"`+prev+`"`))
					require.Equal(t, http.StatusOK, code)
					require.Equal(t, fmt.Sprintf("resp_b_%d", i+2), id, "request %d", i)
					prev = id // each turn continues the last
				}
				assert.Zero(t, a.hits.Load())
				assert.EqualValues(t, 51, b.hits.Load())
				// A request that continues no response follows the policy.
				code, id = respond(t, h, proxy, responsesBody(stream, ""))
				require.Equal(t, http.StatusOK, code)
				assert.Equal(t, "resp_a_1", id)
			})
		}
	}
}

// A request continuing a response the Transport does not know (produced
// through another router, or forgotten), one whose id is not a string or
// too long, and one whose endpoint has left, are routed as any other.
func TestResponseAffinityRoutesNormally(t *testing.T) {
	a, b := newUpstream(t, responsesServer("a", 0)), newUpstream(t, responsesServer("b", 0))
	var want atomic.Int32
	want.Store(1)
	h := newHarness(t, prefer{&want}, Config{}, a, b)
	_, id := respond(t, h, nil, responsesBody(false, ""))
	require.Equal(t, "resp_b_1", id)
	want.Store(0)
	for _, prev := range []string{`"resp_unknown"`, `7`, `null`, `{"id":"` + id + `"}`, `["` + id + `"]`, `"resp_b\u005f1"`} {
		code, got := respond(t, h, nil, responsesBody(false, prev))
		require.Equal(t, http.StatusOK, code)
		assert.True(t, strings.HasPrefix(got, "resp_a_"), "previous_response_id %s went to %s", prev, got)
	}
	code, got := respond(t, h, nil, responsesBody(false, `"`+id+`"`))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "resp_b_2", got)

	// b leaves: its responses are gone with it.
	eps, err := NewEndpoints(a.URL)
	require.NoError(t, err)
	require.NoError(t, h.b.Update(eps))
	code, got = respond(t, h, nil, responsesBody(false, `"`+id+`"`))
	require.Equal(t, http.StatusOK, code)
	assert.True(t, strings.HasPrefix(got, "resp_a_"), got)
}

// A request pinned to an endpoint that leaves between the pin and the
// pick is routed as any other.
func TestResponseAffinityEndpointLeavesBeforePick(t *testing.T) {
	a, b := newUpstream(t, responsesServer("a", 0)), newUpstream(t, responsesServer("b", 0))
	h := newHarness(t, fixed{}, Config{}, a, b)
	h.tr.ids.learn([]byte("resp_b_0"), h.b.Stats()[1].Key)
	var lr llmlb.Request
	require.True(t, h.tr.pin(&lr, []byte("resp_b_0")))
	require.Equal(t, []string{h.b.Stats()[0].Key}, lr.Exclude)
	eps, err := NewEndpoints(a.URL)
	require.NoError(t, err)
	require.NoError(t, h.b.Update(eps))
	at := &attempt{t: h.tr, lreq: lr, attempts: 1, pinned: true}
	p, err := at.pick(t.Context(), true)
	require.NoError(t, err)
	assert.Equal(t, h.b.Stats()[0].Key, p.Endpoint().Key())
	assert.False(t, at.pinned)
	p.Done(errNotSent)
}

// An id over maxResponseIDLen bytes is neither learned nor looked up.
func TestResponseIDTooLong(t *testing.T) {
	long := "resp_" + strings.Repeat("x", maxResponseIDLen)
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, `{"id":%q,"object":"response"}`, long)
	})
	a := newUpstream(t, responsesServer("a", 0))
	var want atomic.Int32
	want.Store(1)
	h := newHarness(t, prefer{&want}, Config{}, a, b)
	code, id := respond(t, h, nil, responsesBody(false, ""))
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, id)
	assert.Zero(t, h.tr.ids.len())
	want.Store(0)
	_, got := respond(t, h, nil, responsesBody(false, `"`+long+`"`))
	assert.Equal(t, "resp_a_1", got)

	// One byte shorter, the longest id taken.
	h.tr.ids.learn([]byte(long[:maxResponseIDLen]), h.b.Stats()[1].Key)
	code, got = respond(t, h, nil, responsesBody(false, `"`+long[:maxResponseIDLen]+`"`))
	require.Equal(t, http.StatusOK, code)
	assert.Empty(t, got) // b's answer
	assert.EqualValues(t, 2, b.hits.Load())
}

// A request pinned to the endpoint holding its response is not retried or
// hedged elsewhere, where it would fail with a 404: the endpoint's
// retryable answer is the client's.
func TestResponseAffinityNotRetriedElsewhere(t *testing.T) {
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		for _, hedge := range []bool{false, true} {
			t.Run(fmt.Sprintf("status=%d/hedge=%t", code, hedge), func(t *testing.T) {
				a, b := newUpstream(t, responsesServer("a", 0)), newUpstream(t, responsesServer("b", code))
				var want atomic.Int32
				want.Store(1)
				cfg := Config{Retry: llmlbRetry(hedge)}
				h := newHarness(t, prefer{&want}, cfg, a, b)
				// b produced resp_b_0; the policy prefers a.
				h.tr.ids.learn([]byte("resp_b_0"), h.b.Stats()[1].Key)
				want.Store(0)
				got, _ := respond(t, h, nil, responsesBody(true, `"resp_b_0"`))
				assert.Equal(t, code, got)
				assert.Zero(t, a.hits.Load())
				assert.EqualValues(t, 1, b.hits.Load())
			})
		}
	}
}

// llmlbRetry returns a retry configuration that retries at once, and, with
// hedge, hedges at once too.
func llmlbRetry(hedge bool) (c retry.LoopConfig) {
	c.Budget = unlimited{}
	if hedge {
		c.Hedge.Delay = time.Nanosecond
	}
	return c
}

// A response whose request asks not to store it is not learned.
func TestResponseNotStored(t *testing.T) {
	a := newUpstream(t, responsesServer("a", 0))
	h := newHarness(t, fixed{}, Config{}, a)
	_, id := respond(t, h, nil, `{"input":"x","store":false}`)
	require.Equal(t, "resp_a_1", id)
	assert.Zero(t, h.tr.ids.len())
	_, id = respond(t, h, nil, `{"input":"x","store":true}`)
	require.Equal(t, "resp_a_2", id)
	assert.Equal(t, 1, h.tr.ids.len())
}

// The Transport remembers at most MaxResponseIDs ids, the most recently
// used; a negative MaxResponseIDs turns response affinity off.
func TestResponseIDsBounded(t *testing.T) {
	a, b := newUpstream(t, responsesServer("a", 0)), newUpstream(t, responsesServer("b", 0))
	var want atomic.Int32
	want.Store(1)
	h := newHarness(t, prefer{&want}, Config{MaxResponseIDs: 4}, a, b)
	for range 10 {
		respond(t, h, nil, responsesBody(false, ""))
	}
	assert.Equal(t, 4, h.tr.ids.len())
	want.Store(0)
	_, got := respond(t, h, nil, responsesBody(false, `"resp_b_6"`)) // forgotten
	assert.Equal(t, "resp_a_1", got)
	// Held: resp_b_8, resp_b_9, resp_b_10 and resp_a_1.
	_, got = respond(t, h, nil, responsesBody(false, `"resp_b_7"`)) // forgotten for resp_a_1
	assert.Equal(t, "resp_a_2", got)
	_, got = respond(t, h, nil, responsesBody(false, `"resp_b_9"`))
	assert.Equal(t, "resp_b_11", got)
	assert.Equal(t, 4, h.tr.ids.len())

	want.Store(1)
	off := newHarness(t, prefer{&want}, Config{MaxResponseIDs: -1}, a, b)
	require.Nil(t, off.tr.ids)
	_, id := respond(t, off, nil, responsesBody(true, ""))
	require.True(t, strings.HasPrefix(id, "resp_b_"), id)
	want.Store(0)
	_, got = respond(t, off, nil, responsesBody(true, `"`+id+`"`))
	assert.True(t, strings.HasPrefix(got, "resp_a_"), got)

	def := newHarness(t, fixed{}, Config{}, a)
	for i := range DefaultMaxResponseIDs + 10 {
		def.tr.ids.learn([]byte(fmt.Sprint("resp_", i)), "ep")
	}
	assert.Equal(t, DefaultMaxResponseIDs, def.tr.ids.len(), "default")
}

// A previous_response_id is read only when it is a string of at most
// maxResponseIDLen bytes without escapes; the last string given wins.
func TestParsePreviousResponseID(t *testing.T) {
	p := newParser(t, ParserConfig{})
	long := strings.Repeat("x", maxResponseIDLen)
	cases := []struct {
		body, want string
		noStore    bool
	}{
		{`{"previous_response_id":"resp_1"}`, "resp_1", false},
		{`{"previous_response_id":"` + long + `"}`, long, false},
		{`{"previous_response_id":"` + long + `x"}`, "", false},
		{`{"previous_response_id":""}`, "", false},
		{`{"previous_response_id":"resp_\u0031"}`, "", false},
		{`{"previous_response_id":1}`, "", false},
		{`{"previous_response_id":null}`, "", false},
		{`{"previous_response_id":{"id":"resp_1"}}`, "", false},
		{`{"previous_response_id":"resp_1","previous_response_id":"resp_2"}`, "resp_2", false},
		{`{"previous_response_id":"resp_1","store":false}`, "resp_1", true},
		{`{"previous_response_id":"resp_1","store":"false"}`, "resp_1", false},
		{`{"previous_response_id":"resp_1"`, "", false}, // not JSON
		{`{"x":{"previous_response_id":"resp_1"}}`, "", false},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(c.body))
		var info bodyInfo
		_, err := p.parse(r, &info)
		require.NoError(t, err)
		assert.Equal(t, c.want, string(info.prevID), c.body)
		assert.Equal(t, c.noStore, info.noStore, c.body)
	}
}

// The id of an answer is read from the bytes held back, as far as they go.
func TestHeldResponseID(t *testing.T) {
	created := event("response.created", `"response":{"id":"resp_s","status":"in_progress"},"sequence_number":0`)
	cases := []struct {
		name, held string
		stream     bool
		want       string
	}{
		{"json", `{"id":"resp_1","object":"response"}`, false, "resp_1"},
		{"json spaced", " \n{ \"object\" : \"response\" , \"id\" : \"resp_1\" }", false, "resp_1"},
		{"json id last", `{"object":"response","output":[{"id":"msg_1"}],"id":"resp_1"}`, false, "resp_1"},
		{"json cut in id", `{"id":"resp_1`, false, ""},
		{"json cut after id", `{"id":"resp_1"`, false, ""},
		{"json cut before id", `{"object":"resp`, false, ""},
		{"json nested only", `{"output":{"id":"resp_1"}}`, false, ""},
		{"json not an object", `["resp_1"]`, false, ""},
		{"json id not a string", `{"id":1}`, false, ""},
		{"json id escaped", `{"id":"resp\u005f1"}`, false, ""},
		{"stream", created + event("response.in_progress", `"response":{"id":"resp_s"}`) + "data: {\"x\"", true, "resp_s"},
		{"stream crlf", strings.ReplaceAll(created, "\n", "\r\n"), true, "resp_s"},
		{"stream bom", "\uFEFF" + created, true, "resp_s"},
		{"stream type first", "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_t\"}}\n", true, "resp_t"},
		{"stream cut", created[:len(created)-3], true, ""},
		{"stream other event", event("response.in_progress", `"response":{"id":"resp_s"}`), true, ""},
		{"stream type in text", "data: {\"type\":\"x\",\"text\":\"\\\"response.created\\\"\",\"response\":{\"id\":\"resp_1\"}}\n", true, ""},
		{"stream invalid", "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}\n", true, ""},
		{"stream no id", "data: {\"type\":\"response.created\",\"response\":{}}\n", true, ""},
		{"json as stream", `{"id":"resp_1"}`, true, ""},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, string(heldResponseID([]byte(c.held), c.stream)), c.name)
	}
}

// Learning an answer's id allocates nothing once the ids held are at their
// bound, nor does looking one up.
func TestResponseIDsAllocs(t *testing.T) {
	ids := newResponseIDs(4)
	for i := range 4 {
		ids.learn([]byte(fmt.Sprint("resp_", i)), "ep")
	}
	stream := []byte(event("response.created", `"response":{"id":"resp_s","instructions":"`+strings.Repeat("be brief ", 100)+`"},"sequence_number":0`))
	json := []byte(`{"id":"resp_j","object":"response"}`)
	allocs := testing.AllocsPerRun(100, func() {
		ids.learn(heldResponseID(stream, true), "ep")
		ids.learn(heldResponseID(json, false), "ep")
		if _, ok := ids.lookup([]byte("resp_j")); !ok {
			t.Fatal("not learned")
		}
	})
	assert.Zero(t, allocs)
}

// refPrevID is the previous_response_id the parser must read from a body
// without repeated keys, decoded with encoding/json: its raw text, if it
// is a string of 1 to maxResponseIDLen bytes without escapes.
func refPrevID(body []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	raw := m["previous_response_id"]
	var s string
	if json.Unmarshal(raw, &s) != nil || isNull(raw) || bytes.IndexByte(raw, '\\') >= 0 {
		return ""
	}
	if id := raw[1 : len(raw)-1]; len(id) > 0 && len(id) <= maxResponseIDLen {
		return string(id)
	}
	return ""
}

// FuzzHeldResponseID checks that reading an id from held-back bytes never
// panics, returns a slice of them within bounds, and agrees with
// encoding/json on a complete JSON body.
func FuzzHeldResponseID(f *testing.F) {
	for _, s := range []string{
		`{"id":"resp_1","object":"response"}`,
		`{"object":"response","id":"resp_1"}`,
		`{"id":"resp_1`,
		`{"id":"a\"b"}`,
		`{"id":1,"id":"x"}`,
		event("response.created", `"response":{"id":"resp_s"}`),
		"data: {\"type\":\"response.created\",\"response\":{\"id\":\"\\u0072\"}}\r\n",
		"data:{\"type\":\"response.created\",\"response\":[]}\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, held []byte, stream bool) {
		id := heldResponseID(held, stream)
		if id == nil {
			return
		}
		if len(id) == 0 || len(id) > maxResponseIDLen || bytes.IndexByte(id, '\\') >= 0 || !bytes.Contains(held, id) {
			t.Fatalf("%q: id %q", held, id)
		}
		var v map[string]any
		if !stream && utf8.Valid(id) && plainJSON(held) && json.Unmarshal(held, &v) == nil && v["id"] != string(id) {
			t.Fatalf("%q: id %q, encoding/json %v", held, id, v["id"])
		}
	})
}
