package extproc_test

import (
	"io"
	"net"
	"testing"
	"time"

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
	body := chatBody(limit-200, false)

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
