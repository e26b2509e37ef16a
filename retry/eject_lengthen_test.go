package retry

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"
)

// coolEvent is one call of [Observer.Eject] or [Observer.Cooldown].
type coolEvent struct {
	kind, key string
	d         time.Duration
}

// recordOutEvents returns an Observer that appends every ejection and
// cooldown to *events.
func recordOutEvents(events *[]coolEvent) *Observer {
	return &Observer{
		Eject:    func(k string, d time.Duration) { *events = append(*events, coolEvent{"eject", k, d}) },
		Cooldown: func(k string, d time.Duration) { *events = append(*events, coolEvent{"cooldown", k, d}) },
	}
}

// busy returns a 429 asking for a wait of sec seconds.
func busy(sec int) error {
	return &StatusError{Code: 429, Header: http.Header{"Retry-After": {strconv.Itoa(sec)}}}
}

// TestEjectorCooldownLengthenedIsObserved: a longer wait asked of an
// endpoint cooling down keeps it out until the end of that wait, and the
// Observer is told so (the endpoint is out for the wait from the call); a
// shorter wait changes nothing, and one ending within a second of the
// cooldown's end (a burst of answers asking the same wait) keeps the
// endpoint out until it ends without being reported again.
func TestEjectorCooldownLengthenedIsObserved(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, "a", "b")
	var events []coolEvent
	e, err := NewEjector(b, EjectorConfig{Clock: clk, Observer: recordOutEvents(&events)})
	if err != nil {
		t.Fatal(err)
	}
	e.Report("a", busy(2))
	clk.Advance(time.Second)
	e.Report("a", busy(60)) // answered by an attempt sent before the cooldown
	want := []coolEvent{{"cooldown", "a", 2 * time.Second}, {"cooldown", "a", time.Minute}}
	if !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v: the cooldown was lengthened unseen", events, want)
	}
	if n, next := e.Out(); n != 1 || next != time.Minute {
		t.Fatalf("Out() = %d, %v; want 1, 1m0s", n, next)
	}
	// The same wait asked a moment later, or a shorter one: the endpoint
	// stays out for the later wait, unreported.
	clk.Advance(500 * time.Millisecond)
	e.Report("a", busy(60))
	e.Report("a", busy(30))
	if len(events) != 2 {
		t.Fatalf("events %v after waits ending within a second of the cooldown's end", events)
	}
	if _, next := e.Out(); next != time.Minute {
		t.Fatalf("Out() next %v, want 1m0s: the server's later wait was not kept", next)
	}
	checkEjector(t, e)
	clk.Advance(time.Minute - time.Millisecond)
	e.Sweep()
	if healthy(b, "a") {
		t.Fatal("a back before the end of the longest wait")
	}
	clk.Advance(time.Millisecond)
	e.Sweep()
	if !healthy(b, "a") || len(e.Cooling()) != 0 {
		t.Fatalf("a healthy %v, cooling %v at the end of the longest wait", healthy(b, "a"), e.Cooling())
	}
}

// TestEjectorCooldownAfterEjectionLengthenedIsObserved: the cooldown that
// follows an ejection, lengthened by a longer wait asked while the endpoint
// is still ejected, is reported again with that wait.
func TestEjectorCooldownAfterEjectionLengthenedIsObserved(t *testing.T) {
	clk := newFakeClock()
	b := newBalancer(t, keys(10)...)
	var events []coolEvent
	e, err := NewEjector(b, EjectorConfig{Clock: clk, Observer: recordOutEvents(&events)})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < DefaultConsecutiveFailures; i++ {
		e.Report("e0", &StatusError{Code: 500})
	}
	clk.Advance(10 * time.Second)
	e.Report("e0", busy(60)) // outlasts the ejection by 40 s
	clk.Advance(10 * time.Second)
	e.Report("e0", busy(200)) // outlasts that cooldown
	e.Report("e0", busy(100)) // shorter: nothing
	want := []coolEvent{
		{"eject", "e0", DefaultBaseEjectionTime},
		{"cooldown", "e0", time.Minute},
		{"cooldown", "e0", 200 * time.Second},
	}
	if !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v", events, want)
	}
	checkEjector(t, e)
	clk.Advance(DefaultBaseEjectionTime - 20*time.Second) // the ejection ends
	if got := e.Cooling(); !slices.Equal(got, []string{"e0"}) {
		t.Fatalf("Cooling() = %v after the ejection, want [e0]", got)
	}
	if _, next := e.Out(); next != 190*time.Second {
		t.Fatalf("Out() next %v, want 3m10s: back 200 s after the longer wait was asked", next)
	}
	clk.Advance(190 * time.Second)
	e.Sweep()
	if !healthy(b, "e0") {
		t.Fatal("e0 not back at the end of the longer wait")
	}
	checkEjector(t, e)
}
