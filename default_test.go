package llmlb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

func TestDefaultPrefersCachedHolderUntilItsQueueCostsMore(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, err := Default(DefaultConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	prompt := blocks(2, 100) // 1600 tokens, all cached on ep3
	_ = ix.Stored("ep3", 16, prompt...)
	req := Request{PromptTokens: 1600, OutputTokens: 10, Prefix: prompt}
	pk, _ := b.Pick(context.Background(), &req)
	if k := pk.Endpoint().Key(); k != "ep3" {
		t.Fatalf("picked %s, want the holder ep3", k)
	}
	pk.Done(nil)
	// With the default weights an idle endpoint costs k*1600 = 6400 (the
	// whole prompt uncached) and the holder, behind w waiting requests of
	// Q queued prompt tokens (each with a 256-token decode allowance),
	// costs Q + w*1600 (the mean prompt) + 0.5*(Q + 256w): one request of
	// 3000 tokens costs 6228 and the holder wins; two of 5000 cost 10828
	// and it loses.
	held := holdOn(t, b, "ep3", 1, Request{PromptTokens: 3000, MaxTokens: 256})
	pk, _ = b.Pick(context.Background(), &req)
	if k := pk.Endpoint().Key(); k != "ep3" {
		t.Fatalf("picked %s with 3000 queued tokens on the holder, want ep3", k)
	}
	pk.Done(nil)
	held = append(held, holdOn(t, b, "ep3", 1, Request{PromptTokens: 2000, MaxTokens: 1})...)
	pk, _ = b.Pick(context.Background(), &req)
	if k := pk.Endpoint().Key(); k == "ep3" {
		t.Fatal("picked the holder behind 5000 queued tokens to save 1600")
	}
	pk.Done(nil)
	for _, h := range held {
		h.Done(nil)
	}
	for _, bad := range []DefaultConfig{{KVPenalty: -1}, {CacheWeight: math.NaN()}, {FootprintWeight: math.Inf(1)}, {Holders: -2}, {Slots: -1}, {SlotWeight: math.NaN()}, {SlotWeight: -2}} {
		if _, err := Default(bad); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("config %+v accepted", bad)
		}
	}
}

func TestDefaultSamplesHoldersAndRandom(t *testing.T) {
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	pol, _ := Default(DefaultConfig{Index: ix, Sampled: 2})
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(16))
	// Without prefixes the policy spreads load like P2C over prefill work:
	// after many held requests no endpoint holds far more than the mean.
	var held []Pick
	for range 1600 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 500})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, pk)
	}
	for _, s := range b.Stats() {
		if s.Outstanding > 130 || s.Outstanding < 70 {
			t.Errorf("%s holds %d of 1600 requests on 16 endpoints", s.Key, s.Outstanding)
		}
	}
	for _, h := range held {
		h.Done(nil)
	}
}

// With Slots set, a holder whose batch slots are all taken loses to an idle
// endpoint: the request would wait for a running one to finish, which its
// cache does not shorten. The holder runs two decoding requests; with two
// slots the new request costs SlotWeight*1600 = 16000 on top, more than an
// idle endpoint's k*1600 = 16000 for the whole prompt uncached, while with
// three slots, or none set, the holder wins by its cache.
func TestDefaultSlots(t *testing.T) {
	for _, tc := range []struct {
		slots int
		want  bool // the holder wins
	}{{0, true}, {2, false}, {3, true}} {
		b, req := eventsHolder(t, DefaultConfig{Slots: tc.slots})
		held := holdOn(t, b, "ep3", 2, Request{PromptTokens: 100, MaxTokens: 16})
		for _, h := range held {
			h.FirstToken()
		}
		pk, _ := b.Pick(context.Background(), &req)
		if got := pk.Endpoint().Key() == "ep3"; got != tc.want {
			t.Errorf("Slots %d: holder chosen = %v, want %v", tc.slots, got, tc.want)
		}
		pk.Done(nil)
		for _, h := range held {
			h.Done(nil)
		}
	}
}

// eventsHolder returns a balancer over four endpoints running Default(cfg)
// on an events-only index that reports req's 1600-token prompt cached on
// ep3, after one pick of req (which sets the mean prompt to 1600).
func eventsHolder(t *testing.T, cfg DefaultConfig) (*Balancer, Request) {
	t.Helper()
	ix, _ := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
	cfg.Index = ix
	pol, err := Default(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol)
	mustUpdate(t, b, eps(4))
	prompt := blocks(2, 100)
	_ = ix.Stored("ep3", 16, prompt...)
	req := Request{PromptTokens: 1600, OutputTokens: 10, Prefix: prompt}
	pk, _ := b.Pick(context.Background(), &req)
	pk.Done(nil)
	return b, req
}

// With an index that holds only what engine KV events report, a cached
// token is certainly there and is worth DefaultEventsCacheWeight prefill
// tokens: the holder that lost at k = 4 behind 5000 queued tokens (idle
// endpoints cost 4*1600 = 6400 against its 10828) now wins (8*1600 = 12800
// against 10828), unless CacheWeight is set explicitly.
func TestDefaultCreditsEventFedCacheMore(t *testing.T) {
	for _, tc := range []struct {
		weight float64
		want   bool // the holder wins
	}{{0, true}, {DefaultCacheWeight, false}} {
		b, req := eventsHolder(t, DefaultConfig{CacheWeight: tc.weight})
		held := holdOn(t, b, "ep3", 1, Request{PromptTokens: 3000, MaxTokens: 256})
		held = append(held, holdOn(t, b, "ep3", 1, Request{PromptTokens: 2000, MaxTokens: 1})...)
		pk, _ := b.Pick(context.Background(), &req)
		if got := pk.Endpoint().Key() == "ep3"; got != tc.want {
			t.Errorf("CacheWeight %v: holder chosen = %v, want %v", tc.weight, got, tc.want)
		}
		pk.Done(nil)
		for _, h := range held {
			h.Done(nil)
		}
	}
}

// With an Events index, a block counts as cached at CacheWeight only if the
// engines reported it: a prefix the policy merely sent requests for earns
// no credit at nominal load, so idle endpoints stay equal.
func TestDefaultEventsIndex(t *testing.T) {
	decisions, _ := prefix.NewIndex(prefix.IndexConfig{})
	events, _ := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
	pol, err := Default(DefaultConfig{Index: decisions, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithRand(rand.NewPCG(1, 2)))
	mustUpdate(t, b, eps(4))
	prompt := blocks(5, 100)
	_ = decisions.Record("ep3", prompt, time.Now())
	req := Request{PromptTokens: 1600, OutputTokens: 10, Prefix: prompt}
	counts := map[string]int{}
	for range 400 {
		pk, err := b.Pick(context.Background(), &req)
		if err != nil {
			t.Fatal(err)
		}
		counts[pk.Endpoint().Key()]++
		pk.Done(nil)
	}
	if len(counts) != 4 {
		t.Errorf("picks %v: a prefix only sent for must not attract requests at nominal load", counts)
	}
	_ = events.Stored("ep1", 16, prompt...)
	for range 20 {
		pk, _ := b.Pick(context.Background(), &req)
		if k := pk.Endpoint().Key(); k != "ep1" {
			t.Fatalf("picked %s, want ep1, which the engine reported holding the prompt", k)
		}
		pk.Done(nil)
	}
	notEvents, _ := prefix.NewIndex(prefix.IndexConfig{})
	otherSize, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: 32, EventsOnly: true})
	for _, bad := range []*prefix.Index{notEvents, otherSize} {
		if _, err := Default(DefaultConfig{Index: decisions, Events: bad}); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("Events index %p accepted", bad)
		}
	}
}

// TestDefaultOverloadReadsBacklog checks that the overload term measures the
// requests waiting for their first token, not the dispatches since the last
// observation: requests that stream at once leave it at zero however many
// are outstanding, and requests that wait raise it.
func TestDefaultOverloadReadsBacklog(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	pol, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(4))
	for i := range 4 {
		sig.Set(fmt.Sprintf("ep%d", i), Load{At: clock.Now(), Running: 0, Waiting: 0})
	}
	clock.Advance(time.Millisecond)
	smoothed := func() float64 { return math.Float64frombits(pol.(*defaultPolicy).backlog.Load()) }
	var held []Pick
	for range 400 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 50})
		if err != nil {
			t.Fatal(err)
		}
		pk.FirstToken()
		held = append(held, pk)
	}
	if l := b.Stats(); l[0].Outstanding < 50 {
		t.Fatalf("ep0 holds %d requests, want about 100", l[0].Outstanding)
	}
	if got := smoothed(); got != 0 {
		t.Fatalf("smoothed backlog %v with every request streaming, want 0", got)
	}
	for range 400 {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 50})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, pk)
	}
	if got := smoothed(); got <= DefaultOverloadQueue {
		t.Fatalf("smoothed backlog %v with 100 requests queued per endpoint, want above %v", got, DefaultOverloadQueue)
	}
	for _, pk := range held {
		pk.Done(nil)
	}
}

// TestDefaultOverloadBoundsAbsurdBacklog checks that an observation of an
// absurd number of waiting requests (a faulty metrics endpoint) read by a
// pick does not switch the overload term on, and that one read by every
// pick for a long time holds the average at most at maxBacklog, from which
// it falls below OverloadQueue as fast as from a real backlog of that size.
func TestDefaultOverloadBoundsAbsurdBacklog(t *testing.T) {
	clock := newFakeClock()
	sig := &fakeSignal{}
	pol, err := Default(DefaultConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(4))
	observe := func(waiting int) {
		for i := range 4 {
			sig.Set(fmt.Sprintf("ep%d", i), Load{At: clock.Now(), Waiting: waiting, KVUsage: math.NaN()})
		}
		clock.Advance(time.Millisecond)
	}
	pick := func() {
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100, OutputTokens: 50})
		if err != nil {
			t.Fatal(err)
		}
		pk.FirstToken()
		pk.Done(nil)
	}
	smoothed := func() float64 { return math.Float64frombits(pol.(*defaultPolicy).backlog.Load()) }
	observe(0)
	for range 10 {
		pick()
	}
	observe(1 << 62)
	pick()
	observe(0)
	for range 10 {
		pick()
	}
	if got := smoothed(); got > DefaultOverloadQueue {
		t.Fatalf("smoothed backlog %v 10 picks after one read 2^62 waiting requests per endpoint, want at most %v", got, DefaultOverloadQueue)
	}

	observe(1 << 62)
	for range 1000 {
		pick()
	}
	if got := smoothed(); got > maxBacklog {
		t.Fatalf("smoothed backlog %v after 1000 picks read 2^62 waiting requests per endpoint, want at most %v", got, maxBacklog)
	}
	observe(0)
	// From maxBacklog the average, decaying by 1/100 a pick, falls below
	// OverloadQueue in 100*ln(maxBacklog/OverloadQueue) picks.
	picks := int(math.Ceil(100 * math.Log(maxBacklog/DefaultOverloadQueue)))
	for range picks {
		pick()
	}
	if got := smoothed(); got > DefaultOverloadQueue {
		t.Fatalf("smoothed backlog %v %d picks after the absurd observations ended, want at most %v", got, picks, DefaultOverloadQueue)
	}
}

// Other routers' waiting requests cost the prefill the signal reports for
// them (Load.PeerWaiting, Load.PeerPrefillTokens), the rest the mean
// prompt. ep3 holds the 1600-token prompt (worth 8*1600 = 12800 on an idle
// endpoint) behind 5 waiting requests of other routers; each costs
// QueueWeight*1600 = 1600 for waiting, 8000 in all, plus its prefill: at
// the mean prompt 5*1600 = 8000 and ep3 loses (16000); reported at 500
// tokens in all it wins (8500), at 5000 it loses (13000); with 4 of the 5
// reported at 400 tokens it wins (1600 + 400 + 8000 = 10000).
func TestDefaultPricesPeersPrefill(t *testing.T) {
	for _, tc := range []struct {
		peers   int
		prefill int64
		want    bool // the holder wins
	}{{0, 0, false}, {5, 500, true}, {5, 5000, false}, {4, 400, true}, {2, 200, false}} {
		clock := newFakeClock()
		sig := &fakeSignal{}
		ix, _ := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
		pol, err := Default(DefaultConfig{Index: ix})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol, WithClock(clock), WithSignal(sig, time.Minute))
		mustUpdate(t, b, eps(4))
		prompt := blocks(2, 100)
		_ = ix.Stored("ep3", 16, prompt...)
		req := Request{PromptTokens: 1600, OutputTokens: 10, Prefix: prompt}
		pk, _ := b.Pick(context.Background(), &req) // the mean prompt is 1600
		pk.Done(nil)
		clock.Advance(time.Millisecond)
		for i := range 3 {
			sig.Set(fmt.Sprintf("ep%d", i), Load{At: clock.Now(), KVUsage: math.NaN()})
		}
		sig.Set("ep3", Load{At: clock.Now(), Waiting: 5, PeerWaiting: tc.peers, PeerPrefillTokens: tc.prefill, KVUsage: math.NaN()})
		pk, _ = b.Pick(context.Background(), &req)
		if got := pk.Endpoint().Key() == "ep3"; got != tc.want {
			t.Errorf("%d peers' requests of %d prefill tokens: holder chosen = %v, want %v", tc.peers, tc.prefill, got, tc.want)
		}
		pk.Done(nil)
	}
}

// TestArgminScored checks that choosing among the scored candidates alone
// chooses as argminCost over every candidate with the unscored ones at
// +Inf, drawing the same random numbers, or defers to it: with ties, NaN,
// infinite and unscored costs, in random scored orders.
func TestArgminScored(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	values := []float64{1, 2, 2, 3, math.NaN(), math.Inf(1), math.Inf(-1), -1}
	for trial := range 20000 {
		n := 1 + r.IntN(12)
		costs := make([]float64, n)
		var pick []int32
		for i := range n {
			costs[i] = math.Inf(1)
			if r.IntN(2) == 0 {
				pick = append(pick, int32(i))
			}
		}
		if len(pick) == 0 {
			pick = append(pick, int32(r.IntN(n)))
		}
		r.Shuffle(len(pick), func(a, b int) { pick[a], pick[b] = pick[b], pick[a] })
		for _, i := range pick {
			costs[i] = values[r.IntN(len(values))]
		}
		seed := r.Uint64()
		scored := &Candidates{b: mustNew(t, RoundRobin(), WithRand(rand.NewPCG(seed, 0)))}
		all := &Candidates{b: mustNew(t, RoundRobin(), WithRand(rand.NewPCG(seed, 0)))}
		got := argminScored(scored, slices.Clone(costs), pick)
		if got < 0 {
			for _, i := range pick {
				if v := costs[i]; v < math.Inf(1) {
					t.Fatalf("trial %d: argminScored deferred with scored cost %v finite (costs %v, scored %v)", trial, v, costs, pick)
				}
			}
			continue
		}
		want := argminCost(all, costs)
		if got != want {
			t.Fatalf("trial %d: argminScored chose %d, argminCost %d (costs %v, scored %v)", trial, got, want, costs, pick)
		}
		if a, b := scored.Uint64N(1<<62), all.Uint64N(1<<62); a != b {
			t.Fatalf("trial %d: the random sources diverged", trial)
		}
	}
}

// TestSampledScoresLongestHolders checks which holders a sampled Default
// scores: those of the longest matches, the first candidates among equals,
// as a scan of every candidate in order would take them.
func TestSampledScoresLongestHolders(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := Default(DefaultConfig{Index: ix, Sampled: 1, Holders: 3})
	if err != nil {
		t.Fatal(err)
	}
	b := mustNew(t, pol, WithRand(rand.NewPCG(1, 2)))
	mustUpdate(t, b, eps(16))
	blocks := []uint64{11, 12, 13, 14}
	now := time.Now()
	for _, held := range []struct {
		ep     int
		blocks int
	}{{12, 2}, {5, 2}, {9, 2}, {7, 4}, {3, 2}, {14, 1}} {
		if err := ix.Record("ep"+fmt.Sprint(held.ep), blocks[:held.blocks], now); err != nil {
			t.Fatal(err)
		}
	}
	p := pol.(*defaultPolicy)
	c := candidatesPool.Get().(*Candidates)
	defer c.release()
	c.req = &Request{PromptTokens: 64, Prefix: blocks}
	if err := c.init(b, b.snap.Load()); err != nil {
		t.Fatal(err)
	}
	p.t.match(c)
	pick := p.scored(c, c.Len(), p.samples(c.Len()), -1)
	if len(pick) != 4 || pick[0] != 7 || pick[1] != 3 || pick[2] != 5 {
		t.Fatalf("scored %v, want the holders 7, 3 and 5 first, then one drawn", pick)
	}
}

// TestDefaultSamples checks how many candidates a pick draws to score for
// each Sampled: zero samples DefaultSampled beyond 64 candidates, a
// negative value never samples, and no setting samples a pool it would
// score entirely anyway.
func TestDefaultSamples(t *testing.T) {
	for _, tc := range []struct {
		sampled, holders, n, want int
	}{
		{0, 0, 8, 0},
		{0, 0, 64, 0},
		{0, 0, 65, DefaultSampled},
		{0, 0, 512, DefaultSampled},
		{0, 3, 512, DefaultSampled},
		{-1, 0, 512, 0},
		{-7, 0, 100000, 0},
		{5, 0, 7, 0},
		{5, 0, 8, 5},
		{5, 4, 9, 0},
		{5, 4, 10, 5},
		{1, 0, 4, 1},
		{100, 0, 512, 100},
		{math.MaxInt, 2, 512, 0},
		{16, math.MaxInt, 512, 0},
		{math.MinInt, 0, 512, 0},
	} {
		pol, err := Default(DefaultConfig{Sampled: tc.sampled, Holders: tc.holders})
		if err != nil {
			t.Fatal(err)
		}
		if got := pol.(*defaultPolicy).samples(tc.n); got != tc.want {
			t.Errorf("Sampled %d, Holders %d: %d candidates draw %d, want %d", tc.sampled, tc.holders, tc.n, got, tc.want)
		}
	}
}

// TestDefaultSamplesLargePool picks without Done on 200 equal endpoints, one
// pick per endpoint: scoring every candidate (Sampled negative) puts exactly
// one request on each, as each pick sees the idle endpoints left; the
// default samples 16 of them per pick and meets endpoints it already loaded,
// so some get two or more.
func TestDefaultSamplesLargePool(t *testing.T) {
	const n = 200
	for _, tc := range []struct {
		sampled int
		spread  bool
	}{{-1, true}, {0, false}} {
		pol, err := Default(DefaultConfig{Sampled: tc.sampled})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol, WithRand(rand.NewPCG(3, 4)))
		mustUpdate(t, b, eps(n))
		for range n {
			if _, err := b.Pick(context.Background(), &Request{PromptTokens: 100}); err != nil {
				t.Fatal(err)
			}
		}
		most := int64(0)
		for _, st := range b.Stats() {
			most = max(most, st.Outstanding)
		}
		if spread := most == 1; spread != tc.spread {
			t.Errorf("Sampled %d: at most %d requests on an endpoint after %d picks on %d endpoints; want one each: %v", tc.sampled, most, n, n, tc.spread)
		}
	}
}

// TestDefaultHugeSampled checks that a pick completes when Sampled or
// Holders is as large as an int: their sum once overflowed, and a pick with
// Sampled math.MaxInt drew candidates forever.
func TestDefaultHugeSampled(t *testing.T) {
	for _, cfg := range []DefaultConfig{{Sampled: math.MaxInt}, {Sampled: math.MaxInt, Holders: 2}, {Sampled: 1, Holders: math.MaxInt}} {
		pol, err := Default(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol)
		mustUpdate(t, b, eps(100))
		p, err := b.Pick(context.Background(), &Request{PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		p.Done(nil)
	}
}

// With latency objectives, a cache miss also costs the decode stall its
// prefill causes. ep0 streams 20 short requests; ep1 has one 300-token
// prompt queued. A new 1000-token prompt (100 output tokens) costs ep0
// k*1000 + 0.5*40 = 4020 without objectives and ep1 300 + 1000 (a waiting
// request at the mean prompt) + 4000 + 0.5*301, about 5450: ep0 wins. With
// a 2 s TTFT and a 50 ms TPOT objective, its 20 streaming requests add
// 2/0.05/100 * 20 * 1000 = 8000 to ep0, and ep1 wins.
func TestDefaultPricesDecodeStall(t *testing.T) {
	for _, tc := range []struct {
		ttft, tpot time.Duration
		want       string
	}{{0, 0, "ep0"}, {2 * time.Second, 50 * time.Millisecond, "ep1"}, {2 * time.Second, time.Second, "ep0"}} {
		pol, err := Default(DefaultConfig{TTFTObjective: tc.ttft, TPOTObjective: tc.tpot})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol)
		mustUpdate(t, b, eps(2))
		held := holdOn(t, b, "ep0", 20, Request{PromptTokens: 1, MaxTokens: 1})
		for _, h := range held {
			h.FirstToken()
		}
		held = append(held, holdOn(t, b, "ep1", 1, Request{PromptTokens: 300, MaxTokens: 1})...)
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if k := pk.Endpoint().Key(); k != tc.want {
			t.Errorf("objectives %v/%v: picked %s, want %s", tc.ttft, tc.tpot, k, tc.want)
		}
		pk.Done(nil)
		for _, h := range held {
			h.Done(nil)
		}
	}
	for _, bad := range []DefaultConfig{{TTFTObjective: time.Second}, {TPOTObjective: time.Millisecond}, {TTFTObjective: -time.Second, TPOTObjective: time.Millisecond}} {
		if _, err := Default(bad); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("objectives %v/%v accepted", bad.TTFTObjective, bad.TPOTObjective)
		}
	}
}

// The request itself decodes behind the prompts its endpoint prefills
// meanwhile: with objectives, an endpoint sent 20,000 uncached tokens just
// now (a rate of 10,000 tokens/s over the 2 s time constant) costs 2 s of
// that rate, 20,000 prefill tokens, more than ep1's queued prompt, until the
// rate decays. Without objectives the rate is not read.
func TestDefaultPricesPrefillFlow(t *testing.T) {
	for _, tc := range []struct {
		objectives   bool
		now, decayed string
	}{{false, "ep0", "ep0"}, {true, "ep1", "ep0"}} {
		cfg := DefaultConfig{}
		if tc.objectives {
			cfg.TTFTObjective, cfg.TPOTObjective = 2*time.Second, 50*time.Millisecond
		}
		pol, err := Default(cfg)
		if err != nil {
			t.Fatal(err)
		}
		clock := newFakeClock()
		b := mustNew(t, pol, WithClock(clock))
		mustUpdate(t, b, eps(2))
		held := holdOn(t, b, "ep1", 1, Request{PromptTokens: 100, MaxTokens: 1})
		b.snap.Load().byKey["ep0"].aux.flow.add(20000, clock.Now().UnixNano())
		for _, want := range []string{tc.now, tc.decayed} {
			now := clock.Now().UnixNano()
			rate := func(k string) float64 { return b.snap.Load().byKey[k].aux.flow.rate(now) }
			before := map[string]float64{"ep0": rate("ep0"), "ep1": rate("ep1")}
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 100})
			if err != nil {
				t.Fatal(err)
			}
			k := pk.Endpoint().Key()
			if k != want {
				t.Errorf("objectives %v: picked %s, want %s", tc.objectives, k, want)
			}
			// The pick's 1000 uncached tokens count in the rate (500/s),
			// with objectives only.
			wantRate := 0.0
			if tc.objectives {
				wantRate = 500
			}
			if got := rate(k) - before[k]; math.Abs(got-wantRate) > 1e-6 {
				t.Errorf("objectives %v: the pick added %v to %s's rate, want %v", tc.objectives, got, k, wantRate)
			}
			pk.Done(nil)
			clock.Advance(30 * time.Second)
		}
		for _, h := range held {
			h.Done(nil)
		}
	}
}

func TestPrefillFlow(t *testing.T) {
	var f prefillFlow
	const t0 = int64(1_000_000_000_000)
	if r := f.rate(t0); r != 0 {
		t.Fatalf("empty rate %v", r)
	}
	f.add(1000, t0)
	if r := f.rate(t0); math.Abs(r-500) > 1e-9 {
		t.Errorf("rate %v just after 1000 tokens, want 500/s over the 2 s time constant", r)
	}
	if r := f.rate(t0 + int64(2*time.Second)); math.Abs(r-500/math.E) > 1e-9 {
		t.Errorf("rate %v one time constant later, want %v", r, 500/math.E)
	}
	for _, bad := range []float64{0, -5, math.NaN()} {
		f.add(bad, t0)
	}
	if r := f.rate(t0); math.Abs(r-500) > 1e-9 {
		t.Errorf("rate %v after adding nothing, negative and NaN tokens", r)
	}
	// A clock that goes back neither decays nor rewinds the sum.
	f.add(1000, t0-int64(time.Hour))
	if r := f.rate(t0 - int64(time.Hour)); math.Abs(r-1000) > 1e-9 {
		t.Errorf("rate %v read before the last add, want 1000", r)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	now := t0
	for range 10000 {
		now += rng.Int64N(int64(time.Second)) - int64(100*time.Millisecond)
		f.add(rng.Float64()*1e6, now)
		if r := f.rate(now); !(r >= 0) || math.IsInf(r, 0) {
			t.Fatalf("rate %v", r)
		}
	}
}

// Idle endpoints share one load reading, but not their rates: ep1, idle
// like ep0 but sent 20,000 tokens just now, never wins.
func TestDefaultPrefillFlowOfIdleEndpoints(t *testing.T) {
	clock := newFakeClock()
	for seed := range uint64(20) {
		pol, err := Default(DefaultConfig{TTFTObjective: 2 * time.Second, TPOTObjective: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol, WithClock(clock), WithRand(rand.NewPCG(seed, 1)))
		mustUpdate(t, b, eps(2))
		b.snap.Load().byKey["ep1"].aux.flow.add(20000, clock.Now().UnixNano())
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if k := pk.Endpoint().Key(); k != "ep0" {
			t.Fatalf("seed %d: picked %s, want the idle endpoint without a rate", seed, k)
		}
		pk.Done(nil)
		clock.Advance(time.Minute)
	}
}

// Extreme objectives price finitely: picks succeed and leave no count.
func TestDefaultExtremeObjectives(t *testing.T) {
	for _, o := range [][2]time.Duration{{math.MaxInt64, 1}, {1, math.MaxInt64}, {1, 1}} {
		pol, err := Default(DefaultConfig{TTFTObjective: o[0], TPOTObjective: o[1]})
		if err != nil {
			t.Fatal(err)
		}
		clock := newFakeClock() // stands still: the rates never decay
		b := mustNew(t, pol, WithClock(clock))
		mustUpdate(t, b, eps(4))
		var held []Pick
		for i := range 2000 {
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1 << 20, MaxTokens: 1 + i%3})
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				pk.FirstToken()
			}
			held = append(held, pk)
		}
		for _, st := range b.snap.Load().eps {
			if r := st.aux.flow.rate(clock.Now().UnixNano()); math.IsNaN(r) || math.IsInf(r, 0) {
				t.Errorf("objectives %v: rate %v", o, r)
			}
		}
		for _, h := range held {
			h.Done(nil)
		}
		for _, s := range b.Stats() {
			if s.Outstanding != 0 {
				t.Errorf("objectives %v: %s keeps %d outstanding", o, s.Key, s.Outstanding)
			}
		}
	}
}

// tinyWeightEP declares the least positive weight, which, in a membership
// with an endpoint of the largest weight (which Update scales into [1, 2)), prices
// every cost at +Inf.
type tinyWeightEP struct{ key string }

func (e tinyWeightEP) Key() string     { return e.key }
func (e tinyWeightEP) Weight() float64 { return math.SmallestNonzeroFloat64 }

// TestDefaultUnscoredChoiceLearnsItsWork checks that when a sampled pick
// finds no finite cost among the candidates it scored and chooses among
// all of them, the speed estimate of the chosen endpoint is fed the work
// priced for it, not what an earlier pick left in the scratch space.
func TestDefaultUnscoredChoiceLearnsItsWork(t *testing.T) {
	for seed := range uint64(8) {
		p, err := Default(DefaultConfig{Sampled: 1})
		if err != nil {
			t.Fatal(err)
		}
		clock := newFakeClock()
		b, err := New(p, WithClock(clock), WithRand(rand.NewPCG(seed, 1)))
		if err != nil {
			t.Fatal(err)
		}
		all := make([]Endpoint, 8, 9)
		for i := range all {
			all[i] = tinyWeightEP{key: fmt.Sprint("ep", i)}
		}
		mustUpdate(t, b, append(all, weightedEP{testEP{"huge", math.MaxFloat64}}))
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, Exclude: []string{"huge"}})
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
		pk.FirstToken()
		est := b.snap.Load().byKey[pk.Endpoint().Key()].est
		est.mu.Lock()
		work := est.mw // the work of the first observation
		est.mu.Unlock()
		if work != 1000 {
			t.Errorf("seed %d: the first token was fitted against %v prefill tokens of work, want 1000", seed, work)
		}
		pk.Done(nil)
	}
}

// TestDefaultEventsIndexOutlivesMembership: an endpoint that leaves a
// balancer's membership keeps the blocks its engine reported in the events
// index, for another balancer sharing it and for its own return.
func TestDefaultEventsIndexOutlivesMembership(t *testing.T) {
	events, _ := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true})
	newBalancer := func() *Balancer {
		decisions, _ := prefix.NewIndex(prefix.IndexConfig{})
		pol, err := Default(DefaultConfig{Index: decisions, Events: events})
		if err != nil {
			t.Fatal(err)
		}
		b := mustNew(t, pol, WithRand(rand.NewPCG(1, 2)))
		mustUpdate(t, b, eps(4))
		return b
	}
	a, other := newBalancer(), newBalancer()
	prompt := blocks(5, 100)
	req := Request{PromptTokens: 1600, OutputTokens: 10, Prefix: prompt}
	_ = events.Stored("ep1", 16, prompt...)
	wantEP1 := func(b *Balancer, when string) {
		t.Helper()
		pk, err := b.Pick(context.Background(), &req)
		if err != nil {
			t.Fatal(err)
		}
		defer pk.Done(nil)
		if k := pk.Endpoint().Key(); k != "ep1" {
			t.Errorf("%s: picked %s, want ep1, whose engine reported the prompt", when, k)
		}
	}
	wantEP1(a, "before")
	all := eps(4)
	mustUpdate(t, a, []Endpoint{all[0], all[2], all[3]}) // ep1 leaves a
	if pk, err := a.Pick(context.Background(), &req); err != nil {
		t.Fatal(err)
	} else {
		pk.Done(nil)
	}
	wantEP1(other, "after ep1 left another balancer")
	mustUpdate(t, a, all) // and comes back
	wantEP1(a, "after ep1 came back")
}

// decodeMisses prices the requests decoding at a candidate that the new
// request would take past the TPOT objective: most when their time per
// token is at the objective, little when it is far below (they meet it
// anyway) or far above (they miss it anyway); in proportion to the
// requests streaming and to the request's decode and uncached prompt
// tokens; never more than the requests streaming, and never NaN.
func TestDefaultDecodeMisses(t *testing.T) {
	pol, err := Default(DefaultConfig{TTFTObjective: 2 * time.Second, TPOTObjective: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := pol.(*defaultPolicy)
	req := &Request{PromptTokens: 1000}
	c := &Candidates{req: req, reqTok: 1100} // 100 decode tokens
	// The pool prefills 10,000 tokens a second; the log of the time per
	// token grows by 1e-5 per token of load.
	pool := &poolSpeed{g: 1, tau: 1e-4, lg: 1, lcov: 1e-5, lvar: 1}
	misses := func(dtau float64, streaming int64, uncached float64) float64 {
		v := &speedView{dtau: dtau, dlog: math.Log(dtau), dg: 0.5, loaded: true, lload: 5000}
		l := &EndpointLoad{Outstanding: streaming + 2, Queued: 2, ActiveTokens: 5000}
		return p.decodeMisses(c, v, l, pool, uncached)
	}
	at := misses(0.050, 10, 900)
	// 10 streaming * the spread's density at the objective * 1e-5 * 1000
	// tokens, decodeMissWeight TTFT objectives (20,000 tokens) each.
	want := 10 / (math.Sqrt(2*math.Pi) * decodeSpread) * 1e-5 * 1000 * decodeMissWeight * 20000
	if math.Abs(at-want) > 1e-6*want {
		t.Errorf("at the objective: %v, want %v", at, want)
	}
	// Four spreads below and above the objective.
	for _, dtau := range []float64{0.05 * math.Exp(-4*decodeSpread), 0.05 * math.Exp(4*decodeSpread)} {
		if got := misses(dtau, 10, 900); !(got < at/100) {
			t.Errorf("time per token %v: %v, want far less than %v at the objective", dtau, got, at)
		}
	}
	if got := misses(0.05, 20, 900); math.Abs(got-2*at) > 1e-6*at {
		t.Errorf("twice the streaming requests: %v, want %v", got, 2*at)
	}
	if got := misses(0.05, 10, 1900); math.Abs(got-2*at) > 1e-6*at {
		t.Errorf("twice the tokens: %v, want %v", got, 2*at)
	}
	if got := misses(0.05, 0, 900); got != 0 {
		t.Errorf("nothing streaming: %v, want 0", got)
	}
	if got := misses(0, 10, 900); got != 0 {
		t.Errorf("no decode fit: %v, want 0", got)
	}
	// The load moves the time per token: at 1e-5 per token, 2*decodeSpread
	// / 1e-5 more tokens than the fit's mean load take it two spreads past
	// the objective.
	v := &speedView{dtau: 0.05, dlog: math.Log(0.05), dg: 0.5, loaded: true, lload: 5000}
	l := &EndpointLoad{Outstanding: 12, Queued: 2, ActiveTokens: 5000 + int64(2*decodeSpread/1e-5)}
	if got := p.decodeMisses(c, v, l, pool, 900); !(got < at/2) {
		t.Errorf("loaded past the objective: %v, want less than half of %v", got, at)
	}
	// Bounded by the streaming requests, whatever the fits say.
	for _, tc := range []struct{ beta, dtau, lload float64 }{
		{1e300, 0.05, 5000}, {math.Inf(1), 0.05, 5000}, {1e-5, 1e6, 0}, {1e-5, 1e-15, 1e12}, {1e-5, 0.05, math.NaN()},
	} {
		pool := &poolSpeed{g: 1, tau: 1e-4, lg: 1, lcov: tc.beta, lvar: 1}
		v := &speedView{dtau: tc.dtau, dlog: math.Log(tc.dtau), dg: 0.5, loaded: true, lload: tc.lload}
		l := &EndpointLoad{Outstanding: 12, Queued: 2, ActiveTokens: 5000}
		got := p.decodeMisses(c, v, l, pool, 900)
		if !(got >= 0) || got > 10*decodeMissWeight*20000*(1+1e-9) {
			t.Errorf("beta %v, dtau %v, lload %v: %v, want in [0, %v]", tc.beta, tc.dtau, tc.lload, got, 10*decodeMissWeight*20000)
		}
	}
}

// BenchmarkDecodeMisses measures the decode-miss price of one candidate
// whose decoding is near the TPOT objective: the cost a pick adds per
// scored candidate with objectives on a pool of unequal speeds.
func BenchmarkDecodeMisses(b *testing.B) {
	pol, _ := Default(DefaultConfig{TTFTObjective: 2 * time.Second, TPOTObjective: 50 * time.Millisecond})
	p := pol.(*defaultPolicy)
	c := &Candidates{req: &Request{PromptTokens: 1000}, reqTok: 1100}
	pool := &poolSpeed{g: 1, tau: 1e-4, lg: 1, lcov: 1e-5, lvar: 1}
	v := &speedView{dtau: 0.045, dlog: math.Log(0.045), dg: 0.5, loaded: true, lload: 5000}
	l := &EndpointLoad{Outstanding: 12, Queued: 2, ActiveTokens: 6000}
	b.ReportAllocs()
	sum := 0.0
	for b.Loop() {
		sum += p.decodeMisses(c, v, l, pool, 900)
	}
	if !(sum > 0) {
		b.Fatal("no decode misses priced")
	}
}

// With objectives, on a pool whose measured speeds differ, Default prices
// the decode misses a request causes: of two endpoints measured alike, the
// one whose requests decode at the objective loses the request to the one
// whose requests decode far past it, which holds more tokens and so wins
// without objectives.
func TestDefaultObjectivesAvoidDecodeAtObjective(t *testing.T) {
	for _, slo := range []bool{false, true} {
		cfg := DefaultConfig{}
		if slo {
			cfg.TTFTObjective, cfg.TPOTObjective = 2*time.Second, 50*time.Millisecond
		}
		p, err := Default(cfg)
		if err != nil {
			t.Fatal(err)
		}
		clock := newFakeClock()
		b := mustNew(t, p, WithClock(clock))
		mustUpdate(t, b, []Endpoint{testEP{key: "edge"}, testEP{key: "past"}, testEP{key: "slow"}})
		// Prefill: "slow" takes four times as long per token, so the pool
		// is uneven. Decode: the time per token is 50 ms at a load of 2,000
		// tokens and grows by a factor e per 1,000 tokens, on every
		// endpoint.
		rng := rand.New(rand.NewPCG(5, 5))
		now := clock.Now().UnixNano()
		for range 400 {
			work := float64(100 + rng.IntN(20000))
			load := 1000 + 2000*rng.Float64()
			tokens := int64(100 + rng.IntN(200))
			decode := time.Duration(float64(tokens) * 0.05 * math.Exp((load-2000)/1000) * float64(time.Second))
			for _, st := range b.snap.Load().eps {
				rate := 40000.0
				if st.key == "slow" {
					rate /= 4
				}
				st.est.firstToken(work, syntheticTTFT(rng, 0.02, rate, work, 0), now)
				st.est.done(decode, tokens, now, load)
			}
		}
		// "edge" holds 2,000 tokens decoding, at the objective; "past" and
		// "slow" 6,000, four factors of e past it.
		var held []Pick
		for _, h := range []struct {
			key string
			n   int
		}{{"edge", 10}, {"past", 30}, {"slow", 30}} {
			for _, h := range holdOn(t, b, h.key, h.n, Request{PromptTokens: 100, OutputTokens: 100}) {
				h.FirstToken()
				held = append(held, h)
			}
		}
		pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1000, OutputTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		got := pk.Endpoint().Key()
		pk.Done(nil)
		for _, h := range held {
			h.Done(nil)
		}
		if !slo && got != "edge" {
			t.Errorf("without objectives: picked %s, want edge, which holds the fewest tokens", got)
		}
		if slo && got == "edge" {
			t.Errorf("with objectives: picked edge, whose requests decode at the objective")
		}
	}
}
