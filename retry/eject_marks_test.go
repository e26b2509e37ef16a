package retry

import (
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// TestEjectorKeepsOtherMarks: an endpoint that the program marked unhealthy
// on the balancer before the Ejector ejected or cooled it down stays
// unhealthy when the ejection or cooldown ends, while one that the Ejector
// marked itself is marked healthy again.
func TestEjectorKeepsOtherMarks(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, keys(4)...)
	e, err := NewEjector(b, EjectorConfig{Clock: clk, ConsecutiveFailures: 1, MaxEjectionPercent: 100})
	if err != nil {
		t.Fatal(err)
	}
	// e0 and e1: the program's own health check holds them out.
	for _, k := range []string{"e0", "e1"} {
		if err := b.SetHealthy(k, false); err != nil {
			t.Fatal(err)
		}
	}
	e.Report("e0", errors.New("connection reset"))                                     // ejected for 30 s
	e.Report("e1", &StatusError{Code: 429, Header: http.Header{"Retry-After": {"2"}}}) // cooling for 2 s
	e.Report("e2", errors.New("connection reset"))                                     // marked by the ejector
	if got := e.Ejected(); !slices.Equal(got, []string{"e0", "e2"}) {
		t.Fatalf("Ejected() = %v, want [e0 e2]", got)
	}
	if got := e.Cooling(); !slices.Equal(got, []string{"e1"}) {
		t.Fatalf("Cooling() = %v, want [e1]", got)
	}
	clk.Advance(2 * time.Second)
	e.Sweep()
	if healthy(b, "e1") {
		t.Fatal("the end of a cooldown marked healthy an endpoint the program held out")
	}
	clk.Advance(28 * time.Second)
	e.Sweep()
	if healthy(b, "e0") {
		t.Fatal("the end of an ejection marked healthy an endpoint the program held out")
	}
	if !healthy(b, "e2") {
		t.Fatal("the end of an ejection did not restore the endpoint the ejector marked")
	}
	// The Ejector's own state moves on as usual: e0 is half-open, and its
	// next failure ejects it for twice as long.
	e.Report("e0", errors.New("connection reset"))
	if got, _ := e.Out(); got != 1 {
		t.Fatalf("Out() = %d, want e0 ejected again", got)
	}
	if _, next := e.Out(); next != 60*time.Second {
		t.Fatalf("second ejection of e0 lasts %v, want 60s", next)
	}
}

// markLog is a Health that combines the Ejector's marks with others of its
// own, as a program with several health sources does (package gateway's
// health): it records every mark the Ejector makes.
type markLog struct {
	b     *llmlb.Balancer
	marks []string
}

func (m *markLog) SetHealthy(key string, healthy bool) error {
	if healthy {
		m.marks = append(m.marks, "+"+key)
	} else {
		m.marks = append(m.marks, "-"+key)
	}
	return nil
}

func (m *markLog) Stats() []llmlb.EndpointStats { return m.b.Stats() }

// TestEjectorMarksCombiningHealth: a Health other than an *llmlb.Balancer
// is told of every ejection and cooldown and of every end, whatever the
// balancer's mark, since it keeps the Ejector's mark apart from the others.
func TestEjectorMarksCombiningHealth(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	if err := b.SetHealthy("a", false); err != nil {
		t.Fatal(err)
	}
	h := &markLog{b: b}
	e, _ := NewEjector(h, EjectorConfig{Clock: clk, ConsecutiveFailures: 1})
	e.Report("a", errors.New("reset"))
	e.Report("b", &StatusError{Code: 503, Header: http.Header{"Retry-After": {"1"}}})
	clk.Advance(30 * time.Second)
	e.Sweep()
	if want := []string{"-a", "-b", "+b", "+a"}; !slices.Equal(h.marks, want) {
		t.Fatalf("marks %v, want %v", h.marks, want)
	}
}
