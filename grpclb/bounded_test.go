package grpclb_test

import (
	"context"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestBoundedAcrossManyStreams streams 10,000 calls (1,000 with -short)
// through the balancer, some cancelled mid-stream, and checks that the
// accounting returns to zero and that goroutines and the heap end where
// they started.
func TestBoundedAcrossManyStreams(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	servers := []*testServer{startServer(t, 0.2, false), startServer(t, 0.5, false), startServer(t, 0.3, false)}
	client, _, lb := dial(t, testName, `{"policy": "default"}`, servers...)
	waitReady(t, lb, 3)

	stream := func(i int) error {
		call := &grpclb.Call{Request: llmlb.Request{PromptTokens: 100 + i%1000, MaxTokens: 32, Prefix: []uint64{uint64(i % 50), uint64(i)}}}
		ctx, cancel := context.WithTimeout(grpclb.WithCall(context.Background(), call), 10*time.Second)
		defer cancel()
		s, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
		if err != nil {
			return err
		}
		for first := true; ; first = false {
			if _, err := s.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			if first {
				call.FirstToken()
				if i%10 == 0 {
					cancel() // the client goes away mid-stream
					return nil
				}
			}
		}
	}
	// Warm up, then measure.
	for i := range 100 {
		if err := stream(i); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()

	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if err := stream(int(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	eventually(t, "every Done", func() bool {
		for _, s := range lb().Stats() {
			if s.Outstanding != 0 {
				return false
			}
		}
		return true
	})
	assertIdle(t, lb())
	eventually(t, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= goroutines+2 })
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 32<<20 {
		t.Errorf("heap grew by %d MiB over %d streams", grow>>20, n)
	}
	t.Logf("%d streams: heap %d -> %d KiB, goroutines %d -> %d", n, before.HeapAlloc>>10, after.HeapAlloc>>10, goroutines, runtime.NumGoroutine())
}
