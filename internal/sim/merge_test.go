package sim

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

// mergeRuns simulates policy on a small synthetic workload under each seed.
func mergeRuns(t *testing.T, policy string, seeds ...uint64) []*Result {
	t.Helper()
	var out []*Result
	for _, seed := range seeds {
		reqs, err := DefaultSynthetic(400, 30).Generate(seed)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Simulate(context.Background(), Config{Replicas: 3, Seed: seed}, reqs, policy)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// withoutRaw returns a copy of r without its per-run data, for comparing the
// exported fields.
func withoutRaw(r *Result) Result {
	c := *r
	c.raw = nil
	return c
}

func TestMergeOneIsIdentity(t *testing.T) {
	r := mergeRuns(t, "p2c", 1)[0]
	m, err := Merge(r)
	if err != nil {
		t.Fatal(err)
	}
	got, want := withoutRaw(m), withoutRaw(r)
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) || !slices.Equal(got.TTFTs, want.TTFTs) || len(got.Series) != len(want.Series) {
		t.Errorf("Merge of one result differs from it:\n got %s\nwant %s", gotJSON, wantJSON)
	}
}

func TestMergePools(t *testing.T) {
	rs := mergeRuns(t, "least-tokens", 1, 2, 3)
	m, err := Merge(rs...)
	if err != nil {
		t.Fatal(err)
	}
	var all []float64
	requests, good, gap := 0, 0.0, 0
	window, span := 0.0, 0.0
	for _, r := range rs {
		all = append(all, r.TTFTs...)
		requests += r.Requests
		good += r.SLOAttainment * float64(r.Requests)
		window += r.SLOAttainment * float64(r.Requests) / r.GoodputRPS
		span += r.SpanSeconds
		gap = max(gap, r.AssignmentGap)
	}
	slices.Sort(all)
	if m.Requests != requests || m.Completed != len(all) || !slices.Equal(m.TTFTs, all) {
		t.Fatalf("requests %d completed %d, want %d and %d", m.Requests, m.Completed, requests, len(all))
	}
	if want := quantile(all, .99); m.TTFT.P99 != want {
		t.Errorf("TTFT p99 %v, want the pooled %v", m.TTFT.P99, want)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
	if !near(m.SLOAttainment, good/float64(requests)) {
		t.Errorf("SLO attainment %v, want %v", m.SLOAttainment, good/float64(requests))
	}
	if !near(m.GoodputRPS, good/window) {
		t.Errorf("goodput %v, want %v over the summed windows", m.GoodputRPS, good/window)
	}
	if !near(m.SpanSeconds, span) || m.AssignmentGap != gap {
		t.Errorf("span %v gap %d, want %v and %d", m.SpanSeconds, m.AssignmentGap, span, gap)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		lo, hi = min(lo, r.PrefixHitRate), max(hi, r.PrefixHitRate)
	}
	if m.PrefixHitRate < lo || m.PrefixHitRate > hi {
		t.Errorf("hit rate %v outside the runs' [%v, %v]", m.PrefixHitRate, lo, hi)
	}
	// Merging is associative: pooling a pooled result with another run
	// gives the same as pooling all three at once.
	ab, _ := Merge(rs[0], rs[1])
	abc, err := Merge(ab, rs[2])
	if err != nil {
		t.Fatal(err)
	}
	x, _ := json.Marshal(withoutRaw(abc))
	y, _ := json.Marshal(withoutRaw(m))
	if string(x) != string(y) {
		t.Errorf("Merge(Merge(a, b), c) = %s\nMerge(a, b, c) = %s", x, y)
	}
}

func TestMergeErrors(t *testing.T) {
	rs := mergeRuns(t, "p2c", 1)
	other := mergeRuns(t, "round-robin", 1)
	var decoded Result
	b, _ := json.Marshal(rs[0])
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string][]*Result{
		"none":     nil,
		"nil":      {rs[0], nil},
		"policies": {rs[0], other[0]},
		"decoded":  {rs[0], &decoded},
	} {
		if _, err := Merge(in...); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
}

// Missed counts the requests outside the SLO, unfinished and rejected ones
// included, and Merge sums it.
func TestMissed(t *testing.T) {
	var rs []*Result
	for _, seed := range []uint64{1, 2} {
		reqs, err := DefaultSynthetic(300, 300).Generate(seed)
		if err != nil {
			t.Fatal(err)
		}
		// One replica with a tight TTFT objective: most requests miss.
		cfg := Config{Replicas: 1, Seed: seed, SLO: SLO{TTFT: 100 * time.Millisecond, TPOT: time.Second}}
		r, err := Simulate(context.Background(), cfg, reqs, "round-robin")
		if err != nil {
			t.Fatal(err)
		}
		good := int(math.Round(r.SLOAttainment * float64(r.Requests)))
		if r.Missed != r.Requests-good || r.Missed == 0 || r.Missed == r.Requests {
			t.Errorf("seed %d: missed %d of %d with %d within the SLO; want some, not all", seed, r.Missed, r.Requests, good)
		}
		rs = append(rs, r)
	}
	m, err := Merge(rs...)
	if err != nil {
		t.Fatal(err)
	}
	if m.Missed != rs[0].Missed+rs[1].Missed {
		t.Errorf("merged missed %d, want %d + %d", m.Missed, rs[0].Missed, rs[1].Missed)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var decoded map[string]any
	if err := json.Unmarshal(b, &decoded); err != nil || decoded["missed"] != float64(m.Missed) {
		t.Errorf("JSON %s: missed %v, want %d (%v)", b, decoded["missed"], m.Missed, err)
	}
}
