package grpclb_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// TestORCASteersAwayFromFullKVCache runs three real servers, one of which
// reports a nearly full KV cache in its per-call ORCA reports, and checks
// that KV-aware policies send it measurably less traffic than round robin.
func TestORCASteersAwayFromFullKVCache(t *testing.T) {
	const calls = 300
	for _, tc := range []struct {
		cfg string
		// maxShare is the largest share of calls the full server may get.
		maxShare float64
		minShare float64
	}{
		{`{"policy": "round-robin"}`, 0.40, 0.25},
		{`{"policy": "p2c", "score": "kv"}`, 0.10, 0},
		{`{"policy": "least-kv"}`, 0.10, 0},
		{`{"policy": "default"}`, 0.10, 0},
	} {
		t.Run(tc.cfg, func(t *testing.T) {
			low1, full, low2 := startServer(t, 0.10, false), startServer(t, 0.95, false), startServer(t, 0.10, false)
			client, _, lb := dial(t, testName, tc.cfg, low1, full, low2)
			waitMembers(t, lb, 3)
			for i := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
				cancel()
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			n := []int64{low1.calls.Load(), full.calls.Load(), low2.calls.Load()}
			share := float64(n[1]) / calls
			t.Logf("calls per server (kv 0.10, 0.95, 0.10): %v; full server's share %.3f", n, share)
			if n[0]+n[1]+n[2] != calls {
				t.Errorf("servers saw %d calls, want %d", n[0]+n[1]+n[2], calls)
			}
			if share > tc.maxShare || share < tc.minShare {
				t.Errorf("full server got %.3f of the calls, want in [%.2f, %.2f]", share, tc.minShare, tc.maxShare)
			}
			assertIdle(t, lb())
		})
	}
}

// TestMembershipFollowsServerShutdown stops one of three servers and checks
// that its endpoint leaves the membership and calls continue on the others.
func TestMembershipFollowsServerShutdown(t *testing.T) {
	servers := []*testServer{startServer(t, 0.1, false), startServer(t, 0.1, false), startServer(t, 0.1, false)}
	client, _, lb := dial(t, testName, `{"policy": "least-outstanding"}`, servers...)
	waitMembers(t, lb, 3)
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		return err
	}
	for range 30 {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	servers[0].stop()
	waitMembers(t, lb, 2)
	if got := members(lb()); slices.Contains(got, servers[0].addr) {
		t.Fatalf("members %v still include the stopped server %s", got, servers[0].addr)
	}
	before := servers[0].calls.Load()
	for i := range 60 {
		if err := call(); err != nil {
			t.Fatalf("call %d after shutdown: %v", i, err)
		}
	}
	if got := servers[0].calls.Load(); got != before {
		t.Errorf("stopped server received %d calls", got-before)
	}
	if a, b := servers[1].calls.Load(), servers[2].calls.Load(); a == 0 || b == 0 {
		t.Errorf("remaining servers got %d and %d calls; want both used", a, b)
	}
	assertIdle(t, lb())
}

// TestResolverUpdateChangesMembership removes and re-adds an endpoint
// through the resolver.
func TestResolverUpdateChangesMembership(t *testing.T) {
	a, b := startServer(t, 0.1, false), startServer(t, 0.1, false)
	_, r, lb := dial(t, testName, `{}`, a, b)
	waitMembers(t, lb, 2)
	r.UpdateState(resolver.State{Endpoints: endpoints(b)})
	waitMembers(t, lb, 1)
	if got := members(lb()); got[0] != b.addr {
		t.Fatalf("members %v, want [%s]", got, b.addr)
	}
	r.UpdateState(resolver.State{Endpoints: endpoints(a, b)})
	waitMembers(t, lb, 2)
}

// TestDoneAccounting issues concurrent calls that succeed, fail on the
// server, and are cancelled, and checks that the balancer's accounting
// returns to zero.
func TestDoneAccounting(t *testing.T) {
	servers := []*testServer{startServer(t, 0.1, false), startServer(t, 0.2, false), startServer(t, 0.3, false)}
	client, _, lb := dial(t, testName, `{"policy": "least-tokens"}`, servers...)
	waitMembers(t, lb, 3)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				ctx := metadata.AppendToOutgoingContext(context.Background(),
					grpclb.MetadataPromptTokens, fmt.Sprint(100+i), grpclb.MetadataMaxTokens, "64")
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				req := &testgrpc.SimpleRequest{}
				switch i % 4 {
				case 1:
					req.ResponseStatus = &testgrpc.EchoStatus{Code: int32(codes.ResourceExhausted), Message: "busy"}
				case 2:
					cancel() // cancelled before it starts
				}
				_, err := client.UnaryCall(ctx, req)
				cancel()
				if i%4 == 0 && err != nil {
					t.Errorf("goroutine %d call %d: %v", g, i, err)
				}
			}
		}()
	}
	wg.Wait()
	assertIdle(t, lb())
}

// TestCallFirstToken streams through a Call: after the first message the
// request is no longer queued, and Done releases the rest when the stream
// ends.
func TestCallFirstToken(t *testing.T) {
	s := startServer(t, 0.1, false)
	s.release = make(chan struct{})
	client, _, lb := dial(t, testName, `{"policy": "least-tokens"}`, s)
	waitMembers(t, lb, 1)

	call := &grpclb.Call{Request: llmlb.Request{PromptTokens: 1000, MaxTokens: 100}}
	ctx, cancel := context.WithTimeout(grpclb.WithCall(context.Background(), call), 10*time.Second)
	defer cancel()
	stream, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := call.Endpoint(); got != s.addr {
		t.Errorf("Call.Endpoint() = %q, want %q", got, s.addr)
	}
	st := lb().Stats()[0]
	if st.Outstanding != 1 || st.Queued != 1 || st.PrefillTokens != 1000 || st.DecodeTokens != 100 {
		t.Errorf("before FirstToken: %+v, want 1 outstanding and queued, 1000 prefill, 100 decode tokens", st)
	}
	call.FirstToken()
	st = lb().Stats()[0]
	if st.Outstanding != 1 || st.Queued != 0 || st.PrefillTokens != 0 || st.DecodeTokens != 100 {
		t.Errorf("after FirstToken: %+v, want 1 outstanding, 0 queued, 0 prefill, 100 decode tokens", st)
	}
	close(s.release)
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	eventually(t, "Done after the stream ends", func() bool { return lb().Stats()[0].Outstanding == 0 })
	assertIdle(t, lb())
	call.FirstToken() // after Done: a no-op
	assertIdle(t, lb())
}

// TestAffinityKeyFromMetadata checks that the affinity key in call metadata
// reaches a hashing policy: every call of a session lands on one server.
func TestAffinityKeyFromMetadata(t *testing.T) {
	servers := []*testServer{startServer(t, -1, false), startServer(t, -1, false), startServer(t, -1, false)}
	client, _, lb := dial(t, testName, `{"policy": "consistent-hash", "hashBalance": 1e9}`, servers...)
	waitMembers(t, lb, 3)
	for _, session := range []string{"alice", "bob", "carol", "dave"} {
		before := make([]int64, len(servers))
		for i, s := range servers {
			before[i] = s.calls.Load()
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), grpclb.MetadataAffinityKey, session)
		for range 10 {
			if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		used := 0
		for i, s := range servers {
			if s.calls.Load() != before[i] {
				used++
			}
		}
		if used != 1 {
			t.Errorf("session %q spread over %d servers, want 1", session, used)
		}
	}
}

// TestWithRequestExcludeAll: a request that excludes every endpoint fails
// with Unavailable rather than hanging.
func TestWithRequestExcludeAll(t *testing.T) {
	s := startServer(t, 0.1, false)
	client, _, lb := dial(t, testName, `{}`, s)
	waitMembers(t, lb, 1)
	ctx := grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: []string{s.addr}})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	ctx = grpclb.WithRequest(context.Background(), &llmlb.Request{PromptTokens: -1})
	if _, err = client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); status.Code(err) != codes.Internal {
		t.Fatalf("invalid request: got %v, want Internal", err)
	}
	assertIdle(t, lb())
}

// TestNoReadyEndpoint: with no server listening, a call that does not wait
// for ready fails with Unavailable once the connection attempt fails, and a
// call that waits for ready proceeds when a server appears.
func TestNoReadyEndpoint(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens on addr
	dead := &testServer{addr: addr}
	client, r, _ := dial(t, testName, `{}`, dead)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	live := startServer(t, 0.1, false)
	done := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		done <- err
	}()
	r.UpdateState(resolver.State{Endpoints: endpoints(live)})
	if err := <-done; err != nil {
		t.Fatalf("wait-for-ready call: %v", err)
	}
}

// TestOutOfBandReports checks that out-of-band ORCA streams feed the
// store, without any call being made.
func TestOutOfBandReports(t *testing.T) {
	a, b := startServer(t, 0.9, true), startServer(t, 0.2, true)
	_, _, lb := dial(t, sharedName, `{"oobReportInterval": "100ms"}`, a, b)
	waitMembers(t, lb, 2)
	for _, s := range []*testServer{a, b} {
		eventually(t, "an out-of-band report from "+s.addr, func() bool {
			l, ok := sharedStore.Load(s.addr)
			return ok && l.KVUsage == s.kv
		})
	}
}

// TestRegisterRejectsBadName checks the name validation.
func TestRegisterRejectsBadName(t *testing.T) {
	for _, name := range []string{"LLMLB", "ll mlb"} {
		if _, err := grpclb.NewBuilder(grpclb.Options{Name: name}); !errors.Is(err, grpclb.ErrInvalidOptions) {
			t.Errorf("NewBuilder(%q) = %v, want ErrInvalidOptions", name, err)
		}
	}
	b, err := grpclb.NewBuilder(grpclb.Options{})
	if err != nil || b.Name() != grpclb.DefaultName {
		t.Fatalf("NewBuilder(zero) = %v, %v; want name %q", b, err, grpclb.DefaultName)
	}
}

// TestBadServiceConfigRejected: grpc rejects a default service config
// whose balancer config does not parse.
func TestBadServiceConfigRejected(t *testing.T) {
	r := manual.NewBuilderWithScheme("llmlbbadconfig")
	_, err := grpc.NewClient(r.Scheme()+":///x", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"policy": "nope"}}]}`, testName)))
	if err == nil {
		t.Fatal("NewClient accepted a config with an unknown policy")
	}
}

// TestConfigChange: a resolver-supplied service config that changes the
// policy replaces the channel's balancer (and membership follows); one that
// changes only out-of-band reporting keeps it and its accounting.
func TestConfigChange(t *testing.T) {
	servers := []*testServer{startServer(t, 0.1, false), startServer(t, 0.1, false)}
	client, r, lb := dial(t, testName, `{"policy": "least-outstanding"}`, servers...)
	waitMembers(t, lb, 2)
	first := lb()
	update := func(cfg string) {
		t.Helper()
		sc := r.CC().ParseServiceConfig(fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, testName, cfg))
		if sc.Err != nil {
			t.Fatal(sc.Err)
		}
		r.UpdateState(resolver.State{Endpoints: endpoints(servers...), ServiceConfig: sc})
	}
	update(`{"policy": "round-robin"}`)
	eventually(t, "a new balancer", func() bool { return lb() != first })
	waitMembers(t, lb, 2)
	second := lb()
	update(`{"policy": "round-robin", "oobReportInterval": "1s"}`)
	time.Sleep(50 * time.Millisecond)
	if lb() != second {
		t.Error("changing only oobReportInterval replaced the balancer")
	}
	for range 20 {
		if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := servers[0].calls.Load(), servers[1].calls.Load(); a != 10 || b != 10 {
		t.Errorf("round robin split 20 calls %d/%d, want 10/10", a, b)
	}
	assertIdle(t, first)
	assertIdle(t, second)
}
