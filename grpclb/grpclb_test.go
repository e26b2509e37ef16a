package grpclb_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/keepalive"
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
			waitReady(t, lb, 3)
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

// TestNonReadyMemberNotPicked stops one of two servers and checks that its
// endpoint stays a member, marked unhealthy, and is not picked although
// least-outstanding prefers it; when a server listens on its address again
// it is healthy and picked again.
func TestNonReadyMemberNotPicked(t *testing.T) {
	a, b := startServer(t, 0.1, false), startServer(t, 0.1, false)
	b.release = make(chan struct{})
	client, _, lb := dial(t, testName, `{"policy": "least-outstanding"}`, a, b)
	waitReady(t, lb, 2)
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		return err
	}
	// A stream held on b makes a, with nothing outstanding, the policy's
	// choice whenever it is a healthy candidate.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := client.StreamingOutputCall(grpclb.WithRequest(ctx, &llmlb.Request{Exclude: []string{a.addr}}),
		&testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}

	a.stop()
	eventually(t, "the stopped server marked unhealthy", func() bool {
		s, ok := stats(lb(), a.addr)
		return ok && !s.Healthy
	})
	for i := range 20 {
		if err := call(); err != nil {
			t.Fatalf("call %d after shutdown: %v", i, err)
		}
	}
	if got := b.calls.Load(); got != 21 {
		t.Errorf("the READY server got %d calls after the shutdown, want 21 (the stream and 20 unary)", got)
	}
	// A call that excludes b has only the unhealthy a to try (panic mode):
	// it fails, and its pick is released.
	pctx, pcancel := context.WithTimeout(grpclb.WithRequest(context.Background(), &llmlb.Request{Exclude: []string{b.addr}}),
		300*time.Millisecond)
	_, err = client.UnaryCall(pctx, &testgrpc.SimpleRequest{})
	pcancel()
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Errorf("a call to the stopped server only: %v, want Unavailable or DeadlineExceeded", err)
	}
	if s, ok := stats(lb(), a.addr); !ok || s.Healthy || s.Outstanding != 0 {
		t.Errorf("stopped server: %+v, member %v; want an unhealthy member with nothing outstanding", s, ok)
	}
	if s, _ := stats(lb(), b.addr); s.Outstanding != 1 {
		t.Errorf("READY server has %d outstanding, want 1 (the stream)", s.Outstanding)
	}

	a2 := startServerAt(t, a.addr, 0.1, false)
	waitReady(t, lb, 2)
	if err := call(); err != nil {
		t.Fatal(err)
	}
	if got := a2.calls.Load(); got != 1 {
		t.Errorf("the restarted server got %d calls, want 1", got)
	}
	close(b.release)
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	eventually(t, "Done after the stream ends", func() bool { s, _ := stats(lb(), b.addr); return s.Outstanding == 0 })
	assertIdle(t, lb())
}

// TestProgramHealthMarkKept: an endpoint the program marks unhealthy stays
// so while the adapter marks another one down and up again.
func TestProgramHealthMarkKept(t *testing.T) {
	a, b, c := startServer(t, 0.1, false), startServer(t, 0.1, false), startServer(t, 0.1, false)
	client, _, lb := dial(t, testName, `{"policy": "round-robin"}`, a, b, c)
	waitReady(t, lb, 3)
	if err := lb().SetHealthy(a.addr, false); err != nil {
		t.Fatal(err)
	}
	b.stop()
	waitReady(t, lb, 1)
	b2 := startServerAt(t, b.addr, 0.1, false)
	waitReady(t, lb, 2)
	if s, _ := stats(lb(), a.addr); s.Healthy {
		t.Fatal("the endpoint the program marked unhealthy is healthy again")
	}
	for i := range 10 {
		if _, err := client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := a.calls.Load(); n != 0 {
		t.Errorf("the endpoint marked unhealthy got %d calls", n)
	}
	if n2, n3 := b2.calls.Load(), c.calls.Load(); n2 != 5 || n3 != 5 {
		t.Errorf("round robin split 10 calls %d/%d over the healthy endpoints, want 5/5", n2, n3)
	}
}

// TestGoAwayKeepsRunningStreams holds a stream on a server whose
// connections reach their maximum age: the server's GOAWAY takes the
// connection out of READY, the stream keeps running on it, and the channel
// reconnects. The endpoint must still count the stream as outstanding when
// it is READY again, so least-outstanding sends new calls to the other
// server.
func TestGoAwayKeepsRunningStreams(t *testing.T) {
	a := startServer(t, -1, false, grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      300 * time.Millisecond,
		MaxConnectionAgeGrace: time.Minute, // the stream outlives its connection's GOAWAY
	}))
	a.release = make(chan struct{})
	b := startServer(t, -1, false)
	client, _, lb := dial(t, testName, `{"policy": "least-outstanding"}`, a, b)
	waitReady(t, lb, 2)

	call := &grpclb.Call{Request: llmlb.Request{Exclude: []string{b.addr}}}
	stream := startStream(t, client, call, 20*time.Second)
	if got := call.Endpoint(); got != a.addr {
		t.Fatalf("the stream went to %q, want %q", got, a.addr)
	}
	// The stream runs on the latest connection or an older one; once a
	// later one is accepted, the stream's has had its GOAWAY.
	conns := a.conns.Load()
	eventually(t, "a new connection to the aged server, READY", func() bool {
		s, ok := stats(lb(), a.addr)
		return a.conns.Load() > conns && ok && s.Healthy
	})
	if s, _ := stats(lb(), a.addr); s.Outstanding != 1 {
		t.Errorf("after the reconnection the aged server has %d outstanding, want 1 (the running stream)", s.Outstanding)
	}
	before := a.calls.Load()
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got := a.calls.Load() - before; got != 0 {
		t.Errorf("the server with a running stream got %d of 20 unary calls, want 0", got)
	}

	close(a.release)
	for {
		if _, err := stream.Recv(); err != nil {
			if err != io.EOF {
				t.Errorf("the stream ended with %v, want EOF", err)
			}
			break
		}
	}
	eventually(t, "Done after the stream ends", func() bool { s, _ := stats(lb(), a.addr); return s.Outstanding == 0 })
	assertIdle(t, lb())
}

// TestResolverUpdateChangesMembership removes and re-adds an endpoint
// through the resolver.
func TestResolverUpdateChangesMembership(t *testing.T) {
	a, b := startServer(t, 0.1, false), startServer(t, 0.1, false)
	_, r, lb := dial(t, testName, `{}`, a, b)
	waitReady(t, lb, 2)
	r.UpdateState(resolver.State{Endpoints: endpoints(b)})
	eventually(t, "1 member", func() bool { return len(members(lb())) == 1 })
	if got := members(lb()); got[0] != b.addr {
		t.Fatalf("members %v, want [%s]", got, b.addr)
	}
	r.UpdateState(resolver.State{Endpoints: endpoints(a, b)})
	waitReady(t, lb, 2)
}

// TestDoneAccounting issues concurrent calls that succeed, fail on the
// server, and are cancelled, and checks that the balancer's accounting
// returns to zero.
func TestDoneAccounting(t *testing.T) {
	servers := []*testServer{startServer(t, 0.1, false), startServer(t, 0.2, false), startServer(t, 0.3, false)}
	client, _, lb := dial(t, testName, `{"policy": "least-tokens"}`, servers...)
	waitReady(t, lb, 3)
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
	waitReady(t, lb, 1)

	call := &grpclb.Call{Request: llmlb.Request{PromptTokens: 1000, MaxTokens: 100}}
	stream := startStream(t, client, call, 10*time.Second)
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
	waitReady(t, lb, 3)
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
	waitReady(t, lb, 1)
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
	waitReady(t, lb, 2)
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
	// A name another balancer holds is refused, and that balancer stays.
	for _, name := range []string{"round_robin", "pick_first", "least_request_experimental"} {
		before := balancer.Get(name)
		if _, err := grpclb.Register(grpclb.Options{Name: name}); !errors.Is(err, grpclb.ErrInvalidOptions) {
			t.Errorf("Register(%q) = %v, want ErrInvalidOptions", name, err)
		}
		if balancer.Get(name) != before {
			t.Errorf("Register(%q) replaced grpc-go's balancer", name)
		}
	}
	// A Builder of this package may be registered again under its name.
	for range 2 {
		if _, err := grpclb.Register(grpclb.Options{Name: "llmlb-twice"}); err != nil {
			t.Fatalf("Register(llmlb-twice) = %v", err)
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
	waitReady(t, lb, 2)
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
	waitReady(t, lb, 2)
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
