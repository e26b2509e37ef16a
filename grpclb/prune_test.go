package grpclb

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/llmlb/llmlb"
)

// captureName is the name of a builder whose balancers the internal tests
// can reach: built balancers are kept in captured, by target.
const captureName = "llmlb-internal-capture"

var captured sync.Map // target -> *lbBalancer

// captureBuilder is a Builder that keeps the balancers it builds.
type captureBuilder struct{ *Builder }

func (c captureBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := newBalancer(c.Builder, cc, opts)
	captured.Store(b.target, b)
	return b
}

func init() {
	b, err := NewBuilder(Options{Name: captureName})
	if err != nil {
		panic(err)
	}
	balancer.Register(captureBuilder{b})
}

// heldServer is a TestService whose streaming calls send one message, wait
// for release and end with a per-call ORCA report.
type heldServer struct {
	testgrpc.UnimplementedTestServiceServer
	addr    string
	release chan struct{}
}

func (s *heldServer) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	orca.CallMetricsRecorderFromContext(stream.Context()).SetNamedMetric("kv_cache_utilization", 0.5)
	if err := stream.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	select {
	case <-s.release:
	case <-stream.Context().Done():
	}
	return nil
}

func startHeldServer(t *testing.T) *heldServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &heldServer{addr: lis.Addr().String(), release: make(chan struct{})}
	srv := grpc.NewServer(orca.CallMetricsServerOption(nil))
	testgrpc.RegisterTestServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return s
}

// waitFor polls cond every 5 ms until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestOwnedStoreForgetsDroppedEndpoint checks that a report arriving after
// the resolver dropped its endpoint (from a call that was still running)
// does not bring the endpoint back into the channel's own store, where
// nothing would ever prune it again.
func TestOwnedStoreForgetsDroppedEndpoint(t *testing.T) {
	a, b := startHeldServer(t), startHeldServer(t)
	r := manual.NewBuilderWithScheme("llmlbprune")
	eps := func(ss ...*heldServer) []resolver.Endpoint {
		var out []resolver.Endpoint
		for _, s := range ss {
			out = append(out, resolver.Endpoint{Addresses: []resolver.Address{{Addr: s.addr}}})
		}
		return out
	}
	r.InitialState(resolver.State{Endpoints: eps(a, b)})
	target := r.Scheme() + ":///backends"
	cc, err := grpc.NewClient(target, grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"policy": "least-outstanding"}}]}`, captureName)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)
	bal := func() *lbBalancer {
		v, ok := captured.Load(target)
		if !ok {
			return nil
		}
		return v.(*lbBalancer)
	}
	healthy := func() int {
		n := 0
		if lb := bal(); lb != nil {
			lb.mu.Lock()
			defer lb.mu.Unlock()
			if lb.lb != nil {
				for _, s := range lb.lb.Stats() {
					if s.Healthy {
						n++
					}
				}
			}
		}
		return n
	}
	cc.Connect()
	waitFor(t, "two READY members", func() bool { return healthy() == 2 })

	// A call to b runs while the resolver drops b.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = WithCall(ctx, &Call{Request: llmlb.Request{Exclude: []string{a.addr}}})
	stream, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	r.UpdateState(resolver.State{Endpoints: eps(a)})
	waitFor(t, "b to leave", func() bool { return healthy() == 1 })

	close(b.release)
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	// grpc calls the pick's Done before Recv returns the stream's end.
	if l, ok := bal().rec.store.Load(b.addr); ok {
		t.Errorf("the store holds an observation of the dropped endpoint %s: %+v", b.addr, l)
	}
}
