package extproc_test

import (
	"context"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/telemetry"
)

// resetStream is a directStream that Envoy closes as it closes every
// ext_proc stream, by half-closing it and then resetting it: after the
// scripted messages Recv returns io.EOF, or, when the reset wins the race
// in the gRPC server, cancels the stream's context and returns Canceled.
type resetStream struct {
	directStream
	reset  bool
	cancel context.CancelFunc
}

func (r *resetStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(r.in) == 0 && r.reset {
		r.cancel()
		return nil, status.Error(codes.Canceled, "context canceled")
	}
	return r.directStream.Recv()
}

// TestResponseBodyNoneStreamEnd: with response_body_mode NONE the end of the
// stream is the end of the response, however Envoy's close reaches the
// server: after the response headers, a half-close or a reset completes the
// pick alike; before them, the response headers were not sent to the picker
// (response_header_mode SKIP, where Envoy closes the stream once the request
// is answered) or the client went away, and the pick ends with
// ErrStreamEnded wrapping context.Canceled, alike: neither a success that
// would teach the policy a response that never was, nor a failure that
// outlier detection would count against the endpoint.
func TestResponseBodyNoneStreamEnd(t *testing.T) {
	for _, responded := range []bool{true, false} {
		for _, reset := range []bool{false, true} {
			name := map[bool]string{false: "half-close", true: "reset"}[reset] +
				map[bool]string{true: "-after-response", false: "-before-response"}[responded]
			t.Run(name, func(t *testing.T) {
				rec := &doneRecorder{}
				b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
				srv, err := extproc.NewServer(extproc.Config{Balancer: b, Logger: quiet})
				require.NoError(t, err)
				first := requestHeaders("/v1/completions", false)
				first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: none}
				in := []*extprocv3.ProcessingRequest{first, requestBody([]byte(`{"prompt":"x","max_tokens":4}`), true)}
				if responded {
					in = append(in, responseHeaders(200, "text/event-stream", false))
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				err = srv.Process(&resetStream{reset: reset, cancel: cancel, directStream: directStream{ctx: ctx, in: in}})
				require.True(t, idle(b))
				errs, _ := rec.get()
				require.Len(t, errs, 1)
				if responded {
					require.NoError(t, err)
					require.NoError(t, errs[0], "the response completed")
				} else {
					require.NoError(t, err)
					require.ErrorIs(t, errs[0], extproc.ErrStreamEnded)
					require.ErrorIs(t, errs[0], context.Canceled)
					require.Equal(t, retry.Abandoned, retry.HealthOutcome(errs[0]))
					require.Equal(t, "canceled", telemetry.ErrorType(errs[0]))
				}
			})
		}
	}
}

// TestStreamEndedMidResponse: in the modes where the picker sees the
// response, a stream that Envoy closes mid-response, as its ext_proc filter
// does whatever ended the HTTP request (the client went away, the upstream
// failed, a timeout), ends the pick with ErrStreamEnded: a half-close, with
// which Envoy starts every close, as a failure of the endpoint
// (retry.HealthOutcome: Failed), since the picker cannot tell a client that
// left from an upstream that failed; a reset read first, as neither
// (Abandoned). See ErrStreamEnded.
func TestStreamEndedMidResponse(t *testing.T) {
	modes := map[string]filterv3.ProcessingMode_BodySendMode{"full-duplex-streamed": fullDuplex, "streamed": streamed, "buffered": buffered}
	for name, mode := range modes {
		for _, reset := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/half-close", true: "/reset"}[reset], func(t *testing.T) {
				rec := &doneRecorder{}
				b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
				srv, err := extproc.NewServer(extproc.Config{Balancer: b, Logger: quiet})
				require.NoError(t, err)
				first := requestHeaders("/v1/completions", false)
				first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: mode}
				in := []*extprocv3.ProcessingRequest{first, requestBody([]byte(`{"prompt":"x","max_tokens":4,"stream":true}`), true),
					responseHeaders(200, "text/event-stream", false)}
				if mode != buffered { // a buffered body comes whole or not at all
					in = append(in, responseBody("data: {}\n\n", false))
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				require.NoError(t, srv.Process(&resetStream{reset: reset, cancel: cancel, directStream: directStream{ctx: ctx, in: in}}))
				require.True(t, idle(b))
				errs, _ := rec.get()
				require.Len(t, errs, 1)
				require.ErrorIs(t, errs[0], extproc.ErrStreamEnded)
				if reset {
					require.ErrorIs(t, errs[0], context.Canceled)
					require.Equal(t, retry.Abandoned, retry.HealthOutcome(errs[0]))
					return
				}
				require.NotErrorIs(t, errs[0], context.Canceled)
				require.Equal(t, retry.Failed, retry.HealthOutcome(errs[0]))
			})
		}
	}
}

// TestEarlyResponse: an upstream may answer before the request body has all
// reached it (an early error, a bidirectional stream); in the modes where
// the request goes upstream as it arrives, the rest of its body and its
// trailers still pass through the picker, and the response completes the
// pick.
func TestEarlyResponse(t *testing.T) {
	cases := []struct {
		name     string
		mode     filterv3.ProcessingMode_BodySendMode
		trailers bool // the request ends with trailers, not with its body
	}{
		{"streamed", streamed, false},
		{"streamed-trailers", streamed, true},
		{"buffered-trailers", buffered, true},
		{"none-trailers", none, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := &doneRecorder{}
			b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, c.mode, fullDuplex)
			e.send(requestHeaders("/v1/completions", false))
			require.NotNil(t, e.recv().GetRequestHeaders())
			if c.mode != none {
				e.send(requestBody([]byte(`{"prompt":`), false))
				require.NotNil(t, e.recv().GetRequestBody())
			}
			e.send(responseHeaders(200, "text/event-stream", false))
			require.NotNil(t, e.recv().GetResponseHeaders())
			if c.mode == streamed {
				e.send(requestBody([]byte(`"x"}`), !c.trailers))
				require.NotNil(t, e.recv().GetRequestBody())
			}
			if c.trailers {
				e.send(requestTrailers())
				require.NotNil(t, e.recv().GetRequestTrailers())
			}
			e.send(responseBody("data: 1\n\n", true))
			require.True(t, streamedBack(t, e.recv(), false).GetEndOfStream())
			require.NoError(t, e.closeAndWait())
			require.True(t, idle(b))
			errs, _ := rec.get()
			require.Equal(t, []error{nil}, errs)
		})
	}
}

// TestClientDestinationHeader: whatever the body mode, the request that
// reaches the data plane carries the picked destination or none, never one
// the client sent; in BUFFERED mode a request that ends with trailers and
// no body is routed by the metadata alone, its header removed. With the
// request headers not sent to the picker (request_header_mode SKIP), the
// answer to the body sets the header.
func TestClientDestinationHeader(t *testing.T) {
	const forged = "169.254.169.254:80"
	cases := []struct {
		name string
		mode filterv3.ProcessingMode_BodySendMode
		body bool // the request has a body (else it ends with trailers)
		skip bool // the headers are not sent to the picker
	}{
		{"duplex", fullDuplex, true, false},
		{"duplex-trailers", fullDuplex, false, false},
		{"buffered", buffered, true, false},
		{"buffered-trailers", buffered, false, false},
		{"buffered-partial", filterv3.ProcessingMode_BUFFERED_PARTIAL, true, false},
		{"buffered-partial-trailers", filterv3.ProcessingMode_BUFFERED_PARTIAL, false, false},
		{"streamed", streamed, true, false},
		{"none-trailers", none, false, false},
		{"duplex-headers-skipped", fullDuplex, true, true},
		{"duplex-headers-skipped-large", fullDuplex, true, true},
		{"buffered-headers-skipped", buffered, true, true},
		{"buffered-partial-headers-skipped", filterv3.ProcessingMode_BUFFERED_PARTIAL, true, true},
		{"streamed-headers-skipped", streamed, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			srv, err := extproc.NewServer(extproc.Config{Balancer: b, Logger: quiet})
			require.NoError(t, err)
			var in []*extprocv3.ProcessingRequest
			if !c.skip {
				in = append(in, requestHeaders("/v1/completions", false, extproc.DestinationHeader, forged))
			}
			switch {
			case strings.HasSuffix(c.name, "-large"):
				// The body goes back in several pieces: the first sets the route.
				body := chatBody(150_000, false)
				in = append(in, requestBody(body[:70_000], false), requestBody(body[70_000:], true))
			case c.body:
				in = append(in, requestBody([]byte(`{"prompt":"x"}`), true))
			default:
				in = append(in, requestTrailers())
			}
			in[0].ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: c.mode, ResponseBodyMode: fullDuplex}
			d := &directStream{ctx: context.Background(), in: in}
			require.NoError(t, srv.Process(d))

			// The request headers as the data plane forwards them: the
			// client's, changed by every request headers or body answer.
			dest, metadata := forged, ""
			for _, m := range d.out {
				for _, common := range []*extprocv3.CommonResponse{m.GetRequestHeaders().GetResponse(), m.GetRequestBody().GetResponse()} {
					for _, k := range common.GetHeaderMutation().GetRemoveHeaders() {
						if strings.EqualFold(k, extproc.DestinationHeader) {
							dest = ""
						}
					}
					for _, h := range common.GetHeaderMutation().GetSetHeaders() {
						if strings.EqualFold(h.GetHeader().GetKey(), extproc.DestinationHeader) {
							dest = string(h.GetHeader().GetRawValue())
						}
					}
				}
				if v := routeOf(t, m, nil).metadata; v != "" {
					metadata = v
				}
			}
			require.NotEmpty(t, metadata, "routed")
			require.NotEqual(t, forged, dest, "the client chose the destination")
			if dest != "" {
				require.Equal(t, metadata, dest)
			}
			waitIdle(t, b) // the stream ended before the response
		})
	}
}

// TestNoHealthyEndpoint: with every endpoint that may take a request marked
// unhealthy, the request is refused with 503, as the protocol answers when
// no endpoint is ready, instead of being sent to an unhealthy one (the
// balancer's panic mode); a healthy endpoint is picked while there is one,
// also when the subset hint leaves only unhealthy ones besides it.
func TestNoHealthyEndpoint(t *testing.T) {
	cases := []struct {
		name   string
		sick   []string
		subset []string
		want   string // the endpoint picked; "": 503
	}{
		{name: "all-unhealthy", sick: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}},
		{name: "one-healthy", sick: []string{"10.0.0.1:8000", "10.0.0.3:8000"}, want: "10.0.0.2:8000"},
		{name: "subset-all-unhealthy", sick: []string{"10.0.0.1:8000"}, subset: []string{"10.0.0.1:8000"}},
		{name: "subset-one-healthy", sick: []string{"10.0.0.1:8000"}, subset: []string{"10.0.0.1:8000", "10.0.0.3:8000"}, want: "10.0.0.3:8000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := &doneRecorder{}
			b := newBalancer(t, 3, nil, llmlb.WithObserver(rec.observer()))
			for _, k := range c.sick {
				require.NoError(t, b.SetHealthy(k, false))
			}
			h := start(t, extproc.Config{Balancer: b})
			for range 4 {
				e := h.open(t, fullDuplex, fullDuplex)
				if c.subset != nil {
					e.md = subsetMetadata(c.subset...)
				}
				e.send(requestHeaders("/v1/completions", false))
				e.send(requestBody([]byte(`{"model":"m","prompt":"x","max_tokens":4}`), true))
				m := e.recv()
				if c.want == "" {
					ir := m.GetImmediateResponse()
					require.NotNil(t, ir, "want 503, got %v", m)
					require.Equal(t, typev3.StatusCode_ServiceUnavailable, ir.GetStatus().GetCode())
					var dropped string
					for _, h := range ir.GetHeaders().GetSetHeaders() {
						if h.GetHeader().GetKey() == extproc.DroppedReasonHeader {
							dropped = string(h.GetHeader().GetRawValue())
						}
					}
					require.Equal(t, "rejected-no-endpoints", dropped)
					require.NoError(t, e.closeAndWait())
					continue
				}
				hr := m.GetRequestHeaders()
				require.NotNil(t, hr, "got %v", m)
				require.Equal(t, c.want, routeOf(t, m, hr.GetResponse()).header)
				streamedBack(t, e.recv(), true)
				e.send(responseHeaders(200, "application/json", false))
				require.NotNil(t, e.recv().GetResponseHeaders())
				e.send(responseBody(`{"choices":[]}`, true))
				streamedBack(t, e.recv(), false)
				require.NoError(t, e.closeAndWait())
			}
			waitIdle(t, b)
			_, keys := rec.get()
			for _, k := range keys {
				if c.want != "" && !strings.HasPrefix(k, c.want) {
					// A pick of an unhealthy endpoint is let go at once.
					require.Contains(t, c.sick, k)
				}
			}
		})
	}
}

// TestResponseHeadersSkipped: with response_header_mode SKIP and
// response_body_mode NONE, Envoy sends the picker nothing of the response
// and half-closes the stream once the request is answered; the pick ends
// then, as neither a success nor a failure of the endpoint, in every
// request body mode.
func TestResponseHeadersSkipped(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, buffered, streamed, none} {
		t.Run(mode.String(), func(t *testing.T) {
			rec := &doneRecorder{}
			b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, mode, none)
			body := []byte(`{"model":"m","prompt":"x","max_tokens":4}`)
			e.send(requestHeaders("/v1/completions", mode == none))
			if mode == fullDuplex { // the headers are answered with the route
				e.send(requestBody(body, true))
				require.NotNil(t, e.recv().GetRequestHeaders())
				require.NotNil(t, e.recv().GetRequestBody())
			} else {
				require.NotNil(t, e.recv().GetRequestHeaders())
				if mode != none {
					e.send(requestBody(body, true))
					require.NotNil(t, e.recv().GetRequestBody())
				}
			}
			require.NoError(t, e.closeAndWait())
			waitIdle(t, b)
			errs, keys := rec.get()
			require.Len(t, errs, 1)
			require.Len(t, keys, 1)
			require.ErrorIs(t, errs[0], extproc.ErrStreamEnded)
			require.Equal(t, retry.Abandoned, retry.HealthOutcome(errs[0]), "the endpoint's answer is unknown: %v", errs[0])
			require.Equal(t, "canceled", telemetry.ErrorType(errs[0]))
		})
	}
}
