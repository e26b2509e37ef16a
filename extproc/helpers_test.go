package extproc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
)

// addr is an endpoint named by the address the data plane dials.
type addr string

func (a addr) Key() string { return string(a) }

// addrs returns n endpoints 10.0.0.1:8000, 10.0.0.2:8000, ...
func addrs(n int) []llmlb.Endpoint {
	eps := make([]llmlb.Endpoint, n)
	for i := range eps {
		eps[i] = addr(fmt.Sprintf("10.0.0.%d:8000", i+1))
	}
	return eps
}

// newBalancer returns a balancer over n endpoints with policy (nil: least
// outstanding).
func newBalancer(t testing.TB, n int, policy llmlb.Policy, opts ...llmlb.Option) *llmlb.Balancer {
	t.Helper()
	if policy == nil {
		policy = llmlb.LeastOutstanding()
	}
	b, err := llmlb.New(policy, opts...)
	require.NoError(t, err)
	require.NoError(t, b.Update(addrs(n)))
	return b
}

// quiet is a logger that discards everything.
var quiet = slog.New(slog.DiscardHandler)

// harness is a Server on an in-process gRPC connection (bufconn).
type harness struct {
	b      *llmlb.Balancer
	client extprocv3.ExternalProcessorClient
}

// start serves cfg's Server over bufconn until the test ends; the client
// connection is dialled with opts.
func start(t testing.TB, cfg extproc.Config, opts ...grpc.DialOption) *harness {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	srv, err := extproc.NewServer(cfg)
	require.NoError(t, err)
	return serve(t, srv, cfg.Balancer, opts...)
}

// serve serves srv, whose balancer is b, over bufconn until the test ends;
// the client connection is dialled with opts.
func serve(t testing.TB, srv *extproc.Server, b *llmlb.Balancer, opts ...grpc.DialOption) *harness {
	t.Helper()
	l := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	cc, err := grpc.NewClient("passthrough:///bufconn", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cc.Close()
		gs.Stop()
		<-served
	})
	return &harness{b: b, client: extprocv3.NewExternalProcessorClient(cc)}
}

// envoy drives one ext_proc stream as Envoy's ext_proc filter does: the first
// message carries the protocol configuration, every message the filter
// metadata it is given.
type envoy struct {
	t      testing.TB
	s      extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	cfg    *extprocv3.ProtocolConfiguration
	sent   bool
	md     *corev3.Metadata // metadata_context of request messages
	respMD *corev3.Metadata // metadata_context of response messages
}

// open starts a stream whose body modes are req and resp.
func (h *harness) open(t testing.TB, req, resp filterv3.ProcessingMode_BodySendMode) *envoy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ctx = metadata.AppendToOutgoingContext(ctx, "x-test", t.Name())
	s, err := h.client.Process(ctx)
	require.NoError(t, err)
	t.Cleanup(cancel)
	return &envoy{t: t, s: s, cancel: cancel, cfg: &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}}
}

func (e *envoy) send(m *extprocv3.ProcessingRequest) {
	e.t.Helper()
	if !e.sent {
		m.ProtocolConfig, e.sent = e.cfg, true
	}
	switch m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders, *extprocv3.ProcessingRequest_RequestBody, *extprocv3.ProcessingRequest_RequestTrailers:
		m.MetadataContext = e.md
	default:
		m.MetadataContext = e.respMD
	}
	require.NoError(e.t, e.s.Send(m))
}

// recv returns the next answer, failing the test if the stream ends.
func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	m, err := e.s.Recv()
	require.NoError(e.t, err)
	return m
}

// closeAndWait half-closes the stream and waits for the server to end it.
func (e *envoy) closeAndWait() error {
	e.t.Helper()
	require.NoError(e.t, e.s.CloseSend())
	for {
		_, err := e.s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// requestHeaders is a POST to path with extra headers given as key, value.
func requestHeaders(path string, eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{header(":method", "POST"), header(":path", path), header(":authority", "gw.example"),
		header(":scheme", "http"), header("content-type", "application/json"), header("x-request-id", "req-1")}
	for i := 0; i+1 < len(kv); i += 2 {
		hs = append(hs, header(kv[i], kv[i+1]))
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: eos}}}
}

func requestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func requestTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{header("x-checksum", "1")}}}}}
}

func responseHeaders(status int, contentType string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header(":status", fmt.Sprint(status)), header("content-type", contentType)}}, EndOfStream: eos}}}
}

func responseBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

func responseTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{header("grpc-status", "0")}}}}}
}

// servedMetadata is the metadata_context the data plane sends with the
// response: the endpoint that served the request.
func servedMetadata(ep string) *corev3.Metadata {
	s, _ := structpb.NewStruct(map[string]any{extproc.ServedKey: ep})
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: s}}
}

// subsetMetadata is the metadata_context of a request restricted to eps.
func subsetMetadata(eps ...string) *corev3.Metadata {
	list := make([]any, len(eps))
	for i, e := range eps {
		list[i] = e
	}
	s, _ := structpb.NewStruct(map[string]any{extproc.SubsetKey: list})
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.SubsetNamespace: s}}
}

// route is what a headers or body answer tells the data plane.
type route struct {
	header        string // the destination header set
	metadata      string // the destination in the envoy.lb dynamic metadata
	contentLength string
	clearCache    bool
}

func routeOf(t testing.TB, m *extprocv3.ProcessingResponse, common *extprocv3.CommonResponse) route {
	t.Helper()
	var r route
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		switch strings.ToLower(h.GetHeader().GetKey()) {
		case extproc.DestinationHeader:
			r.header = string(h.GetHeader().GetRawValue())
			require.Equal(t, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, h.GetAppendAction())
		case "content-length":
			r.contentLength = string(h.GetHeader().GetRawValue())
		}
	}
	r.metadata = m.GetDynamicMetadata().GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()[extproc.DestinationHeader].GetStringValue()
	r.clearCache = common.GetClearRouteCache()
	return r
}

// streamedBack returns the body piece of a FULL_DUPLEX_STREAMED answer.
func streamedBack(t testing.TB, m *extprocv3.ProcessingResponse, request bool) *extprocv3.StreamedBodyResponse {
	t.Helper()
	var br *extprocv3.BodyResponse
	if request {
		br = m.GetRequestBody()
	} else {
		br = m.GetResponseBody()
	}
	require.NotNil(t, br, "want a body response, got %v", m)
	sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
	require.NotNil(t, sr, "want a streamed body mutation, got %v", m)
	return sr
}

// waitIdle waits until the balancer has nothing in flight.
func waitIdle(t testing.TB, b *llmlb.Balancer) {
	t.Helper()
	require.Eventually(t, func() bool { return idle(b) }, 5*time.Second, time.Millisecond, "accounting did not return to zero: %+v", b.Stats())
}

func idle(b *llmlb.Balancer) bool {
	for _, s := range b.Stats() {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			return false
		}
	}
	return true
}

// stats returns the balancer's accounting of key.
func stats(b *llmlb.Balancer, key string) llmlb.EndpointStats {
	for _, s := range b.Stats() {
		if s.Key == key {
			return s
		}
	}
	return llmlb.EndpointStats{}
}

// chatBody is a chat completion request of about n bytes of prompt.
func chatBody(n int, stream bool) []byte {
	return fmt.Appendf(nil, `{"model":"m","stream":%v,"max_tokens":64,"messages":[{"role":"user","content":%q}]}`,
		stream, strings.Repeat("hello llm ", n/10+1)[:n])
}

// directStream is an ext_proc stream without gRPC: Recv returns the scripted
// messages, then io.EOF; Send records the answers.
type directStream struct {
	grpc.ServerStream
	ctx context.Context
	in  []*extprocv3.ProcessingRequest
	out []*extprocv3.ProcessingResponse
}

func (d *directStream) Context() context.Context { return d.ctx }

func (d *directStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(d.in) == 0 {
		return nil, io.EOF
	}
	m := d.in[0]
	d.in = d.in[1:]
	return m, nil
}

func (d *directStream) Send(m *extprocv3.ProcessingResponse) error {
	d.out = append(d.out, m)
	return nil
}

// doneRecorder records the errors a balancer's picks are done with.
type doneRecorder struct {
	mu   sync.Mutex
	errs []error
	keys []string
}

func (r *doneRecorder) observer() *llmlb.Observer {
	return &llmlb.Observer{Done: func(d llmlb.DoneInfo) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.errs = append(r.errs, d.Err)
		r.keys = append(r.keys, d.Endpoint.Key())
	}}
}

func (r *doneRecorder) get() ([]error, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...), append([]string(nil), r.keys...)
}

// infoRecorder keeps the DoneInfo of every pick that ends.
type infoRecorder struct {
	mu    sync.Mutex
	infos []llmlb.DoneInfo
}

func (r *infoRecorder) observer() *llmlb.Observer {
	return &llmlb.Observer{Done: func(d llmlb.DoneInfo) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.infos = append(r.infos, d)
	}}
}

// only returns the DoneInfo of the one pick that ended, and fails t unless
// exactly one did.
func (r *infoRecorder) only(t *testing.T) llmlb.DoneInfo {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.infos, 1)
	return r.infos[0]
}
