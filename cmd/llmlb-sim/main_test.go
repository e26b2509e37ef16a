package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunJSON(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-requests", "300", "-replicas", "3", "-policies", "round-robin,p2c,oracle", "-json", "-"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Scenario map[string]any   `json:"scenario"`
		Results  []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if rep.Scenario["name"] != "default" || rep.Scenario["replicas"] != 3.0 {
		t.Errorf("scenario %v", rep.Scenario)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results, want 3", len(rep.Results))
	}
	keys := []string{"policy", "requests", "completed", "ttft_ms", "tpot_ms", "e2e_ms", "slo_attainment",
		"goodput_rps", "prefix_hit_rate", "output_tokens_per_s", "assignment_gap", "preemptions"}
	for _, r := range rep.Results {
		for _, k := range keys {
			if _, ok := r[k]; !ok {
				t.Errorf("result %v lacks %q", r["policy"], k)
			}
		}
		ttft := r["ttft_ms"].(map[string]any)
		for _, k := range []string{"p50", "p95", "p99", "max"} {
			if _, ok := ttft[k]; !ok {
				t.Errorf("ttft_ms lacks %q", k)
			}
		}
		if r["requests"] != 300.0 {
			t.Errorf("requests %v, want 300", r["requests"])
		}
	}
}

func TestRunTableAndSVG(t *testing.T) {
	dir := t.TempDir()
	svg := filepath.Join(dir, "out.svg")
	var out, errb bytes.Buffer
	args := []string{"-scenario", "herding", "-requests", "200", "-svg", svg, "-json", filepath.Join(dir, "out.json")}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, col := range []string{"policy", "TTFT p50", "mean skew", "pile-up", "stale-p2c"} {
		if !strings.Contains(out.String(), col) {
			t.Errorf("table lacks %q:\n%s", col, out.String())
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("TTFT")) {
		t.Errorf("SVG not written (%v)", err)
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 5, "output_length": 1}`+"\nnot json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"-nope"}, "flag provided but not defined"},
		{"unknown policy", []string{"-policies", "p2c,fastest"}, `unknown policy "fastest"`},
		{"unknown scenario", []string{"-scenario", "peak"}, "unknown scenario"},
		{"bad rate scale", []string{"-rate-scale", "0"}, "-rate-scale"},
		{"malformed trace", []string{"-trace", bad}, "line 2"},
		{"missing trace", []string{"-trace", filepath.Join(dir, "none.csv")}, "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), c.args, &out, &errb); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(errb.String(), c.want) {
				t.Errorf("stderr %q lacks %q", errb.String(), c.want)
			}
		})
	}
}

func TestRunSeeds(t *testing.T) {
	runTable := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		args = append([]string{"-requests", "200", "-replicas", "3", "-policies", "p2c,least-tokens"}, args...)
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		return out.String()
	}
	pooled := runTable("-seed", "3", "-seeds", "2", "-json", "-")
	var rep struct {
		Scenario struct {
			Seed, Seeds, Requests int
		} `json:"scenario"`
		Results []struct {
			Policy   string `json:"policy"`
			Requests int    `json:"requests"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(pooled), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, pooled)
	}
	if rep.Scenario.Seed != 3 || rep.Scenario.Seeds != 2 || rep.Scenario.Requests != 200 {
		t.Errorf("scenario %+v, want seed 3, seeds 2, 200 requests per seed", rep.Scenario)
	}
	for _, r := range rep.Results {
		if r.Requests != 400 {
			t.Errorf("%s: %d requests, want 400 over two seeds", r.Policy, r.Requests)
		}
	}
	if table := runTable("-seeds", "2"); !strings.Contains(table, "seeds 1-2 pooled") || !strings.Contains(table, "per seed") {
		t.Errorf("table header does not name the pooled seeds:\n%s", table)
	}
	// One seed is the plain run: the same table with or without -seeds 1.
	if a, b := runTable("-seed", "5"), runTable("-seed", "5", "-seeds", "1"); a != b {
		t.Errorf("-seeds 1 changed the table:\n%s\n%s", a, b)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-seeds", "0"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "-seeds") {
		t.Errorf("-seeds 0: exit %d, stderr %q", code, errb.String())
	}
}
