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
