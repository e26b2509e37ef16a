package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

const (
	fullDuplex = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered   = filterv3.ProcessingMode_BUFFERED
	streamed   = filterv3.ProcessingMode_STREAMED
	none       = filterv3.ProcessingMode_NONE
)

// TestFullDuplexStreamed drives a whole request as Envoy does in the mode
// the protocol requires: headers and body chunks sent without waiting, the
// route and the body streamed back, then the response's headers and chunks;
// FirstToken at the first "data:" line, even split across chunks, Done at the
// end of the response.
func TestFullDuplexStreamed(t *testing.T) {
	rec := &doneRecorder{}
	b := newBalancer(t, 4, nil, llmlb.WithObserver(rec.observer()))
	h := start(t, extproc.Config{Balancer: b})
	e := h.open(t, fullDuplex, fullDuplex)

	body := chatBody(3000, true)
	e.send(requestHeaders("/v1/chat/completions", false, "x-gateway-destination-endpoint", "6.6.6.6:1"))
	e.send(requestBody(body[:1000], false))
	e.send(requestBody(body[1000:2000], false))
	e.send(requestBody(body[2000:], true))

	m := e.recv()
	hr := m.GetRequestHeaders()
	require.NotNil(t, hr, "want the headers response first, got %v", m)
	r := routeOf(t, m, hr.GetResponse())
	require.Regexp(t, `^10\.0\.0\.[1-4]:8000$`, r.header)
	require.Equal(t, r.header, r.metadata, "the header and the metadata must agree")
	require.Equal(t, strconv.Itoa(len(body)), r.contentLength)
	require.True(t, r.clearCache)
	sr := streamedBack(t, e.recv(), true)
	require.Equal(t, body, sr.GetBody(), "the body goes upstream unchanged")
	require.True(t, sr.GetEndOfStream())

	picked := r.header
	st := stats(b, picked)
	require.EqualValues(t, 1, st.Outstanding)
	require.EqualValues(t, 1, st.Queued)

	e.send(responseHeaders(200, "text/event-stream", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	for _, chunk := range []string{": keep-alive\n\n", "event: x\nda"} {
		e.send(responseBody(chunk, false))
		require.Equal(t, chunk, string(streamedBack(t, e.recv(), false).GetBody()))
		require.EqualValues(t, 1, stats(b, picked).Queued, "no first token before a data line (after %q)", chunk)
	}
	e.send(responseBody("ta: {\"x\":1}\n\n", false))
	streamedBack(t, e.recv(), false)
	require.EqualValues(t, 0, stats(b, picked).Queued, "FirstToken at the first data line")
	require.EqualValues(t, 1, stats(b, picked).Outstanding)
	e.send(responseBody("data: [DONE]\n\n", true))
	require.True(t, streamedBack(t, e.recv(), false).GetEndOfStream())
	require.NoError(t, e.closeAndWait())
	require.True(t, idle(b), "%+v", b.Stats())
	errs, keys := rec.get()
	require.Equal(t, []error{nil}, errs)
	require.Equal(t, []string{picked}, keys)
}

// TestBufferedMode: the headers pass at once, the route is set in the answer
// to the buffered body, and the response's buffered body ends the request.
func TestBufferedMode(t *testing.T) {
	b := newBalancer(t, 3, nil)
	h := start(t, extproc.Config{Balancer: b})
	e := h.open(t, buffered, buffered)
	e.send(requestHeaders("/v1/completions", false))
	m := e.recv()
	require.NotNil(t, m.GetRequestHeaders())
	require.Empty(t, m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders(), "nothing to route on yet")

	e.send(requestBody([]byte(`{"model":"m","prompt":"hi","max_tokens":5}`), true))
	m = e.recv()
	require.NotNil(t, m.GetRequestBody(), "got %v", m)
	r := routeOf(t, m, m.GetRequestBody().GetResponse())
	require.NotEmpty(t, r.header)
	require.Equal(t, r.header, r.metadata)
	require.Empty(t, r.contentLength, "a buffered body keeps its Content-Length")
	require.True(t, r.clearCache)
	require.Nil(t, m.GetRequestBody().GetResponse().GetBodyMutation(), "the body is not changed")
	require.EqualValues(t, 1, stats(b, r.header).Outstanding)

	e.send(responseHeaders(200, "application/json", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody(`{"choices":[]}`, true))
	require.NotNil(t, e.recv().GetResponseBody())
	require.True(t, idle(b))
	require.NoError(t, e.closeAndWait())
}

// TestStreamedModeRoutesOnHeaders: in STREAMED (and NONE) mode the headers
// go upstream before the body reaches the picker, so the route is in the
// headers answer, and body chunks are let through.
func TestStreamedModeRoutesOnHeaders(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{streamed, none} {
		t.Run(mode.String(), func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, mode, mode)
			e.send(requestHeaders("/v1/completions", false, "x-session-id", "s1"))
			m := e.recv()
			r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
			require.NotEmpty(t, r.header)
			if mode == streamed {
				e.send(requestBody([]byte(`{"prompt":"a"`), false))
				require.NotNil(t, e.recv().GetRequestBody())
				e.send(requestBody([]byte(`}`), true))
				require.NotNil(t, e.recv().GetRequestBody())
				e.send(responseHeaders(200, "text/event-stream", false))
				require.NotNil(t, e.recv().GetResponseHeaders())
				e.send(responseBody("data: x\n\n", false))
				require.NotNil(t, e.recv().GetResponseBody())
				require.EqualValues(t, 0, stats(b, r.header).Queued)
				e.send(responseBody("", true))
				require.NotNil(t, e.recv().GetResponseBody())
				require.True(t, idle(b))
			} else {
				// Without the response body, the stream's end is the
				// response's end.
				e.send(responseHeaders(200, "text/event-stream", false))
				require.NotNil(t, e.recv().GetResponseHeaders())
				require.EqualValues(t, 1, stats(b, r.header).Outstanding)
			}
			require.NoError(t, e.closeAndWait())
			waitIdle(t, b)
		})
	}
}

// TestLargeBodyChunked: a body streamed back is cut into pieces of at most
// 62000 bytes, end_of_stream on the last only.
func TestLargeBodyChunked(t *testing.T) {
	b := newBalancer(t, 2, nil)
	h := start(t, extproc.Config{Balancer: b})
	e := h.open(t, fullDuplex, fullDuplex)
	body := chatBody(200_000, false)
	e.send(requestHeaders("/v1/chat/completions", false))
	for i := 0; i < len(body); i += 16 << 10 {
		e.send(requestBody(body[i:min(i+16<<10, len(body))], i+16<<10 >= len(body)))
	}
	require.NotNil(t, e.recv().GetRequestHeaders())
	var got []byte
	for {
		sr := streamedBack(t, e.recv(), true)
		require.LessOrEqual(t, len(sr.GetBody()), 62000)
		got = append(got, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	require.Equal(t, body, got)
	e.send(responseHeaders(200, "application/json", true)) // no body
	require.NotNil(t, e.recv().GetResponseHeaders())
	require.True(t, idle(b))
	require.NoError(t, e.closeAndWait())
}

// TestTrailers: request trailers end a FULL_DUPLEX_STREAMED body whose last
// chunk has no end_of_stream; response trailers end the response.
func TestTrailers(t *testing.T) {
	b := newBalancer(t, 2, nil)
	h := start(t, extproc.Config{Balancer: b})
	e := h.open(t, fullDuplex, fullDuplex)
	body := chatBody(500, true)
	e.send(requestHeaders("/v1/chat/completions", false))
	e.send(requestBody(body, false))
	e.send(requestTrailers())
	m := e.recv()
	r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
	require.NotEmpty(t, r.header)
	sr := streamedBack(t, e.recv(), true)
	require.Equal(t, body, sr.GetBody())
	require.False(t, sr.GetEndOfStream(), "the trailers end the body")
	require.NotNil(t, e.recv().GetRequestTrailers(), "headers, body, trailers: in order")

	e.send(responseHeaders(200, "application/grpc", false))
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody("\x00\x00\x00\x00\x01x", false))
	require.False(t, streamedBack(t, e.recv(), false).GetEndOfStream())
	require.EqualValues(t, 0, stats(b, r.header).Queued, "the first byte of a body that is not an event stream")
	require.EqualValues(t, 1, stats(b, r.header).Outstanding)
	e.send(responseTrailers())
	require.NotNil(t, e.recv().GetResponseTrailers())
	require.True(t, idle(b))
	require.NoError(t, e.closeAndWait())
}

// TestNoBody: a request without a body is routed on its headers.
func TestNoBody(t *testing.T) {
	b := newBalancer(t, 2, nil)
	h := start(t, extproc.Config{Balancer: b})
	e := h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/models", true))
	m := e.recv()
	r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
	require.NotEmpty(t, r.header)
	require.Empty(t, r.contentLength)
	e.send(responseHeaders(200, "application/json", false))
	e.recv()
	e.send(responseBody(`{"data":[]}`, true))
	e.recv()
	require.True(t, idle(b))
	require.NoError(t, e.closeAndWait())
}

// TestDisconnect: a client that goes away mid-stream (Envoy resets the
// ext_proc stream), at any point, leaves no accounting behind.
func TestDisconnect(t *testing.T) {
	steps := []struct {
		name  string
		until func(e *envoy, body []byte)
	}{
		{"mid-request-body", func(e *envoy, body []byte) {
			e.send(requestHeaders("/v1/chat/completions", false))
			e.send(requestBody(body[:10], false))
		}},
		{"before-response", func(e *envoy, body []byte) {
			e.send(requestHeaders("/v1/chat/completions", false))
			e.send(requestBody(body, true))
			e.recv()
			e.recv()
		}},
		{"mid-response-stream", func(e *envoy, body []byte) {
			e.send(requestHeaders("/v1/chat/completions", false))
			e.send(requestBody(body, true))
			e.recv()
			e.recv()
			e.send(responseHeaders(200, "text/event-stream", false))
			e.recv()
			e.send(responseBody("data: {}\n\n", false))
			e.recv()
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			rec := &doneRecorder{}
			b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
			adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 10})
			require.NoError(t, err)
			h := start(t, extproc.Config{Balancer: b, Admission: adm})
			e := h.open(t, fullDuplex, fullDuplex)
			s.until(e, chatBody(100, true))
			e.cancel()
			waitIdle(t, b)
			require.Eventually(t, func() bool { return adm.InFlight() == 0 }, 5*time.Second, time.Millisecond)
			errs, _ := rec.get()
			for _, err := range errs {
				require.ErrorIs(t, err, extproc.ErrStreamEnded)
				require.ErrorIs(t, err, context.Canceled)
			}
		})
	}
}

// TestDisconnectWhileSending: a data plane that cancels the stream while
// the picker is streaming a response body back to it (its flow-control
// window full) is a cancellation like any other: the pick is done with an
// error wrapping ErrStreamEnded and context.Canceled, which observers and
// metrics count as cancelled, not failed.
func TestDisconnectWhileSending(t *testing.T) {
	rec := &doneRecorder{}
	b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
	// A fixed window: the picker can send no more than 64 KiB the data
	// plane has not read.
	h := start(t, extproc.Config{Balancer: b}, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	e := h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/chat/completions", false))
	e.send(requestBody(chatBody(100, true), true))
	e.recv()
	e.recv()
	e.send(responseHeaders(200, "text/event-stream", false))
	e.recv()
	e.send(responseBody(strings.Repeat("data: {}\n\n", 100_000), false)) // 1 MB, streamed back in pieces
	streamedBack(t, e.recv(), false)                                     // the picker is sending
	e.cancel()
	waitIdle(t, b)
	errs, _ := rec.get()
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], extproc.ErrStreamEnded)
	require.ErrorIs(t, errs[0], context.Canceled)
}

// TestImmediateResponses: refusals are immediate responses with the
// protocol's statuses, a JSON body without internal detail, and the
// stream ends with no accounting left.
func TestImmediateResponses(t *testing.T) {
	cases := []struct {
		name       string
		endpoints  int
		cfg        func(t *testing.T, cfg *extproc.Config)
		md         func(e *envoy)
		body       []byte
		code       typev3.StatusCode
		retryAfter string
		dropped    string // x-llm-d-request-dropped-reason
	}{
		{name: "no-endpoints", endpoints: 0, code: typev3.StatusCode_ServiceUnavailable, dropped: "rejected-no-endpoints"},
		{name: "empty-subset", endpoints: 3, md: func(e *envoy) { e.md = subsetMetadata() }, code: typev3.StatusCode_ServiceUnavailable,
			dropped: "rejected-no-endpoints"},
		{name: "subset-outside-pool", endpoints: 3, md: func(e *envoy) { e.md = subsetMetadata("192.168.0.1:8000") }, code: typev3.StatusCode_ServiceUnavailable,
			dropped: "rejected-no-endpoints"},
		{name: "overloaded", endpoints: 2, code: typev3.StatusCode_TooManyRequests, retryAfter: "3", dropped: "rejected-saturated", cfg: func(t *testing.T, cfg *extproc.Config) {
			adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 1, RetryAfter: 2500 * time.Millisecond})
			require.NoError(t, err)
			release, err := adm.Acquire("")
			require.NoError(t, err)
			t.Cleanup(release)
			cfg.Admission = adm
		}},
		{name: "overloaded-for-ever", endpoints: 2, code: typev3.StatusCode_TooManyRequests, retryAfter: "9223372037", dropped: "rejected-saturated", cfg: func(t *testing.T, cfg *extproc.Config) {
			adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 1, RetryAfter: math.MaxInt64})
			require.NoError(t, err)
			release, err := adm.Acquire("")
			require.NoError(t, err)
			t.Cleanup(release)
			cfg.Admission = adm
		}},
		{name: "body-too-large", endpoints: 2, body: chatBody(4096, false), code: typev3.StatusCode_PayloadTooLarge, cfg: func(t *testing.T, cfg *extproc.Config) {
			p, err := httplb.NewParser(httplb.ParserConfig{MaxBodyBytes: 1024})
			require.NoError(t, err)
			cfg.Parser = p
		}},
		{name: "unauthenticated", endpoints: 2, code: typev3.StatusCode_Unauthorized, cfg: func(t *testing.T, cfg *extproc.Config) {
			p, err := httplb.NewParser(httplb.ParserConfig{Tenant: func(r *http.Request) (string, error) {
				return "", errors.New("secret token 10.9.8.7 rejected")
			}})
			require.NoError(t, err)
			cfg.Parser = p
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, c.endpoints, nil)
			cfg := extproc.Config{Balancer: b}
			if c.cfg != nil {
				c.cfg(t, &cfg)
			}
			h := start(t, cfg)
			e := h.open(t, fullDuplex, fullDuplex)
			if c.md != nil {
				c.md(e)
			}
			body := c.body
			if body == nil {
				body = chatBody(100, true)
			}
			e.send(requestHeaders("/v1/chat/completions", false))
			e.send(requestBody(body, true))
			m := e.recv()
			ir := m.GetImmediateResponse()
			require.NotNil(t, ir, "got %v", m)
			require.Equal(t, c.code, ir.GetStatus().GetCode())
			hdrs := map[string]string{}
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				hdrs[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
			}
			require.Equal(t, "application/json", hdrs["content-type"])
			require.Equal(t, c.retryAfter, hdrs["retry-after"])
			require.Equal(t, c.dropped, hdrs[extproc.DroppedReasonHeader])
			require.Equal(t, "req-1", hdrs["x-request-id"])
			var doc struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(ir.GetBody(), &doc), "%s", ir.GetBody())
			require.Equal(t, int(c.code), doc.Error.Code)
			require.Contains(t, doc.Error.Message, "req-1")
			for _, leak := range []string{"llmlb", "extproc", "10.", "secret", "over 1024"} {
				require.NotContains(t, string(ir.GetBody()), leak)
			}
			require.NotEmpty(t, ir.GetDetails())
			_, err := e.s.Recv()
			require.ErrorIs(t, err, io.EOF, "the stream ends after an immediate response")
			require.True(t, idle(b))
			if cfg.Admission != nil {
				require.Equal(t, 1, cfg.Admission.InFlight(), "only the test's own slot is held")
			}
		})
	}
}

// TestSubsetHint: the picker chooses only among the endpoints of the data
// plane's subset hint, matched by address.
func TestSubsetHint(t *testing.T) {
	b := newBalancer(t, 6, nil)
	h := start(t, extproc.Config{Balancer: b, Fallbacks: 3})
	for range 20 {
		e := h.open(t, fullDuplex, fullDuplex)
		e.md = subsetMetadata("10.0.0.2:8000", "10.0.0.5:9999") // the port is not compared
		e.send(requestHeaders("/v1/completions", true))
		m := e.recv()
		r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
		list := strings.Split(r.header, ",")
		require.ElementsMatch(t, []string{"10.0.0.2:8000", "10.0.0.5:8000"}, list, "fallbacks too stay in the subset")
		require.NoError(t, e.closeAndWait())
	}
	waitIdle(t, b)
}

// TestFallbacks: the destination lists the pick and then distinct
// fallbacks, fewest in flight first; header and metadata agree.
func TestFallbacks(t *testing.T) {
	b := newBalancer(t, 5, llmlb.RoundRobin())
	h := start(t, extproc.Config{Balancer: b, Fallbacks: 2})
	busy := h.open(t, fullDuplex, fullDuplex) // keeps one request in flight
	busy.send(requestHeaders("/v1/completions", true))
	m := busy.recv()
	busyKey := routeOf(t, m, m.GetRequestHeaders().GetResponse()).header
	busyKey = strings.Split(busyKey, ",")[0]

	for range 10 {
		e := h.open(t, fullDuplex, fullDuplex)
		e.send(requestHeaders("/v1/completions", true))
		m := e.recv()
		r := routeOf(t, m, m.GetRequestHeaders().GetResponse())
		require.Equal(t, r.header, r.metadata)
		list := strings.Split(r.header, ",")
		require.Len(t, list, 3)
		require.NotEqual(t, list[0], list[1])
		require.NotEqual(t, list[1], list[2])
		require.NotEqual(t, list[0], list[2])
		require.NotContains(t, list[1:], busyKey, "the busy endpoint comes after idle ones")
		require.NoError(t, e.closeAndWait())
	}
	require.NoError(t, busy.closeAndWait())
	waitIdle(t, b)
}

// routeWithFallbacks routes a streamed chat request on b, a balancer of
// three endpoints, with two fallbacks, and returns the exchange and the
// route: the picked endpoint, then the fallbacks.
func routeWithFallbacks(t *testing.T, b *llmlb.Balancer) (*envoy, []string) {
	t.Helper()
	h := start(t, extproc.Config{Balancer: b, Fallbacks: 2})
	e := h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/chat/completions", false))
	e.send(requestBody(chatBody(100, true), true))
	m := e.recv()
	list := strings.Split(routeOf(t, m, m.GetRequestHeaders().GetResponse()).header, ",")
	e.recv()
	require.Len(t, list, 3)
	return e, list
}

// TestServedFailover: when the data plane reports that a fallback served the
// request, the request is charged to it from then on.
func TestServedFailover(t *testing.T) {
	rec := &doneRecorder{}
	b := newBalancer(t, 3, nil, llmlb.WithObserver(rec.observer()))
	e, list := routeWithFallbacks(t, b)
	e.respMD = servedMetadata(list[1])
	e.send(responseHeaders(200, "text/event-stream", false))
	e.recv()
	require.EqualValues(t, 0, stats(b, list[0]).Outstanding)
	require.EqualValues(t, 1, stats(b, list[1]).Outstanding)
	e.send(responseBody("data: 1\n\n", true))
	e.recv()
	require.NoError(t, e.closeAndWait())
	require.True(t, idle(b))
	errs, keys := rec.get()
	require.Len(t, errs, 2)
	require.ErrorIs(t, errs[0], extproc.ErrFailedOver)
	require.Equal(t, list[0], keys[0])
	require.NoError(t, errs[1])
	require.Equal(t, list[1], keys[1])
}

// TestUpstreamError: an error status is not a first token and finishes the
// pick with a *retry.StatusError.
func TestUpstreamError(t *testing.T) {
	rec := &doneRecorder{}
	b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
	h := start(t, extproc.Config{Balancer: b})
	e := h.open(t, fullDuplex, fullDuplex)
	e.send(requestHeaders("/v1/completions", true))
	key := routeOf(t, e.recv(), nil).metadata
	e.send(responseHeaders(503, "application/json", false))
	e.recv()
	e.send(responseBody(`{"error":"busy"}`, false))
	e.recv()
	require.EqualValues(t, 1, stats(b, key).Queued, "an error body is no first token")
	e.send(responseBody("", true))
	e.recv()
	require.NoError(t, e.closeAndWait())
	require.True(t, idle(b))
	errs, _ := rec.get()
	var se *retry.StatusError
	require.ErrorAs(t, errs[0], &se)
	require.Equal(t, 503, se.Code)
}

// TestProtocolViolations: messages out of order end the stream with a
// gRPC error, never a panic, and leave no accounting.
func TestProtocolViolations(t *testing.T) {
	cases := []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
		mode filterv3.ProcessingMode_BodySendMode // of the request
	}{
		{"response-before-route", []*extprocv3.ProcessingRequest{requestHeaders("/", false), responseHeaders(200, "x", false)}, fullDuplex},
		{"body-before-route", []*extprocv3.ProcessingRequest{responseBody("x", true)}, fullDuplex},
		{"trailers-before-route", []*extprocv3.ProcessingRequest{responseTrailers()}, fullDuplex},
		{"headers-twice", []*extprocv3.ProcessingRequest{requestHeaders("/", false), requestHeaders("/", false)}, fullDuplex},
		{"request-after-response", []*extprocv3.ProcessingRequest{requestHeaders("/", true), responseHeaders(200, "x", false), requestBody(nil, true)}, fullDuplex},
		// Trailers route a request whose headers are skipped; headers
		// arriving after them must not route it again.
		{"headers-after-trailers", []*extprocv3.ProcessingRequest{requestTrailers(), requestHeaders("/", true)}, buffered},
		{"headers-after-trailers-streamed", []*extprocv3.ProcessingRequest{requestTrailers(), requestHeaders("/", true)}, streamed},
		{"headers-after-trailers-duplex", []*extprocv3.ProcessingRequest{requestTrailers(), requestHeaders("/", true)}, fullDuplex},
		{"headers-after-trailers-none", []*extprocv3.ProcessingRequest{requestTrailers(), requestHeaders("/", true)}, none},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 2})
			require.NoError(t, err)
			h := start(t, extproc.Config{Balancer: b, Admission: adm})
			e := h.open(t, c.mode, fullDuplex)
			for _, m := range c.msgs {
				e.send(m)
			}
			// Half-closed, a stream that breaks no rule ends with io.EOF
			// instead of waiting for more.
			require.NoError(t, e.s.CloseSend())
			err = nil
			for err == nil {
				_, err = e.s.Recv()
			}
			require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
			waitIdle(t, b)
			require.Eventually(t, func() bool { return adm.InFlight() == 0 }, 5*time.Second, time.Millisecond, "admission not released")
		})
	}
}

// TestObservabilityMode: in observability mode the data plane ignores
// answers, so none is sent, and the response still completes the pick.
func TestObservabilityMode(t *testing.T) {
	b := newBalancer(t, 2, nil)
	srv, err := extproc.NewServer(extproc.Config{Balancer: b, Logger: quiet})
	require.NoError(t, err)
	mark := func(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest {
		m.ObservabilityMode = true
		return m
	}
	d := &directStream{ctx: context.Background(), in: []*extprocv3.ProcessingRequest{
		mark(requestHeaders("/v1/completions", false)), mark(requestBody([]byte(`{"prompt":"x"}`), true)),
		mark(responseHeaders(200, "text/event-stream", false)), mark(responseBody("data: 1\n\n", true)),
	}}
	require.NoError(t, srv.Process(d))
	require.Empty(t, d.out)
	require.True(t, idle(b))
}

// TestTenantAndSession: the tenant comes from the trusted header, the
// session key from X-Session-ID, and both reach the balancer's request (a
// session stays on one endpoint under consistent hashing, tenants apart).
func TestTenantAndSession(t *testing.T) {
	pol, err := llmlb.ConsistentHash(llmlb.HashConfig{})
	require.NoError(t, err)
	b := newBalancer(t, 8, pol)
	p, err := httplb.NewParser(httplb.ParserConfig{TrustTenantHeader: "x-gateway-inference-fairness-id"})
	require.NoError(t, err)
	h := start(t, extproc.Config{Balancer: b, Parser: p})
	pickFor := func(tenant, session string) string {
		e := h.open(t, fullDuplex, fullDuplex)
		e.send(requestHeaders("/v1/chat/completions", false, "x-gateway-inference-fairness-id", tenant, "x-session-id", session))
		e.send(requestBody(chatBody(200, true), true))
		m := e.recv()
		e.recv()
		require.NoError(t, e.closeAndWait())
		return routeOf(t, m, m.GetRequestHeaders().GetResponse()).header
	}
	first := pickFor("a", "s1")
	for range 5 {
		require.Equal(t, first, pickFor("a", "s1"))
	}
	differs := false
	for i := range 10 {
		differs = differs || pickFor("t"+strconv.Itoa(i), "s1") != first
	}
	require.True(t, differs, "the session key is scoped by the tenant")
	waitIdle(t, b)
}

// TestParseBodyMatchesParse: httplb's ParseBody reads a body as Parse reads
// the same request.
func TestParseBodyMatchesParse(t *testing.T) {
	p, err := httplb.NewParser(httplb.ParserConfig{TrustTenantHeader: "X-Tenant"})
	require.NoError(t, err)
	for _, body := range [][]byte{chatBody(5000, true), []byte(`{"prompt":"abc","user":"u","max_tokens":7}`), []byte(`not json`), nil} {
		r, err := http.NewRequest("POST", "http://gw/v1/chat/completions", bytes.NewReader(body))
		require.NoError(t, err)
		r.Header.Set("X-Tenant", "t1")
		want, err := p.Parse(r)
		require.NoError(t, err)
		r2, _ := http.NewRequest("POST", "http://gw/v1/chat/completions", nil)
		r2.Header.Set("X-Tenant", "t1")
		got, err := p.ParseBody(r2, body)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err = p.ParseBody(&http.Request{Header: http.Header{}}, make([]byte, p.MaxBodyBytes()+1))
	require.ErrorIs(t, err, httplb.ErrBodyTooLarge)
}

// TestNewServerConfig: invalid configurations are rejected.
func TestNewServerConfig(t *testing.T) {
	b := newBalancer(t, 1, nil)
	for _, cfg := range []extproc.Config{{}, {Balancer: b, Fallbacks: -1}, {Balancer: b, Fallbacks: extproc.MaxFallbacks + 1}} {
		_, err := extproc.NewServer(cfg)
		require.ErrorIs(t, err, extproc.ErrInvalidConfig)
	}
}

// TestTrailersWithoutBody: request trailers that follow answered (BUFFERED)
// or skipped headers with no body get exactly one answer, the trailers',
// which carries the route in its metadata; a second headers answer, or a
// body answer for a body never sent, is a spurious message that makes the
// data plane fail the request.
func TestTrailersWithoutBody(t *testing.T) {
	cases := []struct {
		name    string
		mode    filterv3.ProcessingMode_BodySendMode
		headers bool // the request headers are sent (else skipped)
	}{
		{"buffered", buffered, true},
		{"buffered-headers-skipped", buffered, false},
		{"streamed-headers-skipped", streamed, false},
		{"duplex-headers-skipped", fullDuplex, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, c.mode, fullDuplex)
			if c.headers {
				e.send(requestHeaders("/v1/models", false))
				require.NotNil(t, e.recv().GetRequestHeaders(), "BUFFERED headers are let through")
			}
			e.send(requestTrailers())
			m := e.recv()
			require.NotNil(t, m.GetRequestTrailers(), "the only answer owed is the trailers', got %v", m)
			r := routeOf(t, m, nil)
			require.NotEmpty(t, r.metadata, "the route")
			require.EqualValues(t, 1, stats(b, r.metadata).Outstanding)
			e.send(responseHeaders(200, "application/json", true))
			require.NotNil(t, e.recv().GetResponseHeaders())
			require.True(t, idle(b))
			require.NoError(t, e.closeAndWait())
		})
	}
}

// TestServedAfterFirstToken: a data plane that reports the serving endpoint
// only after the first token moves the request to it streaming, not queued.
func TestServedAfterFirstToken(t *testing.T) {
	b := newBalancer(t, 3, nil)
	e, list := routeWithFallbacks(t, b)
	e.send(responseHeaders(200, "text/event-stream", false))
	e.recv()
	e.send(responseBody("data: 1\n\n", false))
	e.recv()
	require.EqualValues(t, 0, stats(b, list[0]).Queued)
	e.respMD = servedMetadata(list[1])
	e.send(responseBody("data: 2\n\n", false))
	e.recv()
	require.EqualValues(t, 0, stats(b, list[0]).Outstanding)
	require.EqualValues(t, 1, stats(b, list[1]).Outstanding)
	require.EqualValues(t, 0, stats(b, list[1]).Queued, "the request streams, yet its new endpoint counts it queued")
	e.send(responseBody("data: 3\n\n", true))
	e.recv()
	require.NoError(t, e.closeAndWait())
	require.True(t, idle(b))
}
