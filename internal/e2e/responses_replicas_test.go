package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/llmlb/llmlb/engine"
	gw "github.com/llmlb/llmlb/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Behind two replicas of the gateway, each with its own memory of which
// engine produced which response, a response created through one is found
// through the other: the second replica tries the engines in turn while
// they answer 404, remembers the one that answers, and sends the next turn
// of the conversation there, where its prompt's head is cached.
func TestResponsesAcrossGatewayReplicas(t *testing.T) {
	c, err := StartCluster(3, engine.Config{Speedup: 20})
	require.NoError(t, err)
	defer c.Close()
	gA, baseA := startResponsesGateway(t, c.URLs, gw.Config{})
	client := newClient()
	defer client.CloseIdleConnections()
	ctx := context.Background()

	const want = 4
	instructions := randomText(11, 2048)
	var ids []string
	for i := range 6 {
		id, _ := createResponse(t, client, baseA, instructions, "question "+string(rune('a'+i)), want)
		ids = append(ids, id)
	}

	// Each retrieve through a new replica of the gateway, which knows none
	// of the responses: without probing, two in three would find an
	// engine that does not hold it.
	for i, id := range ids {
		_, baseB := startResponsesGateway(t, c.URLs, gw.Config{})
		for j := range 3 {
			status, got, err := getBody(ctx, client, http.MethodGet, baseB+"/v1/responses/"+id)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, status, "response %d, retrieve %d: %s", i, j, got)
		}
	}

	// The next turn through yet another replica continues the conversation
	// where it is held.
	gC, baseC := startResponsesGateway(t, c.URLs, gw.Config{})
	next, _ := json.Marshal(map[string]any{
		"model": engine.DefaultModel, "instructions": instructions, "input": "next question",
		"max_output_tokens": want, "stream": true, "previous_response_id": ids[0],
	})
	status, body, err := postBody(ctx, client, baseC+"/v1/responses", string(next))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Positive(t, checkStream(t, body, want), "the next turn went to an engine without the conversation")

	// An id no engine holds is answered 404, after each engine said so once.
	status, got, err := getBody(ctx, client, http.MethodGet, baseC+"/v1/responses/resp_unknown")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, status, "%s", got)
	for _, g := range []*gw.Gateway{gA, gC} {
		require.Eventually(t, func() bool { return idleBalancer(g.Balancer()) }, 10*time.Second, 5*time.Millisecond,
			"accounting not released: %+v", g.Balancer().Stats())
	}
}
