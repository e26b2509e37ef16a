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

// settableClock is a clock that may be set anywhere, back as well as
// forward.
type settableClock struct{ fakeClock }

func (c *settableClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// checkSpeedEstimate fails t if e publishes an estimate that is not a
// number, infinite, or negative where it must not be.
func checkSpeedEstimate(t *testing.T, key string, e *speedEstimate) {
	t.Helper()
	if e == nil {
		return
	}
	for i, bits := range [...]uint64{e.a.Load(), e.tau.Load(), e.se.Load(), e.count.Load(), e.dtau.Load(),
		e.dse.Load(), e.dcount.Load(), e.lload.Load(), e.lvar.Load()} {
		if v := math.Float64frombits(bits); !(v >= 0) || math.IsInf(v, 0) {
			t.Fatalf("%s: estimate %d published %v", key, i, v)
		}
	}
	for _, bits := range [...]uint64{e.llog.Load(), e.lcov.Load()} {
		if v := math.Float64frombits(bits); math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("%s: load moment published %v", key, v)
		}
	}
}

// defaultOps drives a balancer with a Default policy through random
// operations: picks of any size, FirstToken, Generated and Done in any
// order and repetition, membership changes that drop and re-add endpoints
// under their keys and change their weights, health, signal observations,
// engine KV events and a clock that steps back and jumps. It notes every
// endpoint state the balancer had, for the checks.
type defaultOps struct {
	b      *Balancer
	clock  *settableClock
	sig    *fakeSignal
	events *prefix.Index
	all    []Endpoint

	mu     sync.Mutex // protects all and states
	states map[*epState]bool
}

// The extremes the operations draw from.
var (
	propWeights = []float64{1, 1, 1, 2, 0.5, 5e-324, 1e-300, 1e300, math.MaxFloat64}
	propTokens  = []int{0, 1, 16, 100, 1000, 1 << 20, maxTokens - 1, maxTokens}
	propCounts  = []int{math.MinInt, -1, 0, 1, 7, 1000, 1 << 30, 1 << 45, math.MaxInt}
)

func (o *defaultOps) note() {
	o.mu.Lock()
	for _, st := range o.b.snap.Load().eps {
		o.states[st] = true
	}
	o.mu.Unlock()
}

func (o *defaultOps) reweight(rng *rand.Rand) {
	for i := range o.all {
		o.all[i] = weightedEP{testEP{key: "ep" + strconv.Itoa(i), weight: propWeights[rng.IntN(len(propWeights))]}}
	}
}

// step runs one random operation with rng and returns live, the caller's
// handles, updated. It may run on any goroutine.
func (o *defaultOps) step(t *testing.T, rng *rand.Rand, live []Pick) []Pick {
	n := len(o.all)
	switch k := rng.IntN(100); {
	case k < 30:
		r := Request{PromptTokens: propTokens[rng.IntN(len(propTokens))], Feature: strconv.Itoa(rng.IntN(3))}
		if rng.IntN(2) == 0 {
			r.MaxTokens = propTokens[rng.IntN(len(propTokens))]
		}
		if rng.IntN(2) == 0 {
			r.OutputTokens = propTokens[rng.IntN(len(propTokens))]
		}
		if rng.IntN(3) != 0 {
			// Hostile block lists too: repeated, and longer than the
			// prompt.
			r.Prefix = make([]uint64, rng.IntN(40))
			for i := range r.Prefix {
				r.Prefix[i] = uint64(rng.IntN(6))
			}
		}
		if rng.IntN(5) == 0 {
			r.Exclude = []string{"ep" + strconv.Itoa(rng.IntN(n))}
		}
		pk, err := o.b.Pick(context.Background(), &r)
		switch {
		case err == nil:
			live = append(live, pk)
		case !errors.Is(err, ErrNoCandidates):
			t.Error(err)
		}
	case k < 42 && len(live) > 0:
		live[rng.IntN(len(live))].FirstToken()
	case k < 52 && len(live) > 0:
		live[rng.IntN(len(live))].Generated(propCounts[rng.IntN(len(propCounts))])
	case k < 72 && len(live) > 0:
		i := rng.IntN(len(live))
		var err error
		if rng.IntN(3) == 0 {
			err = errors.New("failed")
		}
		live[i].Done(err)
		if rng.IntN(3) == 0 {
			live[i].Done(nil)
			live[i].FirstToken()
			live[i].Generated(5)
		}
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	case k < 76:
		lo := rng.IntN(n - 1)
		hi := lo + 1 + rng.IntN(n-lo-1)
		o.mu.Lock()
		if rng.IntN(2) == 0 {
			o.reweight(rng)
		}
		eps := append([]Endpoint(nil), o.all[lo:hi]...)
		o.mu.Unlock()
		if err := o.b.Update(eps); err != nil {
			t.Error(err)
		}
		o.note()
	case k < 78:
		_ = o.b.SetHealthy("ep"+strconv.Itoa(rng.IntN(n)), rng.IntN(2) == 0)
	case k < 81:
		o.sig.Set("ep"+strconv.Itoa(rng.IntN(n)), Load{At: o.clock.Now().Add(-time.Duration(rng.IntN(100)) * time.Millisecond),
			Running: rng.IntN(10), Waiting: propCounts[rng.IntN(len(propCounts))] & math.MaxInt,
			KVUsage: rng.Float64(), KVBlocks: rng.IntN(1 << 20), BlockSize: 16, PeerWaiting: rng.IntN(3)})
	case k < 85:
		key := "ep" + strconv.Itoa(rng.IntN(n))
		hashes := make([]uint64, rng.IntN(50))
		for i := range hashes {
			hashes[i] = uint64(rng.IntN(6))
		}
		switch rng.IntN(4) {
		case 0, 1:
			_ = o.events.Stored(key, o.events.BlockSize(), hashes...)
		case 2:
			_ = o.events.Removed(key, o.events.BlockSize(), hashes...)
		default:
			o.events.Cleared(key)
		}
	case k < 95:
		o.clock.Advance(time.Duration(rng.IntN(3)) * time.Duration([]int64{1, 1e6, 1e9, 1e12}[rng.IntN(4)]))
	case k < 98:
		o.clock.Advance(-time.Duration(rng.IntN(1e9)))
	default:
		o.clock.Set([]time.Time{time.Unix(0, 0), time.Unix(1_000_000, 0), time.Unix(1<<40, 0), time.Unix(-1<<40, 0)}[rng.IntN(4)])
	}
	return live
}

// check fails t if any endpoint's counts are negative or its estimates not
// finite.
func (o *defaultOps) check(t *testing.T) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for st := range o.states {
		checkSpeedEstimate(t, st.key, st.est)
		if c := st.counts(); c.outstanding < 0 || c.queued < 0 || c.prefill < 0 || c.prompt < 0 || c.decode < 0 {
			t.Fatalf("%s: counts %+v", st.key, c)
		}
	}
}

// checkIdle fails t unless every endpoint the balancer ever had is back to
// zero, as its Stats report and in its counts.
func (o *defaultOps) checkIdle(t *testing.T) {
	o.check(t)
	for st := range o.states {
		if c := st.counts(); c != (counts{}) {
			t.Errorf("%s: counts %+v after every pick ended", st.key, c)
		}
	}
	for _, s := range o.b.Stats() {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			t.Errorf("%+v after every pick ended", s)
		}
	}
}

func newDefaultOps(t *testing.T, seed uint64, cfg DefaultConfig, opts ...Option) *defaultOps {
	events, err := prefix.NewIndex(prefix.IndexConfig{EventsOnly: true, Capacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	if seed%2 == 0 {
		cfg.Events = events
	}
	p, err := Default(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &defaultOps{clock: &settableClock{}, sig: &fakeSignal{}, events: events,
		all: make([]Endpoint, 8), states: map[*epState]bool{}}
	o.clock.t = time.Unix(1_000_000, 0)
	opts = append(opts, WithClock(o.clock), WithRand(rand.NewPCG(seed, 1)))
	if seed%3 != 0 {
		opts = append(opts, WithSignal(o.sig, time.Second))
	}
	if seed%4 < 2 {
		opts = append(opts, WithOutputPrediction(OutputConfig{MinObservations: 1}))
	}
	if seed%5 == 0 {
		opts = append(opts, WithSlowStart(SlowStart{Window: time.Second}))
	}
	if o.b, err = New(p, opts...); err != nil {
		t.Fatal(err)
	}
	o.reweight(rand.New(rand.NewPCG(seed, 2)))
	mustUpdate(t, o.b, o.all[:5])
	o.note()
	return o
}

// propSeeds is the number of random sequences TestDefaultAccountingProperty
// runs.
const propSeeds = 24

// defaultConfigs are the configurations the property tests run.
var defaultConfigs = []DefaultConfig{
	{},
	{Sampled: 2},
	{Sampled: 1, Holders: 1},
	{TTFTObjective: time.Second, TPOTObjective: 50 * time.Millisecond},
	{Slots: 2},
	{DisableLearning: true},
	// The extremes the configuration accepts.
	{CacheWeight: 1e12, FootprintWeight: 1e12, KVPenalty: 1e12, OverloadWeight: 1e12, QueueWeight: 1e12,
		SlotWeight: 1e12, Slots: 1, OverloadQueue: 5e-324, TTFTObjective: math.MaxInt64, TPOTObjective: 1},
	{CacheWeight: 5e-324, FootprintWeight: 5e-324, KVPenalty: 5e-324, OverloadWeight: 5e-324, QueueWeight: 5e-324,
		SlotWeight: 5e-324, Slots: math.MaxInt, Sampled: math.MaxInt, Holders: math.MaxInt, OverloadQueue: math.MaxFloat64},
}

// TestDefaultAccountingProperty runs random operation sequences on a
// Default balancer and checks that its counts never go negative, its speed
// estimates stay finite, and every endpoint's counts return to zero when
// every pick has ended, whatever the order and repetition of the handles'
// calls, the membership changes and the clock's steps.
func TestDefaultAccountingProperty(t *testing.T) {
	for seed := range uint64(propSeeds) {
		cfg := defaultConfigs[int(seed)%len(defaultConfigs)]
		o := newDefaultOps(t, seed, cfg)
		rng := rand.New(rand.NewPCG(seed, 99))
		var live []Pick
		for range 2000 {
			live = o.step(t, rng, live)
			o.check(t)
		}
		for _, pk := range live {
			if rng.IntN(2) == 0 {
				pk.FirstToken()
			}
			pk.Done(nil)
		}
		o.checkIdle(t)
	}
}

// TestDefaultConcurrentAccountingProperty is TestDefaultAccountingProperty
// with several goroutines, some calling one handle's methods at once.
func TestDefaultConcurrentAccountingProperty(t *testing.T) {
	const workers = 4
	ops := 3000
	if raceEnabled {
		ops = 1500
	}
	for seed := range uint64(len(defaultConfigs)) {
		o := newDefaultOps(t, seed, defaultConfigs[seed])
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				var live []Pick
				var calls sync.WaitGroup
				for range ops {
					if len(live) > 0 && rng.IntN(10) == 0 {
						// Race a handle's calls against each other.
						pk := live[rng.IntN(len(live))]
						calls.Add(3)
						go func() { defer calls.Done(); pk.FirstToken() }()
						go func() { defer calls.Done(); pk.Generated(3) }()
						go func() { defer calls.Done(); pk.Done(nil) }()
					}
					live = o.step(t, rng, live)
				}
				for _, pk := range live {
					pk.FirstToken()
					pk.Done(nil)
				}
				calls.Wait()
			}()
		}
		wg.Wait()
		o.checkIdle(t)
	}
}
