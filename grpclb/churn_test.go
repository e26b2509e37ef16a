package grpclb_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
)

// TestResolverChurn: while RPCs run, the resolver drops every endpoint and
// lists them again, whole or in part, many times in a row. Every RPC that
// waits for ready succeeds, the accounting returns to zero, every endpoint
// is a healthy member at the end but the one the program marked unhealthy,
// which stays so.
func TestResolverChurn(t *testing.T) {
	for _, cfg := range []string{`{"policy": "least-outstanding"}`, `{"policy": "round-robin", "slowStartWindow": "1h"}`} {
		t.Run(cfg, func(t *testing.T) {
			servers := []*testServer{startServer(t, -1, false), startServer(t, -1, false), startServer(t, -1, false)}
			marked := servers[2]
			client, r, lb := dial(t, testName, cfg, servers...)
			waitReady(t, lb, 3)
			if err := testBuilder.SetHealthy(lb(), marked.addr, false); err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true)); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			lists := [][]*testServer{nil, servers, nil, servers[:1], servers[1:], nil, {servers[2], servers[0]}, servers}
			for i := range 200 {
				r.UpdateState(resolver.State{Endpoints: endpoints(lists[i%len(lists)]...)})
				if i%16 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			r.UpdateState(resolver.State{Endpoints: endpoints(servers...)})
			waitReady(t, lb, 2)
			close(stop)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("call: %v", err)
			}
			eventually(t, "3 members", func() bool { return len(members(lb())) == 3 })
			if s, _ := stats(lb(), marked.addr); s.Healthy {
				t.Error("the endpoint the program marked unhealthy is healthy after the churn")
			}
			before := marked.calls.Load()
			calls(t, client, 20)
			if n := marked.calls.Load() - before; n != 0 {
				t.Errorf("the endpoint the program marked unhealthy got %d of 20 calls after the churn", n)
			}
			assertIdle(t, lb())
		})
	}
}
