package gateway

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/spill"
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

// The tiers of SpillTo cool down on Config.Retry.Clock too: a next tier
// that asked for a wait takes requests again when that clock says its wait
// is over.
func TestGatewaySpillReadsRetryClock(t *testing.T) {
	clk := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var calls atomic.Int32
	provider := spill.Tier{Name: "paygo", Transport: tierFunc(func(r *http.Request) (*http.Response, error) {
		h := http.Header{"Content-Type": {"application/json"}}
		if calls.Add(1) == 1 {
			h.Set("Retry-After", "10")
			return &http.Response{StatusCode: http.StatusTooManyRequests, Header: h, Request: r,
				Body: io.NopCloser(strings.NewReader(`{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`))}, nil
		}
		return &http.Response{StatusCode: http.StatusOK, Header: h, Request: r, Body: io.NopCloser(strings.NewReader(`{}`))}, nil
	})}
	log, _ := newLogger()
	g, err := New([]string{deadURL(t)}, Config{Logger: log, ScrapeInterval: -1,
		Retry: retry.LoopConfig{MaxAttempts: 1, Clock: clk}, SpillTo: []spill.Tier{provider}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	if code, body, _ := post(t, g, "hello"); code != http.StatusTooManyRequests {
		t.Fatalf("first request: %d %q, want the provider's 429", code, body)
	}
	clk.Advance(11 * time.Second)
	if code, body, _ := post(t, g, "hello"); code != http.StatusOK {
		t.Fatalf("after the provider's wait on Config.Retry.Clock: %d %q, want 200", code, body)
	}
}
