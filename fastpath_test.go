package llmlb

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/stamped"
	"github.com/llmlb/llmlb/prefix"
)

// onPolicyPath returns an option that keeps a balancer off the fast path
// (see pickFast): an observer, which the fast path does not serve, so that
// every pick goes through the policy's Choose.
func onPolicyPath() Option {
	return WithObserver(&Observer{Pick: func(PickInfo) {}})
}

// TestFastPathChoosesAsPolicy checks that the policies with a fast path
// (round robin, random, P2C over requests, with and without a signal)
// choose on it exactly as their Choose does, drawing the same random
// numbers: with unit and mixed weights, with requests held open, and with
// exclusions, an unhealthy endpoint and an endpoint in slow start, which
// leave the fast path.
func TestFastPathChoosesAsPolicy(t *testing.T) {
	policies := []struct {
		name   string
		new    func() Policy
		signal bool
	}{
		{"round-robin", RoundRobin, false},
		{"random", Random, false},
		{"p2c", func() Policy { return P2C(nil) }, false},
		{"p2c-signal", func() Policy { return P2C(nil) }, true},
	}
	for _, pol := range policies {
		for _, weighted := range []bool{false, true} {
			t.Run(pol.name+"/weighted="+strconv.FormatBool(weighted), func(t *testing.T) {
				clock := newFakeClock()
				members := make([]Endpoint, 16)
				for i := range members {
					members[i] = testEP{key: "ep" + strconv.Itoa(i)}
					if weighted {
						members[i] = weightedEP{testEP{key: "ep" + strconv.Itoa(i), weight: float64(1 + i%3)}}
					}
				}
				newBalancer := func(extra ...Option) *Balancer {
					sig := &fakeSignal{}
					// A stale observation: loaded, and then ignored.
					sig.Set("ep3", Load{At: clock.Now().Add(-time.Hour), Running: 9, KVUsage: math.NaN()})
					opts := []Option{WithClock(clock), WithRand(rand.NewPCG(7, 9)),
						WithSlowStart(SlowStart{Window: time.Minute})}
					if pol.signal {
						opts = append(opts, WithSignal(sig, time.Second))
					}
					b := mustNew(t, pol.new(), append(opts, extra...)...)
					mustUpdate(t, b, members)
					return b
				}
				fast, slow := newBalancer(), newBalancer(onPolicyPath())
				rng := rand.New(rand.NewPCG(1, 2))
				var open [2][]Pick
				pick := func(step int, r *Request) {
					t.Helper()
					var keys [2]string
					for k, b := range []*Balancer{fast, slow} {
						p, err := b.Pick(context.Background(), r)
						if err != nil {
							t.Fatal(err)
						}
						keys[k] = p.Endpoint().Key()
						open[k] = append(open[k], p)
					}
					if keys[0] != keys[1] {
						t.Fatalf("step %d: the fast path picked %s, the policy %s", step, keys[0], keys[1])
					}
					if r != nil && excluded(r.Exclude, keys[0]) {
						t.Fatalf("step %d: picked excluded %s", step, keys[0])
					}
				}
				for step := range 2000 {
					switch {
					case step == 500:
						for _, b := range []*Balancer{fast, slow} {
							if err := b.SetHealthy("ep5", false); err != nil {
								t.Fatal(err)
							}
						}
					case step == 800:
						for _, b := range []*Balancer{fast, slow} {
							_ = b.SetHealthy("ep5", true) // starts slow start
						}
					case step == 1200:
						clock.Advance(2 * time.Minute) // slow start is over
					}
					var r *Request
					switch rng.IntN(4) {
					case 0: // nil: the zero request
					case 1:
						r = &Request{PromptTokens: 100, Exclude: []string{"ep" + strconv.Itoa(rng.IntN(16))}}
					default:
						r = &Request{PromptTokens: rng.IntN(1000), MaxTokens: rng.IntN(500), OutputTokens: rng.IntN(3) * 50}
					}
					pick(step, r)
					// Finish a random open request in both, so that the
					// counts differ between endpoints.
					if n := len(open[0]); n > 8 || n > 0 && rng.IntN(2) == 0 {
						j := rng.IntN(n)
						for k := range open {
							if rng.IntN(3) == 0 {
								open[k][j].FirstToken()
							}
							open[k][j].Done(nil)
							open[k] = append(open[k][:j], open[k][j+1:]...)
						}
					}
				}
				for k, b := range []*Balancer{fast, slow} {
					for _, p := range open[k] {
						p.Done(nil)
					}
					for _, s := range b.Stats() {
						if s.Outstanding != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
							t.Errorf("%s still holds %+v", s.Key, s)
						}
					}
				}
			})
		}
	}
}

// TestFastRoundRobinCycles checks that round robin on the fast path deals
// requests to the members in turn, so each gets the same number, and that
// the handle charges and releases the request.
func TestFastRoundRobinCycles(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(64))
	counts := map[string]int{}
	for i := range 640 {
		p, err := b.Pick(context.Background(), &Request{PromptTokens: 10, OutputTokens: 5})
		if err != nil {
			t.Fatal(err)
		}
		key := p.Endpoint().Key()
		if want := "ep" + strconv.Itoa(i%64); key != want {
			t.Fatalf("pick %d went to %s, want %s", i, key, want)
		}
		counts[key]++
		if s := statsByKey(b)[key]; s.Outstanding != 1 || s.PrefillTokens != 10 || s.DecodeTokens != 5 {
			t.Fatalf("pick %d: %s holds %+v, want the request", i, key, s)
		}
		p.Done(nil)
		p.Done(nil) // a no-op
		if s := statsByKey(b)[key]; s.Outstanding != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			t.Fatalf("pick %d: %s holds %+v after Done", i, key, s)
		}
	}
	for key, n := range counts {
		if n != 10 {
			t.Errorf("%s got %d requests, want 10", key, n)
		}
	}
}

// recordedSignal is a fakeSignal that stamps observations when they are
// recorded and says whether it has recorded any (see package
// internal/stamped).
type recordedSignal struct {
	fakeSignal
	recorded atomic.Bool
	loads    atomic.Int64
}

func (s *recordedSignal) Recorded(stamped.Token) bool { return s.recorded.Load() }

func (s *recordedSignal) Load(key string) (Load, bool) {
	s.loads.Add(1)
	return s.fakeSignal.Load(key)
}

func (s *recordedSignal) Set(key string, l Load) {
	s.fakeSignal.Set(key, l)
	s.recorded.Store(true)
}

// TestUnobservedSignalIsNotLoaded checks that the scoring policies read a
// stamped signal that has recorded nothing as no signal at all: they do not
// load it, and choose as a balancer without a signal does.
func TestUnobservedSignalIsNotLoaded(t *testing.T) {
	policies := map[string]func() Policy{
		"default":           func() Policy { p, _ := Default(DefaultConfig{}); return p },
		"least-outstanding": LeastOutstanding,
		"least-tokens":      LeastTokens,
	}
	for name, newPolicy := range policies {
		sig := &recordedSignal{}
		with := mustNew(t, newPolicy(), WithRand(rand.NewPCG(1, 2)), WithSignal(sig, 5*time.Second))
		without := mustNew(t, newPolicy(), WithRand(rand.NewPCG(1, 2)))
		mustUpdate(t, with, eps(16))
		mustUpdate(t, without, eps(16))
		var open [2][]Pick
		for i := range 200 {
			r := &Request{PromptTokens: 100 + 37*(i%11), MaxTokens: 64}
			var keys [2]string
			for k, b := range []*Balancer{with, without} {
				p, err := b.Pick(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				keys[k] = p.Endpoint().Key()
				open[k] = append(open[k], p)
				if i%3 == 0 {
					open[k][0].Done(nil)
					open[k] = open[k][1:]
				}
			}
			if keys[0] != keys[1] {
				t.Fatalf("%s: pick %d went to %s with the unobserved signal and to %s without a signal", name, i, keys[0], keys[1])
			}
		}
		if n := sig.loads.Load(); n != 0 {
			t.Errorf("%s: the unobserved signal was loaded %d times, want 0", name, n)
		}
	}
}

// countingClock is a fakeClock that counts its readings.
type countingClock struct {
	*fakeClock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.fakeClock.Now()
}

// TestStampedSignal checks a signal that stamps its observations when it
// records them: before it has recorded any, P2C's picks and completions
// neither load it nor read the clock; and a request picked before an
// endpoint's first observation counts in it, as with a signal whose
// observation is taken after the pick.
func TestStampedSignal(t *testing.T) {
	clock := &countingClock{fakeClock: newFakeClock()}
	sig := &recordedSignal{}
	b := mustNew(t, P2C(nil), WithClock(clock), WithSignal(sig, 5*time.Second))
	mustUpdate(t, b, eps(4))
	for range 8 {
		p, err := b.Pick(context.Background(), &Request{PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		p.Done(nil)
	}
	if n, r := sig.loads.Load(), clock.reads.Load(); n != 0 || r != 0 {
		t.Fatalf("before any observation: %d signal loads and %d clock readings, want none", n, r)
	}

	for _, stamped := range []bool{false, true} {
		var s Signal = &fakeSignal{}
		set := s.(*fakeSignal).Set
		if stamped {
			rs := &recordedSignal{}
			s, set = rs, rs.Set
		}
		p := &probe{pick: "ep0"}
		b := mustNew(t, p, WithClock(clock.fakeClock), WithSignal(s, 5*time.Second))
		mustUpdate(t, b, eps(2))
		var early []Pick
		for range 4 {
			pk, err := b.Pick(context.Background(), &Request{PromptTokens: 100})
			if err != nil {
				t.Fatal(err)
			}
			early = append(early, pk)
		}
		clock.Advance(time.Millisecond)
		set("ep0", Load{At: clock.Now(), Running: 2, Waiting: 4 + 3, KVUsage: math.NaN()})
		clock.Advance(time.Millisecond)
		early[0].Done(nil)
		early[1].Done(nil)
		pk, err := b.Pick(context.Background(), nil) // refreshes p.loads
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		// The observation counted the four; two of them finished since.
		if l := p.loads["ep0"]; !l.Fresh || l.Requests != 2+7-2 || l.Waiting != 7-2 {
			t.Errorf("stamped %v: fresh %v, requests %d, waiting %d; want true, 7, 5", stamped, l.Fresh, l.Requests, l.Waiting)
		}
		for _, pk := range early[2:] {
			pk.Done(nil)
		}
	}
}

// TestGeneratedAfterDone checks that output tokens reported for a request
// after its Done never count for a later request served by the same
// record.
func TestGeneratedAfterDone(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(2))
	for range 100 {
		p, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Generated(5)
		p.Done(nil)
		p.Generated(7) // late
		rec := p.rec
		if v := rec.out.Load(); v&^outCountMask == outTag(p.base) && v&outCountMask != 0 {
			t.Fatalf("a count of %d left under the done request's tag", v&outCountMask)
		}
		q, _ := b.Pick(context.Background(), nil)
		if v := q.rec.out.Load(); v&^outCountMask == outTag(q.base) && v&outCountMask != 0 {
			t.Fatalf("a new request starts with a count of %d", v&outCountMask)
		}
		q.Generated(3)
		if v := q.rec.out.Load(); v != outTag(q.base)|3 {
			t.Fatalf("after Generated(3) the record holds %#x, want %#x", v, outTag(q.base)|3)
		}
		q.Done(nil)
	}
}

// TestGeneratedIgnoresHandlesOfEarlierGenerations checks that a handle
// whose request ended 2^24 or 2^32 requests of its record ago, a
// generation equal to the current one in as many low bits, neither adds to
// the count of the record's current request nor clears it.
func TestGeneratedIgnoresHandlesOfEarlierGenerations(t *testing.T) {
	b := mustNew(t, RoundRobin())
	mustUpdate(t, b, eps(1))
	for _, ago := range []uint64{1 << 24, 1 << 32} {
		q, err := b.Pick(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		stale := q
		// The record serves its request ago requests after stale's.
		q.base += ago * generationStep
		q.rec.state.Store(q.base | phasePicked)
		q.Generated(5)
		stale.Generated(7)
		if v, want := q.rec.out.Load(), outTag(q.base)|5; v != want {
			t.Errorf("%d requests after a handle's, its Generated(7) left the record holding %#x, want %#x", ago, v, want)
		}
		q.Done(nil)
	}
	if s := b.Stats()[0]; s.Outstanding != 0 {
		t.Fatalf("%d requests outstanding after every Done, want 0", s.Outstanding)
	}
}

// TestDefaultScoresEqualLoadsAlike checks that Default, which prices a
// candidate whose load and cached prefix are the previous candidate's
// without pricing it again, decides exactly as when it prices each: a
// balancer whose signal never reports prices every candidate.
func TestDefaultScoresEqualLoadsAlike(t *testing.T) {
	h, _ := prefix.NewHasher(prefix.HasherConfig{})
	root := h.Root(prefix.Salt{Model: "m"})
	prompts := make([][]uint64, 6)
	for i := range prompts {
		prompts[i] = h.AppendString(nil, root, decisionPrompt()[i*1000:i*1000+4096])
	}
	var bals [2]*Balancer
	for k := range bals {
		ix, _ := prefix.NewIndex(prefix.IndexConfig{BlockSize: h.BlockTokens()})
		pol, err := Default(DefaultConfig{Index: ix})
		if err != nil {
			t.Fatal(err)
		}
		opts := []Option{WithRand(rand.NewPCG(3, 4))}
		if k == 1 {
			opts = append(opts, WithSignal(&fakeSignal{}, time.Second))
		}
		bals[k] = mustNew(t, pol, opts...)
		members := make([]Endpoint, 48)
		for i := range members {
			members[i] = weightedEP{testEP{key: "ep" + strconv.Itoa(i), weight: float64(1 + i/16)}}
		}
		mustUpdate(t, bals[k], members)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var open [2][]Pick
	for step := range 1500 {
		r := &Request{PromptTokens: 1024, MaxTokens: 128, Prefix: prompts[rng.IntN(len(prompts))]}
		var keys [2]string
		for k, b := range bals {
			p, err := b.Pick(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			keys[k] = p.Endpoint().Key()
			open[k] = append(open[k], p)
		}
		if keys[0] != keys[1] {
			t.Fatalf("step %d: picked %s, pricing every candidate %s", step, keys[0], keys[1])
		}
		for n := len(open[0]); n > 0 && rng.IntN(3) != 0; n = len(open[0]) {
			j := rng.IntN(n)
			for k := range open {
				open[k][j].Done(nil)
				open[k] = append(open[k][:j], open[k][j+1:]...)
			}
		}
	}
}

// TestTokensScoreFastPath checks that TokensScore on a balancer without a
// signal, which the selectors read from the packed counts alone, scores
// every candidate exactly as the Score does on the whole load estimate:
// with mixed weights, requests before and after their first token, counts
// that spilled, and members in slow start.
func TestTokensScoreFastPath(t *testing.T) {
	clock := newFakeClock()
	members := make([]Endpoint, 12)
	for i := range members {
		members[i] = weightedEP{testEP{key: "ep" + strconv.Itoa(i), weight: float64(1+i%3) / 2}}
	}
	b := mustNew(t, LeastTokens(), WithClock(clock), WithSlowStart(SlowStart{Window: time.Minute}))
	mustUpdate(t, b, members)
	rng := rand.New(rand.NewPCG(5, 6))
	var held []Pick
	for i := range 300 {
		r := Request{PromptTokens: rng.IntN(20000), MaxTokens: 1 + rng.IntN(4000)}
		held = append(held, holdOn(t, b, "ep"+strconv.Itoa(rng.IntN(len(members))), 1, r)...)
		if i == 100 {
			// Three prompts of maxTokens spill ep1's packed prefill.
			held = append(held, holdOn(t, b, "ep1", 3, Request{PromptTokens: maxTokens})...)
		}
		if i%3 == 0 {
			held[rng.IntN(len(held))].FirstToken()
		}
		if i%5 == 0 {
			k := rng.IntN(len(held))
			held[k].Done(nil)
			held = append(held[:k], held[k+1:]...)
		}
		if i == 150 {
			// Two members leave and come back: they start slow.
			mustUpdate(t, b, members[2:])
			clock.Advance(time.Second)
			mustUpdate(t, b, members)
			clock.Advance(10 * time.Second)
		}
		sc := newScorer(TokensScore)
		c := candidatesPool.Get().(*Candidates)
		c.req = &Request{PromptTokens: rng.IntN(5000), OutputTokens: rng.IntN(500)}
		if err := c.init(b, b.snap.Load()); err != nil {
			t.Fatal(err)
		}
		if mode := sc.mode(c); mode != tokens {
			t.Fatalf("mode %d, want the tokens fast path", mode)
		}
		for j := range c.Len() {
			if fast, whole := sc.weighted(c, j, tokens), weighted(c, TokensScore, j); fast != whole {
				t.Fatalf("step %d, candidate %d: fast path %v, Score %v", i, j, fast, whole)
			}
		}
		c.release()
	}
	if !b.spilled.Load() {
		t.Fatal("no counts spilled: the test misses that case")
	}
	for _, p := range held {
		p.Done(nil)
	}
}
