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

// TestReplacedBalancerCarriesInFlight: a service config update that
// replaces the channel's balancer (another policy, then another decode
// allowance) leaves a stream that is still running counted against its
// endpoint by each new balancer, so that least-outstanding and p2c send no
// call to it while other endpoints are idle; once the stream ends, the
// Done that reaches the balancer it was picked with releases it from the
// channel's balancer too, and the endpoint takes calls again.
func TestReplacedBalancerCarriesInFlight(t *testing.T) {
	busy, b, c := startServer(t, -1, false), startServer(t, -1, false), startServer(t, -1, false)
	busy.release = make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(busy.release)
		}
	}()
	client, r, lb := dial(t, testName, `{"policy": "least-outstanding"}`, busy, b, c)
	waitReady(t, lb, 3)
	stream := startStream(t, client, &grpclb.Call{Request: llmlb.Request{Exclude: []string{b.addr, c.addr}}}, 20*time.Second)

	// calls makes n unary calls and returns how many reached busy.
	calls := func(n int) int64 {
		t.Helper()
		before := busy.calls.Load()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
			cancel()
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		return busy.calls.Load() - before
	}
	for _, cfg := range []string{
		`{"policy": "p2c"}`,
		`{"policy": "p2c", "decodeAllowance": 64}`,
	} {
		old := lb()
		sc := r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, testName, cfg))
		if sc.Err != nil {
			t.Fatal(sc.Err)
		}
		r.UpdateState(resolver.State{Endpoints: endpoints(busy, b, c), ServiceConfig: sc})
		eventually(t, "a new balancer", func() bool { return lb() != old })
		waitReady(t, lb, 3)
		eventually(t, "the stream counted by the new balancer", func() bool {
			s, _ := stats(lb(), busy.addr)
			return s.Outstanding == 1
		})
		// p2c draws two of the three endpoints: without the stream
		// counted, busy would take about a third of the calls.
		if n := calls(30); n != 0 {
			t.Errorf("%s: the endpoint with a stream running got %d of 30 calls while two were idle, want 0", cfg, n)
		}
	}

	close(busy.release)
	released = true
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	eventually(t, "the stream's end released by the channel's balancer", func() bool {
		s, _ := stats(lb(), busy.addr)
		return s.Outstanding == 0
	})
	if n := calls(30); n == 0 {
		t.Error("the endpoint whose stream ended got none of 30 calls")
	}
	assertIdle(t, lb())
}
