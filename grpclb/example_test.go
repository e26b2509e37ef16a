package grpclb_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// kvServer reports a fixed KV-cache usage with every response.
type kvServer struct {
	testgrpc.UnimplementedTestServiceServer
	kv    float64
	calls atomic.Int64
}

func (s *kvServer) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	s.calls.Add(1)
	orca.CallMetricsRecorderFromContext(ctx).SetNamedMetric("kv_cache_utilization", s.kv)
	return &testgrpc.SimpleResponse{}, nil
}

// Example routes RPCs over three servers, one of which reports a nearly
// full KV cache in its ORCA load reports, with P2C over KV usage.
func Example() {
	// Once, early in main: register the balancer under a name.
	if _, err := grpclb.Register(grpclb.Options{Name: "llmlb-example"}); err != nil {
		log.Fatal(err)
	}

	var servers []*kvServer
	var eps []resolver.Endpoint
	for _, kv := range []float64{0.2, 0.95, 0.2} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		s := &kvServer{kv: kv}
		srv := grpc.NewServer(orca.CallMetricsServerOption(nil)) // per-call ORCA reports
		testgrpc.RegisterTestServiceServer(srv, s)
		go srv.Serve(lis)
		defer srv.Stop()
		servers = append(servers, s)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: lis.Addr().String()}}})
	}

	r := manual.NewBuilderWithScheme("example")
	r.InitialState(resolver.State{Endpoints: eps})
	cc, err := grpc.NewClient("example:///replicas", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"llmlb-example": {"policy": "p2c", "score": "kv"}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)

	for range 200 {
		// Request facts travel as call metadata (or in a grpclb.Call).
		ctx := metadata.AppendToOutgoingContext(context.Background(), grpclb.MetadataPromptTokens, "512")
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
			log.Fatal(err)
		}
	}
	full := servers[1].calls.Load()
	fmt.Println("calls:", servers[0].calls.Load()+full+servers[2].calls.Load())
	fmt.Println("server with a full KV cache got under 10%:", full < 20)
	// Output:
	// calls: 200
	// server with a full KV cache got under 10%: true
}

// ExampleBuilder_ParseConfig shows the error for a parameter the selected
// policy does not take.
func ExampleBuilder_ParseConfig() {
	b, err := grpclb.NewBuilder(grpclb.Options{})
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.ParseConfig(json.RawMessage(`{"policy": "round-robin", "score": "kv"}`))
	fmt.Println(err)
	fmt.Println(errors.Is(err, grpclb.ErrInvalidConfig))
	// Output:
	// grpclb: invalid config: parameter "score" does not apply to policy "round-robin" (it takes no parameters of its own)
	// true
}

// ExampleBuilder_SetHealthy marks an endpoint unhealthy in every channel,
// as a program would when its own health check of the server fails: the
// channels do not pick it, even while its connection is READY, until the
// program marks it healthy again. The program keeps its marks and applies
// them in OnBalancer to each new balancer (of a new channel, after a config
// change that replaces the policy, when a channel leaves idle mode), so
// that the endpoints join it unhealthy. Here the mark comes before the
// channel is dialed, and the channel's round robin sends every call to the
// other server.
func ExampleBuilder_SetHealthy() {
	var (
		mu   sync.Mutex                         // protects lbs and down
		lbs  = make(map[string]*llmlb.Balancer) // by channel target
		down = make(map[string]bool)            // the endpoints marked unhealthy
		b    *grpclb.Builder                    // set before any channel is dialed
	)
	b, err := grpclb.Register(grpclb.Options{
		Name: "llmlb-example-health",
		OnBalancer: func(target string, lb *llmlb.Balancer) {
			mu.Lock()
			defer mu.Unlock()
			lbs[target] = lb
			for key := range down {
				// Fails only for a key no channel can have (empty, or
				// over 1 KiB): one the resolver lists later joins
				// unhealthy.
				_ = b.SetHealthy(lb, key, false)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	setHealthy := func(key string, healthy bool) {
		mu.Lock()
		defer mu.Unlock()
		if healthy {
			delete(down, key)
		} else {
			down[key] = true
		}
		for target, lb := range lbs {
			if err := b.SetHealthy(lb, key, healthy); err != nil && !errors.Is(err, llmlb.ErrUnknownEndpoint) {
				log.Printf("%s: %v", target, err)
			}
		}
	}

	// Two servers; the program's health check of the first fails before
	// any channel is dialed, so it joins the channel's balancer unhealthy.
	var servers []*kvServer
	var eps []resolver.Endpoint
	for range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		s := &kvServer{}
		srv := grpc.NewServer(orca.CallMetricsServerOption(nil))
		testgrpc.RegisterTestServiceServer(srv, s)
		go srv.Serve(lis)
		defer srv.Stop()
		servers = append(servers, s)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: lis.Addr().String()}}})
	}
	failing := eps[0].Addresses[0].Addr // the endpoint's key: its first address
	setHealthy(failing, false)

	r := manual.NewBuilderWithScheme("example-health")
	r.InitialState(resolver.State{Endpoints: eps})
	cc, err := grpc.NewClient("example-health:///replicas", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"llmlb-example-health": {"policy": "round-robin"}}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)
	for range 20 {
		if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("calls to the server marked unhealthy:", servers[0].calls.Load())
	fmt.Println("calls to the other:", servers[1].calls.Load())
	// Output:
	// calls to the server marked unhealthy: 0
	// calls to the other: 20
}
