package grpclb_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
)

// TestFullStoreKeepsNewestReports: a shared store that holds at most one
// endpoint records the report of each call's endpoint, evicting the other's,
// so that every endpoint is scored on its reports and none is shut out
// because another took the store's place first.
func TestFullStoreKeepsNewestReports(t *testing.T) {
	a, b := startServer(t, 0.5, false), startServer(t, 0.5, false)
	t.Cleanup(func() { fullStore.Delete(a.addr); fullStore.Delete(b.addr) }) // for -count
	client, _, lb := dial(t, fullName, `{"policy": "round-robin"}`, a, b)
	waitReady(t, lb, 2)
	held := map[string]bool{}
	for i := range 6 {
		var p peer.Peer
		if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		// The call's Done, which records its report, may run after the
		// call returns.
		key := p.Addr.String()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, ok := fullStore.Observation(key); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %d: the store holds no report of %s, the endpoint that served it", i, key)
			}
			time.Sleep(5 * time.Millisecond)
		}
		held[key] = true
		if n := fullStore.Len(); n != 1 {
			t.Fatalf("call %d: the store holds %d endpoints, want 1", i, n)
		}
	}
	if !held[a.addr] || !held[b.addr] {
		t.Errorf("reports held of %v; want both %s and %s", held, a.addr, b.addr)
	}
}
