package extproc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

// pod is a model server replica, named by the address Envoy connects to.
type pod string

func (p pod) Key() string { return string(p) }

// Example serves the endpoint picker on a gRPC listener and sends it one
// request as Envoy does in FULL_DUPLEX_STREAMED mode: the headers, then the
// body; the answer routes the request.
func Example() {
	policy, err := llmlb.Default(llmlb.DefaultConfig{})
	if err != nil {
		log.Fatal(err)
	}
	b, err := llmlb.New(policy)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{pod("10.0.0.7:8000")}); err != nil {
		log.Fatal(err)
	}
	picker, err := extproc.NewServer(extproc.Config{Balancer: b})
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, picker)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go gs.Serve(l)
	defer gs.Stop()

	// What Envoy's ext_proc filter sends.
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	stream, err := extprocv3.NewExternalProcessorClient(cc).Process(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	_ = stream.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/completions")}}}}},
	})
	_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(`{"model":"m","prompt":"Hello","max_tokens":8}`), EndOfStream: true}}})
	answer, err := stream.Recv()
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range answer.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		fmt.Printf("%s: %s\n", h.GetHeader().GetKey(), h.GetHeader().GetRawValue())
	}
	// Output:
	// x-gateway-destination-endpoint: 10.0.0.7:8000
	// Content-Length: 45
}

// ExampleNewServer configures a picker that reads the tenant from a header
// the gateway sets, caps the requests in flight per session, and lists two
// fallbacks after each pick.
func ExampleNewServer() {
	b, err := llmlb.New(llmlb.LeastOutstanding())
	if err != nil {
		log.Fatal(err)
	}
	parser, err := httplb.NewParser(httplb.ParserConfig{TrustTenantHeader: "x-gateway-inference-fairness-id"})
	if err != nil {
		log.Fatal(err)
	}
	admission, err := retry.NewAdmission(retry.AdmissionConfig{MaxPerSession: 8})
	if err != nil {
		log.Fatal(err)
	}
	picker, err := extproc.NewServer(extproc.Config{Balancer: b, Parser: parser, Admission: admission, Fallbacks: 2})
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, picker)
	fmt.Println(extproc.DestinationHeader, extproc.ProtocolVersion)
	// Output: x-gateway-destination-endpoint v1.0.0
}
