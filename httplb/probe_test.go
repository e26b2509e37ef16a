package httplb

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// continuingServer is storedServer that also answers a Responses request
// continuing a response as vLLM does: 404 before computing anything when
// it does not hold the response named by previous_response_id, a new
// response of its own otherwise.
func continuingServer(name string) http.HandlerFunc {
	stored, create := storedServer(name, 0), responsesServer(name, 0)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/responses" {
			stored(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if i := bytes.Index(body, []byte(`"previous_response_id":"`)); i >= 0 {
			prev, _, _ := strings.Cut(string(body[i+len(`"previous_response_id":"`):]), `"`)
			if !strings.HasPrefix(prev, "resp_"+name+"_") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, prev)
				return
			}
		}
		create(w, r)
	}
}

// A request addressing a stored response this Transport does not know (it
// was produced through another replica of the router) is sent to each
// endpoint in turn while they answer 404, and the endpoint that answers is
// remembered: the next request for the response goes there directly.
func TestStoredResponseProbed(t *testing.T) {
	for _, hedge := range []bool{false, true} {
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			t.Run(fmt.Sprintf("hedge=%t/method=%s", hedge, m), func(t *testing.T) {
				ups := []*upstream{newUpstream(t, storedServer("a", 0)), newUpstream(t, storedServer("b", 0)), newUpstream(t, storedServer("c", 0))}
				var want atomic.Int32 // the policy prefers a, then b
				h := newHarness(t, prefer{&want}, Config{Retry: llmlbRetry(hedge)}, ups...)
				path := "/v1/responses/resp_c_7"
				if m == http.MethodPost {
					path += "/cancel"
				}
				got, body := send(t, h, nil, m, path)
				require.Equal(t, http.StatusOK, got, body)
				assert.Contains(t, body, `"resp_c_7"`)
				for i, n := range []int64{1, 1, 1} {
					assert.Equal(t, n, ups[i].hits.Load(), "endpoint %d", i)
				}
				// Learned: the next one goes to c alone.
				got, _ = send(t, h, nil, m, path)
				require.Equal(t, http.StatusOK, got)
				for i, n := range []int64{1, 1, 2} {
					assert.Equal(t, n, ups[i].hits.Load(), "endpoint %d", i)
				}
			})
		}
	}
}

// A Responses request continuing a response this Transport does not know
// is sent to each endpoint in turn while they answer 404; the endpoint
// that answers holds the response continued and the new one, which is
// remembered (the conversation goes on from the new one, not the old).
func TestContinuationProbed(t *testing.T) {
	ups := []*upstream{newUpstream(t, continuingServer("a")), newUpstream(t, continuingServer("b")), newUpstream(t, continuingServer("c"))}
	var want atomic.Int32
	h := newHarness(t, prefer{&want}, Config{Retry: llmlbRetry(false)}, ups...)
	for _, stream := range []bool{false, true} {
		got, id := respond(t, h, nil, responsesBody(stream, `"resp_b_9"`))
		require.Equal(t, http.StatusOK, got)
		require.True(t, strings.HasPrefix(id, "resp_b_"), id)
	}
	// Each probed a, then found b.
	assert.EqualValues(t, 2, ups[0].hits.Load())
	assert.EqualValues(t, 2, ups[1].hits.Load())
	assert.Zero(t, ups[2].hits.Load())
	got, _ := send(t, h, nil, http.MethodGet, "/v1/responses/resp_b_1")
	require.Equal(t, http.StatusOK, got)
	assert.EqualValues(t, 3, ups[1].hits.Load())
	assert.EqualValues(t, 2, ups[0].hits.Load())
}

// When every endpoint answers 404, each is tried once and the last one's
// answer is the client's, as sent.
func TestStoredResponseProbedNowhere(t *testing.T) {
	ups := []*upstream{newUpstream(t, storedServer("a", 0)), newUpstream(t, storedServer("b", 0)), newUpstream(t, storedServer("c", 0))}
	var want atomic.Int32
	var retries, probes atomic.Int32
	cfg := Config{Retry: llmlbRetry(false)}
	cfg.Retry.Observer = &retry.Observer{
		Retry: func(int, error) { retries.Add(1) },
		Probe: func(attempt int, cause error) {
			probes.Add(1)
			assert.Equal(t, int(probes.Load())+1, attempt)
			var status *retry.StatusError
			assert.True(t, errors.As(cause, &status) && status.Code == http.StatusNotFound, "cause %v", cause)
		},
	}
	h := newHarness(t, prefer{&want}, cfg, ups...)
	got, body := send(t, h, nil, http.MethodGet, "/v1/responses/resp_z_1")
	assert.Equal(t, http.StatusNotFound, got)
	assert.JSONEq(t, `{"error":{"message":"Response with id 'resp_z_1' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, body)
	for i, u := range ups {
		assert.EqualValues(t, 1, u.hits.Load(), "endpoint %d", i)
	}
	assert.EqualValues(t, 2, probes.Load(), "probes")
	assert.Zero(t, retries.Load(), "a probe follows no failure: not a retry")
	assert.Zero(t, h.tr.ids.len(), "an id no endpoint holds is not remembered")
	for _, s := range h.b.Stats() {
		assert.Zero(t, s.Outstanding, s.Key)
	}
}

// Each probe after the first is a retry for the budget: a budget that
// grants none leaves the first endpoint's 404 the answer.
func TestStoredResponseProbeBudget(t *testing.T) {
	ups := []*upstream{newUpstream(t, storedServer("a", 0)), newUpstream(t, storedServer("b", 0))}
	var want atomic.Int32
	budget := &denyAll{}
	var denied atomic.Int32
	cfg := Config{}
	cfg.Retry.Budget = budget
	cfg.Retry.Observer = &retry.Observer{Denied: func() { denied.Add(1) }}
	h := newHarness(t, prefer{&want}, cfg, ups...)
	got, _ := send(t, h, nil, http.MethodGet, "/v1/responses/resp_b_1")
	assert.Equal(t, http.StatusNotFound, got)
	assert.EqualValues(t, 1, ups[0].hits.Load())
	assert.Zero(t, ups[1].hits.Load())
	assert.EqualValues(t, 1, denied.Load())
	assert.EqualValues(t, 1, budget.finished.Load())
	for _, s := range h.b.Stats() {
		assert.Zero(t, s.Outstanding, s.Key)
	}
}

// With response affinity off, nothing is probed: the first endpoint's 404
// is the answer.
func TestStoredResponseProbeOff(t *testing.T) {
	ups := []*upstream{newUpstream(t, storedServer("a", 0)), newUpstream(t, storedServer("b", 0))}
	var want atomic.Int32
	h := newHarness(t, prefer{&want}, Config{Retry: llmlbRetry(false), MaxResponseIDs: -1}, ups...)
	got, _ := send(t, h, nil, http.MethodGet, "/v1/responses/resp_b_1")
	assert.Equal(t, http.StatusNotFound, got)
	assert.EqualValues(t, 1, ups[0].hits.Load())
	assert.Zero(t, ups[1].hits.Load())
}

// A probe follows no failure and a retry follows one: a continuation whose
// first endpoint fails is retried, and the observer hears a retry for the
// attempt after the failure and a probe for the one after a 404. (A
// request naming a stored response in its path is not retried at all.)
func TestStoredResponseProbeAfterFailure(t *testing.T) {
	ups := []*upstream{newUpstream(t, status(http.StatusServiceUnavailable)), newUpstream(t, continuingServer("b")), newUpstream(t, continuingServer("c"))}
	var want atomic.Int32
	var events []string // attempts run one at a time: no lock needed
	cfg := Config{Retry: llmlbRetry(false)}
	cfg.Retry.Observer = &retry.Observer{
		Retry: func(attempt int, _ error) { events = append(events, fmt.Sprint("retry ", attempt)) },
		Probe: func(attempt int, _ error) { events = append(events, fmt.Sprint("probe ", attempt)) },
	}
	h := newHarness(t, prefer{&want}, cfg, ups...)
	got, id := respond(t, h, nil, responsesBody(false, `"resp_c_3"`))
	require.Equal(t, http.StatusOK, got)
	assert.True(t, strings.HasPrefix(id, "resp_c_"), id)
	assert.Equal(t, []string{"retry 2", "probe 3"}, events)
	for i, u := range ups {
		assert.EqualValues(t, 1, u.hits.Load(), "endpoint %d", i)
	}
}
