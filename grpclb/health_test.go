package grpclb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

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

	if err := testBuilder.SetHealthy(lb(), "127.0.0.1:1", false); !errors.Is(err, llmlb.ErrUnknownEndpoint) {
		t.Errorf("SetHealthy of an unknown endpoint: %v, want llmlb.ErrUnknownEndpoint", err)
	}
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
