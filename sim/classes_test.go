package sim

import (
	"context"
	"testing"

	"github.com/llmlb/llmlb/fair"
)

// TestClassesPriority: behind the queue ordering by class, the interactive
// class meets the SLO however much batch traffic overloads the cluster,
// where the queue ignoring classes makes it wait as long as the rest;
// aging bounds the wait of the batch requests admitted, which without it
// wait for as long as more urgent ones keep arriving.
func TestClassesPriority(t *testing.T) {
	sc := ClassesScenario()
	reqs, err := sc.Workload.Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	runs := make(map[string]*Result)
	for _, a := range sc.Admissions {
		if a.Kind == AdmitAll {
			continue
		}
		cfg := sc.Config
		cfg.Seed = 1
		cfg.Admission = a
		res, err := Simulate(context.Background(), cfg, reqs, "default")
		if err != nil {
			t.Fatalf("%s: %v", a.Name, err)
		}
		runs[a.Name] = res
	}
	fifo, prio, noAging := runs["fifo"], runs["priority"], runs["priority-no-aging"]

	fi, pi, ni := tenant(t, fifo, "interactive"), tenant(t, prio, "interactive"), tenant(t, noAging, "interactive")
	if pi.SLOAttainment < 0.99 || ni.SLOAttainment < 0.99 || pi.Refused != 0 {
		t.Errorf("interactive: SLO %.1f%% with priority, %.1f%% without aging, %d refused; want 99%% and none refused",
			100*pi.SLOAttainment, 100*ni.SLOAttainment, pi.Refused)
	}
	if pi.TTFT.P99*5 > fi.TTFT.P99 {
		t.Errorf("interactive: TTFT p99 %.0f ms with priority, %.0f ms with fifo; want a fifth", pi.TTFT.P99, fi.TTFT.P99)
	}
	if fi.Refused == 0 {
		t.Error("fifo: no interactive request refused; the classes are not overloaded")
	}

	pb, nb := tenant(t, prio, "batch"), tenant(t, noAging, "batch")
	if pb.Completed == 0 || pb.TTFT.P99 > 3*fair.DefaultAgingInterval.Seconds()*1000 {
		t.Errorf("batch with aging: %d completed, TTFT p99 %.0f ms; want some, within 3 aging intervals", pb.Completed, pb.TTFT.P99)
	}
	if nb.TTFT.P99 < 3*pb.TTFT.P99 {
		t.Errorf("batch: TTFT p99 %.0f ms without aging, %.0f ms with it; want three times as long", nb.TTFT.P99, pb.TTFT.P99)
	}
	// Aging lifts the whole batch class by its oldest waiter: the standard
	// class, ranked between, pays for it.
	if ps, ns := tenant(t, prio, "standard"), tenant(t, noAging, "standard"); ps.SLOAttainment >= ns.SLOAttainment {
		t.Errorf("standard: SLO %.1f%% with aging, %.1f%% without; want less with aging", 100*ps.SLOAttainment, 100*ns.SLOAttainment)
	}
}
