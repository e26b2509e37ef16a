package sim

import (
	"context"
	"testing"
)

// TestClassesPriority: behind the queue ordering by class, the interactive
// class meets the SLO however much batch traffic overloads the cluster,
// where the queue ignoring classes makes it wait as long as the rest; and
// aging, which lends the batch class one admission per interval, does not
// give it the standard class's place under sustained overload.
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

	if pb := tenant(t, prio, "batch"); pb.Completed == 0 {
		t.Error("batch with aging: none completed")
	}
	ps, ns := tenant(t, prio, "standard"), tenant(t, noAging, "standard")
	if ps.SLOAttainment < ns.SLOAttainment-0.03 || ps.Refused > ns.Refused+ns.Refused/10+10 {
		t.Errorf("standard: SLO %.1f%% and %d refused with aging, %.1f%% and %d without; want about the same",
			100*ps.SLOAttainment, ps.Refused, 100*ns.SLOAttainment, ns.Refused)
	}
}
