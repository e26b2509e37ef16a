package grpclb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/leastrequest" // registers least_request_experimental
	_ "google.golang.org/grpc/balancer/roundrobin"   // registers round_robin
	"google.golang.org/grpc/connectivity"
	estats "google.golang.org/grpc/experimental/stats"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/grpclb"
)

// fakeCC is a balancer.ClientConn whose SubConns connect when told to; it
// keeps the last picker published. Unimplemented methods of the embedded
// nil interfaces are never called by the balancers under test.
type fakeCC struct {
	balancer.ClientConn
	mu       sync.Mutex // protects the fields below
	subConns []*fakeSC
	picker   balancer.Picker
	state    connectivity.State
}

func (c *fakeCC) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc := &fakeSC{addr: addrs[0].Addr, listener: opts.StateListener}
	c.subConns = append(c.subConns, sc)
	return sc, nil
}

func (c *fakeCC) UpdateState(s balancer.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.picker, c.state = s.Picker, s.ConnectivityState
}

func (c *fakeCC) Target() string                          { return "fake:///backends" }
func (c *fakeCC) MetricsRecorder() estats.MetricsRecorder { return noMetrics{} }
func (c *fakeCC) ResolveNow(resolver.ResolveNowOptions)   {}

// connectAll moves every SubConn to READY and healthy.
func (c *fakeCC) connectAll() {
	c.mu.Lock()
	scs := append([]*fakeSC(nil), c.subConns...)
	c.mu.Unlock()
	for _, sc := range scs {
		sc.listener(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
		sc.listener(balancer.SubConnState{ConnectivityState: connectivity.Ready})
		if sc.health != nil {
			sc.health(balancer.SubConnState{ConnectivityState: connectivity.Ready})
		}
	}
}

func (c *fakeCC) currentPicker() (balancer.Picker, connectivity.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.picker, c.state
}

type fakeSC struct {
	balancer.SubConn
	addr     string
	listener func(balancer.SubConnState)
	health   func(balancer.SubConnState)
}

func (sc *fakeSC) Connect()                                             {}
func (sc *fakeSC) Shutdown()                                            {}
func (sc *fakeSC) RegisterHealthListener(l func(balancer.SubConnState)) { sc.health = l }

type noMetrics struct{ estats.MetricsRecorder }

func (noMetrics) RecordInt64Count(*estats.Int64CountHandle, int64, ...string)             {}
func (noMetrics) RecordFloat64Count(*estats.Float64CountHandle, float64, ...string)       {}
func (noMetrics) RecordInt64Histo(*estats.Int64HistoHandle, int64, ...string)             {}
func (noMetrics) RecordFloat64Histo(*estats.Float64HistoHandle, float64, ...string)       {}
func (noMetrics) RecordInt64Gauge(*estats.Int64GaugeHandle, int64, ...string)             {}
func (noMetrics) RecordInt64UpDownCount(*estats.Int64UpDownCountHandle, int64, ...string) {}
func (noMetrics) RegisterAsyncReporter(estats.AsyncMetricReporter, ...estats.AsyncMetric) func() {
	return func() {}
}

// readyPicker builds the balancer of builder with config js over n fake
// endpoints, connects them all and returns the READY picker.
func readyPicker(t testing.TB, builder balancer.Builder, js string, n int) (balancer.Picker, func()) {
	t.Helper()
	cc := new(fakeCC)
	b := builder.Build(cc, balancer.BuildOptions{})
	var cfg serviceconfig.LoadBalancingConfig
	if parser, ok := builder.(balancer.ConfigParser); ok {
		var err error
		if cfg, err = parser.ParseConfig(json.RawMessage(js)); err != nil {
			t.Fatal(err)
		}
	}
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)}}}
	}
	if err := b.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}, BalancerConfig: cfg}); err != nil {
		t.Fatal(err)
	}
	cc.connectAll()
	p, st := cc.currentPicker()
	if st != connectivity.Ready || p == nil {
		t.Fatalf("state %v after connecting all SubConns, want READY", st)
	}
	return p, b.Close
}

// TestFakePickerSpreadsLoad checks, without a network, that the picker
// picks only READY endpoints, that an endpoint leaving READY leaves the
// picker, and that Done is wired.
func TestFakePickerSpreadsLoad(t *testing.T) {
	builder := newTestBuilder(t)
	cc := new(fakeCC)
	b := builder.Build(cc, balancer.BuildOptions{})
	defer b.Close()
	cfg, err := builder.ParseConfig(json.RawMessage(`{"policy": "least-outstanding"}`))
	if err != nil {
		t.Fatal(err)
	}
	eps := []resolver.Endpoint{
		{Addresses: []resolver.Address{{Addr: "a:1"}}},
		{Addresses: []resolver.Address{{Addr: "b:1"}}},
	}
	if err := b.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}, BalancerConfig: cfg}); err != nil {
		t.Fatal(err)
	}
	p, st := cc.currentPicker()
	if st == connectivity.Ready {
		t.Fatalf("READY before any SubConn connected")
	}
	if _, err := p.Pick(balancer.PickInfo{Ctx: context.Background()}); err != balancer.ErrNoSubConnAvailable {
		t.Fatalf("Pick while connecting = %v, want ErrNoSubConnAvailable", err)
	}
	cc.connectAll()
	p, _ = cc.currentPicker()
	// Least outstanding with both held: two picks go to different SubConns.
	r1, err1 := p.Pick(balancer.PickInfo{Ctx: context.Background()})
	r2, err2 := p.Pick(balancer.PickInfo{Ctx: context.Background()})
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if r1.SubConn.(*fakeSC).addr == r2.SubConn.(*fakeSC).addr {
		t.Errorf("two outstanding picks on %s, want one per endpoint", r1.SubConn.(*fakeSC).addr)
	}
	r1.Done(balancer.DoneInfo{})
	r2.Done(balancer.DoneInfo{})

	// a:1 fails: every pick now goes to b:1. (The SubConns are created in
	// a random order.)
	cc.mu.Lock()
	var failed *fakeSC
	for _, sc := range cc.subConns {
		if sc.addr == "a:1" {
			failed = sc
		}
	}
	cc.mu.Unlock()
	failed.listener(balancer.SubConnState{ConnectivityState: connectivity.TransientFailure})
	p, _ = cc.currentPicker()
	for range 10 {
		r, err := p.Pick(balancer.PickInfo{Ctx: context.Background()})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.SubConn.(*fakeSC).addr; got != "b:1" {
			t.Fatalf("picked %s after a:1 failed", got)
		}
		r.Done(balancer.DoneInfo{})
	}
}

// BenchmarkPickGRPC compares the cost of a pick plus its Done through
// grpclb's picker with grpc-go's own pickers on the same fake SubConns:
// least_request_experimental (P2C over outstanding RPCs, the algorithm of
// llmlb's p2c) and round_robin. The llmlb pickers build the request from
// the call: "ctx" reads a Call attached with WithCall, "md" reads the
// outgoing metadata keys, and a plain context has neither; "rpc" is a
// context as an RPC's is at the pick, with neither but a deadline, a few
// values and outgoing metadata of its own (an authorization header), which
// the llmlb pickers look through for their keys (the same context is given
// to grpc-go's pickers, which do not read it). Each Done is an RPC's that
// was sent and answered (bytes sent and received): a zero DoneInfo is grpc's
// for a pick it discarded, which the llmlb pickers end as not sent. Run with
// -cpu 1,2 to see the scaling.
func BenchmarkPickGRPC(b *testing.B) {
	callCtx := func() context.Context {
		return grpclb.WithCall(context.Background(), &grpclb.Call{Request: llmlb.Request{PromptTokens: 1000, MaxTokens: 256}})
	}
	mdCtx := func() context.Context {
		return metadata.AppendToOutgoingContext(context.Background(),
			grpclb.MetadataPromptTokens, "1000", grpclb.MetadataMaxTokens, "256")
	}
	plainCtx := context.Background
	rpcCtx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		b.Cleanup(cancel)
		for i := range 4 {
			ctx = context.WithValue(ctx, benchKey(i), i)
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token")
	}
	for _, n := range []int{8, 64} {
		for _, tc := range []struct {
			name    string
			builder balancer.Builder
			js      string
			ctx     func() context.Context
		}{
			{"llmlb-p2c", newTestBuilder(b), `{"policy": "p2c"}`, plainCtx},
			{"llmlb-p2c-ctx", newTestBuilder(b), `{"policy": "p2c"}`, callCtx},
			{"llmlb-p2c-md", newTestBuilder(b), `{"policy": "p2c"}`, mdCtx},
			{"llmlb-p2c-rpc", newTestBuilder(b), `{"policy": "p2c"}`, rpcCtx},
			{"llmlb-round-robin", newTestBuilder(b), `{"policy": "round-robin"}`, plainCtx},
			{"llmlb-default", newTestBuilder(b), `{"policy": "default"}`, plainCtx},
			{"least_request", balancer.Get("least_request_experimental"), `{}`, plainCtx},
			{"least_request-rpc", balancer.Get("least_request_experimental"), `{}`, rpcCtx},
			{"round_robin", balancer.Get("round_robin"), ``, plainCtx},
		} {
			b.Run(fmt.Sprintf("picker=%s/endpoints=%d", tc.name, n), func(b *testing.B) {
				p, closeFn := readyPicker(b, tc.builder, tc.js, n)
				defer closeFn()
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					info := balancer.PickInfo{FullMethodName: "/svc/Method", Ctx: tc.ctx()}
					for pb.Next() {
						r, err := p.Pick(info)
						if err != nil {
							b.Error(err)
							return
						}
						if r.Done != nil { // round_robin does not ask
							r.Done(balancer.DoneInfo{BytesSent: true, BytesReceived: true})
						}
					}
				})
			})
		}
	}
}

// benchKey is a context key of BenchmarkPickGRPC's RPC context.
type benchKey int

// TestPickDoesNotAllocate checks that a pick and its Done through the
// picker allocate nothing, with the request read from a Call in the context
// or with no request at all.
func TestPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; allocation counts are meaningless")
	}
	for _, policy := range []string{"p2c", "round-robin", "least-outstanding"} {
		p, closeFn := readyPicker(t, newTestBuilder(t), `{"policy": "`+policy+`"}`, 8)
		call := &grpclb.Call{Request: llmlb.Request{PromptTokens: 1000, MaxTokens: 256}}
		for _, ctx := range []context.Context{context.Background(), grpclb.WithCall(context.Background(), call)} {
			info := balancer.PickInfo{FullMethodName: "/svc/Method", Ctx: ctx}
			allocs := testing.AllocsPerRun(1000, func() {
				r, err := p.Pick(info)
				if err != nil {
					t.Fatal(err)
				}
				r.Done(balancer.DoneInfo{})
			})
			if allocs != 0 {
				t.Errorf("%s: %v allocs per pick and Done, want 0", policy, allocs)
			}
		}
		closeFn()
	}
}
