package llmlb

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// pdPool returns n endpoints keyed name0, name1, ...
func pdPool(name string, n int) []Endpoint {
	out := make([]Endpoint, n)
	for i := range out {
		out[i] = testEP{key: name + strconv.Itoa(i)}
	}
	return out
}

// newPD returns a Disaggregated over a prefill pool of np endpoints and a
// decode pool of nd, both balanced by Default over their own index.
func newPD(t *testing.T, np, nd int, cfg DisaggConfig) (*Disaggregated, *Balancer, *Balancer, *prefix.Index) {
	t.Helper()
	pre := mustNew(t, P2C(RequestsScore))
	mustUpdate(t, pre, pdPool("p", np))
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, err := Default(DefaultConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	dec := mustNew(t, pol)
	mustUpdate(t, dec, pdPool("d", nd))
	d, err := NewDisaggregated(pre, dec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, pre, dec, ix
}

func sum(b *Balancer) EndpointStats {
	var s EndpointStats
	for _, e := range b.Stats() {
		s.Outstanding += e.Outstanding
		s.Queued += e.Queued
		s.PrefillTokens += e.PrefillTokens
		s.DecodeTokens += e.DecodeTokens
	}
	return s
}

func TestDisaggregatedChargesEachPoolItsPhase(t *testing.T) {
	d, pre, dec, _ := newPD(t, 2, 3, DisaggConfig{})
	pk, err := d.Pick(context.Background(), &Request{PromptTokens: 3000, OutputTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	if pk.Local() || pk.Prefill.Endpoint() == nil || pk.Decode.Endpoint() == nil {
		t.Fatalf("got a local pick (prefill %v, decode %v), want one from each pool", pk.Prefill.Endpoint(), pk.Decode.Endpoint())
	}
	// The prefill endpoint computes the prompt and one token; the decode
	// endpoint holds the prompt's KV and decodes, with no prefill queued.
	if s := sum(pre); s.Outstanding != 1 || s.Queued != 1 || s.PrefillTokens != 3000 || s.DecodeTokens != 1 {
		t.Fatalf("prefill pool %+v, want 1 queued request of 3000 prefill tokens and 1 decode token", s)
	}
	if s := sum(dec); s.Outstanding != 1 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 200 {
		t.Fatalf("decode pool %+v, want 1 streaming request of 200 decode tokens and no prefill", s)
	}
	pk.Prefilled()
	if s := sum(pre); s != (EndpointStats{}) {
		t.Fatalf("prefill pool after Prefilled %+v, want nothing charged", s)
	}
	pk.FirstToken()
	if s := sum(dec); s.Outstanding != 1 || s.DecodeTokens != 200 {
		t.Fatalf("decode pool after FirstToken %+v, want the request still charged", s)
	}
	pk.Done(nil)
	pk.Done(nil) // idempotent
	if s := sum(dec); s != (EndpointStats{}) {
		t.Fatalf("decode pool after Done %+v, want nothing charged", s)
	}
}

func TestDisaggregatedLocalPrefillRule(t *testing.T) {
	// Dynamo's rule: local when uncached < 2048 tokens and uncached <
	// 0.7 of the prompt, both strictly.
	d, _, _, ix := newPD(t, 2, 1, DisaggConfig{LocalPrefillTokens: 2048})
	prompt := blocks(7, 200) // 3200 tokens
	for _, tc := range []struct {
		name          string
		cached, total int // blocks of 16 tokens
		local         bool
	}{
		{"nothing cached", 0, 100, false},              // 1600 uncached, ratio 1
		{"mostly cached", 80, 100, true},               // 320 uncached, ratio 0.2
		{"ratio at the bound", 30, 100, false},         // 1120 uncached, ratio 0.7
		{"ratio under the bound", 31, 100, true},       // 1104 uncached, ratio 0.69
		{"long prompt, mostly cached", 150, 200, true}, // 800 uncached, ratio 0.25
		{"tokens at the bound", 72, 200, false},        // 2048 uncached
		{"tokens under the bound", 73, 200, true},      // 2032 uncached, ratio 0.635
		{"short prompt, nothing cached", 0, 4, false},  // 64 uncached, ratio 1
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix.Cleared("d0")
			if tc.cached > 0 {
				_ = ix.Stored("d0", 16, prompt[:tc.cached]...)
			}
			pk, err := d.Pick(context.Background(), &Request{PromptTokens: 16 * tc.total, OutputTokens: 10, Prefix: prompt[:tc.total]})
			if err != nil {
				t.Fatal(err)
			}
			defer pk.Done(nil)
			if pk.Local() != tc.local {
				t.Fatalf("local = %v with %d of %d blocks cached, want %v", pk.Local(), tc.cached, tc.total, tc.local)
			}
		})
	}
}

func TestDisaggregatedLocalPrefillIsChargedWhereItDecodes(t *testing.T) {
	// A ratio of 1 lets a short prompt prefill locally with nothing cached.
	d, pre, dec, _ := newPD(t, 2, 1, DisaggConfig{LocalPrefillTokens: 2048, LocalPrefillRatio: 1})
	pk, err := d.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	if !pk.Local() {
		t.Fatal("a 100-token prompt prefills remotely, want locally")
	}
	if s := sum(pre); s != (EndpointStats{}) {
		t.Fatalf("prefill pool %+v, want nothing charged", s)
	}
	if s := sum(dec); s.Queued != 1 || s.PrefillTokens != 100 || s.DecodeTokens != 50 {
		t.Fatalf("decode pool %+v, want the whole request, prefill included", s)
	}
	pk.Prefilled() // no prefill endpoint: does nothing
	if s := sum(dec); s.Queued != 1 {
		t.Fatalf("decode pool after Prefilled %+v, want the prompt still queued", s)
	}
	pk.FirstToken()
	if s := sum(dec); s.Queued != 0 || s.PrefillTokens != 0 {
		t.Fatalf("decode pool after FirstToken %+v, want the prompt prefilled", s)
	}
	pk.Done(nil)
	if s := sum(dec); s != (EndpointStats{}) {
		t.Fatalf("decode pool after Done %+v, want nothing charged", s)
	}
}

func TestDisaggregatedPrefillsLocallyWhenThePrefillPoolCannot(t *testing.T) {
	d, pre, _, _ := newPD(t, 2, 2, DisaggConfig{})
	pk, err := d.Pick(context.Background(), &Request{PromptTokens: 5000, Exclude: []string{"p0", "p1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !pk.Local() {
		t.Fatal("every prefill endpoint excluded, and the request did not prefill locally")
	}
	pk.Done(nil)

	if err := pre.Update(nil); err != nil {
		t.Fatal(err)
	}
	pk, err = d.Pick(context.Background(), &Request{PromptTokens: 5000})
	if err != nil || !pk.Local() {
		t.Fatalf("empty prefill pool: local %v, err %v; want a local prefill", pk.Local(), err)
	}
	pk.Done(nil)
}

func TestDisaggregatedErrorsChargeNothing(t *testing.T) {
	d, pre, dec, _ := newPD(t, 2, 2, DisaggConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Pick(ctx, &Request{PromptTokens: 10}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if _, err := d.Pick(context.Background(), &Request{PromptTokens: -1}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("err = %v, want ErrInvalidRequest", err)
	}
	if _, err := d.Pick(context.Background(), &Request{PromptTokens: 10, Exclude: []string{"d0", "d1"}}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("every decode endpoint excluded: err = %v, want ErrNoCandidates", err)
	}
	if s, t2 := sum(pre), sum(dec); s != (EndpointStats{}) || t2 != (EndpointStats{}) {
		t.Fatalf("after errors: prefill %+v, decode %+v; want nothing charged", s, t2)
	}
	var zero DisaggPick // inert
	zero.Prefilled()
	zero.FirstToken()
	zero.Done(nil)
}

func TestNewDisaggregatedRejectsBadConfigs(t *testing.T) {
	a := mustNew(t, RoundRobin())
	b := mustNew(t, RoundRobin())
	for _, tc := range []struct {
		name     string
		pre, dec *Balancer
		cfg      DisaggConfig
	}{
		{"nil prefill", nil, b, DisaggConfig{}},
		{"nil decode", a, nil, DisaggConfig{}},
		{"one balancer for both", a, a, DisaggConfig{}},
		{"negative tokens", a, b, DisaggConfig{LocalPrefillTokens: -1}},
		{"negative ratio", a, b, DisaggConfig{LocalPrefillTokens: 10, LocalPrefillRatio: -0.1}},
		{"ratio above one", a, b, DisaggConfig{LocalPrefillTokens: 10, LocalPrefillRatio: 1.5}},
		{"NaN ratio", a, b, DisaggConfig{LocalPrefillTokens: 10, LocalPrefillRatio: math.NaN()}},
	} {
		if _, err := NewDisaggregated(tc.pre, tc.dec, tc.cfg); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%s: err = %v, want ErrInvalidPolicy", tc.name, err)
		}
	}
}

// TestDisaggregatedDecodeObserverSeesTheTransferAsAFirstToken checks that
// the decode pool's observer sees a request prefilled remotely as its
// balancer counts it: streaming from the pick, with one first token then
// and none at the decode's own first token, so that every Done reporting
// Streamed follows a first token it saw, whether the request completed or
// failed before its prefill ended; the first token is marked Transferred,
// so that nothing takes it for a time to first token.
func TestDisaggregatedDecodeObserverSeesTheTransferAsAFirstToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish func(DisaggPick)
	}{
		{"completed", func(pk DisaggPick) { pk.Prefilled(); pk.FirstToken(); pk.Done(nil) }},
		{"failed in prefill", func(pk DisaggPick) { pk.Done(errors.New("prefill worker reset")) }},
		{"failed in transfer", func(pk DisaggPick) { pk.Prefilled(); pk.Done(context.DeadlineExceeded) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre := mustNew(t, RoundRobin())
			mustUpdate(t, pre, pdPool("p", 1))
			var (
				mu     sync.Mutex
				firsts int
				dones  []DoneInfo
			)
			obs := &Observer{
				FirstToken: func(i FirstTokenInfo) {
					mu.Lock()
					defer mu.Unlock()
					firsts++
					if !i.Transferred {
						t.Errorf("first token %+v at the pick, want Transferred", i)
					}
				},
				Done: func(i DoneInfo) { mu.Lock(); dones = append(dones, i); mu.Unlock() },
			}
			dec := mustNew(t, RoundRobin(), WithObserver(obs))
			mustUpdate(t, dec, pdPool("d", 1))
			d, err := NewDisaggregated(pre, dec, DisaggConfig{})
			if err != nil {
				t.Fatal(err)
			}
			pk, err := d.Pick(context.Background(), &Request{PromptTokens: 4000})
			if err != nil {
				t.Fatal(err)
			}
			if pk.Local() {
				t.Fatal("local pick, want a remote prefill")
			}
			if firsts != 1 {
				t.Fatalf("decode observer saw %d first tokens at the pick, want 1", firsts)
			}
			tc.finish(pk)
			if firsts != 1 || len(dones) != 1 || !dones[0].Streamed {
				t.Fatalf("decode observer saw %d first tokens and completions %+v, want 1 first token and 1 streamed completion", firsts, dones)
			}
		})
	}
}

// TestDisaggregatedAccountingBalances drives many requests through every
// order of the handle's calls, from several goroutines, and checks that
// both pools end with nothing charged.
func TestDisaggregatedAccountingBalances(t *testing.T) {
	d, pre, dec, _ := newPD(t, 3, 5, DisaggConfig{LocalPrefillTokens: 512})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 500 {
				n := rng.IntN(60) + 1
				r := Request{PromptTokens: 16 * n, OutputTokens: rng.IntN(300), Prefix: blocks(rng.IntN(4), n)}
				if rng.IntN(10) == 0 {
					r.Exclude = []string{"p0", "p1", "p2"}
				}
				pk, err := d.Pick(context.Background(), &r)
				if err != nil {
					t.Error(err)
					return
				}
				switch rng.IntN(4) {
				case 0: // fails before its prefill ends
				case 1:
					pk.Prefilled()
				case 2:
					pk.FirstToken()
				case 3:
					pk.Prefilled()
					pk.FirstToken()
					pk.FirstToken()
				}
				if rng.IntN(2) == 0 {
					pk.Done(errors.New("reset"))
				} else {
					pk.Done(nil)
				}
			}
		}()
	}
	wg.Wait()
	if s, t2 := sum(pre), sum(dec); s != (EndpointStats{}) || t2 != (EndpointStats{}) {
		t.Fatalf("prefill %+v, decode %+v; want nothing charged", s, t2)
	}
}

// TestDisaggregatedDecodePoolLearnsDecodeFromTheFirstToken checks that a
// decode pool that learns speeds times a remote request's decode from its
// first token, not from the pick: the wait for the prefill and the transfer
// is not decode time, and the load it decoded under is measured from there.
func TestDisaggregatedDecodePoolLearnsDecodeFromTheFirstToken(t *testing.T) {
	clk := newFakeClock()
	pre := mustNew(t, RoundRobin(), WithClock(clk))
	mustUpdate(t, pre, pdPool("p", 1))
	pol, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dec := mustNew(t, pol, WithClock(clk))
	mustUpdate(t, dec, pdPool("d", 1))
	d, err := NewDisaggregated(pre, dec, DisaggConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		pk, err := d.Pick(context.Background(), &Request{PromptTokens: 4000, OutputTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(5 * time.Second) // prefill and transfer
		pk.FirstToken()
		clk.Advance(time.Second) // 100 tokens at 10 ms
		pk.Decode.Generated(100)
		pk.Done(nil)
	}
	est := dec.snap.Load().eps[0].est
	if got := math.Float64frombits(est.dtau.Load()); math.Abs(got-0.01) > 1e-9 {
		t.Fatalf("learned %v s per decode token, want 0.01", got)
	}
	// The load the decode is measured against is the one request's
	// tokens, outstanding from its first token to Done.
	if got := math.Float64frombits(est.lload.Load()); !est.loaded.Load() || math.Abs(got-4100) > 1 {
		t.Fatalf("decode measured at a mean load of %v tokens (known %v), want 4100", got, est.loaded.Load())
	}
}

// TestDisaggregatedPrefillPoolLearnsNoDecode checks that the prefill pool's
// picks, whose answer is their first token, teach their endpoint its time
// to first token but no decode: the time from that token to Prefilled is
// the KV transfer's, and the decode estimate stays at its prior.
func TestDisaggregatedPrefillPoolLearnsNoDecode(t *testing.T) {
	clk := newFakeClock()
	prePol, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pre := mustNew(t, prePol, WithClock(clk))
	mustUpdate(t, pre, pdPool("p", 2))
	decPol, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dec := mustNew(t, decPol, WithClock(clk))
	mustUpdate(t, dec, pdPool("d", 2))
	d, err := NewDisaggregated(pre, dec, DisaggConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		pk, err := d.Pick(context.Background(), &Request{PromptTokens: 1000 + i, OutputTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(100 * time.Millisecond) // prefill
		if i%2 == 0 {
			// The prefill endpoint answers, then the KV moves.
			pk.Prefill.FirstToken()
			clk.Advance(300 * time.Millisecond)
			pk.Prefilled()
		}
		pk.FirstToken()
		clk.Advance(time.Second) // 100 tokens at 10 ms
		pk.Done(nil)
	}
	for _, st := range pre.snap.Load().eps {
		e := st.est
		if c := math.Float64frombits(e.count.Load()); c == 0 {
			t.Errorf("prefill endpoint %s learned no time to first token", st.key)
		}
		if tau, n := math.Float64frombits(e.dtau.Load()), math.Float64frombits(e.dcount.Load()); tau != 0 || n != 0 {
			t.Errorf("prefill endpoint %s learned %v s per decode token from %v observations, want no decode estimate", st.key, tau, n)
		}
	}
	for _, st := range dec.snap.Load().eps {
		if got := math.Float64frombits(st.est.dtau.Load()); math.Abs(got-0.01) > 1e-9 {
			t.Errorf("decode endpoint %s learned %v s per decode token, want 0.01", st.key, got)
		}
	}
}

// A decode endpoint takes a local prefill only while what it has to prefill,
// the new prompt included, stays under LocalPrefillTokens.
func TestDisaggregatedLocalPrefillsDoNotPileUp(t *testing.T) {
	d, _, _, _ := newPD(t, 1, 1, DisaggConfig{LocalPrefillTokens: 2048, LocalPrefillRatio: 1})
	pick := func(tokens int) DisaggPick {
		t.Helper()
		pk, err := d.Pick(context.Background(), &Request{PromptTokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		return pk
	}
	first := pick(1500)
	if !first.Local() {
		t.Fatal("1500 tokens on an idle decode endpoint prefill remotely, want locally")
	}
	second := pick(1000)
	if second.Local() {
		t.Fatal("1000 more tokens behind 1500 queued prefill locally, want remotely")
	}
	second.Done(nil)
	first.FirstToken()
	third := pick(1000)
	if !third.Local() {
		t.Fatal("1000 tokens once the queue is prefilled prefill remotely, want locally")
	}
	third.Done(nil)
	first.Done(nil)
}

// panickingPolicy is a policy with a bug.
type panickingPolicy struct{}

func (panickingPolicy) Choose(*Candidates) int { panic("policy bug") }

// TestDisaggregatedPanicLeavesNothingCharged checks that a panic in the
// prefill pool's policy or Observer.Pick, or in the decode pool's
// Observer.FirstToken, after the decode endpoint was picked releases both
// pools' charges before it goes on: Pick returns no handle to release them.
func TestDisaggregatedPanicLeavesNothingCharged(t *testing.T) {
	bug := func(FirstTokenInfo) { panic("observer bug") }
	for _, tc := range []struct {
		name     string
		pre, dec func(t *testing.T) *Balancer
	}{
		{"prefill policy",
			func(t *testing.T) *Balancer { return mustNew(t, panickingPolicy{}) },
			func(t *testing.T) *Balancer { return mustNew(t, P2C(RequestsScore)) }},
		{"prefill Observer.Pick",
			func(t *testing.T) *Balancer {
				return mustNew(t, P2C(RequestsScore), WithObserver(&Observer{Pick: func(PickInfo) { panic("observer bug") }}))
			},
			func(t *testing.T) *Balancer { return mustNew(t, P2C(RequestsScore)) }},
		{"decode Observer.FirstToken",
			func(t *testing.T) *Balancer { return mustNew(t, P2C(RequestsScore)) },
			func(t *testing.T) *Balancer {
				return mustNew(t, P2C(RequestsScore), WithObserver(&Observer{FirstToken: bug}))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre, dec := tc.pre(t), tc.dec(t)
			mustUpdate(t, pre, pdPool("p", 2))
			mustUpdate(t, dec, pdPool("d", 2))
			d, err := NewDisaggregated(pre, dec, DisaggConfig{})
			if err != nil {
				t.Fatal(err)
			}
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				_, _ = d.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 50})
				return false
			}()
			if !panicked {
				t.Fatal("Pick did not panic")
			}
			if s := sum(dec); s != (EndpointStats{}) {
				t.Errorf("decode pool %+v after the panic, want nothing charged", s)
			}
			if s := sum(pre); s != (EndpointStats{}) {
				t.Errorf("prefill pool %+v after the panic, want nothing charged", s)
			}
		})
	}
}

// With latency objectives, Default counts the uncached prompt it sends an
// endpoint into that endpoint's prefill flow, the decode stall to come. A
// decode endpoint whose request is prefilled on the prefill pool computes
// none of it: the flow it counted at the pick is taken back, and only a
// request that prefills where it decodes leaves its prompt in the flow.
func TestDisaggregatedDecodeFlowIsTheLocalPrefills(t *testing.T) {
	clock := newFakeClock()
	pol, err := Default(DefaultConfig{TTFTObjective: time.Second, TPOTObjective: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pre := mustNew(t, P2C(RequestsScore), WithClock(clock))
	mustUpdate(t, pre, pdPool("p", 1))
	dec := mustNew(t, pol, WithClock(clock))
	mustUpdate(t, dec, pdPool("d", 1))
	d, err := NewDisaggregated(pre, dec, DisaggConfig{LocalPrefillTokens: 1000, LocalPrefillRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	rate := func() float64 {
		return dec.snap.Load().byKey["d0"].aux.flow.rate(clock.Now().UnixNano())
	}
	pk, err := d.Pick(context.Background(), &Request{PromptTokens: 8000})
	if err != nil {
		t.Fatal(err)
	}
	if pk.Local() {
		t.Fatal("an 8000-token prompt prefilled locally")
	}
	if r := rate(); r != 0 {
		t.Errorf("decode endpoint's prefill flow %v tokens/s after a remote prefill, want 0", r)
	}
	pk.Done(nil)
	local, err := d.Pick(context.Background(), &Request{PromptTokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	if !local.Local() {
		t.Fatal("a 500-token prompt prefilled remotely")
	}
	if r := rate(); !(r > 0) {
		t.Errorf("decode endpoint's prefill flow %v tokens/s after a local prefill, want above 0", r)
	}
	local.Done(nil)
}

// A request whose prompt length is unknown (PromptTokens 0, or a nil
// request) prefills on the prefill pool, as every request does without
// the local-prefill rule, which needs the length to apply.
func TestDisaggregatedUnknownPromptPrefillsRemotely(t *testing.T) {
	for _, cfg := range []DisaggConfig{{}, {LocalPrefillTokens: 2048}, {LocalPrefillTokens: 2048, LocalPrefillRatio: 1}} {
		d, pre, dec, _ := newPD(t, 2, 2, cfg)
		for _, r := range []*Request{nil, {}, {MaxTokens: 100}} {
			pk, err := d.Pick(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			if pk.Local() {
				t.Errorf("%+v: request %+v prefilled on its decode endpoint, want the prefill pool", cfg, r)
			}
			pk.Done(nil)
		}
		for _, b := range []*Balancer{pre, dec} {
			for _, s := range b.Stats() {
				if s.Outstanding != 0 {
					t.Errorf("%s: %d outstanding after every Done", s.Key, s.Outstanding)
				}
			}
		}
	}
}
