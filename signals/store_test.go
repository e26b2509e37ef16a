package signals_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/stamped"
	"github.com/llmlb/llmlb/signals"
)

func TestStoreNewestWins(t *testing.T) {
	var s signals.Store
	t0 := time.Unix(1000, 0)
	_, ok := s.Load("a")
	assert.False(t, ok)
	require.NoError(t, s.Record("a", llmlb.Load{At: t0, Running: 1, KVUsage: math.NaN()}))
	require.NoError(t, s.Record("a", llmlb.Load{At: t0.Add(-time.Second), Running: 2}))
	l, ok := s.Load("a")
	require.True(t, ok)
	assert.Equal(t, 1, l.Running, "an older observation never replaces a newer one")
	require.NoError(t, s.Record("a", llmlb.Load{At: t0, Running: 3}))
	l, _ = s.Load("a")
	assert.Equal(t, 3, l.Running, "an observation at the same time replaces")
	require.NoError(t, s.Record("a", llmlb.Load{At: t0.Add(time.Second), Running: 4}))
	o, ok := s.Observation("a")
	require.True(t, ok)
	assert.Equal(t, 4, o.Running)
	assert.True(t, math.IsNaN(o.Preemptions), "a pushed load has no engine counters")
	assert.Equal(t, signals.EngineAuto, o.Engine)
	assert.Equal(t, 1, s.Len())
	s.Delete("a")
	s.Delete("a")
	_, ok = s.Load("a")
	assert.False(t, ok)
	assert.Zero(t, s.Len())
}

// TestStoreObservationFromTheFuture checks that an observation stamped
// ahead of the store's clock, by a clock that then stepped back or by a
// recorder whose clock runs ahead, does not keep out the observations that
// follow it.
func TestStoreObservationFromTheFuture(t *testing.T) {
	clk := newFakeClock()
	s, err := signals.NewStore(signals.StoreConfig{Clock: clk})
	require.NoError(t, err)
	now := clk.Now()
	require.NoError(t, s.Record("a", llmlb.Load{At: now.Add(time.Hour), Running: 1}))
	require.NoError(t, s.Record("a", llmlb.Load{At: now, Running: 2}))
	l, _ := s.Load("a")
	assert.Equal(t, 2, l.Running, "an observation stamped an hour ahead kept out the current one")
	// Newest still wins among observations not ahead of the clock.
	require.NoError(t, s.Record("a", llmlb.Load{At: now.Add(-time.Second), Running: 3}))
	l, _ = s.Load("a")
	assert.Equal(t, 2, l.Running, "an older observation replaced a newer one")
	// The clock steps back: the next scrape is stamped before the held one.
	clk.Advance(-time.Minute)
	require.NoError(t, s.Record("a", llmlb.Load{At: clk.Now(), Running: 4}))
	l, _ = s.Load("a")
	assert.Equal(t, 4, l.Running, "after the clock stepped back, observations stayed out")
}

func TestStoreRejectsInvalid(t *testing.T) {
	var s signals.Store
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		key string
		l   llmlb.Load
	}{
		{"", llmlb.Load{At: now}},
		{"a", llmlb.Load{}},
		{"a", llmlb.Load{At: now, Running: -1}},
		{"a", llmlb.Load{At: now, Waiting: -1}},
		{"a", llmlb.Load{At: now, KVBlocks: -1}},
		{"a", llmlb.Load{At: now, BlockSize: -1}},
		{"a", llmlb.Load{At: now, KVUsage: 1.01}},
		{"a", llmlb.Load{At: now, KVUsage: -0.1}},
		{"a", llmlb.Load{At: now, KVUsage: math.Inf(1)}},
	} {
		assert.ErrorIs(t, s.Record(c.key, c.l), signals.ErrInvalidLoad, "%+v", c)
	}
	assert.Zero(t, s.Len())
}

// TestStoreRejectsInvalidCounters checks that RecordObservation refuses
// engine counters that are negative or infinite, as the scrape's parser
// does, and accepts NaN, the value of a counter not reported.
func TestStoreRejectsInvalidCounters(t *testing.T) {
	var s signals.Store
	now := time.Unix(1000, 0)
	nan := math.NaN()
	for _, bad := range []float64{-1, math.Inf(1), math.Inf(-1)} {
		for _, o := range []signals.Observation{
			{Load: llmlb.Load{At: now}, Preemptions: bad, PrefixQueries: nan, PrefixHits: nan},
			{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: bad, PrefixHits: nan},
			{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: nan, PrefixHits: bad},
		} {
			assert.ErrorIs(t, s.RecordObservation("a", o), signals.ErrInvalidLoad, "%+v", o)
		}
	}
	assert.Zero(t, s.Len())
	for _, o := range []signals.Observation{
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: nan, PrefixHits: nan},
		{Load: llmlb.Load{At: now}},
		{Load: llmlb.Load{At: now}, Preemptions: 3, PrefixQueries: 1e6, PrefixHits: 5e5},
	} {
		require.NoError(t, s.RecordObservation("a", o), "%+v", o)
	}
	got, ok := s.Observation("a")
	require.True(t, ok)
	assert.Equal(t, 3.0, got.Preemptions)
}

// TestStoreCountersBoundedAsParse checks that RecordObservation holds
// engine counters to the bounds a scrape's parser does: none above 1e18,
// and no more prefix-cache hits than queries (vLLM counts a request's hits
// among its queries), while a hit count without queries, or equal to them,
// is accepted.
func TestStoreCountersBoundedAsParse(t *testing.T) {
	var s signals.Store
	now := time.Unix(1000, 0)
	nan := math.NaN()
	for _, o := range []signals.Observation{
		{Load: llmlb.Load{At: now}, Preemptions: 2e18, PrefixQueries: nan, PrefixHits: nan},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: math.MaxFloat64, PrefixHits: 1},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: nan, PrefixHits: 1.5e18},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: 10, PrefixHits: 11},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: 0, PrefixHits: 1},
	} {
		assert.ErrorIs(t, s.RecordObservation("a", o), signals.ErrInvalidLoad, "%+v", o)
	}
	assert.Zero(t, s.Len())
	for _, o := range []signals.Observation{
		{Load: llmlb.Load{At: now}, Preemptions: 1e18, PrefixQueries: 1e18, PrefixHits: 1e18},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: 10, PrefixHits: 10},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: nan, PrefixHits: 10},
		{Load: llmlb.Load{At: now}, Preemptions: nan, PrefixQueries: 10, PrefixHits: nan},
	} {
		require.NoError(t, s.RecordObservation("a", o), "%+v", o)
	}

	// The parser reports neither counter of the same exposition, rather
	// than fail the scrape and lose its queue too, so that a scrape never
	// yields an observation the Store rejects.
	const body = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 10
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 11
`
	o, err := signals.Parse(strings.NewReader(body), "text/plain; version=0.0.4", signals.EngineVLLM)
	require.NoError(t, err)
	assert.True(t, math.IsNaN(o.PrefixHits) && math.IsNaN(o.PrefixQueries), "%+v", o)
	assert.Equal(t, 1, o.Running)
	o.At = now
	require.NoError(t, s.RecordObservation("a", o))
}

func TestStoreConfig(t *testing.T) {
	_, err := signals.NewStore(signals.StoreConfig{MaxKeys: -1})
	assert.ErrorIs(t, err, signals.ErrInvalidConfig)
	_, err = signals.NewStore(signals.StoreConfig{MaxAge: -1})
	assert.ErrorIs(t, err, signals.ErrInvalidConfig)

	clock := newFakeClock()
	s, err := signals.NewStore(signals.StoreConfig{MaxKeys: 2, MaxAge: time.Second, Clock: clock})
	require.NoError(t, err)
	require.NoError(t, s.Record("a", llmlb.Load{At: clock.Now()}))
	require.NoError(t, s.Record("b", llmlb.Load{At: clock.Now()}))
	require.NoError(t, s.Record("a", llmlb.Load{At: clock.Now()}), "updating a held key when full")
	assert.Equal(t, 2, s.Len())
	clock.Advance(time.Second)
	_, ok := s.Load("a")
	assert.True(t, ok, "exactly MaxAge old is still served")
	clock.Advance(time.Nanosecond)
	_, ok = s.Load("a")
	assert.False(t, ok)
	s.Delete("b")
	require.NoError(t, s.Record("c", llmlb.Load{At: clock.Now()}))
	assert.Equal(t, 2, s.Len())
}

// TestStoreEvictsUnused fills stores of several sizes and keeps recording,
// between every two new endpoints, a set of live endpoints, as a shared
// store sees pods that stay and pods that come and go; now and then one is
// deleted. After every record: the store holds at most MaxKeys endpoints,
// Len counts them, it holds the endpoint just recorded with its newest
// observation and every live endpoint, and no endpoint that stopped
// reporting outlives 2*MaxKeys endpoints added to the full store.
func TestStoreEvictsUnused(t *testing.T) {
	for _, c := range []struct{ maxKeys, live int }{{1, 0}, {2, 1}, {16, 8}, {16, 15}, {100, 50}} {
		t.Run(fmt.Sprintf("max=%d/live=%d", c.maxKeys, c.live), func(t *testing.T) {
			clock := newFakeClock()
			s, err := signals.NewStore(signals.StoreConfig{MaxKeys: c.maxKeys, Clock: clock})
			require.NoError(t, err)
			r := rand.New(rand.NewPCG(uint64(c.maxKeys), uint64(c.live)))
			added := 0               // new endpoints recorded
			evictions := 0           // new endpoints recorded into the full store
			last := map[string]int{} // endpoint -> evictions when last recorded
			record := func(key string) {
				t.Helper()
				clock.Advance(time.Millisecond)
				// Stamps from the recorders' clocks, some far ahead of the
				// store's: they must not keep an endpoint that left.
				at := clock.Now().Add(time.Duration(r.IntN(2)) * 1000 * time.Hour)
				require.NoError(t, s.Record(key, llmlb.Load{At: at, Running: added}))
				o, ok := s.Observation(key)
				require.True(t, ok, "%q not held just after its record", key)
				require.Equal(t, added, o.Running, "%q", key)
				last[key] = evictions
			}
			check := func(step int) {
				t.Helper()
				held := 0
				for key, at := range last {
					_, ok := s.Observation(key)
					if ok {
						held++
						require.Less(t, evictions-at, 2*c.maxKeys, "step %d: %q held %d evictions after its last record", step, key, evictions-at)
					}
					if strings.HasPrefix(key, "live-") {
						require.True(t, ok, "step %d: live %q evicted", step, key)
					}
				}
				require.Equal(t, held, s.Len(), "step %d", step)
				require.LessOrEqual(t, held, c.maxKeys, "step %d", step)
			}
			for step := range 30 * c.maxKeys {
				for i := range c.live {
					record(fmt.Sprint("live-", i))
				}
				added++
				if s.Len() == c.maxKeys {
					evictions++
				}
				record(fmt.Sprint("new-", step))
				if r.IntN(8) == 0 && step > 0 {
					key := fmt.Sprint("new-", r.IntN(step))
					s.Delete(key)
					delete(last, key)
				}
				check(step)
			}
		})
	}
}

// TestStoreEvictsDeparted: an endpoint whose last observation was stamped
// far in the future (a recorder's clock ahead) and that then left makes
// room for the endpoints that keep reporting.
func TestStoreEvictsDeparted(t *testing.T) {
	clock := newFakeClock()
	s, err := signals.NewStore(signals.StoreConfig{MaxKeys: 3, Clock: clock})
	require.NoError(t, err)
	require.NoError(t, s.Record("gone", llmlb.Load{At: clock.Now().Add(100 * 365 * 24 * time.Hour)}))
	for i := range 100 {
		clock.Advance(time.Second)
		require.NoError(t, s.Record(fmt.Sprint("pod-", i%3), llmlb.Load{At: clock.Now()}))
	}
	_, ok := s.Load("gone")
	assert.False(t, ok, "the departed endpoint is held")
	for i := range 3 {
		_, ok := s.Load(fmt.Sprint("pod-", i))
		assert.True(t, ok, "pod-%d is not held", i)
	}
}

// TestStoreEvictionInvalidatesLoader checks that a loader of an evicted
// endpoint reads nothing, and reads the endpoint again once it is recorded
// again.
func TestStoreEvictionInvalidatesLoader(t *testing.T) {
	clock := newFakeClock()
	s, err := signals.NewStore(signals.StoreConfig{MaxKeys: 1, Clock: clock})
	require.NoError(t, err)
	load := s.Loader(stamped.Token{}, "a")
	require.NoError(t, s.Record("a", llmlb.Load{At: clock.Now(), Running: 1}))
	require.NotNil(t, load())
	clock.Advance(time.Second)
	require.NoError(t, s.Record("b", llmlb.Load{At: clock.Now(), Running: 2}))
	assert.Nil(t, load(), "a was evicted for b")
	clock.Advance(time.Second)
	require.NoError(t, s.Record("a", llmlb.Load{At: clock.Now(), Running: 3}))
	got := load()
	require.NotNil(t, got)
	assert.Equal(t, 3, got.Running)
	_, ok := s.Load("b")
	assert.False(t, ok, "b was evicted for a")
}

// TestStoreConcurrentEviction records distinct keys from several goroutines
// into a small store, with readers and deletes running: the store never
// holds more than MaxKeys, and Len counts what it holds.
func TestStoreConcurrentEviction(t *testing.T) {
	const maxKeys, writers, per = 32, 4, 2000
	s, err := signals.NewStore(signals.StoreConfig{MaxKeys: maxKeys})
	require.NoError(t, err)
	base := time.Unix(1000, 0)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			load := s.Loader(stamped.Token{}, fmt.Sprint("w", w, "-0"))
			for i := range per {
				key := fmt.Sprint("w", w, "-", i%(maxKeys/2+1))
				if err := s.Record(key, llmlb.Load{At: base.Add(time.Duration(i)), Running: i}); err != nil {
					t.Error(err)
					return
				}
				if l := load(); l != nil && l.Running%(maxKeys/2+1) != 0 {
					t.Errorf("loader of w%d-0 read %+v", w, *l)
					return
				}
				if i%50 == 0 {
					s.Delete(fmt.Sprint("w", (w+1)%writers, "-", i%(maxKeys/2+1)))
				}
				if n := s.Len(); n > maxKeys {
					t.Errorf("store holds %d endpoints, more than %d", n, maxKeys)
					return
				}
			}
		})
	}
	wg.Wait()
	held := 0
	for w := range writers {
		for i := range maxKeys/2 + 1 {
			if _, ok := s.Load(fmt.Sprint("w", w, "-", i)); ok {
				held++
			}
		}
	}
	assert.Equal(t, held, s.Len())
	assert.LessOrEqual(t, held, maxKeys)
}

// Concurrent writers of one key leave the newest observation; readers never
// see a torn or older-than-read observation.
func TestStoreConcurrent(t *testing.T) {
	var s signals.Store
	base := time.Unix(1000, 0)
	const writers, per = 8, 500
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var readerErr error
	var rmu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last time.Time
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, k := range []string{"k0", "k1", "k2"} {
				l, ok := s.Load(k)
				if ok && l.Running != int(l.At.Sub(base)) {
					rmu.Lock()
					readerErr = fmt.Errorf("torn observation %+v", l)
					rmu.Unlock()
				}
				if k == "k0" && ok {
					if l.At.Before(last) {
						rmu.Lock()
						readerErr = fmt.Errorf("observation went back in time: %v after %v", l.At, last)
						rmu.Unlock()
					}
					last = l.At
				}
			}
		}
	}()
	var ww sync.WaitGroup
	for w := range writers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			for i := range per {
				n := i*writers + w
				k := fmt.Sprintf("k%d", n%3)
				if err := s.Record(k, llmlb.Load{At: base.Add(time.Duration(n)), Running: n}); err != nil {
					t.Error(err)
				}
				if n%97 == 0 {
					s.Delete("k2")
				}
			}
		}()
	}
	ww.Wait()
	close(stop)
	wg.Wait()
	require.NoError(t, readerErr)
	l, ok := s.Load("k0")
	require.True(t, ok)
	newest := (writers*per - 1) / 3 * 3 // the largest n with n%3 == 0
	assert.Equal(t, newest, l.Running)
}

// TestStoreHugeCountsNeverLookIdle records the largest counts a Store
// accepts and checks that a balancer reading them never prefers that
// endpoint to a lightly loaded one, even with its own dispatches to it
// since the observation.
func TestStoreHugeCountsNeverLookIdle(t *testing.T) {
	for _, tc := range []struct {
		name             string
		running, waiting int
	}{
		{"running", math.MaxInt, 0},
		{"waiting", 0, math.MaxInt},
		{"both", math.MaxInt, math.MaxInt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			s, err := signals.NewStore(signals.StoreConfig{Clock: clock})
			require.NoError(t, err)
			require.NoError(t, s.Record("busy", llmlb.Load{At: clock.Now(), Running: tc.running, Waiting: tc.waiting, KVUsage: math.NaN()}))
			require.NoError(t, s.Record("light", llmlb.Load{At: clock.Now(), Running: 3, KVUsage: math.NaN()}))
			b, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithClock(clock), llmlb.WithSignal(s, time.Minute))
			require.NoError(t, err)
			require.NoError(t, b.Update([]llmlb.Endpoint{replica("busy"), replica("light")}))
			// One dispatch to busy after the observation, as a retry
			// excluding light would make.
			held, err := b.Pick(t.Context(), &llmlb.Request{Exclude: []string{"light"}})
			require.NoError(t, err)
			defer held.Done(nil)
			for range 20 {
				pk, err := b.Pick(t.Context(), nil)
				require.NoError(t, err)
				assert.Equal(t, "light", pk.Endpoint().Key())
				pk.Done(nil)
			}
		})
	}
}

// TestLoaderReadsAsLoad checks that the loaders a balancer of this module
// uses read what Load reads: for a key recorded after its loader was made,
// after a newer observation, past MaxAge, after Delete and after the key is
// recorded again, for a Store and a Scraper.
func TestLoaderReadsAsLoad(t *testing.T) {
	clock := newFakeClock()
	store, err := signals.NewStore(signals.StoreConfig{MaxAge: 10 * time.Second, Clock: clock})
	require.NoError(t, err)
	scraper, err := signals.NewScraper(signals.Config{MaxAge: 5 * time.Second, Clock: clock})
	require.NoError(t, err)
	type signal interface {
		llmlb.Signal
		Loader(stamped.Token, string) func() *llmlb.Load
	}
	record := map[string]func(string, llmlb.Load) error{"store": store.Record, "scraper": scraper.Store().Record}
	del := map[string]func(string){"store": store.Delete, "scraper": scraper.Store().Delete}
	for name, sig := range map[string]signal{"store": store, "scraper": scraper} {
		keys := []string{"a", "b"}
		loaders := make([]func() *llmlb.Load, len(keys))
		for i, k := range keys {
			loaders[i] = sig.Loader(stamped.Token{}, k)
		}
		check := func(step string) {
			t.Helper()
			for i, k := range keys {
				want, wantOK := sig.Load(k)
				got := loaders[i]()
				if (got != nil) != wantOK || got != nil && !reflect.DeepEqual(*got, want) {
					t.Fatalf("%s, %s: loader of %q read %+v; Load %+v, %v", name, step, k, got, want, wantOK)
				}
			}
		}
		check("empty")
		load := func(running int) llmlb.Load {
			return llmlb.Load{At: clock.Now(), Running: running, KVUsage: 0.5}
		}
		require.NoError(t, record[name]("a", load(1)))
		check("a recorded")
		clock.Advance(time.Second)
		require.NoError(t, record[name]("a", load(2)))
		require.NoError(t, record[name]("b", load(3)))
		check("a newer, b recorded")
		clock.Advance(6 * time.Second)
		check("past the scraper's MaxAge")
		clock.Advance(6 * time.Second)
		check("past the store's MaxAge")
		require.NoError(t, record[name]("a", load(4)))
		check("a fresh again")
		del[name]("a")
		check("a deleted")
		require.NoError(t, record[name]("a", load(5)))
		check("a recorded again")
		if got := loaders[0](); got == nil || got.Running != 5 {
			t.Fatalf("%s: loader of a read %+v after it was recorded again; want Running 5", name, got)
		}
	}
}

// TestMaxAgeAfterClockStepsBack: with a maximum age, an observation stamped
// more than that ahead of the clock (the clock stepped back after it was
// taken) is not served as fresh, by the Store or by the Scraper, until a
// new observation replaces it.
func TestMaxAgeAfterClockStepsBack(t *testing.T) {
	clock := newFakeClock()
	store, err := signals.NewStore(signals.StoreConfig{MaxAge: time.Second, Clock: clock})
	require.NoError(t, err)
	scraper := newScraper(t, signals.Config{Store: store, MaxAge: time.Second, Clock: clock})
	loads := map[string]func() bool{
		"Store.Load":          func() bool { _, ok := store.Load("ep"); return ok },
		"Store.Observation":   func() bool { _, ok := store.Observation("ep"); return ok },
		"Scraper.Load":        func() bool { _, ok := scraper.Load("ep"); return ok },
		"Scraper.Observation": func() bool { _, ok := scraper.Observation("ep"); return ok },
	}
	require.NoError(t, store.Record("ep", llmlb.Load{At: clock.Now(), Running: 3}))

	clock.Advance(-time.Second)
	for name, load := range loads {
		assert.True(t, load(), "%s: exactly MaxAge ahead is still served", name)
	}
	clock.Advance(-time.Nanosecond)
	for name, load := range loads {
		assert.False(t, load(), "%s: more than MaxAge ahead of the clock is not fresh", name)
	}
	clock.Advance(-time.Hour)
	for name, load := range loads {
		assert.False(t, load(), "%s: an hour ahead of the clock is not fresh", name)
	}

	require.NoError(t, store.Record("ep", llmlb.Load{At: clock.Now(), Running: 4}), "a new observation replaces it")
	for name, load := range loads {
		assert.True(t, load(), "%s", name)
	}
}
