package engine

import (
	"container/list"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// The response store of vLLM's Responses API, as vLLM keeps it with
// VLLM_ENABLE_RESPONSES_API_STORE=1 (OpenAIServingResponses in
// vllm/entrypoints/openai/responses/serving.py, commit
// 0001948bc76939369ca855c90b36d81256477e85): each response of a request
// with "store" true (the default) is kept, with the messages of its
// prompt, in the memory of the process, once it is complete; GET
// /v1/responses/{response_id} retrieves it, POST
// /v1/responses/{response_id}/cancel cancels it if it is still running
// (only a background response can be), and a request with
// "previous_response_id" continues it. The routes are those of
// responses/api_router.py (f6e93254b870). vLLM's store grows without
// bound; this one keeps the most recently used responses within
// maxStoredResponses and maxStoredBytes.

const (
	// maxStoredResponses bounds the responses an engine stores.
	maxStoredResponses = 4096
	// maxStoredBytes bounds the bytes of the responses an engine stores
	// (their answers and their prompts' text); a response larger than
	// this on its own is not stored.
	maxStoredBytes = 64 << 20
	// responsesPath is the path under which stored responses are
	// addressed.
	responsesPath = "/v1/responses/"
)

// stored is a stored response: its answer, as a JSON object, and its
// conversation, the messages of its prompt and, last, its output as an
// assistant message, which a request continuing it takes as its history.
type stored struct {
	id     string // the response id, unquoted
	answer string
	turns  []turn
	size   int // the bytes it holds, for maxStoredBytes
}

// responseStore is an engine's response store: a bounded LRU of stored
// responses by id. The zero value is an empty store ready to use.
type responseStore struct {
	mu    sync.Mutex               // protects the fields below
	byID  map[string]*list.Element // of *stored; lazily initialized
	order list.List                // most recently used first
	bytes int                      // the sum of sizes held
}

// put stores s, replacing a response of the same id, and forgets the
// least recently used ones beyond the bounds.
func (st *responseStore) put(s *stored) {
	s.size = len(s.id) + len(s.answer)
	for _, t := range s.turns {
		s.size += len(t.role) + len(t.content)
	}
	if s.size > maxStoredBytes {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = make(map[string]*list.Element)
	}
	if el, ok := st.byID[s.id]; ok {
		st.remove(el)
	}
	st.byID[s.id] = st.order.PushFront(s)
	st.bytes += s.size
	for len(st.byID) > maxStoredResponses || st.bytes > maxStoredBytes {
		st.remove(st.order.Back())
	}
}

// get returns the response stored under id, and marks it used.
func (st *responseStore) get(id string) (*stored, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	el, ok := st.byID[id]
	if !ok {
		return nil, false
	}
	st.order.MoveToFront(el)
	return el.Value.(*stored), true
}

// remove forgets el. st.mu must be held.
func (st *responseStore) remove(el *list.Element) {
	s := st.order.Remove(el).(*stored)
	delete(st.byID, s.id)
	st.bytes -= s.size
}

// len returns the number of responses stored.
func (st *responseStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.byID)
}

// history returns the conversation a request continuing s takes before
// its own input: s's messages without the system ones, since, as vLLM's
// construct_input_messages (responses/utils.py, main as of 2026) drops
// them, instructions do not carry over from one response to the next.
func (s *stored) history() []turn {
	h := make([]turn, 0, len(s.turns))
	for _, t := range s.turns {
		if t.role != "system" {
			h = append(h, t)
		}
	}
	return h
}

// serveStored answers a request for a path under /v1/responses/, as
// vLLM's routes do: GET /v1/responses/{response_id} (retrieve) and POST
// /v1/responses/{response_id}/cancel. The id is one path segment of the
// decoded path, as Starlette matches it, so that an escaped slash
// ("%2F") is a slash there; any other path is not found (404), and
// another method is not allowed (405, with Allow).
func (e *Engine) serveStored(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, responsesPath)
	id, cancel := strings.CutSuffix(rest, "/cancel")
	if id == "" || strings.IndexByte(id, '/') >= 0 {
		writeHTTPError(w, http.StatusNotFound)
		return
	}
	if cancel {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeHTTPError(w, http.StatusMethodNotAllowed)
			return
		}
		e.cancelStored(w, id)
		return
	}
	if !getOnly(w, r) {
		return
	}
	e.retrieveStored(w, r, id)
}

// notFound is vLLM's answer for a response id it does not hold
// (_make_not_found_error).
func notFound(id string) errorAnswer {
	return errorAnswer{http.StatusNotFound, typeInvalidRequest, "response_id", fmt.Sprintf("Response with id '%s' not found.", id)}
}

// retrieveStored answers a retrieve of the response id, as vLLM's
// retrieve_responses: its query's "stream" (a boolean) and
// "starting_after" (an integer) are validated first (400); then a
// response not stored is not found (404); a stored one is answered as
// its JSON object, or, with stream=true, with vLLM's failure for a
// response that was not created in background mode, which is every
// response here: vLLM's responses_background_stream_generator raises
// once the 200 and its headers are sent, which breaks the connection.
func (e *Engine) retrieveStored(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	stream := false
	if v, ok := q["stream"]; ok {
		var valid bool
		if stream, valid = queryBool(v[len(v)-1]); !valid {
			writeError(w, invalid("stream: a boolean is required"))
			return
		}
	}
	if v, ok := q["starting_after"]; ok {
		if _, err := strconv.Atoi(strings.TrimSpace(v[len(v)-1])); err != nil {
			writeError(w, invalid("starting_after: an integer is required"))
			return
		}
	}
	s, ok := e.stored.get(id)
	if !ok {
		writeError(w, notFound(id))
		return
	}
	if stream {
		w.Header().Set("Content-Type", eventStreamType)
		w.WriteHeader(http.StatusOK)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		panic(http.ErrAbortHandler)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, s.answer)
}

// cancelStored answers a cancel of the response id, as vLLM's
// cancel_responses: a response not stored is not found (404); one that
// is no longer queued or in progress, which every stored response here
// is, cannot be cancelled (400).
func (e *Engine) cancelStored(w http.ResponseWriter, id string) {
	if _, ok := e.stored.get(id); !ok {
		writeError(w, notFound(id))
		return
	}
	writeError(w, errorAnswer{http.StatusBadRequest, typeInvalidRequest, "response_id", "Cannot cancel a synchronous response."})
}

// queryBool reads a query parameter as a boolean as pydantic does in lax
// mode (FastAPI's query parameters): "1", "true", "t", "yes", "y", "on"
// and "0", "false", "f", "no", "n", "off", in any case.
func queryBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "1", "true", "t", "yes", "y", "on":
		return true, true
	case "0", "false", "f", "no", "n", "off":
		return false, true
	}
	return false, false
}
