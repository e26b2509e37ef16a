package grpclb_test

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestProgramMarkOutlivesReconnect: an endpoint the program marks unhealthy
// with Builder.SetHealthy while its connection is down, and so already
// marked unhealthy by the adapter, stays unhealthy and unpicked when its
// connection is READY again; marked healthy, it is picked again.
func TestProgramMarkOutlivesReconnect(t *testing.T) {
	a, b := startServer(t, -1, false), startServer(t, -1, false)
	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, b)
	waitReady(t, lb, 2)
	a.stop()
	eventually(t, "the stopped server marked unhealthy", func() bool {
		s, ok := stats(lb(), a.addr)
		return ok && !s.Healthy
	})
	if err := testBuilder.SetHealthy(lb(), a.addr, false); err != nil {
		t.Fatal(err)
	}

	a2 := startServerAt(t, a.addr, -1, false)
	// A call with b excluded has only a to pick (panic mode): once it
	// succeeds, a's connection is READY again.
	ctx, cancel := context.WithTimeout(grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: []string{b.addr}}), 10*time.Second)
	defer cancel()
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if s, _ := stats(lb(), a.addr); s.Healthy {
		t.Error("the endpoint the program marked unhealthy is healthy once its connection is READY")
	}
	call := func() {
		t.Helper()
		for i := range 10 {
			if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
	}
	call()
	if n := a2.calls.Load(); n != 1 {
		t.Errorf("the endpoint marked unhealthy got %d of 10 calls", n-1)
	}

	if err := testBuilder.SetHealthy(lb(), a.addr, true); err != nil {
		t.Fatal(err)
	}
	before := a2.calls.Load()
	call()
	if n := a2.calls.Load() - before; n != 5 {
		t.Errorf("marked healthy again, the endpoint got %d of 10 calls, want 5", n)
	}
}

// TestProgramMarkWaitsForReady: an endpoint the program marks healthy while
// its connection is not READY stays unhealthy until it is.
func TestProgramMarkWaitsForReady(t *testing.T) {
	a, b := startServer(t, -1, false), startServer(t, -1, false)
	_, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, b)
	waitReady(t, lb, 2)
	a.stop()
	eventually(t, "the stopped server marked unhealthy", func() bool {
		s, ok := stats(lb(), a.addr)
		return ok && !s.Healthy
	})
	if err := testBuilder.SetHealthy(lb(), a.addr, true); err != nil {
		t.Fatal(err)
	}
	if s, _ := stats(lb(), a.addr); s.Healthy {
		t.Error("marked healthy by the program, an endpoint without a READY connection is healthy")
	}
	startServerAt(t, a.addr, -1, false)
	waitReady(t, lb, 2)
}

// TestDirectMarkOutlivesReconnect: an endpoint the program marks unhealthy
// with the balancer's own SetHealthy while its connection is READY stays
// unhealthy while its connection goes and comes back.
func TestDirectMarkOutlivesReconnect(t *testing.T) {
	a, b := startServer(t, -1, false), startServer(t, -1, false)
	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, b)
	waitReady(t, lb, 2)
	if err := lb().SetHealthy(a.addr, false); err != nil {
		t.Fatal(err)
	}
	a.stop()
	a2 := startServerAt(t, a.addr, -1, false)
	eventually(t, "a new connection", func() bool { return a2.conns.Load() > 0 })
	ctx, cancel := context.WithTimeout(grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: []string{b.addr}}), 10*time.Second)
	defer cancel()
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if s, _ := stats(lb(), a.addr); s.Healthy {
		t.Error("the endpoint the program marked unhealthy is healthy after its connection came back")
	}
	if n := a2.calls.Load(); n != 1 {
		t.Errorf("the restarted server got %d calls, want 1 (the one that excludes b)", n)
	}
}

// TestProgramMarkBeforeReady: an endpoint the resolver lists, marked
// unhealthy with Builder.SetHealthy before its connection is first READY,
// joins the balancer unhealthy and is not picked; marked healthy, it is.
func TestProgramMarkBeforeReady(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := &testServer{addr: lis.Addr().String()}
	lis.Close() // nothing listens on dead.addr yet
	b := startServer(t, -1, false)
	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, dead, b)
	waitReady(t, lb, 1)
	if err := testBuilder.SetHealthy(lb(), dead.addr, false); err != nil {
		t.Fatalf("SetHealthy of a resolved endpoint not yet READY: %v", err)
	}
	a := startServerAt(t, dead.addr, -1, false)
	eventually(t, "the endpoint a member", func() bool { _, ok := stats(lb(), a.addr); return ok })
	if s, _ := stats(lb(), a.addr); s.Healthy {
		t.Error("an endpoint marked unhealthy before it was READY joined healthy")
	}
	calls(t, client, 10)
	if n := a.calls.Load(); n != 0 {
		t.Errorf("the endpoint marked unhealthy got %d of 10 calls", n)
	}
	if err := testBuilder.SetHealthy(lb(), a.addr, true); err != nil {
		t.Fatal(err)
	}
	calls(t, client, 10)
	if n := a.calls.Load(); n != 5 {
		t.Errorf("marked healthy, the endpoint got %d of 10 calls, want 5", n)
	}
}

// TestProgramMarksInOnBalancer: a program that marks its unhealthy
// endpoints in each balancer Options.OnBalancer receives keeps them
// unpicked in a new channel and after a config change replaces the
// balancer, from the first RPC on.
func TestProgramMarksInOnBalancer(t *testing.T) {
	a, b := startServer(t, -1, false), startServer(t, -1, false)
	programMarks.Store(a.addr, true)
	t.Cleanup(func() { programMarks.Delete(a.addr); markErrs.Delete(a.addr) })
	client, r, lb := dial(t, markName, `{"policy": "round-robin"}`, a, b)
	check := func(when string) {
		t.Helper()
		if err, ok := markErrs.Load(a.addr); ok {
			t.Fatalf("%s: OnBalancer's SetHealthy: %v", when, err)
		}
		eventually(t, "both members", func() bool { return len(members(lb())) == 2 })
		if s, _ := stats(lb(), a.addr); s.Healthy {
			t.Errorf("%s: the endpoint the program marked unhealthy is healthy", when)
		}
		before := a.calls.Load()
		calls(t, client, 10)
		if n := a.calls.Load() - before; n != 0 {
			t.Errorf("%s: the endpoint the program marked unhealthy got %d of 10 calls", when, n)
		}
	}
	check("new channel")

	first := lb()
	sc := r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"policy": "least-outstanding"}}]}`, markName))
	r.UpdateState(resolver.State{Endpoints: endpoints(a, b), ServiceConfig: sc})
	eventually(t, "a new balancer", func() bool { return lb() != first })
	check("config change")
}

// TestPanicPrefersReady: when the program's marks leave no healthy READY
// endpoint, calls go to the READY endpoints it marked, not to one whose
// connection is down, where they would fail; so do calls that a mark set
// directly on the balancer sends to an endpoint whose connection is down.
func TestPanicPrefersReady(t *testing.T) {
	for _, test := range []struct {
		name string
		// mark marks the endpoints after b's server stopped.
		mark func(lb *llmlb.Balancer, a, b string) error
	}{
		{"the READY endpoint marked unhealthy", func(lb *llmlb.Balancer, a, _ string) error {
			return testBuilder.SetHealthy(lb, a, false)
		}},
		{"the stopped endpoint marked healthy directly", func(lb *llmlb.Balancer, _, b string) error {
			return lb.SetHealthy(b, true)
		}},
	} {
		t.Run(test.name, func(t *testing.T) {
			a, b := startServer(t, -1, false), startServer(t, -1, false)
			client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, b)
			waitReady(t, lb, 2)
			b.stop()
			// A call that has only b to pick fails once b's connection
			// is in transient failure (and b, marked unhealthy, is no
			// longer picked for a connection that is closing).
			eventually(t, "b in transient failure", func() bool {
				if s, ok := stats(lb(), b.addr); !ok || s.Healthy {
					return false
				}
				ctx, cancel := context.WithTimeout(grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: []string{a.addr}}), time.Second)
				defer cancel()
				_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
				return status.Code(err) == codes.Unavailable
			})
			if err := test.mark(lb(), a.addr, b.addr); err != nil {
				t.Fatal(err)
			}
			failed, first := 0, error(nil)
			for range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
					failed++
					first = cmp.Or(first, err)
				}
				cancel()
			}
			if failed != 0 {
				t.Errorf("%d of 20 calls failed with a READY endpoint to take them, the first with %v", failed, first)
			}
		})
	}
}

// calls makes n unary calls on client, failing the test on an error.
func calls(t *testing.T, client testgrpc.TestServiceClient, n int) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
