package gateway

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/retry"
)

// manualClock is a clock that moves only when told to.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// The gateway's ejector reads Config.Retry.Clock, as the retries do: an
// ejection ends when that clock says so.
func TestGatewayEjectorReadsRetryClock(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clk := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	dead := deadURL(t)
	log, _ := newLogger()
	g, err := New([]string{dead, c.URLs[0]}, Config{Logger: log, ScrapeInterval: -1, Policy: llmlb.RoundRobin(),
		Retry: retry.LoopConfig{Clock: clk}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	for i := range 12 {
		if code, body, _ := post(t, g, "hello"); code != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	if ej := g.State().Ejected; len(ej) != 1 || ej[0] != dead {
		t.Fatalf("ejected %v, want [%s]", ej, dead)
	}
	clk.Advance(retry.DefaultBaseEjectionTime + time.Second)
	g.ejector.Sweep()
	if ej := g.State().Ejected; len(ej) != 0 {
		t.Errorf("ejected %v after the ejection's time passed on Config.Retry.Clock", ej)
	}
}
