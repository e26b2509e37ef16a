package sim

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
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
