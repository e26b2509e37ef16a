package llmlb

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// spyPolicy chooses a candidate at random and notes the load estimate of
// every candidate it saw.
type spyPolicy struct {
	rng   *rand.Rand
	loads map[string]EndpointLoad
}

func (p *spyPolicy) Choose(c *Candidates) int {
	clear(p.loads)
	for i := range c.Len() {
		p.loads[c.Key(i)] = c.Load(i)
	}
	return p.rng.IntN(c.Len())
}

// rejoinModel is what a single engine per endpoint holds of one balancer's
// requests: those picked and not done, streaming or not.
type rejoinModel struct {
	live map[string][]Pick
	// streaming holds the handles that called FirstToken.
	streaming map[Pick]bool
}

func (m *rejoinModel) counts(key string) (running, waiting int) {
	for _, pk := range m.live[key] {
		if m.streaming[pk] {
			running++
		} else {
			waiting++
		}
	}
	return running, waiting
}

// TestRejoinAccountingProperty drives one balancer with a signal through
// random picks, first tokens and completions, memberships that drop
// endpoints with requests in flight and bring them back, observations of
// members and departed endpoints alike, and a clock that lets observations
// expire. The signal reports exactly this balancer's requests, so every
// estimate from a fresh observation must count exactly the requests in
// flight at the endpoint, however often it left and came back; and the
// balancer's own counts must match them at every pick.
func TestRejoinAccountingProperty(t *testing.T) {
	const maxAge = 10 * time.Second
	keys := eps(4)
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clock := newFakeClock()
		sig := &fakeSignal{}
		spy := &spyPolicy{rng: rand.New(rand.NewPCG(seed, 8)), loads: map[string]EndpointLoad{}}
		b := mustNew(t, spy, WithClock(clock), WithSignal(sig, maxAge))
		mustUpdate(t, b, keys)
		m := &rejoinModel{live: map[string][]Pick{}, streaming: map[Pick]bool{}}
		members := map[string]bool{}
		for _, ep := range keys {
			members[ep.Key()] = true
		}
		check := func(step int) {
			t.Helper()
			for key, l := range spy.loads {
				running, waiting := m.counts(key)
				n := int64(running + waiting)
				if l.Outstanding != n || l.Queued != int64(waiting) {
					t.Fatalf("seed %d step %d: %s Outstanding %d, Queued %d; want %d, %d",
						seed, step, key, l.Outstanding, l.Queued, n, waiting)
				}
				if l.Fresh && l.Requests != n {
					t.Fatalf("seed %d step %d: %s estimated at %d requests from a fresh observation, %d in flight",
						seed, step, key, l.Requests, n)
				}
			}
		}
		randomLive := func() (string, int, bool) {
			key := keys[rng.IntN(len(keys))].Key()
			if len(m.live[key]) == 0 {
				return "", 0, false
			}
			return key, rng.IntN(len(m.live[key])), true
		}
		for step := range 600 {
			switch k := rng.IntN(100); {
			case k < 35:
				pk, err := b.Pick(context.Background(), &Request{PromptTokens: 1 + rng.IntN(100)})
				if err != nil {
					if len(members) > 0 {
						t.Fatal(err)
					}
					continue
				}
				check(step)
				key := pk.Endpoint().Key()
				m.live[key] = append(m.live[key], pk)
			case k < 50:
				if key, i, ok := randomLive(); ok {
					pk := m.live[key][i]
					pk.FirstToken()
					m.streaming[pk] = true
				}
			case k < 72:
				if key, i, ok := randomLive(); ok {
					l := m.live[key]
					l[i].Done(nil)
					delete(m.streaming, l[i])
					l[i] = l[len(l)-1]
					m.live[key] = l[:len(l)-1]
				}
			case k < 82:
				var next []Endpoint
				clear(members)
				for _, ep := range keys {
					if rng.IntN(3) != 0 {
						next = append(next, ep)
						members[ep.Key()] = true
					}
				}
				mustUpdate(t, b, next)
			case k < 94:
				// The engine reports what it holds, a member or not.
				key := keys[rng.IntN(len(keys))].Key()
				running, waiting := m.counts(key)
				sig.Set(key, Load{At: clock.Now(), Running: running, Waiting: waiting, KVUsage: 0.5})
				// Later picks are later than the observation.
				clock.Advance(time.Millisecond)
			default:
				clock.Advance([]time.Duration{time.Millisecond, time.Second, 4 * time.Second, maxAge + time.Second}[rng.IntN(4)])
			}
		}
		for _, l := range m.live {
			for _, pk := range l {
				pk.Done(nil)
			}
		}
		for _, s := range b.Stats() {
			if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
				t.Errorf("seed %d: %+v after every pick ended", seed, s)
			}
		}
	}
}

// TestRejoinConcurrentProperty has requests that an observation counted
// finish on several goroutines while another takes their endpoint out of
// the membership and puts it back, again and again: once they have all
// finished and the endpoint is back, the observation, still fresh, must
// estimate it idle, whichever of a completion and an update came first.
func TestRejoinConcurrentProperty(t *testing.T) {
	const workers, each = 4, 16
	rounds := 50
	if raceEnabled {
		rounds = 20
	}
	clock := newFakeClock()
	sig := &fakeSignal{}
	p := &probe{pick: "ep0"}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(2))
	ctx := context.Background()
	for round := range rounds {
		p.pick = "ep0"
		picks := make([]Pick, workers*each)
		for i := range picks {
			pk, err := b.Pick(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				pk.FirstToken()
			}
			picks[i] = pk
		}
		clock.Advance(time.Millisecond)
		sig.Set("ep0", Load{At: clock.Now(), Running: len(picks) / 2, Waiting: len(picks) / 2, KVUsage: 0.5})
		clock.Advance(time.Millisecond)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, pk := range picks[w*each : (w+1)*each] {
					pk.Done(nil)
				}
			}()
		}
		stop := make(chan struct{})
		flapped := make(chan struct{})
		go func() {
			defer close(flapped)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := b.Update(eps(2)[i%2:]); err != nil {
					t.Error(err)
					return
				}
				if i%8 == 7 {
					// Out of the membership: only the balancer refers to
					// ep0's accounting once its requests are done.
					runtime.GC()
				}
			}
		}()
		wg.Wait()
		close(stop)
		<-flapped
		runtime.GC()
		mustUpdate(t, b, eps(2))
		p.pick = "ep1"
		pk, err := b.Pick(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		if l := p.loads["ep0"]; !l.Fresh || l.Requests != 0 || l.Outstanding != 0 {
			t.Fatalf("round %d: ep0 back with every observed request done: fresh %v, Requests %d, Outstanding %d; want true, 0, 0",
				round, l.Fresh, l.Requests, l.Outstanding)
		}
	}
}
