package extproc_test

import (
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
)

// TestUnannouncedModes: a data plane that sends no protocol_config (Envoy
// before v1.34.0) is served in the body modes of Config.Protocol, by
// default FULL_DUPLEX_STREAMED; an Envoy configured BUFFERED gets the answer
// to its request headers at once, without waiting for the body it sends
// only after that answer, and the route in the answer to the body. A
// protocol_config sent by the data plane overrides Config.Protocol.
func TestUnannouncedModes(t *testing.T) {
	cases := []struct {
		name      string
		protocol  *extprocv3.ProtocolConfiguration // Config.Protocol
		announced *extprocv3.ProtocolConfiguration // the stream's protocol_config
		buffered  bool                             // the exchange is BUFFERED's
	}{
		{name: "default-duplex"},
		{name: "buffered", protocol: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: buffered}, buffered: true},
		{name: "announced-duplex", protocol: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: buffered},
			announced: &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: fullDuplex}},
		{name: "announced-buffered", announced: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: buffered}, buffered: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := &doneRecorder{}
			b := newBalancer(t, 2, nil, llmlb.WithObserver(rec.observer()))
			h := start(t, extproc.Config{Balancer: b, Protocol: c.protocol})
			e := h.open(t, fullDuplex, fullDuplex)
			e.cfg = c.announced
			const body = `{"model":"m","prompt":"hi","max_tokens":5}`
			e.send(requestHeaders("/v1/completions", false, extproc.DestinationHeader, "169.254.169.254:80"))
			var dest string
			if c.buffered {
				// Envoy sends the buffered body only once the headers are answered.
				m := recvWithin(t, e, 10*time.Second)
				hr := m.GetRequestHeaders()
				require.NotNil(t, hr, "want the headers answered before the body, got %v", m)
				require.Equal(t, []string{extproc.DestinationHeader}, hr.GetResponse().GetHeaderMutation().GetRemoveHeaders())
				e.send(requestBody([]byte(body), true))
				m = e.recv()
				require.NotNil(t, m.GetRequestBody(), "got %v", m)
				require.Nil(t, m.GetRequestBody().GetResponse().GetBodyMutation(), "a buffered body is not streamed back")
				r := routeOf(t, m, m.GetRequestBody().GetResponse())
				require.Equal(t, r.header, r.metadata)
				dest = r.header
			} else {
				e.send(requestBody([]byte(body[:10]), false))
				e.send(requestBody([]byte(body[10:]), true))
				m := e.recv()
				hr := m.GetRequestHeaders()
				require.NotNil(t, hr, "got %v", m)
				r := routeOf(t, m, hr.GetResponse())
				require.Equal(t, r.header, r.metadata)
				dest = r.header
				require.Equal(t, body, string(streamedBack(t, e.recv(), true).GetBody()))
			}
			require.Regexp(t, `^10\.0\.0\.[12]:8000$`, dest)
			e.send(responseHeaders(200, "application/json", false))
			require.NotNil(t, e.recv().GetResponseHeaders())
			e.send(responseBody(`{"choices":[]}`, true))
			m := e.recv()
			require.NotNil(t, m.GetResponseBody(), "got %v", m)
			if c.buffered {
				require.Nil(t, m.GetResponseBody().GetResponse().GetBodyMutation())
			} else {
				require.True(t, streamedBack(t, m, false).GetEndOfStream())
			}
			require.NoError(t, e.closeAndWait())
			require.True(t, idle(b))
			errs, keys := rec.get()
			require.Equal(t, []error{nil}, errs)
			require.Equal(t, []string{dest}, keys)
		})
	}
}

func TestProtocolConfig(t *testing.T) {
	b := newBalancer(t, 1, nil)
	_, err := extproc.NewServer(extproc.Config{Balancer: b, Protocol: &extprocv3.ProtocolConfiguration{RequestBodyMode: 9}})
	require.ErrorIs(t, err, extproc.ErrInvalidConfig)
	_, err = extproc.NewServer(extproc.Config{Balancer: b, Protocol: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: none}})
	require.NoError(t, err)
	// GRPC is a body mode of the enum that a Server does not serve.
	_, err = extproc.NewServer(extproc.Config{Balancer: b, Protocol: &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: filterv3.ProcessingMode_GRPC}})
	require.ErrorIs(t, err, extproc.ErrInvalidConfig)
}

// TestUnsupportedAnnouncedMode: a stream whose protocol_config announces a
// body mode the Server does not serve (GRPC, or one unknown) fails with
// FAILED_PRECONDITION before anything is answered or picked, rather than be
// answered in another mode's messages, which the data plane rejects.
func TestUnsupportedAnnouncedMode(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_GRPC, 42} {
		t.Run(mode.String(), func(t *testing.T) {
			b := newBalancer(t, 2, nil)
			h := start(t, extproc.Config{Balancer: b})
			e := h.open(t, mode, fullDuplex)
			e.send(requestHeaders("/v1/chat/completions", false))
			_, err := e.s.Recv()
			require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), "unsupported body modes")
			for _, s := range b.Stats() {
				require.Zero(t, s.Outstanding)
			}
		})
	}
}

// recvWithin returns the next answer on e, failing the test if none comes
// within d.
func recvWithin(t *testing.T, e *envoy, d time.Duration) *extprocv3.ProcessingResponse {
	t.Helper()
	type result struct {
		m   *extprocv3.ProcessingResponse
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := e.s.Recv()
		ch <- result{m, err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r.m
	case <-time.After(d):
		e.cancel()
		<-ch
		t.Fatalf("no answer within %v", d)
		return nil
	}
}
