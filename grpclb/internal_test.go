package grpclb

import (
	"context"
	"errors"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

func TestRequestFromMetadata(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   metadata.MD
		want *llmlb.Request
	}{
		{"none", metadata.Pairs("other", "1"), nil},
		{"all", metadata.Pairs(MetadataPromptTokens, "1200", MetadataMaxTokens, "512", MetadataOutputTokens, "100",
			MetadataAffinityKey, "s1", MetadataTenant, "acme"),
			&llmlb.Request{PromptTokens: 1200, MaxTokens: 512, OutputTokens: 100, AffinityKey: "s1", Tenant: "acme"}},
		{"malformed numbers are ignored", metadata.Pairs(MetadataPromptTokens, "lots", MetadataMaxTokens, "-5",
			MetadataOutputTokens, "99999999999", MetadataAffinityKey, "s2"), &llmlb.Request{AffinityKey: "s2"}},
		{"only malformed", metadata.Pairs(MetadataPromptTokens, "1e3"), nil},
		{"first value wins", metadata.Pairs(MetadataPromptTokens, "7", MetadataPromptTokens, "9"), &llmlb.Request{PromptTokens: 7}},
		{"empty strings", metadata.Pairs(MetadataAffinityKey, "", MetadataTenant, ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := requestFromMetadata(metadata.NewOutgoingContext(context.Background(), tc.md))
			if (got == nil) != (tc.want == nil) || (got != nil && (got.PromptTokens != tc.want.PromptTokens ||
				got.MaxTokens != tc.want.MaxTokens || got.OutputTokens != tc.want.OutputTokens ||
				got.AffinityKey != tc.want.AffinityKey || got.Tenant != tc.want.Tenant)) {
				t.Errorf("requestFromMetadata(%v) = %+v, want %+v", tc.md, got, tc.want)
			}
		})
	}
}

// FuzzRequestFromMetadata: whatever the call metadata holds, reading it
// does not panic, a number is read only when it is a decimal integer from 0
// to 2^31-1 (anything else leaves its field unknown), the strings are
// taken as they are, and the request is nil only when nothing was read.
func FuzzRequestFromMetadata(f *testing.F) {
	f.Add("1200", "512", "100", "s1", "acme")
	f.Add("-5", "99999999999", "1e3", "", "")
	f.Add("+7", "0x10", " 3", "\x00", "\xff")
	f.Add("2147483647", "2147483648", "007", "k", "")
	f.Fuzz(func(t *testing.T, prompt, maxTokens, output, affinity, tenant string) {
		md := metadata.Pairs(MetadataPromptTokens, prompt, MetadataMaxTokens, maxTokens,
			MetadataOutputTokens, output, MetadataAffinityKey, affinity, MetadataTenant, tenant)
		num := func(v string) (int, bool) {
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 0 {
				return 0, false
			}
			return int(n), true
		}
		p, pok := num(prompt)
		m, mok := num(maxTokens)
		o, ook := num(output)
		got := requestFromMetadata(metadata.NewOutgoingContext(context.Background(), md))
		if !pok && !mok && !ook && affinity == "" && tenant == "" {
			if got != nil {
				t.Fatalf("nothing to read, got %+v", got)
			}
			return
		}
		if got == nil {
			t.Fatal("got nil, want a request")
		}
		want := llmlb.Request{PromptTokens: p, MaxTokens: m, OutputTokens: o, AffinityKey: affinity, Tenant: tenant}
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("got %+v, want %+v", *got, want)
		}
		requestPool.Put(got)
	})
}

func TestRecorder(t *testing.T) {
	store := new(signals.Store)
	rec := &recorder{store: store}
	rec.record("a", &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{
		"kv_cache_utilization": 0.7, "num_requests_running": 3, "num_requests_waiting": 2}})
	l, ok := store.Load("a")
	if !ok || l.KVUsage != 0.7 || l.Running != 3 || l.Waiting != 2 || time.Since(l.At) > time.Minute {
		t.Fatalf("after a full report: %+v, %v", l, ok)
	}
	// Reports without the mapped metrics, or with bad values, are ignored.
	rec.record("a", &v3orcapb.OrcaLoadReport{CpuUtilization: 0.9})
	rec.record("a", &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_utilization": math.NaN()}})
	rec.record("a", &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"num_requests_running": -1}})
	rec.record("b", nil)
	if l2, _ := store.Load("a"); !reflect.DeepEqual(l2, l) {
		t.Errorf("ignored reports changed the observation: %+v -> %+v", l, l2)
	}
	if _, ok := store.Load("b"); ok {
		t.Error("a nil report was recorded")
	}
	// The utilization map is read too.
	rec.record("c", &v3orcapb.OrcaLoadReport{Utilization: map[string]float64{"kv_cache_usage_perc": 0.25}})
	if l, ok := store.Load("c"); !ok || l.KVUsage != 0.25 {
		t.Errorf("utilization report: %+v, %v", l, ok)
	}
}

// TestRejectedReportIsNoObservation: in a channel's own store, an endpoint
// whose every report is rejected (here, a NaN KV usage) has no observation
// for the balancer, not a KV usage of 0, also once other endpoints'
// reports are recorded; so the policy prices it as it prices an endpoint
// that reports nothing.
func TestRejectedReportIsNoObservation(t *testing.T) {
	keys := map[string]string{"good": "good", "bad": "bad"}
	rec := &recorder{store: new(signals.Store), owned: true}
	rec.keys = new(atomic.Pointer[map[string]string])
	rec.keys.Store(&keys)
	sig := rec.signal()
	nan := &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_utilization": math.NaN(), "num_requests_running": 1}}
	rec.record("bad", nan)
	if l, ok := sig.Load("bad"); ok {
		t.Fatalf("a rejected report is an observation: %+v", l)
	}
	rec.record("good", &v3orcapb.OrcaLoadReport{NamedMetrics: map[string]float64{"kv_cache_utilization": 0.5}})
	rec.record("bad", nan)
	if l, ok := sig.Load("good"); !ok || l.KVUsage != 0.5 {
		t.Fatalf("good: %+v, %v; want KV usage 0.5", l, ok)
	}
	if l, ok := sig.Load("bad"); ok {
		t.Errorf("a rejected report is an observation once others are recorded: %+v", l)
	}
}

// TestPickDoneLayout checks that a pickDone fills a size class whose
// objects start on a cache line (see pickDone).
func TestPickDoneLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is planned for 64-bit platforms")
	}
	if got := unsafe.Sizeof(pickDone{}); got != 128 {
		t.Errorf("pickDone is %d bytes, want 128", got)
	}
}

// keyEndpoint is an llmlb.Endpoint with the key it holds.
type keyEndpoint string

func (e keyEndpoint) Key() string { return string(e) }

// TestPickDoneOutcome: the error a pick ends with for each DoneInfo grpc
// may report. grpc discards a pick whose SubConn turned out not to be READY
// with a zero DoneInfo and picks again: that RPC never reached the
// endpoint, and must count neither as a success nor as a failure there.
func TestPickDoneOutcome(t *testing.T) {
	reset := errors.New("stream reset")
	cases := []struct {
		name string
		di   balancer.DoneInfo
		want error // nil: a success; context.Canceled: not sent
	}{
		{"discarded before sending", balancer.DoneInfo{}, context.Canceled},
		{"answered", balancer.DoneInfo{BytesSent: true, BytesReceived: true}, nil},
		{"sent without an answer", balancer.DoneInfo{BytesSent: true}, nil},
		{"failed", balancer.DoneInfo{Err: reset, BytesSent: true}, reset},
		{"failed before a stream", balancer.DoneInfo{Err: reset}, reset},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			var got []error
			lb, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithObserver(&llmlb.Observer{
				Done: func(d llmlb.DoneInfo) { got = append(got, d.Err) },
			}))
			if err != nil {
				t.Fatal(err)
			}
			if err := lb.Update([]llmlb.Endpoint{keyEndpoint("a")}); err != nil {
				t.Fatal(err)
			}
			pk, err := lb.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var child []balancer.DoneInfo
			d := &pickDone{pk: pk, rec: new(recorder), key: "a", child: func(di balancer.DoneInfo) { child = append(child, di) }}
			d.done = d.finish // as Pick makes one: finish puts it in the pool
			d.finish(test.di)
			if len(got) != 1 {
				t.Fatalf("Done(%+v) ended the pick %d times, want once", test.di, len(got))
			}
			if test.want == nil && got[0] != nil || test.want != nil && !errors.Is(got[0], test.want) {
				t.Errorf("Done(%+v) ended the pick with %v, want %v", test.di, got[0], test.want)
			}
			if len(child) != 1 || !reflect.DeepEqual(child[0], test.di) {
				t.Errorf("the child's Done got %+v, want [%+v]", child, test.di)
			}
			if s := lb.Stats()[0]; s.Outstanding != 0 {
				t.Errorf("%d requests outstanding after Done", s.Outstanding)
			}
		})
	}
}

// errPicker is a child picker that fails every pick with err.
type errPicker struct{ err error }

func (p errPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{}, p.err
}

// firstKey is a policy that chooses the candidate with the smallest key.
type firstKey struct{}

func (firstKey) Choose(c *llmlb.Candidates) int {
	best := 0
	for i := 1; i < c.Len(); i++ {
		if c.MemberKey(c.Member(i)) < c.MemberKey(c.Member(best)) {
			best = i
		}
	}
	return best
}

// TestPickChildFailureNotSent: when the child picker of the endpoint picked
// fails (its SubConn is connecting, or in transient failure), grpc never
// sends the RPC with that pick: it waits for another picker, or fails the
// RPC with the child's error. The pick ends as not sent, neither a success
// nor a failure of the endpoint, and grpc gets the child's error.
func TestPickChildFailureNotSent(t *testing.T) {
	refused := errors.New("connection refused")
	cases := []struct {
		name    string
		members []*endpoint
		unready []string
		want    error // Pick's error
		picks   int
	}{
		{"connecting", []*endpoint{{key: "a", picker: errPicker{balancer.ErrNoSubConnAvailable}, ready: true}},
			nil, balancer.ErrNoSubConnAvailable, 1},
		{"transient failure", []*endpoint{{key: "a", picker: errPicker{refused}}},
			[]string{"a"}, refused, 1},
		{"transient failure, then one that left READY", []*endpoint{
			{key: "a", picker: errPicker{refused}},
			{key: "b", picker: errPicker{balancer.ErrNoSubConnAvailable}, ready: true},
		}, []string{"a"}, refused, 2},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			var got []error
			lb, err := llmlb.New(firstKey{}, llmlb.WithObserver(&llmlb.Observer{
				Done: func(d llmlb.DoneInfo) { got = append(got, d.Err) },
			}))
			if err != nil {
				t.Fatal(err)
			}
			eps := make([]llmlb.Endpoint, len(test.members))
			for i, m := range test.members {
				eps[i] = m
			}
			if err := lb.Update(eps); err != nil {
				t.Fatal(err)
			}
			p := &picker{lb: lb, rec: new(recorder), unready: test.unready}
			_, err = p.Pick(balancer.PickInfo{Ctx: context.Background()})
			if !errors.Is(err, test.want) {
				t.Errorf("Pick = %v, want %v", err, test.want)
			}
			if len(got) != test.picks {
				t.Fatalf("%d picks ended, want %d", len(got), test.picks)
			}
			for i, err := range got {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("pick %d ended with %v, want context canceled", i+1, err)
				}
			}
			for _, s := range lb.Stats() {
				if s.Outstanding != 0 {
					t.Errorf("%d requests outstanding on %s", s.Outstanding, s.Key)
				}
			}
		})
	}
}

func TestKeyEndpoints(t *testing.T) {
	ep := func(addrs ...string) resolver.Endpoint {
		var e resolver.Endpoint
		for _, a := range addrs {
			e.Addresses = append(e.Addresses, resolver.Address{Addr: a})
		}
		return e
	}
	for _, test := range []struct {
		name string
		in   []resolver.Endpoint
		want [][]string        // the addresses of the endpoints returned
		keys map[string]string // address -> key
	}{
		{"distinct", []resolver.Endpoint{ep("a"), ep("b", "c")}, [][]string{{"a"}, {"b", "c"}},
			map[string]string{"a": "a", "b": "b", "c": "b"}},
		{"first address shared", []resolver.Endpoint{ep("a"), ep("b"), ep("a", "c"), ep("a", "d", "c")},
			[][]string{{"a", "c", "d"}, {"b"}}, map[string]string{"a": "a", "b": "b", "c": "a", "d": "a"}},
		{"same set, first listed kept", []resolver.Endpoint{ep("b", "a"), ep("a", "b")}, [][]string{{"b", "a"}},
			map[string]string{"a": "b", "b": "b"}},
		{"merged into the set of another", []resolver.Endpoint{ep("a"), ep("b", "a"), ep("a", "b")},
			[][]string{{"a", "b"}}, map[string]string{"a": "a", "b": "a"}},
		{"later address shared", []resolver.Endpoint{ep("b", "a"), ep("a")}, [][]string{{"b", "a"}, {"a"}},
			map[string]string{"a": "a", "b": "b"}},
		{"repeats inside an endpoint", []resolver.Endpoint{ep("a", "a", "b"), ep("b", "a", "b")}, [][]string{{"a", "b"}},
			map[string]string{"a": "a", "b": "a"}},
		{"repeats across merged endpoints", []resolver.Endpoint{ep("a", "b"), ep("a", "c", "b", "c")}, [][]string{{"a", "b", "c"}},
			map[string]string{"a": "a", "b": "a", "c": "a"}},
		{"no addresses", []resolver.Endpoint{{}, ep("a"), {}}, [][]string{nil, {"a"}},
			map[string]string{"a": "a"}},
	} {
		t.Run(test.name, func(t *testing.T) {
			in := make([]resolver.Endpoint, len(test.in))
			for i, e := range test.in {
				in[i] = resolver.Endpoint{Addresses: slices.Clone(e.Addresses)}
			}
			got, keys := keyEndpoints(in)
			var addrs [][]string
			for _, e := range got {
				var as []string
				for _, a := range e.Addresses {
					as = append(as, a.Addr)
				}
				addrs = append(addrs, as)
			}
			if !reflect.DeepEqual(addrs, test.want) {
				t.Errorf("endpoints %q, want %q", addrs, test.want)
			}
			if !maps.Equal(keys, test.keys) {
				t.Errorf("keys %v, want %v", keys, test.keys)
			}
			if !reflect.DeepEqual(in, test.in) {
				t.Errorf("the resolver's endpoints were modified: %v, were %v", in, test.in)
			}
			// The same list gives the same result.
			again, keys2 := keyEndpoints(in)
			if !reflect.DeepEqual(again, got) || !maps.Equal(keys2, keys) {
				t.Errorf("a second call gave %v, %v; the first %v, %v", again, keys2, got, keys)
			}
		})
	}
}

// TestRememberedMarksBounded: the marks remembered for endpoints the
// resolver does not list are at most maxRememberedMarks, the least
// recently added forgotten first.
func TestRememberedMarksBounded(t *testing.T) {
	var m rememberedMarks
	key := func(i int) string { return "10.0.0.1:" + strconv.Itoa(i) }
	for i := range 10 * maxRememberedMarks {
		m.add(key(i))
		if i == 5 {
			m.add(key(0)) // key(0) is now added after key(1)
		}
		if i == maxRememberedMarks {
			m.add(key(0))
		}
	}
	if n := m.len(); n != maxRememberedMarks {
		t.Fatalf("remembered %d keys, want %d", n, maxRememberedMarks)
	}
	if m.take(key(0)) || m.take(key(9*maxRememberedMarks-1)) {
		t.Error("an old key is still remembered")
	}
	if !m.take(key(10*maxRememberedMarks-1)) || m.take(key(10*maxRememberedMarks-1)) {
		t.Error("the newest key is not remembered once")
	}
	m.add("a")
	m.add("a")
	if !m.take("a") || m.take("a") {
		t.Error("a key added twice is not remembered once")
	}
	m.clear()
	if m.len() != 0 {
		t.Error("clear left keys")
	}
	m.add("b")
	if !m.take("b") {
		t.Error("a key added after clear is not remembered")
	}
}
