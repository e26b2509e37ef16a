package extproc_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
)

// reasoningBody is a chat request asking for effort.
func reasoningBody(effort string) []byte {
	return fmt.Appendf(nil, `{"model":"m","stream":true,"reasoning_effort":%q,"messages":[{"role":"user","content":"hi"}]}`, effort)
}

// exchange routes body on a FULL_DUPLEX_STREAMED stream and returns the
// picked endpoint, with the stream open for the response.
func exchange(t *testing.T, h *harness, body []byte) (*envoy, string) {
	t.Helper()
	e := h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/chat/completions", false))
	e.send(requestBody(body, true))
	m := e.recv()
	r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
	require.NotEmpty(t, r.header)
	streamedBack(t, e.recv(), true)
	return e, r.header
}

// respond streams the response pieces and ends the stream.
func respond(t *testing.T, e *envoy, contentType string, pieces ...string) {
	t.Helper()
	e.send(responseHeaders(200, contentType, false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	for i, p := range pieces {
		e.send(responseBody(p, i == len(pieces)-1))
		streamedBack(t, e.recv(), false)
	}
	require.NoError(t, e.closeAndWait())
}

// cut splits s into pieces of n bytes.
func cut(s string, n int) []string {
	var ps []string
	for len(s) > n {
		ps = append(ps, s[:n])
		s = s[n:]
	}
	return append(ps, s)
}

// The Server reports the output tokens of the response chunks to the pick,
// so that a balancer learns output lengths per Feature (the model and the
// reasoning effort): the usage count of the stream where it has one, else
// its events.
func TestOutputTokensTeachPrediction(t *testing.T) {
	b := newBalancer(t, 1, nil, llmlb.WithOutputPrediction(llmlb.OutputConfig{MinObservations: 2}))
	h := start(t, extproc.Config{Balancer: b})
	var high, low strings.Builder
	for i := range 10 {
		fmt.Fprintf(&high, "data: {\"choices\":[{\"delta\":{\"content\":\"ab%d\"}}]}\n\n", i)
	}
	high.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":30}}\n\ndata: [DONE]\n\n")
	for i := range 4 {
		fmt.Fprintf(&low, "event: delta\ndata: {\"choices\":[{\"delta\":{\"content\":\"a%d\"}}]}\n\n", i)
	}
	low.WriteString("data: [DONE]\n\n")
	for i := range 2 {
		e, _ := exchange(t, h, reasoningBody("high"))
		respond(t, e, "text/event-stream", cut(high.String(), 7+i)...)
		e, _ = exchange(t, h, reasoningBody("low"))
		respond(t, e, "text/event-stream; charset=utf-8", cut(low.String(), 5+i)...)
	}
	waitIdle(t, b)
	for effort, want := range map[string]int64{"high": 30, "low": 4} {
		e, picked := exchange(t, h, reasoningBody(effort))
		require.Equal(t, want, stats(b, picked).DecodeTokens, "effort %s", effort)
		require.NoError(t, e.closeAndWait())
		waitIdle(t, b)
	}
}

// A response that is not an event stream reports its usage count at its end.
func TestOutputTokensOfJSONResponse(t *testing.T) {
	b := newBalancer(t, 1, nil, llmlb.WithOutputPrediction(llmlb.OutputConfig{MinObservations: 1}))
	h := start(t, extproc.Config{Balancer: b})
	body := []byte(`{"model":"claude","max_tokens":9000,"thinking":{"type":"enabled","budget_tokens":3000},"messages":[]}`)
	e, _ := exchange(t, h, body)
	respond(t, e, "application/json", `{"content":[{"type":"text","text":"x"}],`, `"usage":{"input_tokens":9,"output`, `_tokens":77}}`)
	e, picked := exchange(t, h, body)
	require.EqualValues(t, 77, stats(b, picked).DecodeTokens)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}

// A compressed event stream's events cannot be seen in its bytes: its first
// byte is its first token, as for any other body.
func TestCompressedStreamFirstToken(t *testing.T) {
	b := newBalancer(t, 1, nil)
	h := start(t, extproc.Config{Balancer: b})
	e, picked := exchange(t, h, reasoningBody("low"))
	hdr := responseHeaders(200, "text/event-stream", false)
	hs := hdr.GetResponseHeaders().GetHeaders()
	hs.Headers = append(hs.Headers, header("content-encoding", "gzip"))
	e.send(hdr)
	require.NotNil(t, e.recv().GetResponseHeaders())
	require.Equal(t, int64(1), stats(b, picked).Queued)
	e.send(responseBody("\x1f\x8b\x08\x00compressed bytes without a line break", false))
	streamedBack(t, e.recv(), false)
	require.Equal(t, int64(0), stats(b, picked).Queued, "the first compressed chunk did not count as the first token")
	e.send(responseBody("\x03\x00", true))
	streamedBack(t, e.recv(), false)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}

// An event stream may start with a byte-order mark: its first event is
// still the first token.
func TestByteOrderMarkFirstToken(t *testing.T) {
	b := newBalancer(t, 1, nil)
	h := start(t, extproc.Config{Balancer: b})
	e, picked := exchange(t, h, reasoningBody("low"))
	e.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody("\xef\xbb\xbfdata: {\"choices\":[]}\n\n", false))
	streamedBack(t, e.recv(), false)
	require.Equal(t, int64(0), stats(b, picked).Queued, "the first event after a byte-order mark did not count as the first token")
	e.send(responseBody("data: [DONE]\n\n", true))
	streamedBack(t, e.recv(), false)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}

// A response stream that carried an error event (the engine failed the
// request after its 200) ends its pick with httplb.ErrErrorEvent, not as a
// success; an ordinary stream ends with nil.
func TestErrorEventEndsThePickAsAFailure(t *testing.T) {
	var rec doneRecorder
	b := newBalancer(t, 1, nil, llmlb.WithObserver(rec.observer()))
	h := start(t, extproc.Config{Balancer: b})
	failed := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"error\": {\"message\": \"EngineCore encountered an issue.\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\ndata: [DONE]\n\n"
	e, _ := exchange(t, h, reasoningBody("low"))
	respond(t, e, "text/event-stream", cut(failed, 9)...)
	e, _ = exchange(t, h, reasoningBody("low"))
	respond(t, e, "text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	waitIdle(t, b)
	errs, _ := rec.get()
	require.Len(t, errs, 2)
	require.ErrorIs(t, errs[0], httplb.ErrErrorEvent)
	require.NoError(t, errs[1])
}

// A stream whose first event is named "error" (Anthropic's error events,
// the OpenAI Responses API's "error"), whatever its data, produced no first
// token: its pick ends as failed without FirstToken, as httplb's attempt
// at such a stream fails before it commits, and the balancer learns no
// time to first token from it. An event that follows it is one.
func TestNamedErrorEventNoFirstToken(t *testing.T) {
	for _, c := range []struct {
		stream   string
		streamed bool
	}{
		{"event: error\ndata: {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}\n\n", false},
		{": ping\r\n\r\nevent:error\r\ndata: upstream timed out\r\n\r\n", false},
		{"event: error\ndata: {\"message\": \"x\"}\n\ndata: {\"choices\":[]}\n\n", true},
		{"data: {\"choices\":[]}\n\n", true},
	} {
		var rec infoRecorder
		b := newBalancer(t, 1, nil, llmlb.WithObserver(rec.observer()))
		h := start(t, extproc.Config{Balancer: b})
		e, _ := exchange(t, h, reasoningBody("low"))
		respond(t, e, "text/event-stream", cut(c.stream, 7)...)
		waitIdle(t, b)
		d := rec.only(t)
		require.Equal(t, c.streamed, d.Streamed, "FirstToken for %q", c.stream)
		if strings.Contains(c.stream, "error") {
			require.ErrorIs(t, d.Err, httplb.ErrErrorEvent)
		} else {
			require.NoError(t, d.Err)
		}
	}
}

// The response.created and response.in_progress events that vLLM sends of
// a Responses stream as soon as it accepts the request, before the prompt
// is prefilled, are no first token: the first is the event that follows
// them, with the engine's first output.
func TestResponsesPreambleNoFirstToken(t *testing.T) {
	b := newBalancer(t, 1, nil)
	h := start(t, extproc.Config{Balancer: b})
	e, picked := exchange(t, h, reasoningBody("low"))
	e.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	for _, chunk := range []string{
		"event: response.created\ndata: {\"response\":{\"status\":\"in_progress\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n",
		"event: response.in_progress\ndata: {\"response\":{\"status\":\"in_progress\"},\"sequence_number\":1,\"type\":\"response.in_progress\"}\n\nevent: response.output_item.added\nda",
	} {
		e.send(responseBody(chunk, false))
		require.Equal(t, chunk, string(streamedBack(t, e.recv(), false).GetBody()))
		require.EqualValues(t, 1, stats(b, picked).Queued, "FirstToken at a preamble event (after %q)", chunk)
	}
	e.send(responseBody("ta: {\"item\":{\"type\":\"message\"},\"type\":\"response.output_item.added\"}\n\n", false))
	streamedBack(t, e.recv(), false)
	require.EqualValues(t, 0, stats(b, picked).Queued, "no FirstToken at the first output")
	e.send(responseBody("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"output_tokens\":1}}}\n\n", true))
	streamedBack(t, e.recv(), false)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}
