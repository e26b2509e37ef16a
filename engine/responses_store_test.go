package engine

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// do sends a request without a body and returns its status, header and
// body, or the error that broke it.
func do(t *testing.T, method, url string) (int, http.Header, string, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

// TestResponsesStored: a response whose request does not set "store" to
// false is stored once complete, streamed or not, and retrieved as the
// answer it was, as from vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1; one
// not stored, or unknown, is not found, with vLLM's error.
func TestResponsesStored(t *testing.T) {
	e := newEngine(t, Config{Model: "m"})
	url, _ := serve(t, e)
	answer := post(t, url+"/v1/responses", `{"model":"m","input":"hello","max_output_tokens":3}`)
	require.Equal(t, http.StatusOK, answer.StatusCode)
	body, err := io.ReadAll(answer.Body)
	require.NoError(t, err)
	m := decodeJSON(t, strings.NewReader(string(body)))
	id := m["id"].(string)

	code, h, got, err := do(t, http.MethodGet, url+"/v1/responses/"+id)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, got)
	assert.Equal(t, "application/json", h.Get("Content-Type"))
	assert.Equal(t, string(body), got)

	streamed := post(t, url+"/v1/responses", `{"model":"m","input":"hello","max_output_tokens":2,"stream":true,"request_id":"resp_mine"}`)
	evs := readEvents(t, streamed.Body)
	final := evs[len(evs)-1]
	require.Equal(t, "response.completed", final.event)
	code, _, got, err = do(t, http.MethodGet, url+"/v1/responses/resp_mine")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, got)
	assert.Equal(t, final.data["response"], decodeJSON(t, strings.NewReader(got)))

	notStored := decodeJSON(t, post(t, url+"/v1/responses", `{"model":"m","input":"hello","max_output_tokens":1,"store":false}`).Body)
	for _, id := range []string{notStored["id"].(string), "resp_unknown", "r%20x"} {
		code, _, got, err := do(t, http.MethodGet, url+"/v1/responses/"+id)
		require.NoError(t, err)
		assert.Equal(t, http.StatusNotFound, code, id)
		want := strings.ReplaceAll(id, "%20", " ")
		assert.JSONEq(t, fmt.Sprintf(`{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, want), got)
	}
	assert.Equal(t, 2, e.stored.len())
}

// TestResponsesCancelStored: as vLLM's cancel_responses, a stored
// response, which is complete, cannot be cancelled (400), and an unknown
// one is not found (404).
func TestResponsesCancelStored(t *testing.T) {
	e := newEngine(t, Config{Model: "m"})
	url, _ := serve(t, e)
	id := decodeJSON(t, post(t, url+"/v1/responses", `{"model":"m","input":"hello","max_output_tokens":1}`).Body)["id"].(string)
	code, _, got, err := do(t, http.MethodPost, url+"/v1/responses/"+id+"/cancel")
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.JSONEq(t, `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":"response_id","code":400}}`, got)
	code, _, _, err = do(t, http.MethodPost, url+"/v1/responses/resp_unknown/cancel")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, code)
}

// TestResponsesStoredRoutes: only vLLM's routes are served, for their
// method alone (405 with Allow otherwise, as FastAPI answers); a path
// whose id would span segments, an escaped slash included, is not found;
// the retrieve's query is validated first; and a stream of a response
// not created in background mode breaks after its 200, as vLLM's does.
func TestResponsesStoredRoutes(t *testing.T) {
	e := newEngine(t, Config{Model: "m"})
	url, _ := serve(t, e)
	id := decodeJSON(t, post(t, url+"/v1/responses", `{"model":"m","input":"hello","max_output_tokens":1}`).Body)["id"].(string)
	cases := []struct {
		method, path string
		code         int
		allow        string
	}{
		{http.MethodPost, "/v1/responses/" + id, http.StatusMethodNotAllowed, "GET"},
		{http.MethodDelete, "/v1/responses/" + id, http.StatusMethodNotAllowed, "GET"},
		{http.MethodHead, "/v1/responses/" + id, http.StatusMethodNotAllowed, "GET"},
		{http.MethodGet, "/v1/responses/" + id + "/cancel", http.StatusMethodNotAllowed, "POST"},
		{http.MethodGet, "/v1/responses/", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/responses/" + id + "/input_items", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/responses/a%2F" + id, http.StatusNotFound, ""},
		{http.MethodPost, "/v1/responses//cancel", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/responses/" + id + "?stream=maybe", http.StatusBadRequest, ""},
		{http.MethodGet, "/v1/responses/" + id + "?starting_after=x", http.StatusBadRequest, ""},
		{http.MethodGet, "/v1/responses/resp_unknown?stream=true", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/responses/" + id + "?stream=false&starting_after=3", http.StatusOK, ""},
		{http.MethodGet, "/v1/responses/" + id + "?stream=0", http.StatusOK, ""},
	}
	for _, c := range cases {
		code, h, got, err := do(t, c.method, url+c.path)
		require.NoError(t, err, "%s %s", c.method, c.path)
		assert.Equal(t, c.code, code, "%s %s: %s", c.method, c.path, got)
		assert.Equal(t, c.allow, h.Get("Allow"), "%s %s", c.method, c.path)
	}
	code, h, _, err := do(t, http.MethodGet, url+"/v1/responses/"+id+"?stream=true")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "text/event-stream; charset=utf-8", h.Get("Content-Type"))
	assert.Error(t, err, "the stream ended cleanly")
}

// TestResponsesContinueStored: a request whose previous_response_id names
// a stored response continues its conversation, as vLLM's
// construct_input_messages builds it: its own instructions, the earlier
// messages without their system message, the earlier output as an
// assistant message, then its input; the answer names the response it
// continues.
func TestResponsesContinueStored(t *testing.T) {
	e := newEngine(t, Config{Model: "m"})
	url, _ := serve(t, e)
	first := decodeJSON(t, post(t, url+"/v1/responses", `{"model":"m","instructions":"be brief","input":"hello","max_output_tokens":2}`).Body)
	id := first["id"].(string)
	p, ok := e.stored.get(id)
	require.True(t, ok)
	assert.Equal(t, []turn{
		{role: "system", content: "be brief", hasContent: true},
		{role: "user", content: "hello", hasContent: true},
		{role: "assistant", content: " tok tok", hasContent: true},
	}, p.turns)

	_, a, _, ref := e.parseResponses([]byte(`{"model":"m","instructions":"be kind","input":"more","previous_response_id":"` + id + `"}`))
	require.Zero(t, ref.code, ref.msg)
	assert.Equal(t, "system\nbe kind\nuser\nhello\nassistant\n tok tok\nuser\nmore\n", renderTurns(a.turns))
	assert.Equal(t, `"`+id+`"`, a.prevID)

	second := decodeJSON(t, post(t, url+"/v1/responses", `{"model":"m","input":"more","max_output_tokens":1,"previous_response_id":"`+id+`"}`).Body)
	assert.Equal(t, id, second["previous_response_id"])
	assert.Greater(t, second["usage"].(map[string]any)["input_tokens"].(float64), first["usage"].(map[string]any)["input_tokens"].(float64))
}

// TestResponseStoreBounded: the store keeps the most recently used
// responses within maxStoredResponses and maxStoredBytes, and does not
// keep a response larger than maxStoredBytes on its own.
func TestResponseStoreBounded(t *testing.T) {
	var st responseStore
	for i := range maxStoredResponses + 10 {
		st.put(&stored{id: fmt.Sprint("resp_", i), answer: "{}"})
		if i == 20 {
			_, ok := st.get("resp_0") // used: kept
			require.True(t, ok)
		}
	}
	assert.Equal(t, maxStoredResponses, st.len())
	_, ok := st.get("resp_0")
	assert.True(t, ok, "the most recently used is kept")
	_, ok = st.get("resp_1")
	assert.False(t, ok, "the least recently used is forgotten")

	st.put(&stored{id: "huge", answer: strings.Repeat("x", maxStoredBytes)})
	_, ok = st.get("huge")
	assert.False(t, ok)
	assert.Equal(t, maxStoredResponses, st.len())

	big := strings.Repeat("x", maxStoredBytes/4)
	for i := range 8 {
		st.put(&stored{id: fmt.Sprint("big_", i), turns: []turn{{role: "user", content: big}}})
	}
	assert.LessOrEqual(t, st.bytes, maxStoredBytes)
	assert.Equal(t, 3, st.len(), "three quarters and the ids; a fourth would pass the bound")

	// Replacing an id keeps one entry and its size counted once.
	st.put(&stored{id: "big_7", answer: "{}"})
	assert.Equal(t, 3, st.len())
	sum := 0
	for el := st.order.Front(); el != nil; el = el.Next() {
		sum += el.Value.(*stored).size
	}
	assert.Equal(t, sum, st.bytes)
}
