package share

import (
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
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

// startServer runs a NATS server on loopback at port (-1 for a random one)
// and returns it; it is shut down when the test ends, if not before.
func startServer(t testing.TB, port int) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second), "NATS server not ready")
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// connect opens a connection that keeps reconnecting quickly.
func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

type key string

func (k key) Key() string { return string(k) }
