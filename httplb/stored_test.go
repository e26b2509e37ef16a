package httplb

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storedServer serves name's stored responses as vLLM does with its
// response store on: POST /v1/responses creates one (see
// responsesServer); GET /v1/responses/{id} (a JSON body with usage, or
// with ?stream=true the events of the response) and POST
// /v1/responses/{id}/cancel answer 200 for an id it produced, and 404, or
// fail if not 0, for any other.
func storedServer(name string, fail int) http.HandlerFunc {
	create := responsesServer(name, 0)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/responses" {
			create(w, r)
			return
		}
		id, _ := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/cancel")
		if !strings.HasPrefix(id, "resp_"+name+"_") {
			if fail != 0 {
				status(fail)(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id)
			return
		}
		if r.URL.Query().Get("stream") == "true" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, responsesStream([]string{`"hi"`}, completed(1)))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","usage":{"input_tokens":3,"output_tokens":100,"total_tokens":103}}`, id)
	}
}

// send sends a request without a body through h's Transport, or through a
// proxy over it if proxy is set, and returns the status and the body.
func send(t *testing.T, h *harness, proxy *httptest.Server, method, path string) (int, string) {
	t.Helper()
	url := "http://gateway.invalid" + path
	if proxy != nil {
		url = proxy.URL + path
	}
	req, err := http.NewRequest(method, url, nil)
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
	return resp.StatusCode, got
}

// A retrieve or cancel of a stored response goes to the endpoint that
// produced it, every time, though the policy prefers the other, directly
// or through a proxy.
func TestStoredResponsePinned(t *testing.T) {
	for _, proxied := range []bool{false, true} {
		t.Run(fmt.Sprintf("proxy=%t", proxied), func(t *testing.T) {
			a, b := newUpstream(t, storedServer("a", 0)), newUpstream(t, storedServer("b", 0))
			var want atomic.Int32
			want.Store(1)
			h := newHarness(t, prefer{&want}, Config{}, a, b)
			var proxy *httptest.Server
			if proxied {
				proxy = h.proxy(t)
			}
			code, id := respond(t, h, proxy, responsesBody(false, ""))
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "resp_b_1", id)
			want.Store(0) // the policy now sends everything to a
			for i := range 20 {
				code, got := send(t, h, proxy, http.MethodGet, "/v1/responses/"+id)
				require.Equal(t, http.StatusOK, code, "retrieve %d: %s", i, got)
				assert.Contains(t, got, `"id":"`+id+`"`)
				code, got = send(t, h, proxy, http.MethodGet, "/v1/responses/"+id+"?stream=true")
				require.Equal(t, http.StatusOK, code, "stream %d: %s", i, got)
				assert.Contains(t, got, "response.completed")
				code, got = send(t, h, proxy, http.MethodPost, "/v1/responses/"+id+"/cancel")
				require.Equal(t, http.StatusOK, code, "cancel %d: %s", i, got)
			}
			assert.Zero(t, a.hits.Load())
			assert.EqualValues(t, 61, b.hits.Load())
		})
	}
}

// A request addressing a stored response is sent once, never retried or
// hedged: pinned, the endpoint's answer (a 503, a 404) is the client's,
// since no other endpoint holds the response; for an id it does not know,
// a 503 is the client's as well, and a 404 sends it to the next endpoint
// (see TestStoredResponseProbed), the last endpoint's 404 being the
// client's.
func TestStoredResponseNotRetried(t *testing.T) {
	for _, known := range []bool{false, true} {
		for _, hedge := range []bool{false, true} {
			for _, code := range []int{http.StatusServiceUnavailable, http.StatusNotFound} {
				t.Run(fmt.Sprintf("known=%t/hedge=%t/status=%d", known, hedge, code), func(t *testing.T) {
					var fail int
					if code != http.StatusNotFound {
						fail = code
					}
					a, b := newUpstream(t, storedServer("a", fail)), newUpstream(t, storedServer("b", fail))
					var want atomic.Int32
					want.Store(0)
					h := newHarness(t, prefer{&want}, Config{Retry: llmlbRetry(hedge)}, a, b)
					id := "resp_x_1" // produced by neither: each fails it
					if known {
						h.tr.ids.learn([]byte(id), h.b.Stats()[1].Key) // b, which the policy does not prefer
					}
					for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
						path := "/v1/responses/" + id
						if m == http.MethodPost {
							path += "/cancel"
						}
						got, _ := send(t, h, nil, m, path)
						assert.Equal(t, code, got, m)
					}
					switch {
					case known:
						assert.Zero(t, a.hits.Load())
						assert.EqualValues(t, 3, b.hits.Load())
					case code == http.StatusNotFound:
						assert.EqualValues(t, 3, a.hits.Load())
						assert.EqualValues(t, 3, b.hits.Load())
					default:
						assert.EqualValues(t, 3, a.hits.Load())
						assert.Zero(t, b.hits.Load())
					}
				})
			}
		}
	}
}

// A retrieve stream is committed at its first byte, not held back to its
// first output as a new response's stream is: it is no new inference, and
// a background response's stream may wait long for its output. Its
// answer's output is not counted.
func TestStoredResponseStreamNotHeld(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, event("response.created", `"response":{"id":"resp_1","status":"queued"},"sequence_number":0`))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, responsesStream([]string{`"hi"`}, completed(1)))
	})
	h := newHarness(t, fixed{}, Config{}, up)
	req, err := http.NewRequest(http.MethodGet, "http://gateway.invalid/v1/responses/resp_1?stream=true", nil)
	require.NoError(t, err)
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := h.tr.RoundTrip(req)
		done <- result{resp, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the retrieve stream was held back past its first byte")
	}
	close(release)
	require.NoError(t, r.err)
	assert.False(t, r.resp.Body.(*body).metered, "output counted")
	got, err := readAll(t, r.resp)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(got, "event: response.created"), got)
	assert.Contains(t, got, "response.completed")
}

// With response affinity off, a request addressing a stored response is
// routed, and retried, as any other.
func TestStoredResponseAffinityOff(t *testing.T) {
	a, b := newUpstream(t, storedServer("a", http.StatusServiceUnavailable)), newUpstream(t, storedServer("b", 0))
	h := newHarness(t, fixed{}, Config{MaxResponseIDs: -1, Retry: llmlbRetry(false)}, a, b)
	code, _ := send(t, h, nil, http.MethodGet, "/v1/responses/resp_b_1")
	assert.Equal(t, http.StatusOK, code)
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 1, b.hits.Load())
}

// TestStoredResponseID: the id of the stored response a request addresses
// is read, by the rules of package respid (internal/respid/respid_test.go
// has them, and every escape), in the path net/http decodes from the
// request's URL, the one the Transport reads (url.URL.Path): an escape
// stands for its byte, "%2F" for a slash, and the query is not read.
func TestStoredResponseID(t *testing.T) {
	cases := []struct {
		method, path, want string // want "": none
	}{
		{"GET", "/v1/responses/r%65sp%5f1/input_items", "resp_1"},
		{"GET", "/v1/responses/resp_1%2F", ""},
		{"POST", "/v1/responses/resp%5F1%2Fcancel", "resp_1"},
		{"DELETE", "/v1/responses/resp%5F1", "resp_1"},
		{"HEAD", "/v1/responses/resp%5F1", ""},
		{"GET", "/v1/responses/resp%5F1?stream=true&x=%zz", "resp_1"},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, "http://gateway.invalid"+c.path, nil)
		require.NoError(t, err)
		id, ok := storedResponseID(req.Method, req.URL.Path)
		assert.Equal(t, c.want, id, "%s %q", c.method, c.path)
		assert.Equal(t, c.want != "", ok, "%s %q", c.method, c.path)
	}
}

// FuzzStoredResponseID checks that parsing a path never panics and
// returns, for a request that addresses a stored response, an id within
// bounds that is the path's segment after /responses/.
func FuzzStoredResponseID(f *testing.F) {
	for _, s := range []string{
		"/v1/responses/resp_1", "/v1/responses/resp_1/cancel", "/v1/responses/resp_1/input_items",
		"/v1/responses/", "/responses/..", "/v1/responses/a/b", "/v1/responses/\x00", "//responses//cancel",
	} {
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete, "PATCH"} {
			f.Add(m, s)
		}
	}
	f.Fuzz(func(t *testing.T, method, path string) {
		id, ok := storedResponseID(method, path)
		if !ok {
			if id != "" {
				t.Fatalf("%s %q: id %q, not ok", method, path, id)
			}
			return
		}
		if id == "" || len(id) > maxResponseIDLen || strings.ContainsAny(id, "/ ") || id == "." || id == ".." {
			t.Fatalf("%s %q: id %q", method, path, id)
		}
		var suffix string
		switch {
		case method == http.MethodPost:
			suffix = "/cancel"
		case method == http.MethodGet && strings.HasSuffix(path, "/"+id+"/input_items"):
			suffix = "/input_items"
		case method != http.MethodGet && method != http.MethodDelete:
			t.Fatalf("%s %q: method accepted", method, path)
		}
		if !strings.HasSuffix(path, "/responses/"+id+suffix) {
			t.Fatalf("%s %q: id %q is not the segment after /responses/", method, path, id)
		}
	})
}

// A Responses stream's preamble, which repeats the response object twice
// (2 to 3 KiB as vLLM writes it with short instructions), is held
// back in the buffer it starts with, not one grown again and again.
func TestPeekResponsesPreambleOneBuffer(t *testing.T) {
	resp := `"response":{"id":"resp_` + strings.Repeat("0", 32) + `","created_at":1767225600,"incomplete_details":null,` +
		`"instructions":"` + strings.Repeat("Answer briefly. ", 25) + `",` +
		`"metadata":null,"model":"meta-llama/Llama-3.1-8B-Instruct","object":"response","output":[],"parallel_tool_calls":true,` +
		`"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":1024,` +
		`"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress",` +
		`"text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"input_messages":null,"output_messages":null}`
	stream := event("response.created", resp+`,"sequence_number":0`) +
		event("response.in_progress", resp+`,"sequence_number":1`) +
		event("response.output_text.delta", `"content_index":0,"delta":"hi","item_id":"msg_1","logprobs":[],"output_index":0`)
	require.Greater(t, len(stream), 2048)
	req := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(`{"input":"x","stream":true}`))
	allocs := testing.AllocsPerRun(20, func() {
		b := &body{rc: io.NopCloser(strings.NewReader(stream))}
		if code, err := b.peekAs(true, peekSize(req), DefaultMaxPeekBytes); code != 0 || err != nil || len(b.buf) != len(stream) {
			t.Fatalf("peek: %d %v, %d bytes held", code, err, len(b.buf))
		}
	})
	// The body, its reader, and the one buffer.
	assert.LessOrEqual(t, allocs, 3.0)
}
