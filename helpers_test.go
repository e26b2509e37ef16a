package llmlb

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

// testEP is an endpoint with an optional weight.
type testEP struct {
	key    string
	weight float64
}

func (e testEP) Key() string { return e.key }

type weightedEP struct{ testEP }

func (e weightedEP) Weight() float64 { return e.weight }

func eps(n int) []Endpoint {
	out := make([]Endpoint, n)
	for i := range out {
		out[i] = testEP{key: "ep" + strconv.Itoa(i)}
	}
	return out
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeSignal serves settable observations.
type fakeSignal struct {
	mu  sync.Mutex
	obs map[string]Load
}

func (s *fakeSignal) Load(key string) (Load, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.obs[key]
	return l, ok
}

func (s *fakeSignal) Set(key string, l Load) {
	s.mu.Lock()
	if s.obs == nil {
		s.obs = map[string]Load{}
	}
	s.obs[key] = l
	s.mu.Unlock()
}

// probe is a policy that records what it saw and picks a fixed key (or the
// first candidate).
type probe struct {
	pick    string
	loads   map[string]EndpointLoad
	weights map[string]float64
	keys    []string
}

func (p *probe) Choose(c *Candidates) int {
	p.loads = map[string]EndpointLoad{}
	p.weights = map[string]float64{}
	p.keys = p.keys[:0]
	chosen := 0
	for i := 0; i < c.Len(); i++ {
		k := c.Key(i)
		p.keys = append(p.keys, k)
		p.loads[k] = c.Load(i)
		p.weights[k] = c.Weight(i)
		if k == p.pick {
			chosen = i
		}
	}
	return chosen
}

func mustNew(t testing.TB, p Policy, opts ...Option) *Balancer {
	t.Helper()
	opts = append([]Option{WithRand(rand.NewPCG(1, 2))}, opts...)
	b, err := New(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustUpdate(t testing.TB, b *Balancer, e []Endpoint) {
	t.Helper()
	if err := b.Update(e); err != nil {
		t.Fatal(err)
	}
}

func statsByKey(b *Balancer) map[string]EndpointStats {
	m := map[string]EndpointStats{}
	for _, s := range b.Stats() {
		m[s.Key] = s
	}
	return m
}
