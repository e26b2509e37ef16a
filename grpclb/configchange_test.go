package grpclb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestEquivalentConfigKeepsInFlight: a service config update whose
// balancer config sets parameters to their defaults, which the previous
// one left out, keeps the channel's balancer, so that a stream still
// running counts against its endpoint: least-outstanding sends no call to
// it while other endpoints are idle.
func TestEquivalentConfigKeepsInFlight(t *testing.T) {
	busy, b, c := startServer(t, -1, false), startServer(t, -1, false), startServer(t, -1, false)
	busy.release = make(chan struct{})
	defer close(busy.release)
	client, r, lb := dial(t, testName, `{"policy": "least-outstanding"}`, busy, b)
	waitReady(t, lb, 2)
	first := lb()
	startStream(t, client, &grpclb.Call{Request: llmlb.Request{Exclude: []string{b.addr}}}, 20*time.Second)

	// The same policy, its defaults spelled out; c joins with the update, so
	// that the test knows the update was applied.
	cfg := fmt.Sprintf(`{"policy": "least-outstanding", "decodeAllowance": %d, "maxSignalAge": %q, "oobReportInterval": "0s"}`,
		llmlb.DefaultDecodeAllowance, llmlb.DefaultMaxSignalAge)
	sc := r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, testName, cfg))
	if sc.Err != nil {
		t.Fatal(sc.Err)
	}
	r.UpdateState(resolver.State{Endpoints: endpoints(busy, b, c), ServiceConfig: sc})
	waitReady(t, lb, 3)
	if lb() != first {
		t.Error("a config equivalent to the previous one replaced the balancer")
	}
	if s, _ := stats(lb(), busy.addr); s.Outstanding != 1 {
		t.Errorf("the channel's balancer counts %d RPCs on the endpoint with a stream running, want 1", s.Outstanding)
	}
	before := busy.calls.Load()
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := busy.calls.Load() - before; n != 0 {
		t.Errorf("the endpoint with a stream running got %d of 20 calls while two were idle, want 0", n)
	}
}
