package llmlb

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// signalProbe returns a balancer over two endpoints with a fake signal
// (maximum age 5 s) and a probe policy that always picks ep0, and a function
// that picks a request of 100 prompt and 28 output tokens.
func signalProbe(t *testing.T) (*Balancer, *fakeClock, *fakeSignal, *probe, func() Pick) {
	t.Helper()
	clock := newFakeClock()
	sig := &fakeSignal{}
	p := &probe{pick: "ep0"}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, 5*time.Second))
	mustUpdate(t, b, eps(2))
	pick := func() Pick {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 28})
		if err != nil {
			t.Fatal(err)
		}
		return pk
	}
	return b, clock, sig, p, pick
}

func TestSignalCorrection(t *testing.T) {
	b, clock, sig, p, pick := signalProbe(t)

	// Dispatches made before any observation.
	early := pick()
	sig.Set("ep0", Load{At: clock.Now(), Running: 5, Waiting: 2, KVUsage: 0.5, KVBlocks: 1000, BlockSize: 16})
	clock.Advance(10 * time.Millisecond)
	var after []Pick
	for range 3 {
		after = append(after, pick())
	}
	pick().Done(nil) // a dispatch that finished adds nothing
	l := p.loads["ep0"]
	// The observation (7 requests) plus the 3 still-outstanding dispatches
	// made after it; the early dispatch is assumed seen by the observation.
	if !l.Fresh || l.Requests != 10 || l.Waiting != 5 {
		t.Fatalf("after 3 dispatches: %+v, want fresh, 10 requests, 5 waiting", l)
	}
	pick().Done(nil)
	l = p.loads["ep0"]
	if want := 0.5 + 3*128.0/16000; math.Abs(l.KVUsage-want) > 1e-12 {
		t.Fatalf("KV usage %v, want %v (observation plus dispatched tokens)", l.KVUsage, want)
	}

	// A newer observation that saw everything: no double counting.
	sig.Set("ep0", Load{At: clock.Now(), Running: 9, Waiting: 0, KVUsage: 0.6, KVBlocks: 1000, BlockSize: 16})
	clock.Advance(time.Millisecond)
	pick().Done(nil)
	if l := p.loads["ep0"]; l.Requests != 9 || l.KVUsage != 0.6 {
		t.Fatalf("after a newer observation: %+v, want 9 requests and usage 0.6", l)
	}
	// Requests the newer observation counted leave it when they finish.
	for _, pk := range after {
		pk.Done(nil)
	}
	early.Done(nil)
	pick().Done(nil)
	if l := p.loads["ep0"]; l.Requests != 5 {
		t.Fatalf("requests %d, want 5: the observation's 9 less the 4 that finished", l.Requests)
	}

	// The observation never makes an endpoint look emptier than this
	// balancer's own outstanding requests.
	sig.Set("ep1", Load{At: clock.Now(), Running: 0, KVUsage: math.NaN()})
	held := holdOn(t, b, "ep1", 4, Request{})
	pick().Done(nil)
	if l := p.loads["ep1"]; l.Requests != 4 || !math.IsNaN(l.KVUsage) || !l.Fresh {
		t.Fatalf("ep1: %+v, want 4 requests (own count), unknown KV", l)
	}

	// Too old: the observation is ignored and own counts are used.
	clock.Advance(6 * time.Second)
	pick().Done(nil)
	if l := p.loads["ep1"]; l.Fresh || l.Requests != 4 {
		t.Fatalf("stale ep1: %+v, want not fresh and own count 4", l)
	}
	if l := p.loads["ep0"]; l.Fresh || l.Requests != 0 {
		t.Fatalf("stale ep0: %+v, want not fresh and 0", l)
	}
	for _, h := range held {
		h.Done(nil)
	}
}

func TestInvalidObservationsIgnored(t *testing.T) {
	clock := newFakeClock()
	for _, tc := range []struct {
		name string
		obs  Load
	}{
		{"negative running", Load{Running: -1}},
		{"negative waiting", Load{Waiting: -3}},
		{"Inf usage", Load{KVUsage: math.Inf(1)}},
		{"negative usage", Load{KVUsage: -0.1}},
		{"usage over 1", Load{KVUsage: 1.5}},
		{"negative blocks", Load{KVBlocks: -1}},
		{"negative peer waiting", Load{Waiting: 3, PeerWaiting: -1}},
		{"negative peer prefill", Load{Waiting: 3, PeerWaiting: 1, PeerPrefillTokens: -5}},
		{"zero time", Load{Running: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sig := &fakeSignal{}
			p := &probe{}
			b := mustNew(t, p, WithClock(clock), WithSignal(sig, 0))
			mustUpdate(t, b, eps(1))
			obs := tc.obs
			if tc.name != "zero time" {
				obs.At = clock.Now()
			}
			sig.Set("ep0", obs)
			pk, err := b.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pk.Done(nil)
			// A single candidate is not scored; pick again with two.
			mustUpdate(t, b, eps(2))
			pk, _ = b.Pick(context.Background(), nil)
			pk.Done(nil)
			if l := p.loads["ep0"]; l.Fresh || l.Requests != 0 || !math.IsNaN(l.KVUsage) {
				t.Fatalf("invalid observation used: %+v", l)
			}
		})
	}
}

// TestStaleViewHerding checks the property the correction exists for: with a
// signal that is never refreshed, a balancer still spreads its own
// dispatches instead of sending all of them to the endpoint that looked
// emptiest at the last observation.
func TestStaleViewHerding(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	b := mustNew(t, LeastOutstanding(), WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(4))
	for i, running := range []int{0, 5, 5, 5} {
		sig.Set(eps(4)[i].Key(), Load{At: clock.Now(), Running: running, KVUsage: math.NaN()})
	}
	counts := map[string]int{}
	var live []Pick
	for range 40 {
		pk, _ := b.Pick(context.Background(), nil)
		counts[pk.Endpoint().Key()]++
		live = append(live, pk)
	}
	// ep0 absorbs its 5 requests of headroom, then all four share: 5 + 35/4.
	if counts["ep0"] > 15 || counts["ep1"] < 7 {
		t.Fatalf("dispatch counts %v: the stale minimum absorbed everything", counts)
	}
	for _, p := range live {
		p.Done(nil)
	}
}

// TestSignalBacklog checks the backlog the overload term of Default reads:
// the observation's waiting requests plus the dispatches since it that have
// not streamed yet, where Waiting counts every dispatch since it that is
// still outstanding.
func TestSignalBacklog(t *testing.T) {
	_, clock, sig, p, pick := signalProbe(t)
	check := func(when string, waiting, backlog int64) {
		t.Helper()
		pick().Done(nil) // refreshes p.loads; finished at once, it adds nothing
		if l := p.loads["ep0"]; l.Waiting != waiting || l.backlog != backlog {
			t.Fatalf("%s: waiting %d, backlog %d; want %d and %d", when, l.Waiting, l.backlog, waiting, backlog)
		}
	}

	// Without an observation both are this balancer's queued requests.
	early := pick()
	check("no observation", 1, 1)
	early.FirstToken()
	check("no observation, streaming", 0, 0)

	sig.Set("ep0", Load{At: clock.Now(), Running: 5, Waiting: 2})
	clock.Advance(10 * time.Millisecond)
	var since []Pick
	for range 3 {
		since = append(since, pick())
	}
	check("3 dispatches since the observation", 5, 5)
	since[0].FirstToken()
	check("one of them streaming", 5, 4)
	since[0].Done(nil)
	check("it finished", 4, 4)
	since[1].Done(nil) // before its first token
	check("one finished before streaming", 3, 3)
	since[2].FirstToken()
	since[2].FirstToken() // idempotent
	check("the last one streaming", 3, 2)

	// A newer observation starts over; the old dispatches, streaming at
	// it, leave its waiting requests alone when they finish.
	sig.Set("ep0", Load{At: clock.Now(), Running: 1, Waiting: 0})
	clock.Advance(time.Millisecond)
	held := pick()
	check("after a newer observation", 1, 1)
	since[2].Done(nil)
	early.Done(nil)
	check("old dispatches done", 1, 1)
	held.FirstToken()
	check("the new dispatch streaming", 1, 0)
	held.Done(nil)
	check("all done", 0, 0)
}

// TestHugeObservedLoad checks that observed counts as large as an int holds
// saturate instead of wrapping: the estimates stay at least the observed
// values, and an endpoint reporting them never wins against an idle or
// lightly loaded one under the load-based policies.
func TestHugeObservedLoad(t *testing.T) {
	loads := []struct {
		name             string
		running, waiting int
	}{
		{"running", math.MaxInt, 0},
		{"waiting", 0, math.MaxInt},
		{"both", math.MaxInt, math.MaxInt},
	}
	policies := []struct {
		name string
		new  func() (Policy, error)
	}{
		{"least-outstanding", func() (Policy, error) { return LeastOutstanding(), nil }},
		{"p2c", func() (Policy, error) { return P2C(nil), nil }},
		{"weighted-least-request", func() (Policy, error) { return WeightedLeastRequest(1) }},
		{"prefix-aware", func() (Policy, error) { return PrefixAware(PrefixAwareConfig{}) }},
		{"consistent-hash", func() (Policy, error) { return ConsistentHash(HashConfig{}) }},
		// PrefixHash is not here: like SGLang's prefix_hash it reads only
		// the balancer's own requests in flight, never the signal.
	}
	// setup returns a balancer choosing with pol whose ep0 reports huge
	// and ep1 reports other running requests, with one dispatch to ep0
	// since its observation.
	setup := func(t *testing.T, pol Policy, huge Load, other int) *Balancer {
		t.Helper()
		clock := newFakeClock()
		sig := &fakeSignal{}
		b := mustNew(t, pol, WithClock(clock), WithSignal(sig, time.Minute))
		mustUpdate(t, b, eps(2))
		huge.At = clock.Now()
		sig.Set("ep0", huge)
		sig.Set("ep1", Load{At: clock.Now(), Running: other, KVUsage: math.NaN()})
		clock.Advance(time.Millisecond)
		held := holdOn(t, b, "ep0", 1, Request{})[0]
		t.Cleanup(func() { held.Done(nil) })
		return b
	}
	t.Run("kv capacity", func(t *testing.T) {
		// 16 * (2^60 + 1) wraps to 16 tokens: the held dispatch's 256
		// tokens would read as 16 times the capacity.
		p := &probe{}
		b := setup(t, p, Load{KVUsage: 0.5, KVBlocks: 1<<60 + 1, BlockSize: 16}, 0)
		pk, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		if l := p.loads["ep0"]; !l.Fresh || !(l.KVUsage >= 0.5 && l.KVUsage < 0.51) {
			t.Fatalf("estimate %+v, want fresh with KV usage about 0.5", l)
		}
	})
	for _, ld := range loads {
		huge := Load{Running: ld.running, Waiting: ld.waiting, KVUsage: math.NaN()}
		t.Run(ld.name+"/estimate", func(t *testing.T) {
			p := &probe{}
			b := setup(t, p, huge, 0)
			pk, err := b.Pick(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pk.Done(nil)
			l := p.loads["ep0"]
			if !l.Fresh || l.Requests < int64(ld.running) || l.Requests < int64(ld.waiting) || l.Requests < 1 ||
				l.Waiting < int64(ld.waiting) || l.backlog < int64(ld.waiting) {
				t.Fatalf("estimate %+v, want fresh with requests >= %d and >= %d, waiting and backlog >= %d",
					l, ld.running, ld.waiting, ld.waiting)
			}
		})
		for _, pc := range policies {
			for _, other := range []int{0, 3} {
				t.Run(fmt.Sprintf("%s/%s/other=%d", ld.name, pc.name, other), func(t *testing.T) {
					pol, err := pc.new()
					if err != nil {
						t.Fatal(err)
					}
					b := setup(t, pol, huge, other)
					for i := range 50 {
						pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, AffinityKey: strconv.Itoa(i)})
						if err != nil {
							t.Fatal(err)
						}
						if got := pk.Endpoint().Key(); got != "ep1" {
							t.Fatalf("pick %d went to %s, which reports running %d and waiting %d", i, got, ld.running, ld.waiting)
						}
						pk.Done(nil)
					}
				})
			}
		}
	}
}

func TestAddSat(t *testing.T) {
	cases := []struct{ a, b, want int64 }{
		{1, 2, 3},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{math.MinInt64, -1, math.MinInt64},
		{math.MaxInt64, -1, math.MaxInt64 - 1},
		{-5, 3, -2},
		{0, 0, 0},
	}
	for _, tc := range cases {
		if got := addSat(tc.a, tc.b); got != tc.want {
			t.Errorf("addSat(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	for _, tc := range []struct{ a, b, want int }{{3, 4, 12}, {0, math.MaxInt, 0}, {math.MaxInt, 2, math.MaxInt}, {1 << 40, 1 << 40, math.MaxInt}} {
		if got := mulSat(tc.a, tc.b); got != tc.want {
			t.Errorf("mulSat(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestSignalCorrectionAtUnixEpoch checks that an observation taken at
// time.Unix(0, 0) is one like any other: the dispatches made before it are
// assumed seen by it, not counted again.
func TestSignalCorrectionAtUnixEpoch(t *testing.T) {
	clock := &fakeClock{t: time.Unix(0, 0)}
	sig := &fakeSignal{}
	p := &probe{pick: "ep0"}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, 5*time.Second))
	mustUpdate(t, b, eps(2))
	pick := func() Pick {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 28})
		if err != nil {
			t.Fatal(err)
		}
		return pk
	}
	early := pick() // before any observation
	defer early.Done(nil)
	sig.Set("ep0", Load{At: clock.Now(), Running: 1, KVUsage: math.NaN()})
	pick().Done(nil)
	if l := p.loads["ep0"]; !l.Fresh || l.Requests != 1 {
		t.Fatalf("estimate %+v, want fresh with the observation's 1 request", l)
	}
	late := pick()
	defer late.Done(nil)
	pick().Done(nil)
	if l := p.loads["ep0"]; l.Requests != 2 {
		t.Fatalf("after a dispatch since the observation: %d requests, want 2", l.Requests)
	}
}

// TestSignalCountedRequests checks the correction for this balancer's
// requests the observation counted: a completion since removes one from the
// observation's requests, and from its waiting ones if it never streamed.
func TestSignalCountedRequests(t *testing.T) {
	_, clock, sig, p, pick := signalProbe(t)
	check := func(when string, requests, waiting, backlog int64, kv float64) {
		t.Helper()
		pick().Done(nil) // refreshes p.loads; finished at once, it adds nothing
		l := p.loads["ep0"]
		if !l.Fresh || l.Requests != requests || l.Waiting != waiting || l.backlog != backlog || l.KVUsage != kv {
			t.Fatalf("%s: requests %d, waiting %d, backlog %d, KV usage %v; want %d, %d, %d, %v",
				when, l.Requests, l.Waiting, l.backlog, l.KVUsage, requests, waiting, backlog, kv)
		}
	}

	// Four requests, two of them streaming, then an observation of
	// exactly them.
	a, b, c, w := pick(), pick(), pick(), pick()
	a.FirstToken()
	b.FirstToken()
	sig.Set("ep0", Load{At: clock.Now(), Running: 2, Waiting: 2, KVUsage: 0.5})
	clock.Advance(10 * time.Millisecond)
	check("at the observation", 4, 2, 2, 0.5)
	c.FirstToken()
	check("a waiting one streams", 4, 2, 2, 0.5)
	a.Done(nil)
	check("a streaming one finished", 3, 2, 2, 0.5)
	w.Done(nil)
	check("one finished before streaming", 2, 1, 1, 0.5)
	d := pick()
	check("a dispatch since", 3, 2, 2, 0.5)

	// A newer observation, loaded by no pick before a completion: the
	// completion counts against it.
	sig.Set("ep0", Load{At: clock.Now(), Running: 2, Waiting: 1, KVUsage: 0.25})
	clock.Advance(time.Millisecond)
	b.Done(nil)
	check("completion after a newer observation", 2, 1, 1, 0.25)
	c.Done(nil)
	check("the other streaming one finished", 1, 1, 1, 0.25)
	d.Done(nil)
	check("all done", 0, 0, 0, 0.25)
}

// TestSignalCountedNotBeforeObservation checks that a request picked after
// the observation was taken but before this balancer first saw it (a scrape
// in transit) is not taken for one the observation counted.
func TestSignalCountedNotBeforeObservation(t *testing.T) {
	_, clock, sig, p, pick := signalProbe(t)
	at := clock.Now()
	clock.Advance(5 * time.Millisecond)
	x := pick()
	sig.Set("ep0", Load{At: at, Running: 3, KVUsage: math.NaN()})
	clock.Advance(5 * time.Millisecond)
	pick().Done(nil)
	if l := p.loads["ep0"]; l.Requests != 3 {
		t.Fatalf("requests %d, want the observation's 3", l.Requests)
	}
	x.Done(nil)
	pick().Done(nil)
	if l := p.loads["ep0"]; l.Requests != 3 {
		t.Fatalf("after a request the observation did not count finished: requests %d, want 3", l.Requests)
	}
}

// exactProbe picks a candidate at random and checks that, against a signal
// reporting exactly this balancer's own requests, every candidate's
// estimated requests are its own count, and its estimated waiting requests
// and backlog no fewer than its own queued ones.
type exactProbe struct {
	t      *testing.T
	checks int
}

func (p *exactProbe) Choose(c *Candidates) int {
	for i := 0; i < c.Len(); i++ {
		l := c.Load(i)
		if l.Fresh {
			p.checks++
		}
		if l.Requests != l.Outstanding || l.backlog < l.Queued || l.Waiting < l.Queued {
			p.t.Errorf("%s: requests %d, backlog %d, waiting %d; own outstanding %d, queued %d",
				c.Key(i), l.Requests, l.backlog, l.Waiting, l.Outstanding, l.Queued)
		}
	}
	return int(c.Uint64N(uint64(c.Len())))
}

// TestSignalCorrectionExact checks that with one router the correction is
// exact: whatever happened since the observation (dispatches, first tokens,
// completions, a newer observation seen first by a completion), the
// estimate of an endpoint is what it holds now.
func TestSignalCorrectionExact(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	p := &exactProbe{t: t}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(3))
	rng := rand.New(rand.NewPCG(3, 4))
	scrape := func() {
		clock.Advance(time.Millisecond) // observations at one instant would be one
		for _, s := range b.Stats() {
			sig.Set(s.Key, Load{At: clock.Now(), Running: int(s.Outstanding - s.Queued), Waiting: int(s.Queued), KVUsage: math.NaN()})
		}
	}
	var live []Pick
	for range 20_000 {
		switch op := rng.IntN(100); {
		case op < 40:
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1 + rng.IntN(1000), OutputTokens: 1 + rng.IntN(100)})
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, pk)
		case op < 60 && len(live) > 0:
			live[rng.IntN(len(live))].FirstToken()
		case op < 85 && len(live) > 0:
			i := rng.IntN(len(live))
			live[i].Done(nil)
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		case op < 90:
			scrape()
		default:
			clock.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	if p.checks < 10_000 {
		t.Fatalf("only %d fresh estimates checked", p.checks)
	}
	for _, pk := range live {
		pk.Done(nil)
	}
}
