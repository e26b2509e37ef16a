package grpclb_test

import (
	"context"
	"net"
	"sync"
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

// connsListener keeps the connections it accepts, so that a test can close
// them.
type connsListener struct {
	net.Listener
	mu    sync.Mutex // protects conns
	conns []net.Conn
}

func (l *connsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// closeConns closes the connections accepted so far and returns their
// number.
func (l *connsListener) closeConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	n := len(l.conns)
	l.conns = nil
	return n
}

// TestSlowStartNotRestartedByReconnect: with slow start on, an endpoint
// whose connection is lost and comes back at the first attempt (the server
// kept running, and its cache warm) gets its full share at once; one whose
// server was down, so that its connection attempts failed, is ramped in
// again when it comes back.
func TestSlowStartNotRestartedByReconnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := &connsListener{Listener: l}
	a := &testServer{addr: l.Addr().String(), kv: -1, srv: grpc.NewServer()}
	testgrpc.RegisterTestServiceServer(a.srv, a)
	go a.srv.Serve(&countingListener{Listener: lis, n: &a.conns})
	t.Cleanup(a.stop)
	b := startServer(t, -1, false)
	client, _, lb := dial(t, testName, `{"policy": "round-robin", "slowStartWindow": "1h"}`, a, b)
	waitReady(t, lb, 2)
	// A call that excludes b waits until a is READY.
	ctx, cancel := context.WithTimeout(grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: []string{b.addr}}), 10*time.Second)
	defer cancel()
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}

	if n := lis.closeConns(); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	eventually(t, "a new connection", func() bool { return a.conns.Load() == 2 })
	waitReady(t, lb, 2)
	before := a.calls.Load()
	calls(t, client, 300)
	if n := a.calls.Load() - before; n < 140 {
		t.Errorf("after its connection came back, the endpoint got %d of 300 calls, want about 150 (no slow start)", n)
	}

	a.stop()
	eventually(t, "the stopped server unhealthy", func() bool {
		s, ok := stats(lb(), a.addr)
		return ok && !s.Healthy
	})
	a2 := startServerAt(t, a.addr, -1, false)
	waitReady(t, lb, 2)
	calls(t, client, 300)
	// At the ramp's floor (10% of its weight) it gets about 27 of 300.
	if n := a2.calls.Load(); n == 0 || n > 60 {
		t.Errorf("back after its server was down, the endpoint got %d of 300 calls, want a ramped share in [1, 60]", n)
	}
	assertIdle(t, lb())
}

// TestSlowStartSparesFirstListedEndpoints: with slow start on, when the
// resolver's first update lists no endpoint, those of its first update
// that lists some share the traffic evenly from the start, as those of a
// first update would.
func TestSlowStartSparesFirstListedEndpoints(t *testing.T) {
	servers := []*testServer{startServer(t, -1, false), startServer(t, -1, false), startServer(t, -1, false)}
	client, r, lb := dial(t, testName, `{"policy": "round-robin", "slowStartWindow": "1h"}`)
	eventually(t, "the balancer", func() bool { return lb() != nil })
	r.UpdateState(resolver.State{Endpoints: endpoints(servers...)})
	waitReady(t, lb, 3)
	// Calls that exclude the others wait until each is READY.
	for i := range servers {
		var others []string
		for j, o := range servers {
			if j != i {
				others = append(others, o.addr)
			}
		}
		ctx, cancel := context.WithTimeout(grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: others}), 10*time.Second)
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	calls(t, client, 300)
	for _, s := range servers {
		if n := s.calls.Load() - 1; n != 100 {
			t.Errorf("server %s got %d of 300 calls, want 100 (no endpoint of the first non-empty update in slow start)", s.addr, n)
		}
	}
}
