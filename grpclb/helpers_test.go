package grpclb_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
	"github.com/llmlb/llmlb/signals"
)

// Names the test builders are registered under.
const (
	testName   = "llmlb-test"
	sharedName = "llmlb-test-shared"
	// fullName's builder shares a store that holds one endpoint.
	fullName = "llmlb-test-full"
	// markName's builder marks unhealthy, with Builder.SetHealthy, the
	// endpoints in programMarks in each balancer OnBalancer receives.
	markName = "llmlb-test-marks"
)

var (
	// balancers holds the llmlb.Balancer of each channel, by target.
	balancers sync.Map
	// sharedStore is the signal store of the sharedName builder.
	sharedStore = new(signals.Store)
	schemes     atomic.Int64
	// testBuilder and fullBuilder are the testName and fullName builders.
	testBuilder, fullBuilder *grpclb.Builder
	// fullStore is the store of the fullName builder, for one endpoint.
	fullStore *signals.Store
	// markBuilder is the markName builder, programMarks the keys it marks
	// unhealthy in every new balancer, and markErrs the errors of those
	// marks, by key.
	markBuilder            *grpclb.Builder
	programMarks, markErrs sync.Map
)

func TestMain(m *testing.M) {
	hook := func(target string, b *llmlb.Balancer) { balancers.Store(target, b) }
	seed := func() rand.Source { return rand.NewPCG(1, 2) }
	// markHook applies the program's marks to a new balancer, before any
	// endpoint joins it.
	markHook := func(target string, b *llmlb.Balancer) {
		programMarks.Range(func(key, _ any) bool {
			if err := markBuilder.SetHealthy(b, key.(string), false); err != nil {
				markErrs.Store(key, err)
			}
			return true
		})
		balancers.Store(target, b)
	}
	var err error
	if fullStore, err = signals.NewStore(signals.StoreConfig{MaxKeys: 1}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, o := range []struct {
		opts grpclb.Options
		b    **grpclb.Builder
	}{
		{grpclb.Options{Name: testName, OnBalancer: hook, NewRand: seed}, &testBuilder},
		{grpclb.Options{Name: sharedName, OnBalancer: hook, Store: sharedStore}, nil},
		{grpclb.Options{Name: fullName, OnBalancer: hook, Store: fullStore}, &fullBuilder},
		{grpclb.Options{Name: markName, OnBalancer: markHook}, &markBuilder},
	} {
		b, err := grpclb.Register(o.opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if o.b != nil {
			*o.b = b
		}
	}
	child, err := grpclb.NewBuilder(grpclb.Options{Name: twiceName + "-child", OnBalancer: hook})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	balancer.Register(twiceBuilder{child})
	goleak.VerifyTestMain(m)
}

// testServer is a TestService on loopback that counts its calls and
// reports a fixed KV usage per call (ORCA trailer) and, with oob, on an
// out-of-band ORCA stream.
type testServer struct {
	testgrpc.UnimplementedTestServiceServer
	srv   *grpc.Server
	addr  string
	kv    float64 // < 0: no per-call report
	calls atomic.Int64
	// release, if set, holds streaming calls after their first message
	// until it is closed.
	release chan struct{}
	stopped atomic.Bool
	conns   atomic.Int64 // connections accepted
}

// startServer starts a testServer on a new loopback port with the extra
// server options opts.
func startServer(t testing.TB, kv float64, oob bool, opts ...grpc.ServerOption) *testServer {
	t.Helper()
	return startServerAt(t, "127.0.0.1:0", kv, oob, opts...)
}

// startServerAt starts a testServer listening on addr, which may be the
// address of a stopped one.
func startServerAt(t testing.TB, addr string, kv float64, oob bool, opts ...grpc.ServerOption) *testServer {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{addr: l.Addr().String(), kv: kv}
	lis := &countingListener{Listener: l, n: &s.conns}
	smr := orca.NewServerMetricsRecorder()
	s.srv = grpc.NewServer(append([]grpc.ServerOption{orca.CallMetricsServerOption(nil)}, opts...)...)
	if oob {
		smr.SetNamedUtilization("kv_cache_utilization", max(kv, 0))
		if err := orca.Register(s.srv, orca.ServiceOptions{ServerMetricsProvider: smr}); err != nil {
			t.Fatal(err)
		}
	}
	testgrpc.RegisterTestServiceServer(s.srv, s)
	go s.srv.Serve(lis)
	t.Cleanup(s.stop)
	return s
}

// countingListener counts the connections it accepts in n.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func (s *testServer) stop() {
	if s.stopped.CompareAndSwap(false, true) {
		s.srv.Stop()
	}
}

func (s *testServer) report(ctx context.Context) {
	if s.kv < 0 {
		return
	}
	if r := orca.CallMetricsRecorderFromContext(ctx); r != nil {
		r.SetNamedMetric("kv_cache_utilization", s.kv)
		r.SetNamedMetric("num_requests_running", 1)
	}
}

func (s *testServer) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	s.calls.Add(1)
	s.report(ctx)
	if st := req.GetResponseStatus(); st != nil && st.GetCode() != 0 {
		return nil, status.Error(codes.Code(st.GetCode()), st.GetMessage())
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (s *testServer) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	s.calls.Add(1)
	s.report(stream.Context())
	if err := stream.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
		return err
	}
	if s.release != nil {
		select {
		case <-s.release:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
	return stream.Send(&testgrpc.StreamingOutputCallResponse{})
}

// dial returns a client for a channel to servers through a manual resolver,
// with the builder name and the balancer config cfg (a JSON object), and the
// channel's llmlb.Balancer once it is built.
func dial(t testing.TB, name, cfg string, servers ...*testServer) (testgrpc.TestServiceClient, *manual.Resolver, func() *llmlb.Balancer) {
	t.Helper()
	r := manual.NewBuilderWithScheme(fmt.Sprintf("llmlbtest%d", schemes.Add(1)))
	r.InitialState(resolver.State{Endpoints: endpoints(servers...)})
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{%q: %s}]}`, name, cfg)
	target := r.Scheme() + ":///backends"
	cc, err := grpc.NewClient(target, grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cc.Connect()
	lb := func() *llmlb.Balancer {
		v, ok := balancers.Load(target)
		if !ok {
			return nil
		}
		return v.(*llmlb.Balancer)
	}
	return testgrpc.NewTestServiceClient(cc), r, lb
}

func endpoints(servers ...*testServer) []resolver.Endpoint {
	eps := make([]resolver.Endpoint, len(servers))
	for i, s := range servers {
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: s.addr}}}
	}
	return eps
}

// eventually polls cond every 5 ms until it holds or 10 s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// members returns the keys of b's members.
func members(b *llmlb.Balancer) []string {
	if b == nil {
		return nil
	}
	var keys []string
	for _, s := range b.Stats() {
		keys = append(keys, s.Key)
	}
	return keys
}

// stats returns b's accounting of the member key, and whether key is a
// member.
func stats(b *llmlb.Balancer, key string) (llmlb.EndpointStats, bool) {
	if b != nil {
		for _, s := range b.Stats() {
			if s.Key == key {
				return s, true
			}
		}
	}
	return llmlb.EndpointStats{}, false
}

// waitReady waits until n of the channel's balancer's members are healthy,
// which they are while their connection is READY.
func waitReady(t testing.TB, lb func() *llmlb.Balancer, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d READY members", n), func() bool {
		b := lb()
		if b == nil {
			return false
		}
		healthy := 0
		for _, s := range b.Stats() {
			if s.Healthy {
				healthy++
			}
		}
		return healthy == n
	})
}

// assertIdle checks that b has endpoints and that their accounting is back
// to zero.
func assertIdle(t testing.TB, b *llmlb.Balancer) {
	t.Helper()
	stats := b.Stats()
	if len(stats) == 0 {
		t.Error("the balancer has no endpoints to check")
	}
	for _, s := range stats {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			t.Errorf("endpoint %s not idle after all calls: %+v", s.Key, s)
		}
	}
}

// startStream starts a streaming call described by call, within timeout,
// and returns it once its first message has arrived.
func startStream(t *testing.T, client testgrpc.TestServiceClient, call *grpclb.Call, timeout time.Duration) testgrpc.TestService_StreamingOutputCallClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(grpclb.WithCall(context.Background(), call), timeout)
	t.Cleanup(cancel)
	stream, err := client.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	return stream
}
