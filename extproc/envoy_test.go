package extproc_test

import (
	"context"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
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
// pick alike; before them, the response never came, and the pick ends with
// ErrStreamEnded, not as a success that would teach the policy a response
// that never was.
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
					require.ErrorIs(t, errs[0], extproc.ErrStreamEnded)
				}
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
// no body is routed by the metadata alone, its header removed.
func TestClientDestinationHeader(t *testing.T) {
	const forged = "169.254.169.254:80"
	cases := []struct {
		name string
		mode filterv3.ProcessingMode_BodySendMode
		body bool // the request has a body (else it ends with trailers)
	}{
		{"duplex", fullDuplex, true},
		{"duplex-trailers", fullDuplex, false},
		{"buffered", buffered, true},
		{"buffered-trailers", buffered, false},
		{"buffered-partial", filterv3.ProcessingMode_BUFFERED_PARTIAL, true},
		{"buffered-partial-trailers", filterv3.ProcessingMode_BUFFERED_PARTIAL, false},
		{"streamed", streamed, true},
		{"none-trailers", none, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			srv, err := extproc.NewServer(extproc.Config{Balancer: b, Logger: quiet})
			require.NoError(t, err)
			first := requestHeaders("/v1/completions", false, extproc.DestinationHeader, forged)
			first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: c.mode, ResponseBodyMode: fullDuplex}
			in := []*extprocv3.ProcessingRequest{first}
			if c.body {
				in = append(in, requestBody([]byte(`{"prompt":"x"}`), true))
			} else {
				in = append(in, requestTrailers())
			}
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
