package grpclb_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestExcludeMembersWaitsForConnecting: a request that excludes every
// member (every endpoint READY so far) while another resolved endpoint
// makes its first connection attempt waits for that endpoint, as grpc-go
// waits for a connecting one, whether or not it waits for ready, rather
// than failing at once; one that excludes that endpoint too fails with
// Unavailable.
func TestExcludeMembersWaitsForConnecting(t *testing.T) {
	a := startServer(t, -1, false)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gate := &gatedListener{Listener: l, open: make(chan struct{})}
	var once sync.Once
	openGate := func() { once.Do(func() { close(gate.open) }) }
	late := &testServer{addr: l.Addr().String(), kv: -1, srv: grpc.NewServer()}
	testgrpc.RegisterTestServiceServer(late.srv, late)
	go late.srv.Serve(gate)
	t.Cleanup(late.stop)
	t.Cleanup(openGate) // before late.stop, which waits for Accept

	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, late)
	waitReady(t, lb, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = client.UnaryCall(grpclb.WithRequest(ctx, &llmlb.Request{Exclude: []string{a.addr, late.addr}}), &testgrpc.SimpleRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("excluding every endpoint: got %v, want Unavailable", err)
	}

	done := make(chan error, 2)
	for _, wait := range []bool{false, true} {
		go func() {
			_, err := client.UnaryCall(grpclb.WithRequest(ctx, &llmlb.Request{Exclude: []string{a.addr}}),
				&testgrpc.SimpleRequest{}, grpc.WaitForReady(wait))
			done <- err
		}()
	}
	select {
	case err := <-done:
		t.Fatalf("a call excluding the READY endpoint ended (%v) while the other was connecting", err)
	case <-time.After(100 * time.Millisecond):
	}
	openGate()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n, m := late.calls.Load(), a.calls.Load(); n != 2 || m != 0 {
		t.Errorf("calls: %d to the late endpoint, %d to the excluded one; want 2 and 0", n, m)
	}
	assertIdle(t, lb())
}

// TestExcludeMembersWithFailingEndpoint: while the only endpoint a request
// does not exclude has never connected and is in TRANSIENT_FAILURE, a call
// that waits for ready waits for it, and one that does not fails with
// Unavailable, as with grpc-go's own policies.
func TestExcludeMembersWithFailingEndpoint(t *testing.T) {
	a := startServer(t, -1, false)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens on addr yet
	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, &testServer{addr: addr})
	waitReady(t, lb, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = grpclb.WithRequest(ctx, &llmlb.Request{Exclude: []string{a.addr}})
	// The first attempt to connect to addr fails at once; the call that
	// does not wait for ready may still meet it connecting, and then waits.
	eventually(t, "a failfast call failing", func() bool {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		if err != nil && status.Code(err) != codes.Unavailable {
			t.Fatalf("failfast call: got %v, want Unavailable", err)
		}
		return err != nil
	})

	done := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a wait-for-ready call ended (%v) before the endpoint it may use was up", err)
	case <-time.After(100 * time.Millisecond):
	}
	late := startServerAt(t, addr, -1, false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := late.calls.Load(); n != 1 {
		t.Errorf("the late endpoint got %d calls, want 1", n)
	}
	assertIdle(t, lb())
}

// TestExcludeMembersFailingMemberWaitsForConnecting: a call that does not
// wait for ready, whose request excludes the READY member, and whose only
// other member is down, waits for an endpoint still making its first
// connection attempt rather than failing with the down member's error.
func TestExcludeMembersFailingMemberWaitsForConnecting(t *testing.T) {
	a, down := startServer(t, -1, false), startServer(t, -1, false)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gate := &gatedListener{Listener: l, open: make(chan struct{})}
	var once sync.Once
	openGate := func() { once.Do(func() { close(gate.open) }) }
	late := &testServer{addr: l.Addr().String(), kv: -1, srv: grpc.NewServer()}
	testgrpc.RegisterTestServiceServer(late.srv, late)
	go late.srv.Serve(gate)
	t.Cleanup(late.stop)
	t.Cleanup(openGate)

	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, down, late)
	waitReady(t, lb, 2)
	down.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Once down's reconnection failed (its child stays in TRANSIENT_FAILURE
	// until it is READY again), a call excluding the others fails.
	_, err = client.UnaryCall(grpclb.WithRequest(ctx, &llmlb.Request{Exclude: []string{a.addr, late.addr}}), &testgrpc.SimpleRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a call that may only use the stopped endpoint: got %v, want Unavailable", err)
	}
	ctx = grpclb.WithRequest(ctx, &llmlb.Request{Exclude: []string{a.addr}})
	done := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the call ended (%v) while an endpoint it may use was connecting", err)
	case <-time.After(100 * time.Millisecond):
	}
	openGate()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := late.calls.Load(); n != 1 {
		t.Errorf("the late endpoint got %d calls, want 1", n)
	}
	assertIdle(t, lb())
}
