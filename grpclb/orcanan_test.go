package grpclb_test

import (
	"context"
	"math"
	"testing"
	"time"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestRejectedORCAReportsAreNoObservation: an endpoint whose every per-call
// ORCA report is rejected (a NaN KV usage) has no observation, and
// least-kv prices it at the mean KV usage of the endpoints that report
// one, as grpc-go's weighted round robin gives an endpoint without a
// weight the mean weight: it does not take every call, as it would if the
// rejected report counted as an empty KV cache.
func TestRejectedORCAReportsAreNoObservation(t *testing.T) {
	low, high, bad := startServer(t, 0.2, false), startServer(t, 0.6, false), startServer(t, math.NaN(), false)
	client, _, lb := dial(t, testName, `{"policy": "least-kv"}`, low, high, bad)
	waitReady(t, lb, 3)
	call := func(r *llmlb.Request) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if r != nil {
			ctx = grpclb.WithRequest(ctx, r)
		}
		if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// One call to each server brings the reports: 0.2, 0.6 and a rejected
	// one.
	for _, s := range []*testServer{low, high, bad} {
		var exclude []string
		for _, o := range []*testServer{low, high, bad} {
			if o != s {
				exclude = append(exclude, o.addr)
			}
		}
		call(&llmlb.Request{Exclude: exclude})
	}
	before := []int64{low.calls.Load(), high.calls.Load(), bad.calls.Load()}
	const n = 30
	for range n {
		call(nil)
	}
	got := []int64{low.calls.Load() - before[0], high.calls.Load() - before[1], bad.calls.Load() - before[2]}
	t.Logf("calls per server (kv 0.2, 0.6, rejected): %v", got)
	// Priced at the mean, 0.4, the endpoint without an observation loses
	// to the one at 0.2 every time.
	if got[2] != 0 || got[0] != n {
		t.Errorf("of %d calls, the endpoint whose reports are rejected got %d and the one reporting 0.2 got %d; want 0 and %d",
			n, got[2], got[0], n)
	}
	assertIdle(t, lb())
}
