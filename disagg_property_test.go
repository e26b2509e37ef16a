package llmlb

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// TestDisaggregatedAdapterAccountingProperty drives a Disaggregated whose
// pools route LoRA adapters (AdapterAffinity over Default and P2C), from
// several goroutines that share their handles: picks, first tokens,
// prefills, generated tokens and Dones in random order, repeated and after
// Done, while the memberships change under requests in flight, endpoints
// go unhealthy and come back, observations arrive and the clock moves.
// Once every request is done, every endpoint either pool ever had, member
// or not, is charged nothing.
func TestDisaggregatedAdapterAccountingProperty(t *testing.T) {
	const (
		workers = 6
		ops     = 4000 // per worker
		pool    = 6    // endpoints per pool
	)
	clock, sig := newFakeClock(), &fakeSignal{}
	opts := []Option{WithClock(clock), WithSignal(sig, time.Second), WithSlowStart(SlowStart{Window: 100 * time.Millisecond}),
		WithOutputPrediction(OutputConfig{})}
	ix, _ := prefix.NewIndex(prefix.IndexConfig{})
	def, err := Default(DefaultConfig{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	decPol, err := AdapterAffinity(def, AdapterConfig{Memory: 16})
	if err != nil {
		t.Fatal(err)
	}
	prePol, err := AdapterAffinity(P2C(TokensScore), AdapterConfig{TTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	dec := mustNew(t, decPol, opts...)
	pre := mustNew(t, prePol, opts...)
	preEPs, decEPs := pdPool("p", pool), pdPool("d", pool)
	mustUpdate(t, pre, preEPs[:3])
	mustUpdate(t, dec, decEPs[:4])
	d, err := NewDisaggregated(pre, dec, DisaggConfig{LocalPrefillTokens: 400, LocalPrefillRatio: 1})
	if err != nil {
		t.Fatal(err)
	}

	var statesMu sync.Mutex
	states := map[*epState]bool{}
	record := func(b *Balancer) {
		statesMu.Lock()
		for _, st := range b.snap.Load().eps {
			states[st] = true
		}
		statesMu.Unlock()
	}
	record(pre)
	record(dec)

	// live holds the handles of requests in flight, shared by the workers.
	var (
		liveMu sync.Mutex
		live   []DisaggPick
	)
	take := func(rng *rand.Rand, remove bool) (DisaggPick, bool) {
		liveMu.Lock()
		defer liveMu.Unlock()
		if len(live) == 0 {
			return DisaggPick{}, false
		}
		i := rng.IntN(len(live))
		pk := live[i]
		if remove {
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		return pk, true
	}
	var local, remote atomic.Int64 // picks of each kind, to check the test covers both
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			var done []DisaggPick // handles this worker ended, to misuse later
			for range ops {
				switch op := rng.IntN(100); {
				case op < 35:
					n := rng.IntN(40)
					r := Request{PromptTokens: 16 * n, MaxTokens: rng.IntN(400), Prefix: blocks(rng.IntN(3), n)}
					if rng.IntN(3) > 0 {
						r.Adapter = "lora" + strconv.Itoa(rng.IntN(5))
					}
					if rng.IntN(8) == 0 {
						r.Exclude = []string{"p" + strconv.Itoa(rng.IntN(pool)), "d" + strconv.Itoa(rng.IntN(pool))}
					}
					pk, err := d.Pick(context.Background(), &r)
					switch {
					case err == nil:
						if pk.Local() {
							local.Add(1)
						} else {
							remote.Add(1)
						}
						liveMu.Lock()
						live = append(live, pk)
						liveMu.Unlock()
					case !errors.Is(err, ErrNoCandidates) && !errors.Is(err, ErrNoEndpoints):
						t.Error(err)
						return
					}
				case op < 45:
					if pk, ok := take(rng, false); ok {
						pk.Prefilled()
					}
				case op < 55:
					if pk, ok := take(rng, false); ok {
						pk.FirstToken()
					}
				case op < 62:
					if pk, ok := take(rng, false); ok {
						pk.Decode.Generated(rng.IntN(50) - 5)
					}
				case op < 85:
					if pk, ok := take(rng, true); ok {
						var err error
						if rng.IntN(4) == 0 {
							err = errors.New("reset")
						}
						pk.Done(err)
						done = append(done, pk)
					}
				case op < 90 && len(done) > 0:
					// A handle used after Done, perhaps after its record
					// went to a later request.
					pk := done[rng.IntN(len(done))]
					switch rng.IntN(4) {
					case 0:
						pk.FirstToken()
					case 1:
						pk.Prefilled()
					case 2:
						pk.Decode.Generated(7)
					default:
						pk.Done(nil)
					}
				case op < 93:
					b, all := pre, preEPs
					if rng.IntN(2) == 0 {
						b, all = dec, decEPs
					}
					lo := rng.IntN(pool - 1)
					hi := lo + 1 + rng.IntN(pool-lo-1)
					if rng.IntN(10) == 0 {
						hi = lo // empty membership
					}
					if err := b.Update(all[lo:hi]); err != nil {
						t.Error(err)
						return
					}
					record(b)
				case op < 96:
					b, name := pre, "p"
					if rng.IntN(2) == 0 {
						b, name = dec, "d"
					}
					_ = b.SetHealthy(name+strconv.Itoa(rng.IntN(pool)), rng.IntN(3) > 0)
				case op < 98:
					k := "d" + strconv.Itoa(rng.IntN(pool))
					if rng.IntN(2) == 0 {
						k = "p" + strconv.Itoa(rng.IntN(pool))
					}
					sig.Set(k, Load{At: clock.Now(), Running: rng.IntN(8), Waiting: rng.IntN(3), KVUsage: rng.Float64(),
						KVBlocks: 1000, BlockSize: 16, Adapters: []string{"lora" + strconv.Itoa(rng.IntN(5))}, MaxAdapters: 2})
				default:
					clock.Advance(time.Duration(rng.IntN(30)) * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if local.Load() == 0 || remote.Load() == 0 {
		t.Errorf("%d local and %d remote prefills: the test should make both", local.Load(), remote.Load())
	}
	t.Logf("%d local and %d remote prefills", local.Load(), remote.Load())
	for _, pk := range live {
		pk.Done(nil)
	}
	mustUpdate(t, pre, preEPs)
	mustUpdate(t, dec, decEPs)
	for _, b := range []*Balancer{pre, dec} {
		for _, s := range b.Stats() {
			if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
				t.Errorf("%s: %+v after every request is done, want nothing charged", s.Key, s)
			}
		}
	}
	for st := range states {
		if c := st.counts(); c != (counts{}) {
			t.Errorf("%s: counts %+v after every request is done, want 0", st.key, c)
		}
		st.mu.Lock()
		if st.epReqs.Load() != 0 || st.epQueued.Load() != 0 || st.epTokens.Load() != 0 {
			t.Errorf("%s: epoch counts %d/%d/%d, want 0", st.key, st.epReqs.Load(), st.epQueued.Load(), st.epTokens.Load())
		}
		st.mu.Unlock()
	}
}
