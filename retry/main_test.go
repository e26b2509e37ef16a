package retry

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type ep string

func (e ep) Key() string { return string(e) }

// newBalancer returns a round-robin balancer with a seeded source over keys.
func newBalancer(t testing.TB, keys ...string) *llmlb.Balancer {
	t.Helper()
	return newBalancerWith(t, llmlb.RoundRobin(), keys...)
}

func newBalancerWith(t testing.TB, p llmlb.Policy, keys ...string) *llmlb.Balancer {
	t.Helper()
	return newBalancerOpts(t, p, nil, keys...)
}

// newBalancerOpts is newBalancerWith with more options.
func newBalancerOpts(t testing.TB, p llmlb.Policy, opts []llmlb.Option, keys ...string) *llmlb.Balancer {
	t.Helper()
	b, err := llmlb.New(p, append([]llmlb.Option{llmlb.WithRand(rand.NewPCG(1, 2))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	eps := make([]llmlb.Endpoint, len(keys))
	for i, k := range keys {
		eps[i] = ep(k)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	return b
}

// assertIdle fails the test unless b has endpoints and every endpoint's
// accounting is zero.
func assertIdle(t testing.TB, b *llmlb.Balancer) {
	t.Helper()
	stats := b.Stats()
	if len(stats) == 0 {
		t.Error("the balancer has no endpoints to check")
	}
	for _, s := range stats {
		if s.Outstanding != 0 || s.Queued != 0 || s.PrefillTokens != 0 || s.DecodeTokens != 0 {
			t.Errorf("endpoint %s not idle: %+v", s.Key, s)
		}
	}
}

// noBackoff never waits.
type noBackoff struct{}

func (noBackoff) Backoff(int, time.Duration) time.Duration { return 0 }

func nan() float64 { return math.NaN() }
func inf() float64 { return math.Inf(1) }
