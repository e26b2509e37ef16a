package grpclb_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// gatedListener accepts no connection until open is closed: a client's
// connection to it stays CONNECTING until then.
type gatedListener struct {
	net.Listener
	open chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	<-l.open
	return l.Listener.Accept()
}

// TestProgramMarkNotPickedWhileOthersConnect: at a new channel's start, an
// endpoint the program marked unhealthy in OnBalancer gets no RPC while
// the others are still making their first connection attempt, even when it
// is the first to be READY: the RPC waits for a healthy one.
func TestProgramMarkNotPickedWhileOthersConnect(t *testing.T) {
	marked := startServer(t, -1, false)
	programMarks.Store(marked.addr, true)
	t.Cleanup(func() { programMarks.Delete(marked.addr); markErrs.Delete(marked.addr) })

	// live is a testServer whose connections wait for the gate.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gate := &gatedListener{Listener: l, open: make(chan struct{})}
	var once sync.Once
	openGate := func() { once.Do(func() { close(gate.open) }) }
	live := &testServer{addr: l.Addr().String(), kv: -1, srv: grpc.NewServer()}
	testgrpc.RegisterTestServiceServer(live.srv, live)
	go live.srv.Serve(gate)
	t.Cleanup(live.stop)
	t.Cleanup(openGate) // before live.stop, which waits for Accept

	client, _, lb := dial(t, markName, `{"policy": "round-robin"}`, marked, live)
	eventually(t, "the marked endpoint a member", func() bool {
		_, ok := stats(lb(), marked.addr)
		return ok
	})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the call ended (%v) before a healthy endpoint was READY; marked got %d calls", err, marked.calls.Load())
	case <-time.After(100 * time.Millisecond):
	}
	openGate()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, m := live.calls.Load(), marked.calls.Load(); n != 1 || m != 0 {
		t.Errorf("calls: %d to the healthy endpoint, %d to the marked one; want 1 and 0", n, m)
	}
	if err, ok := markErrs.Load(marked.addr); ok {
		t.Fatalf("OnBalancer's SetHealthy: %v", err)
	}
}
