package llmlb

// Endpoints that leave the membership and come back while an engine
// observation that counted this balancer's requests is still fresh.

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// An endpoint that leaves with requests in flight and comes back before
// the observation that counted them expires must be estimated as if it had
// stayed: the observation's requests that finished meanwhile (while it was
// out, or before it left) are taken from it, and those still in flight
// count once.
func TestRejoinBeforeObservationExpires(t *testing.T) {
	for _, tc := range []struct {
		name     string
		streamed bool // the requests streamed before the observation
		before   int  // of the 3 observed requests, those done before ep0 leaves
		while    int  // and while it is out; the rest finish after it is back
		update   bool // another Update while ep0 is out
	}{
		{name: "running", streamed: true, while: 3},
		{name: "waiting", while: 3},
		{name: "before leaving", streamed: true, before: 3},
		{name: "some each", streamed: true, before: 1, while: 1},
		{name: "still in flight", while: 1},
		{name: "another update", streamed: true, before: 1, while: 2, update: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			sig := &fakeSignal{}
			p := &probe{pick: "ep0"}
			b := mustNew(t, p, WithClock(clock), WithSignal(sig, 10*time.Second))
			mustUpdate(t, b, eps(3))
			ctx := context.Background()
			var picks []Pick
			for range 3 {
				pk, err := b.Pick(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if tc.streamed {
					pk.FirstToken()
				}
				picks = append(picks, pk)
			}
			clock.Advance(time.Second)
			obs := Load{At: clock.Now(), KVUsage: 0.5}
			if tc.streamed {
				obs.Running = 3
			} else {
				obs.Waiting = 3
			}
			sig.Set("ep0", obs)
			done := func(n int) {
				for range n {
					picks[0].Done(nil)
					picks = picks[1:]
				}
			}
			done(tc.before)
			mustUpdate(t, b, eps(3)[1:]) // ep0 leaves
			clock.Advance(time.Second)
			done(tc.while)
			if tc.update {
				mustUpdate(t, b, eps(3)[2:])
			}
			// Nothing but the balancer refers to ep0's accounting now,
			// unless requests are still in flight.
			runtime.GC()
			runtime.GC()
			mustUpdate(t, b, eps(3)) // ep0 is back, its observation 2s old
			clock.Advance(time.Second)

			p.pick = "ep1"
			pk, err := b.Pick(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer pk.Done(nil)
			l := p.loads["ep0"]
			if !l.Fresh {
				t.Fatalf("ep0's observation is not fresh: %+v", l)
			}
			left := int64(len(picks))
			wantWaiting := left
			if tc.streamed {
				wantWaiting = 0
			}
			if l.Requests != left || l.Waiting != wantWaiting || l.Outstanding != left {
				t.Errorf("ep0 back with %d of its 3 observed requests in flight: Requests %d, Waiting %d, Outstanding %d; want %d, %d, %d",
					left, l.Requests, l.Waiting, l.Outstanding, left, wantWaiting, left)
			}
			done(len(picks))
			if s := statsByKey(b)["ep0"]; s.Outstanding != 0 {
				t.Errorf("ep0 Outstanding %d after every Done, want 0", s.Outstanding)
			}
		})
	}
}

// Once the observation that counted the requests has expired, or a newer
// one replaced it, a departed endpoint's accounting no longer matters: the
// balancer forgets it, and the endpoint comes back afresh, estimated from
// the newer observation alone.
func TestRejoinAfterObservationExpires(t *testing.T) {
	for _, newer := range []bool{false, true} {
		clock := newFakeClock()
		sig := &fakeSignal{}
		p := &probe{pick: "ep0"}
		b := mustNew(t, p, WithClock(clock), WithSignal(sig, 10*time.Second))
		mustUpdate(t, b, eps(2))
		ctx := context.Background()
		pk, err := b.Pick(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.FirstToken()
		clock.Advance(time.Second)
		sig.Set("ep0", Load{At: clock.Now(), Running: 5, KVUsage: 0.5})
		pk.Done(nil)
		mustUpdate(t, b, eps(2)[1:])
		if len(b.departed) != 1 {
			t.Fatalf("%d departed endpoints remembered, want 1", len(b.departed))
		}
		clock.Advance(11 * time.Second)
		running := 0 // the observation has expired
		if newer {
			running = 4
			sig.Set("ep0", Load{At: clock.Now(), Running: running, KVUsage: 0.5})
		}
		mustUpdate(t, b, eps(2)[1:])
		if len(b.departed) != 0 {
			t.Errorf("newer %v: %d departed endpoints remembered after the observation expired, want 0", newer, len(b.departed))
		}
		mustUpdate(t, b, eps(2))
		p.pick = "ep1"
		pk, err = b.Pick(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(nil)
		if l := p.loads["ep0"]; l.Fresh != newer || l.Requests != int64(running) {
			t.Errorf("newer %v: ep0 fresh %v with Requests %d, want %v and %d", newer, l.Fresh, l.Requests, newer, running)
		}
	}
}
