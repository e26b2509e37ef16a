package grpclb_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/resolver"

	"github.com/llmlb/llmlb"
)

// TestProgramMarkBeforeResolved: an endpoint the program marks unhealthy
// with Builder.SetHealthy before the resolver lists it joins unhealthy when
// the resolver adds it, and is not picked; the mark outlasts the resolver
// dropping and listing the endpoint again; marked healthy, it is picked.
func TestProgramMarkBeforeResolved(t *testing.T) {
	a, b := startServer(t, -1, false), startServer(t, -1, false)
	client, r, lb := dial(t, testName, `{"policy": "round-robin"}`, b)
	waitReady(t, lb, 1)
	if err := testBuilder.SetHealthy(lb(), a.addr, false); err != nil {
		t.Fatalf("SetHealthy of an endpoint the resolver does not list yet: %v", err)
	}
	check := func(when string) {
		t.Helper()
		r.UpdateState(resolver.State{Endpoints: endpoints(a, b)})
		eventually(t, "a a member", func() bool { _, ok := stats(lb(), a.addr); return ok })
		if s, _ := stats(lb(), a.addr); s.Healthy {
			t.Errorf("%s: the endpoint the program marked unhealthy joined healthy", when)
		}
		before := a.calls.Load()
		calls(t, client, 10)
		if n := a.calls.Load() - before; n != 0 {
			t.Errorf("%s: the endpoint the program marked unhealthy got %d of 10 calls", when, n)
		}
	}
	check("added by the resolver")

	r.UpdateState(resolver.State{Endpoints: endpoints(b)})
	eventually(t, "a dropped", func() bool { _, ok := stats(lb(), a.addr); return !ok })
	check("dropped and added again")

	if err := testBuilder.SetHealthy(lb(), a.addr, true); err != nil {
		t.Fatal(err)
	}
	before := a.calls.Load()
	calls(t, client, 10)
	if n := a.calls.Load() - before; n != 5 {
		t.Errorf("marked healthy, the endpoint got %d of 10 calls, want 5", n)
	}

	// Marked unhealthy and healthy again before it is listed, it joins
	// healthy.
	c := startServer(t, -1, false)
	for _, healthy := range []bool{false, true} {
		if err := testBuilder.SetHealthy(lb(), c.addr, healthy); err != nil {
			t.Fatal(err)
		}
	}
	r.UpdateState(resolver.State{Endpoints: endpoints(a, b, c)})
	waitReady(t, lb, 3)

	if err := testBuilder.SetHealthy(lb(), "", false); !errors.Is(err, llmlb.ErrUnknownEndpoint) {
		t.Errorf("SetHealthy of the empty key: %v, want llmlb.ErrUnknownEndpoint", err)
	}
	long := strings.Repeat("x", 1025)
	if err := testBuilder.SetHealthy(lb(), long, false); !errors.Is(err, llmlb.ErrUnknownEndpoint) {
		t.Errorf("SetHealthy of a 1025-byte key no resolver lists: %v, want llmlb.ErrUnknownEndpoint", err)
	}
}
