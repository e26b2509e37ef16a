package grpclb_test

import (
	"context"
	"testing"
	"time"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// TestFullStoreCountsDroppedReports: a shared store that holds its maximum
// number of endpoints (one) records the reports of that endpoint only; the
// builder counts the others' as dropped.
func TestFullStoreCountsDroppedReports(t *testing.T) {
	a, b := startServer(t, 0.5, false), startServer(t, 0.5, false)
	t.Cleanup(func() { fullStore.Delete(a.addr); fullStore.Delete(b.addr) }) // for -count
	client, _, lb := dial(t, fullName, `{"policy": "round-robin"}`, a, b)
	waitReady(t, lb, 2)
	before := fullBuilder.DroppedReports()
	for i := range 10 {
		if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	// Round robin sent 5 calls to each; the first report took the
	// store's only place.
	// Each call's Done, which records its report, may run after the
	// call returns.
	deadline := time.Now().Add(10 * time.Second)
	for fullBuilder.DroppedReports()-before != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("DroppedReports() counts %d reports, want 5", fullBuilder.DroppedReports()-before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := fullStore.Len(); n != 1 {
		t.Errorf("the store holds %d endpoints, want 1", n)
	}
}
