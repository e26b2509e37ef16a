package share

import (
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/natstest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(zmq4PubWriter))
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// signalMap is an llmlb.Signal over a map, safe for concurrent use.
type signalMap struct {
	mu sync.Mutex
	m  map[string]llmlb.Load
}

func (s *signalMap) Load(key string) (llmlb.Load, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.m[key]
	return l, ok
}

func (s *signalMap) Set(key string, l llmlb.Load) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]llmlb.Load{}
	}
	s.m[key] = l
}

// startServer and connect start a NATS server and connect to it for the
// test (package natstest).
var (
	startServer = natstest.Start
	connect     = natstest.Connect
)

type key string

func (k key) Key() string { return string(k) }
