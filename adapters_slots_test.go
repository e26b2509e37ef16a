package llmlb

// AdapterAffinity counts the adapters it sends to an endpoint between two
// of its observations against the endpoint's MaxAdapters.

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Between two observations, each pick of a new adapter takes one of the
// free slots the last observation showed: once they are taken the
// endpoint is full, until a request that took one is done or a newer
// observation arrives.
func TestAdapterAffinityCountsSlotsSent(t *testing.T) {
	for _, ttl := range []time.Duration{-1, 0} {
		b, pr, clock, sig := adapterSetup(t, 3, AdapterConfig{TTL: ttl})
		now := clock.Now()
		sig.Set("ep0", Load{At: now, Adapters: []string{"x"}, MaxAdapters: 3})
		sig.Set("ep1", Load{At: now, MaxAdapters: 2})
		sig.Set("ep2", Load{At: now, MaxAdapters: 2})
		// The probe takes the first candidate: without the count, every
		// new adapter would go to ep0.
		want := []string{"ep0", "ep0", "ep1", "ep1", "ep2", "ep2"}
		var picks []Pick
		for i, w := range want {
			key, pk := pickKey(t, b, &Request{Adapter: "a" + strconv.Itoa(i)})
			if key != w {
				t.Fatalf("TTL %v: adapter %d went to %s among %v, want %s", ttl, i, key, pr.keys, w)
			}
			picks = append(picks, pk)
		}
		// Every endpoint is full: a seventh adapter may go anywhere.
		_, pk := pickKey(t, b, &Request{Adapter: "a6"})
		if len(pr.keys) != 3 {
			t.Fatalf("TTL %v: with every endpoint full, inner saw %v, want every endpoint", ttl, pr.keys)
		}
		pk.Done(nil)
		// An endpoint with a request of an adapter in flight, sent since
		// its observation, holds the adapter: another request of it takes
		// no further slot there.
		key, pk := pickKey(t, b, &Request{Adapter: "a2"})
		if key != "ep1" || len(pr.keys) != 1 {
			t.Fatalf("TTL %v: another request of the adapter sent to ep1 went to %s among %v, want ep1 alone", ttl, key, pr.keys)
		}
		pk.Done(nil)
		// The second adapter sent to ep1 is done: its slot is free again.
		picks[3].Done(nil)
		picks[3].Done(nil)
		if key, pk = pickKey(t, b, &Request{Adapter: "a7"}); key != "ep1" || len(pr.keys) != 1 {
			t.Fatalf("TTL %v: after a slot of ep1 freed, a new adapter went to %s among %v, want ep1 alone", ttl, key, pr.keys)
		}
		picks = append(picks, pk)
		// A newer observation, which lists the adapters in use, replaces
		// the count.
		clock.Advance(time.Second)
		sig.Set("ep2", Load{At: clock.Now(), Adapters: []string{"a4"}, MaxAdapters: 2})
		if key, pk = pickKey(t, b, &Request{Adapter: "a8"}); key != "ep2" || len(pr.keys) != 1 {
			t.Fatalf("TTL %v: after ep2 reported one adapter in use, a new adapter went to %s among %v, want ep2 alone", ttl, key, pr.keys)
		}
		picks = append(picks, pk)
		for _, pk := range picks {
			pk.Done(nil)
		}
		// Every request is done: the slots are free again.
		pickKey(t, b, &Request{Adapter: "a9"})
		if len(pr.keys) != 3 {
			t.Fatalf("TTL %v: after every request was done, inner saw %v, want every endpoint", ttl, pr.keys)
		}
	}
}

// slotsModel is what the engines hold in the slots property tests: the
// requests in flight at each endpoint with their adapters, and the last
// observation of each, which lists the adapters in use when it was taken.
type slotsModel struct {
	max      map[string]int
	observed map[string][]string // the observation's adapters
	// flight holds the requests in flight at each endpoint: their handle,
	// adapter, and whether they were sent after the observation.
	flight map[string][]slotsFlight
}

type slotsFlight struct {
	pk      Pick
	adapter string
	after   bool
}

// inUse returns the adapters in use at key beyond its observation: those
// of the requests sent since, still in flight, that it does not list.
func (m *slotsModel) inUse(key string) map[string]bool {
	use := map[string]bool{}
	for _, a := range m.observed[key] {
		use[a] = true
	}
	for _, f := range m.flight[key] {
		if f.after {
			use[f.adapter] = true
		}
	}
	return use
}

// full reports whether a request of adapter sent to key needs a slot that
// key does not have.
func (m *slotsModel) full(key, adapter string) bool {
	use := m.inUse(key)
	return !use[adapter] && len(use) >= m.max[key]
}

// TestAdapterAffinitySlotsProperty sends random requests of a few adapters
// to endpoints with few adapter slots, with random completions and
// observations, through AdapterAffinity over a policy choosing at random
// among the candidates it is given. A request must never go to an endpoint
// whose slots are all in use by other adapters, counting the adapters of
// requests sent since its observation, unless every endpoint is so.
func TestAdapterAffinitySlotsProperty(t *testing.T) {
	keys := []string{"ep0", "ep1", "ep2"}
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 3))
		ttl := []time.Duration{-1, 0, time.Millisecond}[seed%3]
		spy := &spyPolicy{rng: rand.New(rand.NewPCG(seed, 4)), loads: map[string]EndpointLoad{}}
		p, err := AdapterAffinity(spy, AdapterConfig{TTL: ttl, Spread: []float64{0, 1e-9}[seed/3%2]})
		if err != nil {
			t.Fatal(err)
		}
		clock, sig := newFakeClock(), &fakeSignal{}
		b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute))
		mustUpdate(t, b, eps(len(keys)))
		m := &slotsModel{max: map[string]int{}, observed: map[string][]string{}, flight: map[string][]slotsFlight{}}
		observe := func(key string) {
			seen := map[string]bool{}
			var list []string
			for i, f := range m.flight[key] {
				if !seen[f.adapter] {
					seen[f.adapter] = true
					list = append(list, f.adapter)
				}
				m.flight[key][i].after = false
			}
			m.observed[key] = list
			sig.Set(key, Load{At: clock.Now(), Running: len(m.flight[key]), KVUsage: 0.5,
				Adapters: list, MaxAdapters: m.max[key]})
		}
		for _, key := range keys {
			m.max[key] = 1 + rng.IntN(3)
			observe(key)
		}
		for step := range 500 {
			clock.Advance(time.Millisecond)
			switch k := rng.IntN(10); {
			case k < 5:
				adapter := "a" + strconv.Itoa(rng.IntN(6))
				allFull := true
				for _, key := range keys {
					allFull = allFull && m.full(key, adapter)
				}
				key, pk := pickKey(t, b, &Request{Adapter: adapter})
				if m.full(key, adapter) && !allFull {
					t.Fatalf("seed %d step %d: %s sent to %s, whose %d slots hold %v, while another endpoint had room",
						seed, step, adapter, key, m.max[key], m.inUse(key))
				}
				m.flight[key] = append(m.flight[key], slotsFlight{pk: pk, adapter: adapter, after: true})
			case k < 8:
				key := keys[rng.IntN(len(keys))]
				if fl := m.flight[key]; len(fl) > 0 {
					i := rng.IntN(len(fl))
					fl[i].pk.Done(nil)
					fl[i] = fl[len(fl)-1]
					m.flight[key] = fl[:len(fl)-1]
				}
			default:
				observe(keys[rng.IntN(len(keys))])
			}
		}
		for _, fl := range m.flight {
			for _, f := range fl {
				f.pk.Done(nil)
			}
		}
		for _, key := range keys {
			st := b.snap.Load().byKey[key]
			if n := st.aux.adapters.n.Load(); n != 0 {
				t.Errorf("seed %d: %s counts %d adapters with no request in flight", seed, key, n)
			}
		}
	}
}

// TestAdapterAffinityConcurrentSlots picks requests of distinct adapters
// on several goroutines at once, between two observations of endpoints
// with m adapter slots each: no endpoint may receive more than m adapters
// unless every endpoint received m.
func TestAdapterAffinityConcurrentSlots(t *testing.T) {
	const endpoints, slots = 4, 3
	inners := []func() Policy{
		func() Policy { return LeastOutstanding() },
		func() Policy { return P2C(nil) },
		func() Policy {
			d, err := Default(DefaultConfig{})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	}
	for seed := range uint64(12) {
		for _, picks := range []int{endpoints * slots, endpoints*slots + 5} {
			p, err := AdapterAffinity(inners[seed%3](), AdapterConfig{})
			if err != nil {
				t.Fatal(err)
			}
			clock, sig := newFakeClock(), &fakeSignal{}
			for i := range endpoints {
				sig.Set("ep"+strconv.Itoa(i), Load{At: clock.Now(), KVUsage: 0.2, MaxAdapters: slots})
			}
			b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute), WithRand(rand.NewPCG(seed, 5)))
			mustUpdate(t, b, eps(endpoints))
			var (
				wg    sync.WaitGroup
				start = make(chan struct{})
				mu    sync.Mutex
				got   = map[string]int{}
				held  []Pick
			)
			for i := range picks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					pk, err := b.Pick(context.Background(), &Request{PromptTokens: 10, Adapter: "a" + strconv.Itoa(i)})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					got[pk.Endpoint().Key()]++
					held = append(held, pk)
					mu.Unlock()
				}()
			}
			close(start)
			wg.Wait()
			most, least := 0, picks
			for i := range endpoints {
				n := got["ep"+strconv.Itoa(i)]
				most, least = max(most, n), min(least, n)
			}
			if most > slots && least < slots {
				t.Errorf("seed %d, %d adapters: an endpoint of %d slots got %d adapters while another got %d (%v)",
					seed, picks, slots, most, least, got)
			}
			for _, pk := range held {
				pk.Done(nil)
			}
			for _, st := range b.snap.Load().eps {
				if n := st.aux.adapters.n.Load(); n != 0 {
					t.Errorf("seed %d: %s counts %d adapters with no request in flight", seed, st.key, n)
				}
			}
		}
	}
}

// Taking an adapter slot at the pick and releasing it at Done does not
// allocate once the endpoints have counted as many adapters before.
func TestAdapterAffinitySlotAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p, err := AdapterAffinity(LeastOutstanding(), AdapterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	clock, sig := newFakeClock(), &fakeSignal{}
	for i := range 8 {
		sig.Set("ep"+strconv.Itoa(i), Load{At: clock.Now(), Adapters: []string{"a", "b"}, MaxAdapters: 4})
	}
	b := mustNew(t, p, WithClock(clock), WithSignal(sig, time.Minute))
	mustUpdate(t, b, eps(8))
	r := &Request{PromptTokens: 100, Adapter: "c"}
	var pk Pick
	pick := func() {
		var err error
		if pk, err = b.Pick(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
	}
	for range 100 {
		pick()
	}
	if n := testing.AllocsPerRun(200, pick); n > 0 {
		t.Fatalf("%v allocations per pick of an adapter the endpoints do not report, want 0", n)
	}
	// The pick took a slot, which its Done released.
	if st := b.snap.Load().byKey[pk.Endpoint().Key()]; st.aux.adapters.n.Load() != 0 || cap(st.aux.adapters.uses) == 0 {
		t.Fatalf("after Done, %s counts %d adapters in use beyond its observation (storage for %d), want 0 (and storage for some)",
			st.key, st.aux.adapters.n.Load(), cap(st.aux.adapters.uses))
	}
}
