package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/llmlb/llmlb/engine"
	gw "github.com/llmlb/llmlb/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// getBody sends a request without a body to url and returns the status
// and the whole answer, or the error that broke it.
func getBody(ctx context.Context, client *http.Client, method, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// createResponse creates a stored response through the gateway at base and
// returns its id and the whole answer.
func createResponse(t *testing.T, client *http.Client, base, instructions, input string, want int) (string, []byte) {
	t.Helper()
	status, body, err := postBody(context.Background(), client, base+"/v1/responses", responsesBody(instructions, input, want, false))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var created struct{ ID string }
	require.NoError(t, json.Unmarshal(body, &created))
	require.NotEmpty(t, created.ID)
	return created.ID, body
}

// A stored response lives in the memory of the engine that produced it,
// as in vLLM's and SGLang's: through the gateway, every retrieve of it and
// every cancel goes to that engine, though the balancer would spread
// requests without a body over all three, and so does a request that
// continues it, which finds its conversation there, prefilled already.
func TestResponsesRetrieveThroughGateway(t *testing.T) {
	c, err := StartCluster(3, engine.Config{Speedup: 20})
	require.NoError(t, err)
	defer c.Close()
	g, base := startResponsesGateway(t, c.URLs, gw.Config{})
	client := newClient()
	defer client.CloseIdleConnections()
	ctx := context.Background()

	const want = 4
	instructions := randomText(7, 2048)
	id, body := createResponse(t, client, base, instructions, "first question", want)

	const n = 30
	for i := range n {
		status, got, err := getBody(ctx, client, http.MethodGet, base+"/v1/responses/"+id)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "retrieve %d: %s", i, got)
		assert.JSONEq(t, string(body), string(got), "retrieve %d", i)
	}
	// The engine holding it refuses to cancel a complete response (400),
	// where any other would not know it (404).
	for i := range 5 {
		status, got, err := getBody(ctx, client, http.MethodPost, base+"/v1/responses/"+id+"/cancel")
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, status, "cancel %d: %s", i, got)
		assert.Contains(t, string(got), "Cannot cancel a synchronous response.")
	}
	// An id no engine holds is answered 404, once each engine said so.
	status, got, err := getBody(ctx, client, http.MethodGet, base+"/v1/responses/resp_unknown")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, status, "%s", got)

	// The next turn, streamed, continues the conversation where it is
	// held: its prompt's head, the instructions and the first turn, is
	// found in the prefix cache.
	next, _ := json.Marshal(map[string]any{
		"model": engine.DefaultModel, "instructions": instructions, "input": "second question",
		"max_output_tokens": want, "stream": true, "previous_response_id": id,
	})
	status, body, err = postBody(ctx, client, base+"/v1/responses", string(next))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Positive(t, checkStream(t, body, want), "the next turn went to an engine without the conversation")

	served := 0
	for _, e := range c.Engines {
		if st := e.Stats(); st.Finished > 0 {
			served++
			assert.EqualValues(t, 2, st.Finished)
		}
	}
	assert.Equal(t, 1, served, "one engine serves the conversation")
	require.Eventually(t, func() bool { return idleBalancer(g.Balancer()) }, 10*time.Second, 5*time.Millisecond,
		"accounting not released: %+v", g.Balancer().Stats())
}
