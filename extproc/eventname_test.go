package extproc_test

import (
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/stretchr/testify/require"
)

// The first token of an event stream is the end of its first event, its
// blank line, where a client dispatches it and its name is known: the
// chunk that brings its data line alone is none, the chunk that brings
// the blank line is.
func TestFirstTokenAtEventEnd(t *testing.T) {
	b := newBalancer(t, 1, nil)
	h := start(t, extproc.Config{Balancer: b})
	e, picked := exchange(t, h, reasoningBody("low"))
	e.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody("data: {\"choices\":[]}\n", false))
	streamedBack(t, e.recv(), false)
	require.Equal(t, int64(1), stats(b, picked).Queued, "a data line whose event has not ended counted as the first token")
	e.send(responseBody(": ping\n\n", false))
	streamedBack(t, e.recv(), false)
	require.Equal(t, int64(0), stats(b, picked).Queued, "the end of the first event did not count as the first token")
	e.send(responseBody("data: [DONE]\n\n", true))
	streamedBack(t, e.recv(), false)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
}

// An event's last "event:" line names it, wherever it comes before the
// blank line that ends it: an event named "error" after its data is no
// first token, and fails the pick; one named "error" and then otherwise
// is an ordinary first event. A stream that ends in its first event,
// without its blank line, has its first token at its end.
func TestLastEventNameFirstToken(t *testing.T) {
	for _, c := range []struct {
		stream   string
		streamed bool
		failed   bool
	}{
		{"data: {\"choices\":[]}\nevent: error\n\n", false, true},
		{"event: message\nevent: error\ndata: {\"choices\":[]}\n\n", false, true},
		{"event: error\nevent: message\ndata: {\"choices\":[]}\n\n", true, false},
		{"event: error\r\ndata: {\"choices\":[]}\r\nevent\r\n\r\n", true, false},
		{"data: {\"choices\":[]}\nevent: error\n\ndata: {\"choices\":[]}\n\n", true, true},
		{"data: {\"choices\":[]}", true, false},
		{"data: {\"choices\":[]}\nevent: error", false, true},
	} {
		var rec infoRecorder
		b := newBalancer(t, 1, nil, llmlb.WithObserver(rec.observer()))
		h := start(t, extproc.Config{Balancer: b})
		e, _ := exchange(t, h, reasoningBody("low"))
		respond(t, e, "text/event-stream", cut(c.stream, 7)...)
		waitIdle(t, b)
		d := rec.only(t)
		require.Equal(t, c.streamed, d.Streamed, "FirstToken for %q", c.stream)
		if c.failed {
			require.ErrorIs(t, d.Err, httplb.ErrErrorEvent, "%q", c.stream)
		} else {
			require.NoError(t, d.Err, "%q", c.stream)
		}
	}
}
