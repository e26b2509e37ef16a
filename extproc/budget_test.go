package extproc_test

import (
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
)

// startTCP serves cfg's Server on a loopback TCP socket until the test ends.
func startTCP(t *testing.T, cfg extproc.Config) *harness {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	srv, err := extproc.NewServer(cfg)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cc.Close()
		gs.Stop()
		<-served
	})
	return &harness{b: cfg.Balancer, client: extprocv3.NewExternalProcessorClient(cc)}
}

func parserWithCap(t *testing.T, n int64) *httplb.Parser {
	t.Helper()
	p, err := httplb.NewParser(httplb.ParserConfig{MaxBodyBytes: n})
	require.NoError(t, err)
	return p
}

// requireBudgetRefusal checks that m refuses the request as shed under load:
// 429 with a Retry-After and llm-d's dropped reason for saturation.
func requireBudgetRefusal(t *testing.T, m *extprocv3.ProcessingResponse) {
	t.Helper()
	ir := m.GetImmediateResponse()
	require.NotNil(t, ir, "want an immediate response, got %v", m)
	require.Equal(t, typev3.StatusCode_TooManyRequests, ir.GetStatus().GetCode())
	retryAfter := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retryAfter = string(h.GetHeader().GetRawValue())
		}
	}
	require.Equal(t, "1", retryAfter)
	require.Equal(t, "rejected-saturated", immediateHeaders(ir)[extproc.DroppedReasonHeader])
	require.NotContains(t, string(ir.GetBody()), "budget", "the client reads no internal detail")
}

// TestBodiesInFlightShareTheBudget: request bodies being gathered, on any
// number of streams, hold no more than MaxBufferedBytes together; a body
// that does not fit is refused with 429 and Retry-After, the others are
// routed, and a routed body no longer counts.
func TestBodiesInFlightShareTheBudget(t *testing.T) {
	const limit = 32 << 10
	b := newBalancer(t, 2, nil)
	h := startTCP(t, extproc.Config{Balancer: b, Parser: parserWithCap(t, limit), MaxBufferedBytes: limit})
	body := chatBody(limit-1<<10, false) // and its headers: the whole budget

	// Two streams gather more than half the budget each: the one that
	// comes second is refused, whichever it is.
	streams := []*envoy{h.open(t, fullDuplex, fullDuplex), h.open(t, fullDuplex, fullDuplex)}
	for _, e := range streams {
		e.send(requestHeaders("/v1/chat/completions", false))
		e.send(requestBody(body[:20<<10], false))
	}
	type answer struct {
		i int
		m *extprocv3.ProcessingResponse
	}
	answers := make(chan answer, 2)
	for i, e := range streams {
		go func() {
			if m, err := e.s.Recv(); err == nil {
				answers <- answer{i, m}
			}
		}()
	}
	var refused int
	select {
	case a := <-answers:
		requireBudgetRefusal(t, a.m)
		refused = a.i
	case <-time.After(10 * time.Second):
		t.Fatal("no stream was refused")
	}
	_, err := streams[refused].s.Recv()
	require.ErrorIs(t, err, io.EOF, "the stream ends after the refusal")

	// The other one completes its body, up to the whole budget, and is
	// routed.
	e := streams[1-refused]
	e.send(requestBody(body[20<<10:], true))
	select {
	case a := <-answers:
		require.NotNil(t, a.m.GetRequestHeaders(), "want the route, got %v", a.m)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream within the budget was not routed")
	}
	require.Equal(t, body, streamedBack(t, e.recv(), true).GetBody())
	e.cancel()
	waitIdle(t, b)

	// A routed body is let go: a whole budget's worth on each of several
	// streams open at once, one after another, is routed.
	for range 3 {
		e := h.open(t, buffered, buffered)
		e.send(requestHeaders("/v1/chat/completions", false))
		require.NotNil(t, e.recv().GetRequestHeaders())
		e.send(requestBody(body, true))
		m := e.recv()
		require.NotNil(t, m.GetRequestBody(), "want the route, got %v", m)
		// The next answer comes after the route's answer is complete.
		e.send(responseHeaders(200, "application/json", false))
		require.NotNil(t, e.recv().GetResponseHeaders())
	}
}

// TestMaxBufferedBytesConfig: a budget that cannot hold one body at the cap
// is rejected; the zero value is the default.
func TestMaxBufferedBytesConfig(t *testing.T) {
	b := newBalancer(t, 1, nil)
	p := parserWithCap(t, 1<<20)
	for _, n := range []int64{-1, 1<<20 - 1} {
		_, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: p, MaxBufferedBytes: n})
		require.ErrorIs(t, err, extproc.ErrInvalidConfig, "MaxBufferedBytes %d", n)
	}
	for _, n := range []int64{0, 1 << 20} {
		_, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: p, MaxBufferedBytes: n})
		require.NoError(t, err, "MaxBufferedBytes %d", n)
	}
}

// TestResponseIDScanBudget: the start of a Responses answer that a stream
// holds to read the response's id counts against MaxBufferedBytes with the
// request bodies: on any number of streams at once the total stays within
// the budget, a scan that does not fit gives up learning the id (the
// continuation is then routed as any request) without failing the
// response, and what the scans held returns to the budget when they end,
// when the response ends, and when the stream is cancelled mid-response.
func TestResponseIDScanBudget(t *testing.T) {
	const limit = 8 << 10 // two scan buffers of 4 KiB; the body cap is 4 KiB
	b := newBalancer(t, 2, nil)
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: parserWithCap(t, 4<<10), MaxBufferedBytes: limit,
		Fallbacks: 1, Logger: quiet})
	require.NoError(t, err)
	h := serve(t, srv, b)
	buffered := func() int64 { return extproc.Buffered(srv) }

	// route sends a Responses request and returns its stream, routed, and
	// the endpoint it is routed to.
	route := func(body string) (*envoy, string) {
		t.Helper()
		e := h.open(t, fullDuplex, fullDuplex)
		e.send(requestHeaders("/v1/responses", false))
		e.send(requestBody([]byte(body), true))
		m := e.recv()
		hr := m.GetRequestHeaders()
		require.NotNil(t, hr, "got %v", m)
		streamedBack(t, e.recv(), true)
		return e, routeOf(t, m, hr.GetResponse()).header
	}
	// chunk sends a piece of the response body and checks that it comes
	// back unchanged.
	chunk := func(e *envoy, s string, eos bool) {
		t.Helper()
		e.send(responseBody(s, eos))
		sr := streamedBack(t, e.recv(), false)
		require.Equal(t, s, string(sr.GetBody()))
		require.Equal(t, eos, sr.GetEndOfStream())
	}
	created := func(id string) string {
		return "event: response.created\n" +
			`data: {"type":"response.created","response":{"id":"` + id + `","status":"in_progress"}}` + "\n\n"
	}
	comment := func(n int) string { return ": " + strings.Repeat("x", n-3) + "\n" }

	// A budget smaller than the scan: the id, after 10 KiB of comments, is
	// not learned, and the response is served whole.
	e, _ := route(`{"model":"m","input":"hi","stream":true}`)
	e.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	chunk(e, comment(3<<10), false)
	require.Equal(t, int64(4<<10), buffered(), "the scan holds 4 KiB")
	chunk(e, comment(3<<10), false)
	require.Equal(t, int64(limit), buffered(), "the scan holds 8 KiB")
	chunk(e, comment(4<<10), false)
	require.Zero(t, buffered(), "the scan gave up and let its bytes go")
	chunk(e, created("resp_late"), true)
	require.NoError(t, e.closeAndWait())
	require.Zero(t, buffered())
	// One within the budget is learned.
	e, home := route(`{"model":"m","input":"hi","stream":true}`)
	e.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	chunk(e, comment(3<<10)+created("resp_early"), true)
	require.NoError(t, e.closeAndWait())
	require.Zero(t, buffered())

	// A request pinned to the endpoint holding its response is sent
	// there with no fallback; any other with one.
	e, got := route(`{"model":"m","input":"more","previous_response_id":"resp_early"}`)
	require.Equal(t, strings.Split(home, ",")[0], got, "the id within the budget was learned")
	e.cancel()
	e, got = route(`{"model":"m","input":"more","previous_response_id":"resp_late"}`)
	require.Contains(t, got, ",", "the id beyond the budget was learned")
	e.cancel()
	waitIdle(t, b)
	require.Zero(t, buffered())

	// Many streams at once: each scan takes 4 KiB while it waits for the
	// end of a line; the first two fill the budget, the others give up.
	const n = 6
	streams := make([]*envoy, n)
	for i := range streams {
		streams[i], _ = route(`{"model":"m","input":"hi","stream":true}`)
	}
	// A routed body is let go right after its answers are sent.
	require.Eventually(t, func() bool { return buffered() == 0 }, 5*time.Second, time.Millisecond, "routed request bodies are let go")
	for i, e := range streams {
		e.send(responseHeaders(200, "text/event-stream", false))
		require.NotNil(t, e.recv().GetResponseHeaders())
		chunk(e, "event: response.created\ndata: {", false)
		require.Equal(t, int64(min(i+1, 2)*4<<10), buffered(), "after stream %d", i)
	}
	// A request body finds the budget full.
	full := h.open(t, fullDuplex, fullDuplex)
	full.send(requestHeaders("/v1/responses", false))
	full.send(requestBody([]byte(`{"model":"m","input":"x"}`), true))
	requireBudgetRefusal(t, full.recv())

	// The first stream is cancelled mid-response, the second ends its
	// scan by finding its id, the others end.
	streams[0].cancel()
	require.Eventually(t, func() bool { return buffered() == 4<<10 }, 5*time.Second, time.Millisecond)
	chunk(streams[1], `"type":"response.created","response":{"id":"resp_1"}}`+"\n\n", false)
	require.Zero(t, buffered())
	for _, e := range streams[2:] {
		chunk(e, `"type":"response.created","response":{"id":"resp_x"}}`+"\n\n", false)
		chunk(e, "data: [DONE]\n\n", true)
		require.NoError(t, e.closeAndWait())
	}
	chunk(streams[1], "data: [DONE]\n\n", true)
	require.NoError(t, streams[1].closeAndWait())
	require.Zero(t, buffered())
	waitIdle(t, b)

	// Streams on goroutines of their own, a third cancelled mid-response:
	// the budget is never exceeded, and is whole again at the end.
	const m = 16
	es := make([]*envoy, m)
	for i := range es {
		es[i], _ = route(`{"model":"m","input":"hi","stream":true}`)
	}
	var wg sync.WaitGroup
	var over atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Microsecond)
		defer tick.Stop()
		for {
			if n := buffered(); n > limit {
				over.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	for i, e := range es {
		wg.Go(func() {
			// Only the test's goroutine may stop the test: errors are
			// reported with t.Error.
			exchange := func(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if err := e.s.Send(m); err != nil {
					t.Error(err)
					return nil
				}
				a, err := e.s.Recv()
				if err != nil {
					t.Error(err)
				}
				return a
			}
			if exchange(responseHeaders(200, "text/event-stream", false)).GetResponseHeaders() == nil {
				t.Error("no answer to the response headers")
				return
			}
			for _, c := range []string{"event: response.created\n", "data: {", strings.Repeat("x", 3<<10)} {
				a := exchange(responseBody(c, false))
				if got := a.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); string(got) != c {
					t.Errorf("a chunk came back as %q", got)
					return
				}
			}
			if i%3 == 0 {
				e.cancel()
				return
			}
			exchange(responseBody("\n\n", true))
			if err := e.s.CloseSend(); err != nil {
				t.Error(err)
			}
			for {
				if _, err := e.s.Recv(); err != nil {
					if err != io.EOF {
						t.Error(err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return buffered() == 0 }, 5*time.Second, time.Millisecond)
	close(stop)
	<-sampled
	require.Zero(t, over.Load(), "the budget was exceeded")
	waitIdle(t, b)
}

// TestHeadersShareTheBudget: the request headers a stream holds count
// against MaxBufferedBytes with the bodies, until the request is routed:
// headers that would take the total over it are refused with 429, alone
// or beside other streams' headers, and a routed request's headers no
// longer count, while its response goes on.
func TestHeadersShareTheBudget(t *testing.T) {
	const limit = 64 << 10
	b := newBalancer(t, 2, nil)
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: parserWithCap(t, 4<<10), MaxBufferedBytes: limit, Logger: quiet})
	require.NoError(t, err)
	h := serve(t, srv, b)
	big := strings.Repeat("v", 40<<10) // more than half the budget
	body := []byte(`{"model":"m","prompt":"x","max_tokens":4}`)

	// Headers over the whole budget are refused, in any body mode.
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered, streamed} {
		e := h.open(t, mode, fullDuplex)
		e.send(requestHeaders("/v1/completions", false, "x-big", big+big))
		requireBudgetRefusal(t, e.recv())
		require.NoError(t, e.closeAndWait())
		require.Zero(t, extproc.Buffered(srv))
	}

	// One stream's headers wait for its body (FULL_DUPLEX_STREAMED): a
	// second stream's as large do not fit beside them.
	first := h.open(t, fullDuplex, fullDuplex)
	first.send(requestHeaders("/v1/completions", false, "x-big", big))
	require.Eventually(t, func() bool { return extproc.Buffered(srv) > 40<<10 }, 10*time.Second, time.Millisecond)
	second := h.open(t, fullDuplex, fullDuplex)
	second.send(requestHeaders("/v1/completions", false, "x-big", big))
	requireBudgetRefusal(t, second.recv())
	require.NoError(t, second.closeAndWait())

	// Routed, the first lets its headers go while its response streams:
	// another as large fits.
	first.send(requestBody(body, true))
	require.NotNil(t, first.recv().GetRequestHeaders())
	streamedBack(t, first.recv(), true)
	require.Zero(t, extproc.Buffered(srv))
	first.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, first.recv().GetResponseHeaders())
	third := h.open(t, buffered, fullDuplex)
	third.send(requestHeaders("/v1/completions", false, "x-big", big))
	require.NotNil(t, third.recv().GetRequestHeaders(), "the headers fit")
	third.send(requestBody(body, true))
	require.NotNil(t, third.recv().GetRequestBody(), "routed")
	require.Zero(t, extproc.Buffered(srv))

	// Headers held until the stream ends unrouted are let go then.
	fourth := h.open(t, fullDuplex, fullDuplex)
	fourth.send(requestHeaders("/v1/completions", false, "x-big", big))
	require.Eventually(t, func() bool { return extproc.Buffered(srv) > 40<<10 }, 10*time.Second, time.Millisecond)
	fourth.cancel()
	require.Eventually(t, func() bool { return extproc.Buffered(srv) == 0 }, 10*time.Second, time.Millisecond)
	first.cancel()
	third.cancel()
	waitIdle(t, b)
}

// A request that could not fit even alone, its headers beside a body at the
// cap over a MaxBufferedBytes set to that cap, is refused with 413, which
// retrying would not change, not with the 429 of a budget full for now.
func TestRequestOverTheWholeBudget(t *testing.T) {
	const limit = 8 << 10
	b := newBalancer(t, 2, nil)
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: parserWithCap(t, limit), MaxBufferedBytes: limit, Logger: quiet})
	require.NoError(t, err)
	h := serve(t, srv, b)
	body := []byte(`{"model":"m","max_tokens":4,"prompt":"` + strings.Repeat("x", limit-64) + `"}`)
	require.LessOrEqual(t, len(body), limit)
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered} {
		e := h.open(t, mode, fullDuplex)
		e.send(requestHeaders("/v1/completions", false, "x-pad", strings.Repeat("v", 512)))
		if mode == buffered {
			require.NotNil(t, e.recv().GetRequestHeaders())
		}
		e.send(requestBody(body, true))
		ir := e.recv().GetImmediateResponse()
		require.NotNil(t, ir)
		require.Equal(t, typev3.StatusCode_PayloadTooLarge, ir.GetStatus().GetCode(), "mode %v", mode)
		require.NoError(t, e.closeAndWait())
		require.Zero(t, extproc.Buffered(srv))
	}
	waitIdle(t, b)
}
