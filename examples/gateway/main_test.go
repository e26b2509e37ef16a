package main

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/e2e"
)

// TestDemoFair runs a short -demo-fair over loopback: with the fair queue,
// the light tenant's requests all complete and their median time to first
// token is a clear factor below what it is without the queue, where they
// wait behind the heavy tenant's backlog in the engines. The factor measured
// is 6 to 8; the test asks for 3, so that a busy machine does not fail it.
func TestDemoFair(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the emulated engines in real time for several seconds")
	}
	load := fairDemoLoad // the demo's, with fewer light requests
	load.Light, load.Seed = 8, 1
	if raceEnabled {
		load.Light = 6 // the race detector slows the gateway and the clients
	}
	o := options{
		policy: "default",
		scrape: 100 * time.Millisecond,
		slots:  fairDemoEngine.Engine.MaxRunning,
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	slots := fairDemoEngines * fairDemoEngine.Engine.MaxRunning
	run := func(fair int) fairResult {
		t.Helper()
		o.fairInFlight = fair
		res, err := fairRun(o, load)
		if err != nil {
			t.Fatalf("fair=%d: %v", fair, err)
		}
		t.Logf("fair=%d (%v): heavy %d complete, TTFT p50 %v; light %d/%d complete, TTFT p50 %v p99 %v; light token share %.1f%%",
			fair, res.Elapsed.Round(time.Millisecond), res.Heavy.Count((*e2e.Outcome).Complete), res.Heavy.TTFT(0.5),
			res.Light.Count((*e2e.Outcome).Complete), load.Light, res.Light.TTFT(0.5), res.Light.TTFT(0.99), 100*res.lightShare())
		for i, out := range res.Light.Outcomes {
			if !out.Complete() {
				t.Errorf("fair=%d: light request %d incomplete: status %d, %d/%d tokens, error %v", fair, i, out.Status, out.Got, out.Want, out.Err)
			}
		}
		if res.Heavy.Count((*e2e.Outcome).Complete) == 0 {
			t.Errorf("fair=%d: the heavy tenant completed no request", fair)
		}
		return res
	}
	fifo, fair := run(0), run(slots)
	if t.Failed() {
		return
	}
	if before, after := fifo.Light.TTFT(0.5), fair.Light.TTFT(0.5); 3*after > before {
		t.Errorf("light tenant's TTFT p50: %v with the fair queue, %v without: want at least 3 times lower", after, before)
	}
}
