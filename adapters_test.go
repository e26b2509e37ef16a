package llmlb

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

// adapterSetup returns a balancer over n endpoints whose policy is
// AdapterAffinity over a probe, with a fake clock and signal.
func adapterSetup(t *testing.T, n int, cfg AdapterConfig) (*Balancer, *probe, *fakeClock, *fakeSignal) {
	t.Helper()
	pr := &probe{}
	p, err := AdapterAffinity(pr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	clock, sig := newFakeClock(), &fakeSignal{}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(n))
	return b, pr, clock, sig
}

func pickKey(t *testing.T, b *Balancer, r *Request) (string, Pick) {
	t.Helper()
	p, err := b.Pick(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return p.Endpoint().Key(), p
}

func TestAdapterAffinityConfig(t *testing.T) {
	cases := []struct {
		name  string
		inner Policy
		cfg   AdapterConfig
	}{
		{"nil inner", nil, AdapterConfig{}},
		{"negative memory", RoundRobin(), AdapterConfig{Memory: -1}},
		{"negative spread", RoundRobin(), AdapterConfig{Spread: -1}},
		{"NaN spread", RoundRobin(), AdapterConfig{Spread: nan()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := AdapterAffinity(tc.inner, tc.cfg); !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("err = %v, want ErrInvalidPolicy", err)
			}
		})
	}
}

func nan() float64 { var z float64; return z / z }

func TestAdapterAffinityBaseModelUnchanged(t *testing.T) {
	b, pr, clock, sig := adapterSetup(t, 3, AdapterConfig{})
	sig.Set("ep1", Load{At: clock.Now(), Adapters: []string{"a"}, MaxAdapters: 1})
	pickKey(t, b, &Request{})
	if len(pr.keys) != 3 {
		t.Fatalf("inner saw %v, want every endpoint", pr.keys)
	}
}

func TestAdapterAffinityObservedHolder(t *testing.T) {
	b, pr, clock, sig := adapterSetup(t, 4, AdapterConfig{TTL: -1})
	now := clock.Now()
	sig.Set("ep0", Load{At: now, Adapters: []string{"x"}, MaxAdapters: 2})
	sig.Set("ep2", Load{At: now, Adapters: []string{"b", "a"}, MaxAdapters: 2})
	sig.Set("ep3", Load{At: now, Adapters: []string{"a"}, MaxAdapters: 4})
	pickKey(t, b, &Request{Adapter: "a"})
	if !slices.Equal(pr.keys, []string{"ep2", "ep3"}) {
		t.Fatalf("inner saw %v, want the holders ep2 and ep3", pr.keys)
	}
	// No holder: endpoints with a free slot; ep2 is full, ep1 unreported.
	_, pk := pickKey(t, b, &Request{Adapter: "c"})
	if !slices.Equal(pr.keys, []string{"ep0", "ep1", "ep3"}) {
		t.Fatalf("inner saw %v, want those with room", pr.keys)
	}
	pk.Done(nil) // in flight, it would hold c where it went
	// No holder and no room: every candidate.
	for _, k := range []string{"ep0", "ep1", "ep3"} {
		sig.Set(k, Load{At: now, Adapters: []string{"y"}, MaxAdapters: 1})
	}
	pickKey(t, b, &Request{Adapter: "c"})
	if len(pr.keys) != 4 {
		t.Fatalf("inner saw %v, want every endpoint", pr.keys)
	}
	// A stale observation does not count.
	clock.Advance(2 * time.Minute)
	pickKey(t, b, &Request{Adapter: "a"})
	if len(pr.keys) != 4 {
		t.Fatalf("inner saw %v with stale observations, want every endpoint", pr.keys)
	}
}

func TestAdapterAffinityRemembersDecisions(t *testing.T) {
	b, pr, clock, _ := adapterSetup(t, 4, AdapterConfig{TTL: 10 * time.Second})
	pr.pick = "ep2"
	key, p := pickKey(t, b, &Request{Adapter: "a"})
	p.Done(nil)
	if key != "ep2" || len(pr.keys) != 4 {
		t.Fatalf("first pick %s among %v", key, pr.keys)
	}
	pr.pick = ""
	clock.Advance(9 * time.Second)
	_, p = pickKey(t, b, &Request{Adapter: "a"})
	p.Done(nil)
	if !slices.Equal(pr.keys, []string{"ep2"}) {
		t.Fatalf("inner saw %v, want the endpoint the adapter went to", pr.keys)
	}
	// Another adapter is not held there.
	pickKey(t, b, &Request{Adapter: "b"})
	if len(pr.keys) != 4 {
		t.Fatalf("inner saw %v for another adapter", pr.keys)
	}
	// The second pick renewed the decision; it expires TTL after it.
	clock.Advance(9 * time.Second)
	pickKey(t, b, &Request{Adapter: "a"})
	if !slices.Equal(pr.keys, []string{"ep2"}) {
		t.Fatalf("inner saw %v before expiry", pr.keys)
	}
	clock.Advance(11 * time.Second)
	pickKey(t, b, &Request{Adapter: "a"})
	if len(pr.keys) != 4 {
		t.Fatalf("inner saw %v after expiry, want every endpoint", pr.keys)
	}
}

func TestAdapterAffinitySpreadsHotAdapter(t *testing.T) {
	b, pr, clock, sig := adapterSetup(t, 4, AdapterConfig{TTL: -1})
	now := clock.Now()
	// ep0 holds the adapter with 10 requests; ep1 and ep2 hold 2 each, ep3
	// none and has no room: the others' average is 4/3, and with the
	// default Spread of 2, 10 > (1+2)*4/3 + 1.
	sig.Set("ep0", Load{At: now, Running: 10, Adapters: []string{"hot"}, MaxAdapters: 2})
	sig.Set("ep1", Load{At: now, Running: 2, Adapters: []string{"x"}, MaxAdapters: 2})
	sig.Set("ep2", Load{At: now, Running: 1, Waiting: 1, Adapters: []string{"x"}, MaxAdapters: 2})
	sig.Set("ep3", Load{At: now, Running: 0, Adapters: []string{"x", "y"}, MaxAdapters: 2})
	_, pk := pickKey(t, b, &Request{Adapter: "hot"})
	pk.Done(nil)
	if len(pr.keys) != 2 || pr.keys[0] != "ep0" || (pr.keys[1] != "ep1" && pr.keys[1] != "ep2") {
		t.Fatalf("inner saw %v, want ep0 and one of ep1, ep2 (ep3 is full)", pr.keys)
	}
	// At 3 requests the holder is within the margin (3 <= 3*4/3 + 1).
	sig.Set("ep0", Load{At: now, Running: 3, Adapters: []string{"hot"}, MaxAdapters: 2})
	pickKey(t, b, &Request{Adapter: "hot"})
	if !slices.Equal(pr.keys, []string{"ep0"}) {
		t.Fatalf("inner saw %v, want the holder alone", pr.keys)
	}
	// A larger Spread keeps a busier holder alone: 6 > 3*4/3 + 1, but
	// 6 <= (1+3)*4/3 + 1.
	b2, pr2, clock2, sig2 := adapterSetup(t, 4, AdapterConfig{TTL: -1, Spread: 3})
	for k, v := range sig.obs {
		v.At = clock2.Now()
		sig2.Set(k, v)
	}
	sig2.Set("ep0", Load{At: clock2.Now(), Running: 6, Adapters: []string{"hot"}, MaxAdapters: 2})
	pickKey(t, b2, &Request{Adapter: "hot"})
	if !slices.Equal(pr2.keys, []string{"ep0"}) {
		t.Fatalf("Spread 3: inner saw %v, want the holder alone", pr2.keys)
	}
}

func TestAdapterAffinityBoundedMemory(t *testing.T) {
	inner := LeastOutstanding()
	p, err := AdapterAffinity(inner, AdapterConfig{Memory: 16})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, p)
	mustUpdate(t, b, eps(4))
	for i := 0; i < 1000; i++ {
		pk, err := b.Pick(context.Background(), &Request{Adapter: "hostile-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
	}
	if n := p.(*adapterAffinity).seen.Len(); n > 16 {
		t.Fatalf("%d pairs remembered, want at most 16", n)
	}
}

func TestAdapterAffinityForwardsLearning(t *testing.T) {
	d, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := AdapterAffinity(d, AdapterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if b := mustNew(t, p); !b.learn {
		t.Fatal("a balancer over AdapterAffinity(Default) does not learn")
	}
}

func TestAdapterAffinityPickAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p, err := AdapterAffinity(LeastOutstanding(), AdapterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	clock, sig := newFakeClock(), &fakeSignal{}
	for i := 0; i < 8; i++ {
		sig.Set("ep"+strconv.Itoa(i), Load{At: clock.Now(), Adapters: []string{"a", "b"}, MaxAdapters: 4})
	}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(8))
	r := &Request{PromptTokens: 100, Adapter: "a"}
	pick := func() {
		pk, err := b.Pick(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
	}
	for i := 0; i < 100; i++ {
		pick()
	}
	if n := testing.AllocsPerRun(200, pick); n > 0 {
		t.Fatalf("%v allocations per pick of a known adapter, want 0", n)
	}
}

// BenchmarkPickAdapter measures Pick plus Done of requests naming one of
// 32 adapters, AdapterAffinity over least outstanding, on 64 endpoints that
// report their adapters; compare BenchmarkPickSignal's least-outstanding.
func BenchmarkPickAdapter(b *testing.B) {
	p, err := AdapterAffinity(LeastOutstanding(), AdapterConfig{})
	if err != nil {
		b.Fatal(err)
	}
	sig := &fakeSignal{}
	clock := newFakeClock()
	for i := 0; i < 64; i++ {
		sig.Set("ep"+strconv.Itoa(i), Load{At: clock.Now(), Running: i % 7,
			Adapters: []string{"a" + strconv.Itoa(i%32), "a" + strconv.Itoa((i+1)%32)}, MaxAdapters: 4})
	}
	bal := mustNew(b, p, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(b, bal, eps(64))
	reqs := make([]Request, 32)
	for i := range reqs {
		reqs[i] = Request{PromptTokens: 1000, Adapter: "a" + strconv.Itoa(i)}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pk, err := bal.Pick(ctx, &reqs[i%32])
		if err != nil {
			b.Fatal(err)
		}
		pk.Done(nil)
	}
}
