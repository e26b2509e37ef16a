package extproc_test

import (
	"encoding/json"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/extproc"
)

// fakeTimers stands in for time.AfterFunc: each armed timer is queued for
// the test, which fires it when it chooses.
type fakeTimers struct {
	armed chan fakeTimer
}

type fakeTimer struct {
	d    time.Duration
	fire func()
}

func newFakeTimers(t *testing.T, cfg extproc.Config) (*fakeTimers, *harness, *extproc.Server) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	srv, err := extproc.NewServer(cfg)
	require.NoError(t, err)
	ft := &fakeTimers{armed: make(chan fakeTimer, 64)}
	extproc.SetAfterFunc(srv, func(d time.Duration, fire func()) func() bool {
		ft.armed <- fakeTimer{d, fire}
		return func() bool { return true }
	})
	return ft, serve(t, srv, cfg.Balancer), srv
}

// next returns the next timer armed.
func (f *fakeTimers) next(t *testing.T) fakeTimer {
	t.Helper()
	select {
	case tm := <-f.armed:
		return tm
	case <-time.After(10 * time.Second):
		t.Fatal("no body deadline was armed")
		return fakeTimer{}
	}
}

// TestBodyTimeout: a request whose body has not come by the deadline is
// answered 408, as Envoy's request_timeout answers, and its share of the
// budget, body and headers, is let go at once, before the data plane closes the
// stream, so that slow clients cannot hold the budget and have every other
// request refused with 429.
func TestBodyTimeout(t *testing.T) {
	const limit = 32 << 10
	b := newBalancer(t, 2, nil)
	timers, h, srv := newFakeTimers(t, extproc.Config{Balancer: b, Parser: parserWithCap(t, limit), MaxBufferedBytes: limit,
		BodyTimeout: 5 * time.Second})
	body := chatBody(limit-1<<10, false) // and its headers: nearly the whole budget

	// The slow client sends its headers and half the budget of body.
	slow := h.open(t, fullDuplex, fullDuplex)
	slow.send(requestHeaders("/v1/chat/completions", false))
	deadline := timers.next(t)
	require.Equal(t, 5*time.Second, deadline.d)
	slow.send(requestBody(body[:limit/2], false))

	// probe sends a whole body on a new stream, which needs nearly the
	// whole budget, and returns the answer.
	probe := func() *extprocv3.ProcessingResponse {
		e := h.open(t, fullDuplex, fullDuplex)
		defer e.cancel()
		e.send(requestHeaders("/v1/chat/completions", false))
		e.send(requestBody(body, true))
		return e.recv()
	}
	// Once the slow body is held, another is refused for the budget.
	require.Eventually(t, func() bool { return extproc.Buffered(srv) > limit/2 }, 10*time.Second, time.Millisecond)
	requireBudgetRefusal(t, probe())

	deadline.fire()
	m := slow.recv()
	ir := m.GetImmediateResponse()
	require.NotNil(t, ir, "want 408, got %v", m)
	require.Equal(t, typev3.StatusCode_RequestTimeout, ir.GetStatus().GetCode())
	require.Equal(t, "llmlb_body_timeout", ir.GetDetails())
	var doc struct {
		Error struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(ir.GetBody(), &doc), "%s", ir.GetBody())
	require.Equal(t, 408, doc.Error.Code)
	require.Contains(t, doc.Error.Message, "req-1")
	hdrs := immediateHeaders(ir)
	require.NotContains(t, hdrs, "retry-after")
	require.NotContains(t, hdrs, extproc.DroppedReasonHeader)

	// The budget is free while the slow stream is still open.
	require.Zero(t, extproc.Buffered(srv))
	m = probe()
	require.NotNil(t, m.GetRequestHeaders(), "want the route, got %v", m)

	// More of the slow body ends the stream; so does Envoy's close.
	slow.send(requestBody(body[limit/2:], true))
	require.NoError(t, slow.closeAndWait())
	waitIdle(t, b)
}

// TestBodyTimeoutAfterRoute: a deadline that passes after the request was
// routed changes nothing; a request routed on its headers arms none, and
// neither does a negative BodyTimeout. The zero BodyTimeout is
// DefaultBodyTimeout.
func TestBodyTimeoutAfterRoute(t *testing.T) {
	b := newBalancer(t, 2, nil)
	timers, h, _ := newFakeTimers(t, extproc.Config{Balancer: b})
	e := h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/chat/completions", false))
	deadline := timers.next(t)
	require.Equal(t, extproc.DefaultBodyTimeout, deadline.d)
	e.send(requestBody(chatBody(100, true), true))
	require.NotNil(t, e.recv().GetRequestHeaders())
	require.NotNil(t, streamedBack(t, e.recv(), true))
	deadline.fire()
	e.send(responseHeaders(200, "text/event-stream", false))
	m := e.recv()
	require.NotNil(t, m.GetResponseHeaders(), "want the response headers' answer, got %v", m)
	e.send(responseBody("data: {}\n\n", true))
	require.NotNil(t, e.recv().GetResponseBody())
	require.NoError(t, e.closeAndWait())

	get := h.open(t, fullDuplex, fullDuplex)
	get.send(requestHeaders("/v1/models", true))
	require.NotNil(t, get.recv().GetRequestHeaders())
	require.NoError(t, get.closeAndWait())
	require.Empty(t, timers.armed, "a request routed on its headers arms no deadline")
	waitIdle(t, b)

	timers, h, _ = newFakeTimers(t, extproc.Config{Balancer: b, BodyTimeout: -1})
	e = h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/chat/completions", false))
	e.send(requestBody(chatBody(100, true), true))
	require.NotNil(t, e.recv().GetRequestHeaders())
	require.Empty(t, timers.armed, "a negative BodyTimeout arms no deadline")
	e.cancel()
	waitIdle(t, b)
}

// immediateHeaders returns the headers an immediate response sets.
func immediateHeaders(ir *extprocv3.ImmediateResponse) map[string]string {
	hdrs := map[string]string{}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		hdrs[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return hdrs
}
