package signals_test

import (
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
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

// switchServer is an httptest server whose handler can be replaced between
// requests.
type switchServer struct {
	*httptest.Server
	h    atomic.Pointer[http.Handler]
	hits atomic.Int64
}

func newSwitchServer(t testing.TB, h http.Handler) *switchServer {
	s := &switchServer{}
	s.Set(h)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		(*s.h.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *switchServer) Set(h http.Handler) { s.h.Store(&h) }

// serve returns a handler that answers with body and content type.
func serve(contentType string, body []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		_, _ = w.Write(body)
	})
}

func nan() float64 { return math.NaN() }

func randSource(seed uint64) rand.Source { return rand.NewPCG(seed, seed) }
