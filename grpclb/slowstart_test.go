package grpclb_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestSlowStartSparesInitialEndpoints: with slow start on, the endpoints a
// new channel resolves share its traffic evenly from the start, whichever
// connects first; an endpoint the resolver adds later is ramped in.
func TestSlowStartSparesInitialEndpoints(t *testing.T) {
	servers := []*testServer{startServer(t, -1, false), startServer(t, -1, false), startServer(t, -1, false)}
	client, r, lb := dial(t, testName, `{"policy": "round-robin", "slowStartWindow": "1h"}`, servers...)
	waitReady(t, lb, 3)
	call := func(r *llmlb.Request) {
		t.Helper()
		ctx, cancel := context.WithTimeout(grpclb.WithRequest(context.Background(), r), 10*time.Second)
		defer cancel()
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	// An endpoint still connecting is a healthy member: a call that
	// excludes the others waits until it is READY.
	for i, s := range servers {
		var others []string
		for j, o := range servers {
			if j != i {
				others = append(others, o.addr)
			}
		}
		call(&llmlb.Request{Exclude: others})
		if n := s.calls.Load(); n != 1 {
			t.Fatalf("server %s got %d calls, want the 1 that excluded the others", s.addr, n)
		}
	}
	for range 300 {
		call(nil)
	}
	for _, s := range servers {
		if n := s.calls.Load() - 1; n != 100 {
			t.Errorf("server %s got %d of 300 calls, want 100 (no initial endpoint in slow start)", s.addr, n)
		}
	}

	late := startServer(t, -1, false)
	r.UpdateState(resolver.State{Endpoints: endpoints(append(servers, late)...)})
	waitReady(t, lb, 4)
	for range 300 {
		call(nil)
	}
	// At the ramp's floor (10% of its weight) the new endpoint gets about
	// 10 of 300 calls; without slow start, 75.
	if n := late.calls.Load(); n == 0 || n > 40 {
		t.Errorf("endpoint added later got %d of 300 calls, want a ramped share in [1, 40]", n)
	}
	assertIdle(t, lb())
}

// TestSlowStartInitialEndpointDown: with slow start on, an endpoint the
// new channel resolves whose server is down fails no call while it first
// connects nor after, and is an unhealthy member once its connection
// fails; a program's mark in OnBalancer keeps another unpicked.
func TestSlowStartInitialEndpointDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := &testServer{addr: lis.Addr().String()}
	lis.Close() // nothing listens on dead.addr
	marked, live := startServer(t, -1, false), startServer(t, -1, false)
	programMarks.Store(marked.addr, true)
	t.Cleanup(func() { programMarks.Delete(marked.addr); markErrs.Delete(marked.addr) })
	client, _, lb := dial(t, markName, `{"policy": "least-outstanding", "slowStartWindow": "1h"}`, dead, marked, live)
	for i := range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if err, ok := markErrs.Load(marked.addr); ok {
		t.Fatalf("OnBalancer's SetHealthy: %v", err)
	}
	if n := marked.calls.Load(); n != 0 {
		t.Errorf("the endpoint the program marked unhealthy got %d of 50 calls", n)
	}
	if n := live.calls.Load(); n != 50 {
		t.Errorf("the only healthy READY endpoint got %d of 50 calls, want 50", n)
	}
	eventually(t, "the down endpoint unhealthy", func() bool {
		s, ok := stats(lb(), dead.addr)
		return ok && !s.Healthy
	})
	assertIdle(t, lb())
}
