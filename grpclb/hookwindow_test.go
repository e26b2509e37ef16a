package grpclb

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/llmlb/llmlb"
)

// countingServer is a TestService on loopback that counts its unary calls.
type countingServer struct {
	testgrpc.UnimplementedTestServiceServer
	addr  string
	calls atomic.Int64
}

func (s *countingServer) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	s.calls.Add(1)
	return &testgrpc.SimpleResponse{}, nil
}

func startCountingServer(t *testing.T) *countingServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &countingServer{addr: l.Addr().String()}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, s)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return s
}

// TestNoEndpointJoinsWhileOnBalancerRuns: when a config change replaces
// the channel's balancer, the children may push their states while
// Options.OnBalancer runs: endpointsharding calls ExitIdle on a child that
// went IDLE from a goroutine of its own, and the child's UpdateState then
// brings every child's state. A READY endpoint must not join the new
// balancer before the hook has set the program's marks: it would join
// healthy, and RPCs could be sent to an endpoint the program holds
// unhealthy until the hook marks it. The test pushes the children's states
// from within the hook, the interleaving that goroutine can produce.
func TestNoEndpointJoinsWhileOnBalancerRuns(t *testing.T) {
	marked, live := startCountingServer(t), startCountingServer(t)
	var (
		bb      *Builder
		hooks   atomic.Int64
		mu      sync.Mutex // protects inHook and hookErr
		inHook  []string   // what the hook saw of the new balancer, after the push
		hookErr error
	)
	hook := func(_ string, lb *llmlb.Balancer) {
		if hooks.Add(1) == 2 {
			bb.mu.Lock()
			ch := bb.channels[lb]
			bb.mu.Unlock()
			if ch != nil {
				ch.child.ExitIdle() // the children push their states
			}
			mu.Lock()
			if ch == nil {
				hookErr = fmt.Errorf("the hook's balancer is no channel's")
			}
			for _, s := range lb.Stats() {
				inHook = append(inHook, fmt.Sprintf("%s healthy=%v", s.Key, s.Healthy))
			}
			mu.Unlock()
		}
		if err := bb.SetHealthy(lb, marked.addr, false); err != nil {
			mu.Lock()
			hookErr = err
			mu.Unlock()
		}
	}
	name := "llmlb-test-hookwindow"
	var err error
	if bb, err = Register(Options{Name: name, OnBalancer: hook}); err != nil {
		t.Fatal(err)
	}

	r := manual.NewBuilderWithScheme("llmlbhookwindow")
	eps := []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: marked.addr}}}, {Addresses: []resolver.Address{{Addr: live.addr}}}}
	r.InitialState(resolver.State{Endpoints: eps})
	cc, err := grpc.NewClient(r.Scheme()+":///x", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"policy": "round-robin"}}]}`, name)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)
	call := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	call()
	// Both READY: the marked one joined the first balancer, unhealthy.
	waitFor(t, "both endpoints members", func() bool { return membersOf(bb) == 2 })

	sc := r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"policy": "least-outstanding"}}]}`, name))
	if sc.Err != nil {
		t.Fatal(sc.Err)
	}
	r.UpdateState(resolver.State{Endpoints: eps, ServiceConfig: sc})
	waitFor(t, "the new balancer with both endpoints", func() bool { return hooks.Load() == 2 && membersOf(bb) == 2 })
	mu.Lock()
	if hookErr != nil {
		t.Error(hookErr)
	}
	if len(inHook) != 0 {
		t.Errorf("endpoints joined the new balancer while OnBalancer ran, before the program's marks: %v", inHook)
	}
	mu.Unlock()
	before := marked.calls.Load()
	for range 10 {
		call()
	}
	if n := marked.calls.Load() - before; n != 0 {
		t.Errorf("the endpoint the program marked unhealthy got %d of 10 calls", n)
	}
}

// membersOf returns the number of members of the balancer of bb's only
// open channel.
func membersOf(bb *Builder) int {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	for lb := range bb.channels {
		return len(lb.Stats())
	}
	return 0
}
