package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/sim"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunJSON(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-requests", "300", "-replicas", "3", "-policies", "round-robin,p2c,full-info", "-json", "-"}
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
	checkResults(t, rep.Results)
	for _, r := range rep.Results {
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

// resultKeys are the keys of a result in the JSON output, all of them.
var resultKeys = []string{"policy", "requests", "completed", "rejected", "ttft_ms", "tpot_ms", "e2e_ms",
	"slo_attainment", "missed", "goodput_rps", "prefix_hit_rate", "output_tokens_per_s", "assignment_gap",
	"preemptions", "peak_skew", "mean_skew", "pileup_share", "span_s"}

// checkResults checks that every result of the JSON output has exactly
// resultKeys, and that missed counts the requests outside the SLO.
func checkResults(t *testing.T, results []map[string]any) {
	t.Helper()
	for _, r := range results {
		if len(r) != len(resultKeys) {
			t.Errorf("result %v has %d keys, want %d: %v", r["policy"], len(r), len(resultKeys), r)
		}
		for _, k := range resultKeys {
			if _, ok := r[k]; !ok {
				t.Errorf("result %v lacks %q", r["policy"], k)
			}
		}
		requests, _ := r["requests"].(float64)
		slo, _ := r["slo_attainment"].(float64)
		if want := requests - math.Round(slo*requests); r["missed"] != want {
			t.Errorf("result %v: missed %v, want %v", r["policy"], r["missed"], want)
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

// -svg - writes the SVG document alone to standard output, without the
// table before it, as -json - does its JSON.
func TestRunSVGToStdout(t *testing.T) {
	for _, args := range [][]string{{"-svg", "-"}, {"-svg", "-", "-sweep", "0.5,1"}} {
		var out, errb bytes.Buffer
		args = append([]string{"-requests", "100", "-replicas", "2", "-policies", "p2c"}, args...)
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		if !bytes.HasPrefix(out.Bytes(), []byte("<?xml")) {
			t.Errorf("%v: stdout does not start with the SVG document:\n%.200s", args, out.String())
		}
		if err := xmlDocument(&out); err != nil {
			t.Errorf("%v: stdout is not one XML document: %v", args, err)
		}
	}
}

// A trace whose file name is not valid UTF-8 still gives an SVG that is one
// XML document: the name in its title is made valid.
func TestRunSVGOfOddTraceName(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "x\xff.jsonl")
	line := `{"timestamp": 0, "input_length": 50, "output_length": 5}` + "\n"
	if err := os.WriteFile(trace, []byte(strings.Repeat(line, 20)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-trace", trace, "-policies", "round-robin,p2c", "-svg", "-"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if err := xmlDocument(&out); err != nil {
		t.Fatalf("stdout is not one XML document: %v", err)
	}
}

// xmlDocument reads r to its end as XML and returns the first error.
func xmlDocument(r io.Reader) error {
	dec := xml.NewDecoder(r)
	for {
		if _, err := dec.Token(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 5, "output_length": 1}`+"\nnot json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.jsonl")
	if err := os.WriteFile(good, []byte(`{"timestamp": 0, "input_length": 5, "output_length": 1}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, "long.jsonl")
	if err := os.WriteFile(long, []byte(`{"timestamp": 0, "input_length": 5, "output_length": 1}`+"\n"+
		`{"timestamp": 1, "input_length": 5, "output_length": 16777216}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Fine at its own rate, but a rate scale of 1e-300 spreads its second
	// arrival over 1e300 s.
	spread := filepath.Join(dir, "spread.jsonl")
	if err := os.WriteFile(spread, []byte(`{"timestamp": 0, "input_length": 5, "output_length": 1}`+"\n"+
		`{"timestamp": 1000, "input_length": 5, "output_length": 1}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	same := filepath.Join(dir, "out.json")
	missing := filepath.Join(dir, "missing", "out.json")
	cases := []struct {
		name    string
		args    []string
		want    string
		notWant string // if set, stderr must not hold it
	}{
		{"unknown flag", []string{"-nope"}, "flag provided but not defined", ""},
		{"unknown policy", []string{"-policies", "p2c,fastest"}, `-policies: unknown policy "fastest"`, ""},
		{"unknown scenario", []string{"-scenario", "peak"}, `-scenario: unknown scenario "peak" (known: default, prefixes, herding, slots, mixed, mixed-slowdown, agentic, rag, diurnal, tenants, classes, routes, lora, pd, pd-long, providers, spill, spill-queue8)`, ""},
		{"bad rate scale", []string{"-rate-scale", "0"}, "-rate-scale", ""},
		{"infinite rate scale", []string{"-rate-scale", "Inf"}, "-rate-scale +Inf must be a positive finite number", ""},
		{"NaN rate scale", []string{"-rate-scale", "NaN"}, "-rate-scale NaN must be a positive finite number", ""},
		{"negative replicas", []string{"-replicas", "-1"}, "-replicas -1 must not be negative", "-routers"},
		{"negative routers", []string{"-routers", "-2"}, "-routers -2 must not be negative", "-replicas"},
		{"negative requests", []string{"-requests", "-3"}, "-requests -3 must not be negative", "-replicas"},
		{"negative scrape", []string{"-scrape", "-1s"}, "-scrape -1s must not be negative", "-replicas"},
		{"negative kv blocks", []string{"-kv-blocks", "-4"}, "-kv-blocks -4 must not be negative", "-replicas"},
		{"too many replicas", []string{"-replicas", "4097"}, "-replicas 4097 exceeds the simulator's limit of 4096", ""},
		{"too many routers", []string{"-routers", "1025"}, "-routers 1025 exceeds the simulator's limit of 1024", ""},
		{"too many requests", []string{"-requests", "10000001"}, "-requests 10000001 exceeds the simulator's limit of 10000000", ""},
		{"too many seeds", []string{"-seeds", "1001"}, "-seeds 1001 out of range [1, 1000]", ""},
		{"no seeds", []string{"-seeds", "0"}, "-seeds 0 out of range [1, 1000]", ""},
		{"zero TTFT SLO", []string{"-slo-ttft", "0"}, "-slo-ttft 0s must be positive", ""},
		{"negative TTFT SLO", []string{"-slo-ttft", "-1s"}, "-slo-ttft -1s must be positive", ""},
		{"zero TPOT SLO", []string{"-slo-tpot", "0"}, "-slo-tpot 0s must be positive", ""},
		{"negative TPOT SLO", []string{"-slo-tpot", "-5ms"}, "-slo-tpot -5ms must be positive", ""},
		{"seed overflow", []string{"-seed", "18446744073709551615", "-seeds", "2"}, "-seed 18446744073709551615 with -seeds 2 overflows", ""},
		{"format without trace", []string{"-format", "azure"}, "-format needs -trace", ""},
		{"unknown format", []string{"-format", "csv", "-trace", good}, `-format "csv": want mooncake or azure`, ""},
		{"malformed trace", []string{"-trace", bad}, "line 2", ""},
		{"output too long", []string{"-trace", long}, "line 2: output_length 16777216 out of range [0, 1048576]", ""},
		{"missing trace", []string{"-trace", filepath.Join(dir, "none.csv")}, "no such file", ""},
		{"directory trace", []string{"-trace", dir}, "-trace " + dir + " is a directory", "malformed"},
		{"json in missing directory", []string{"-json", missing}, "-json: open " + missing, ""},
		{"svg in missing directory", []string{"-svg", missing}, "-svg: open " + missing, ""},
		{"json and svg alike", []string{"-json", same, "-svg", same}, "-json and -svg both name " + same, ""},
		{"json and svg both to stdout", []string{"-json", "-", "-svg", "-"}, "-json - and -svg - both write to standard output: send one to a file", ""},
		{"TTFT SLO without a unit", []string{"-slo-ttft", "2"}, `llmlb-sim: invalid -slo-ttft "2": a duration needs a unit, such as 2s or 500ms` + "\n", "invalid value"},
		{"TPOT SLO without a unit", []string{"-slo-tpot", "0.05"}, `invalid -slo-tpot "0.05": a duration needs a unit, such as 2s or 500ms`, "parse error"},
		{"scrape without a unit", []string{"-scrape", "1"}, `invalid -scrape "1": a duration needs a unit, such as 2s or 500ms`, "Usage"},
		{"scrape not a duration", []string{"-scrape", "soon"}, `invalid -scrape "soon": want a duration, such as 2s or 500ms`, "parse error"},
		{"sweep not increasing", []string{"-sweep", "1,0.5"}, `-sweep "1,0.5": rate scales must increase, but 0.5 follows 1`, ""},
		{"sweep repeated", []string{"-sweep", "1,1"}, `-sweep "1,1": rate scales must increase, but 1 follows 1`, ""},
		{"sweep zero", []string{"-sweep", "0,1"}, `-sweep "0,1": rate scale 0 must be a positive finite number`, ""},
		{"sweep negative", []string{"-sweep", "-1"}, `-sweep "-1": rate scale -1 must be a positive finite number`, ""},
		{"sweep infinite", []string{"-sweep", "1,+Inf"}, `rate scale +Inf must be a positive finite number`, ""},
		{"sweep NaN", []string{"-sweep", "NaN"}, `rate scale NaN must be a positive finite number`, ""},
		{"sweep beyond a float64", []string{"-sweep", "1,1e309"}, `-sweep "1,1e309": rate scale 1e309 out of range: want a positive finite number`, ""},
		{"sweep not a number", []string{"-sweep", "1,2x"}, `-sweep "1,2x": rate scale "2x" is not a number`, ""},
		{"sweep empty item", []string{"-sweep", "1,,2"}, `-sweep "1,,2": want comma-separated rate scales`, ""},
		{"sweep empty", []string{"-sweep", ""}, `-sweep "": want comma-separated rate scales`, ""},
		{"sweep too long", []string{"-sweep", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21"}, "21 rate scales, at most 20", ""},
		{"sweep and rate scale", []string{"-sweep", "1,2", "-rate-scale", "2"}, "-sweep and -rate-scale both set the rate scale", ""},
		{"json to stdout and wide", []string{"-json", "-", "-wide"}, "-wide widens the results table, which -json - replaces", ""},
		{"svg to stdout and wide", []string{"-svg", "-", "-wide"}, "-wide widens the results table, which -svg - replaces", ""},
		{"sweep and wide", []string{"-sweep", "1,2", "-wide"}, "-wide widens the results table, which -sweep does not print", ""},
		{"share with the scenario's one router", []string{"-share", "100ms"}, "-share needs -routers 2 or more to share between; the default scenario has 1 router", ""},
		{"share with one router", []string{"-routers", "1", "-share", "100ms"}, "-share needs -routers 2 or more to share between, not 1", ""},
		{"stagger with the scenario's one router", []string{"-stagger"}, "-stagger needs -routers 2 or more to stagger; the default scenario has 1 router", ""},
		{"stagger with one router", []string{"-routers", "1", "-stagger"}, "-stagger needs -routers 2 or more to stagger, not 1", ""},
		{"zero share", []string{"-routers", "2", "-share", "0s"}, "-share 0s must be from 1ms to 1m", ""},
		{"negative share", []string{"-routers", "2", "-share", "-5ms"}, "-share -5ms must be from 1ms to 1m", ""},
		{"share too long", []string{"-routers", "2", "-share", "2m"}, "-share 2m0s must be from 1ms to 1m", ""},
		{"share without a unit", []string{"-routers", "2", "-share", "100"}, `invalid -share "100": a duration needs a unit`, ""},
		{"admission without tenants", []string{"-admission", "vtc"}, `-admission "vtc": the default scenario defines no admission controls (the tenants and classes scenarios do)`, ""},
		{"unknown admission", []string{"-scenario", "tenants", "-admission", "none,fifo"}, `-admission: unknown admission control "fifo" (the tenants scenario defines none, rate, vtc)`, ""},
		{"unknown classes admission", []string{"-scenario", "classes", "-admission", "vtc"}, `-admission: unknown admission control "vtc" (the classes scenario defines none, fifo, priority, priority-no-aging)`, ""},
		{"admission repeated", []string{"-scenario", "tenants", "-admission", "vtc,vtc"}, `-admission "vtc,vtc" lists vtc twice`, ""},
		{"admission empty item", []string{"-scenario", "tenants", "-admission", "none,"}, `-admission "none,": want comma-separated names from none, rate, vtc`, ""},
		{"sweep over admissions", []string{"-scenario", "tenants", "-sweep", "1,2"}, "-sweep compares policies under one admission control, and the tenants scenario compares 3: choose one with -admission", ""},
		{"unknown outputs", []string{"-outputs", "allowance,oracle"}, `-outputs: unknown knowledge of output lengths "oracle" (known: allowance, predict, true)`, ""},
		{"outputs repeated", []string{"-outputs", "true,true"}, `-outputs "true,true" lists true twice`, ""},
		{"outputs empty item", []string{"-outputs", "predict,"}, `-outputs "predict,": want comma-separated names from allowance, predict, true`, ""},
		{"outputs empty", []string{"-outputs", ""}, `-outputs "": want comma-separated names`, ""},
		{"sweep over the pd scenario's splits", []string{"-scenario", "pd", "-replicas", "8", "-policies", "default,pd-default", "-sweep", "1,2"}, "-sweep compares the disaggregated policies under one count of prefill workers, and 2 are compared (2, 3): choose one with -prefill", ""},
		{"sweep over prefill splits", []string{"-replicas", "4", "-policies", "pd-default", "-prefill", "1,2", "-sweep", "1,2"}, "-sweep compares the disaggregated policies under one count of prefill workers, and 2 are compared (1, 2): choose one with -prefill", ""},
		{"prefill without disaggregated policies", []string{"-replicas", "8", "-prefill", "2,3"}, `-prefill "2,3" splits the replicas for the disaggregated policies (pd-*), and none is compared: list one in -policies`, ""},
		{"adapter load without adapter slots", []string{"-adapter-load", "10ms"}, "-adapter-load 10ms: the default scenario's replicas serve no LoRA adapters: give them slots with -adapter-slots, or use the lora scenario", ""},
		{"sweep over outputs", []string{"-scenario", "routes", "-sweep", "1,2"}, "-sweep compares policies under one knowledge of output lengths, and 3 are compared: choose one with -outputs", ""},
		{"output quantile without predict", []string{"-output-quantile", "0.9"}, "-output-quantile needs -outputs predict", ""},
		{"output quantile of one", []string{"-outputs", "predict", "-output-quantile", "1"}, "-output-quantile 1 must be in [0, 1)", ""},
		{"output quantile NaN", []string{"-outputs", "predict", "-output-quantile", "NaN"}, "-output-quantile NaN must be in [0, 1)", ""},
		{"speeds for other replicas", []string{"-speeds", "1,1,0.5"}, `-speeds "1,1,0.5" lists 3 speeds for 2 replicas: give one per replica (-replicas sets their number)`, ""},
		{"speeds zero", []string{"-speeds", "1,0"}, `-speeds "1,0": speed 0 must be a positive finite number`, ""},
		{"prefill all replicas", []string{"-prefill", "1,2"}, `-prefill "1,2": 2 prefill workers of 2 replicas: want 1 to 1, leaving at least one decode worker`, ""},
		{"prefill zero", []string{"-prefill", "0"}, `-prefill "0": 0 prefill workers of 2 replicas`, ""},
		{"prefill not a number", []string{"-prefill", "two"}, `-prefill "two": "two" is not a whole number`, ""},
		{"prefill repeated", []string{"-replicas", "8", "-prefill", "2,2"}, `-prefill "2,2" lists 2 twice`, ""},
		{"prefill empty", []string{"-prefill", ""}, `-prefill "": want comma-separated counts of prefill workers`, ""},
		{"speeds with a trace", []string{"-trace", good, "-speeds", "3x1"}, `-speeds "3x1" lists 3 speeds for 2 replicas`, ""},
		{"speed too low", []string{"-speeds", "1e-300,1"}, `-speeds "1e-300,1": speed 1e-300 out of range [0.001, 1000]`, ""},
		{"speed too high", []string{"-speeds", "2x1e9"}, `-speeds "2x1e9": speed 1e9 out of range [0.001, 1000]`, ""},
		{"speeds counted beyond an int", []string{"-speeds", "99999999999999999999x1"}, `-speeds "99999999999999999999x1" lists more than`, ""},
		{"scrape too short", []string{"-scrape", "1ns"}, "-scrape 1ns must be at least 1ms", ""},
		{"signal interval too short", []string{"-signal-interval", "999us"}, "-signal-interval 999µs must be at least 1ms", ""},
		{"policies repeated", []string{"-policies", "p2c, p2c"}, `-policies "p2c, p2c" lists p2c twice`, ""},
		{"policies empty item", []string{"-policies", "p2c,"}, `-policies "p2c,": want comma-separated policy names, or all`, "unknown policy"},
		{"policies empty", []string{"-policies", ""}, `-policies "": want comma-separated policy names, or all`, ""},
		// Durations beyond time.Duration's range are out of the flag's
		// range, not "no duration".
		{"TTFT SLO overflows", []string{"-slo-ttft", "9999999h"}, `invalid -slo-ttft "9999999h": out of range: want a duration from 1ns to 2562047h47m16.854775807s` + "\n", "such as"},
		{"TPOT SLO overflows", []string{"-slo-tpot", "-9223372036854775809ns"}, `invalid -slo-tpot "-9223372036854775809ns": out of range: want a duration from 1ns to 2562047h47m16.854775807s`, "such as"},
		{"scrape overflows", []string{"-scrape", "9999999h"}, `invalid -scrape "9999999h": out of range: want a duration from 1ms to 854015h55m45.618258602s, or 0 for the scenario's`, "such as"},
		{"signal interval overflows", []string{"-signal-interval", "9999999h"}, `invalid -signal-interval "9999999h": out of range: want a duration from 1ms to 854015h55m45.618258602s, or 0 for each preset's own`, "such as"},
		{"share overflows", []string{"-routers", "2", "-share", "9999999h"}, `invalid -share "9999999h": out of range: want a duration from 1ms to 1m`, "such as"},
		// 0 is not a stall of 0s but the default stall.
		{"adapter load overflows", []string{"-adapter-load", "9999999h"}, `invalid -adapter-load "9999999h": out of range: want a duration from 1ns to 1m, or 0 for the default (50ms)`, "such as"},
		// Bounds of the engine model and of the simulation, named by flag.
		{"scrape too long", []string{"-scrape", "854016h"}, "-scrape 854016h0m0s exceeds the simulator's limit of 854015h55m45.618258602s", "invalid config"},
		{"signal interval too long", []string{"-signal-interval", "900000h"}, "-signal-interval 900000h0m0s exceeds the simulator's limit of 854015h55m45.618258602s", "invalid config"},
		{"adapter load too long", []string{"-adapter-load", "61s"}, "-adapter-load 1m1s exceeds the simulator's limit of 1m", "invalid config"},
		{"too many KV blocks", []string{"-kv-blocks", "16777217"}, "-kv-blocks 16777217 exceeds the simulator's limit of 16777216", "invalid config"},
		{"too many adapter slots", []string{"-scenario", "lora", "-adapter-slots", "65537"}, "-adapter-slots 65537 exceeds the simulator's limit of 65536", "invalid config"},
		{"disaggregated with one replica", []string{"-scenario", "pd", "-policies", "default,pd-default", "-replicas", "1"}, "-replicas 1: the disaggregated policies (pd-default) need at least 2 replicas, a prefill and a decode worker", "invalid config"},
		{"pd scenario's splits on too few replicas", []string{"-scenario", "pd", "-policies", "pd-default", "-replicas", "3"}, "-replicas 3 leaves no decode worker beside the pd scenario's 3 prefill workers: want -replicas 4 or more, or fewer prefill workers with -prefill", "invalid config"},
		{"pd-long scenario's splits on too few replicas", []string{"-scenario", "pd-long", "-policies", "pd-default", "-replicas", "2"}, "-replicas 2 leaves no decode worker beside the pd-long scenario's 4 prefill workers: want -replicas 5 or more", "invalid config"},
		{"prefill of one replica", []string{"-replicas", "1", "-prefill", "1"}, `-prefill "1" needs -replicas 2 or more, a prefill and a decode worker, not 1`, "want 1 to 0"},
		{"disaggregated sharing", []string{"-routers", "2", "-share", "10ms", "-policies", "p2c,pd-default"}, "-share: the disaggregated policies (pd-default) do not share routing state; list only co-located policies in -policies", "invalid config"},
		{"scrape too long to share", []string{"-routers", "2", "-share", "10ms", "-scrape", "81m"}, "-scrape 1h21m0s with -share: a router trusts the engine signals for three intervals, 4h3m, and its share.Group describes its picks over at most 4h: want -scrape at most 1h20m", "invalid config"},
		{"signal interval too long to share", []string{"-routers", "2", "-share", "10ms", "-signal-interval", "2h", "-policies", "gie-default"}, "-signal-interval 2h0m0s with -share: a router trusts the engine signals for three intervals, 6h, and its share.Group describes its picks over at most 4h: want -signal-interval at most 1h20m", "invalid config"},
		// -signal-interval 0 leaves each preset's own, which is -scrape's
		// for p2c.
		{"scrape too long to share, signal interval 0", []string{"-routers", "2", "-share", "10ms", "-scrape", "81m", "-signal-interval", "0"}, "-scrape 1h21m0s with -share: a router trusts the engine signals for three intervals, 4h3m, and its share.Group describes its picks over at most 4h: want -scrape at most 1h20m", "invalid config"},
		{"signal interval 0 before a scrape too long to share", []string{"-routers", "2", "-signal-interval", "0", "-share", "10ms", "-scrape", "81m"}, "want -scrape at most 1h20m", "invalid config"},
		// Staggered scrapes start k*interval/routers in: k intervals must
		// not overflow.
		{"staggered scrape overflows", []string{"-routers", "8", "-stagger", "-scrape", "366007h"}, "-scrape 366007h0m0s with -stagger and 8 routers exceeds the simulator's limit of 366006h49m36.693539401s", ""},
		{"staggered signal interval overflows", []string{"-routers", "5", "-stagger", "-signal-interval", "640512h", "-policies", "gie-default"}, "-signal-interval 640512h0m0s with -stagger and 5 routers exceeds the simulator's limit of 640511h56m49.213693951s", ""},
		{"trace spread too far", []string{"-trace", spread, "-rate-scale", "1e-300"}, "-rate-scale 1e-300 spreads the trace's arrivals beyond the simulator's limit: " + spread + ": sim: malformed trace: line 2: arrival 1e+300s", ""},
		{"trace spread too far in a sweep", []string{"-trace", spread, "-sweep", "1e-300,1"}, "-sweep rate scale 1e-300 spreads the trace's arrivals beyond the simulator's limit", ""},
		{"malformed trace at a rate scale", []string{"-trace", bad, "-rate-scale", "2"}, bad + ": sim: malformed trace: line 2", "-rate-scale"},
		{"rate scale too low", []string{"-rate-scale", "1e-300"}, "-rate-scale 1e-300: sim: invalid workload: rate 6.1e-299 requests/s spreads 100 requests over more than 1e+09s", "arrives at"},
		{"sweep rate scale too low", []string{"-sweep", "1e-300,1"}, "-sweep rate scale 1e-300: sim: invalid workload: rate", "arrives at"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A small run, should a case be accepted; the case's flags
			// come later and win.
			args := append([]string{"-requests", "100", "-replicas", "2", "-policies", "p2c"}, c.args...)
			var out, errb bytes.Buffer
			if code := run(context.Background(), args, &out, &errb); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(errb.String(), c.want) {
				t.Errorf("stderr %q lacks %q", errb.String(), c.want)
			}
			if c.notWant != "" && strings.Contains(errb.String(), c.notWant) {
				t.Errorf("stderr %q holds %q", errb.String(), c.notWant)
			}
			if out.Len() > 0 {
				t.Errorf("stdout not empty:\n%s", out.String())
			}
		})
	}
	if _, err := os.Stat(same); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind (%v)", same, err)
	}
}

func TestRunOutputFailsFast(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing", "out.svg")
	jsonPath := filepath.Join(dir, "out.json")
	var out, errb bytes.Buffer
	// The -json file is created before -svg fails, and must be removed again.
	args := []string{"-requests", "300", "-replicas", "3", "-json", jsonPath, "-svg", missing}
	if code := run(context.Background(), args, &out, &errb); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), missing) {
		t.Errorf("stderr %q does not name %s", errb.String(), missing)
	}
	if strings.Contains(errb.String(), "simulated") || out.Len() > 0 {
		t.Errorf("simulated before failing: stdout %q, stderr %q", out.String(), errb.String())
	}
	if _, err := os.Stat(jsonPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind (%v)", jsonPath, err)
	}
}

// An output that is the trace, or the other output, under another name
// is refused before the run: writing it would overwrite the trace or the
// other output.
func TestRunOutputIsInput(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	const lines = `{"timestamp": 0, "input_length": 5, "output_length": 1}` + "\n"
	out := filepath.Join(dir, "out.json")
	other := dir + "/./out.json"
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"json is the trace", []string{"-trace", trace, "-json", trace}, "-json " + trace + " is the -trace file"},
		{"svg is the trace by another name", []string{"-trace", trace, "-svg", dir + "/./trace.jsonl"}, "-svg " + dir + "/./trace.jsonl is the -trace file"},
		{"svg is the json by another name", []string{"-json", out, "-svg", other}, "-svg " + other + " is the -json file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(trace, []byte(lines), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			args := append([]string{"-requests", "50", "-replicas", "2", "-policies", "p2c"}, c.args...)
			if code := run(context.Background(), args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), c.want)
			}
			if b, err := os.ReadFile(trace); err != nil || string(b) != lines {
				t.Errorf("trace now %.60q (%v)", b, err)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left behind (%v)", out, err)
			}
		})
	}
}

func TestRunFailureRemovesOutputs(t *testing.T) {
	dir := t.TempDir()
	created := filepath.Join(dir, "new.json")
	existing := filepath.Join(dir, "old.svg")
	if err := os.WriteFile(existing, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the simulation fails after the outputs are opened
	var out, errb bytes.Buffer
	args := []string{"-requests", "200", "-replicas", "3", "-policies", "p2c", "-json", created, "-svg", existing}
	if code := run(ctx, args, &out, &errb); code != 1 || !strings.Contains(errb.String(), "context canceled") {
		t.Fatalf("exit %d, stderr %q; want 1 and the cancellation", code, errb.String())
	}
	if _, err := os.Stat(created); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind (%v)", created, err)
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "old" {
		t.Errorf("%s = %q (%v), want its old contents", existing, b, err)
	}

	// A successful run replaces the existing file's contents.
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if b, err := os.ReadFile(existing); err != nil || bytes.HasPrefix(b, []byte("old")) || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("%s = %.40q (%v), want an SVG document", existing, b, err)
	}
	if b, err := os.ReadFile(created); err != nil || !json.Valid(b) {
		t.Errorf("%s is not JSON (%v)", created, err)
	}
}

func TestRunRejectedWarning(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "warning: 300 of 300 requests do not fit one replica's KV cache (1 block of 16 tokens) and were rejected; raise -kv-blocks\n"},
		{[]string{"-seeds", "2"}, "warning: 600 of 600 requests"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"-kv-blocks", "1", "-requests", "300", "-replicas", "2", "-policies", "round-robin,p2c"}, c.args...)
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		if !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: stderr %q lacks %q", args, errb.String(), c.want)
		}
		if !strings.Contains(out.String(), "round-robin") {
			t.Errorf("%v: no table before the warning:\n%s", args, out.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-requests", "300", "-replicas", "2", "-policies", "p2c"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(errb.String(), "warning") {
		t.Errorf("warning without rejected requests: %q", errb.String())
	}
}

func TestUsageKVBlocksDefaults(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := errb.String()
	for _, s := range sim.Scenarios() {
		kv := s.Config.Engine.KVBlocks
		if kv == 0 {
			kv = sim.DefaultKVBlocks
		}
		if want := fmt.Sprintf("%s %d", s.Name, kv); !strings.Contains(help, want) {
			t.Errorf("-kv-blocks help lacks the %s scenario's %d blocks:\n%s", s.Name, kv, help)
		}
		if !strings.Contains(help, s.Name) {
			t.Errorf("help lacks scenario %q", s.Name)
		}
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
	// The last seed may be the largest uint64, but not wrap around.
	if table := runTable("-requests", "50", "-seed", "18446744073709551614", "-seeds", "2"); !strings.Contains(table, "seeds 18446744073709551614-18446744073709551615 pooled") {
		t.Errorf("table header does not name the two largest seeds:\n%s", table)
	}
}

func TestRunSweep(t *testing.T) {
	dir := t.TempDir()
	svg := filepath.Join(dir, "sweep.svg")
	// Two replicas are overloaded at twenty times the rate.
	args := []string{"-requests", "200", "-replicas", "2", "-policies", "round-robin,p2c,default", "-sweep", "0.5,1,20"}
	var out, errb bytes.Buffer
	if code := run(context.Background(), append(args, "-json", "-", "-svg", svg), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var sw struct {
		Scenario struct {
			ArrivalRate float64 `json:"arrival_rate_rps"`
			Requests    int     `json:"requests"`
		} `json:"scenario"`
		Sweep []struct {
			RateScale   float64          `json:"rate_scale"`
			ArrivalRate float64          `json:"arrival_rate_rps"`
			Results     []map[string]any `json:"results"`
		} `json:"sweep"`
	}
	if err := json.Unmarshal(out.Bytes(), &sw); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if len(sw.Sweep) != 3 {
		t.Fatalf("%d sweep points, want 3", len(sw.Sweep))
	}
	policies := []string{"round-robin", "p2c", "default"}
	for i, p := range sw.Sweep {
		if want := []float64{0.5, 1, 20}[i]; p.RateScale != want {
			t.Errorf("point %d: rate scale %v, want %v", i, p.RateScale, want)
		}
		if i > 0 && !(p.ArrivalRate > sw.Sweep[i-1].ArrivalRate) {
			t.Errorf("point %d: offered load %v, not above the previous point's %v", i, p.ArrivalRate, sw.Sweep[i-1].ArrivalRate)
		}
		if len(p.Results) != len(policies) {
			t.Fatalf("point %d: %d results, want %d", i, len(p.Results), len(policies))
		}
		checkResults(t, p.Results)
		for j, r := range p.Results {
			if r["policy"] != policies[j] || r["requests"] != 200.0 {
				t.Errorf("point %d result %d: policy %v, %v requests; want %s, 200", i, j, r["policy"], r["requests"], policies[j])
			}
		}
	}
	if sw.Scenario.Requests != 200 || sw.Scenario.ArrivalRate != sw.Sweep[1].ArrivalRate {
		t.Errorf("scenario: %d requests at %v req/s, want 200 at the x1 point's %v", sw.Scenario.Requests, sw.Scenario.ArrivalRate, sw.Sweep[1].ArrivalRate)
	}
	// Overloaded, every policy serves less than half the offered load
	// within the SLO, and misses more than at the lowest rate.
	low, high := sw.Sweep[0], sw.Sweep[2]
	for j := range policies {
		if g := high.Results[j]["goodput_rps"].(float64); g > high.ArrivalRate/2 {
			t.Errorf("%s at x20: goodput %v of %v offered, want under half", policies[j], g, high.ArrivalRate)
		}
		if lo, hi := low.Results[j]["missed"].(float64), high.Results[j]["missed"].(float64); hi <= lo {
			t.Errorf("%s: %v missed at x20, not more than the %v at x0.5", policies[j], hi, lo)
		}
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("Goodput of each policy against offered load")) {
		t.Errorf("sweep SVG not written (%v)", err)
	}

	// The table: a row per policy in each of three tables, a column per
	// point; the x1 point is the plain run's.
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	table := out.String()
	for _, want := range []string{"goodput: requests per second", "missed: requests that did not meet the SLO, of 200", "TTFT p99:",
		"x0.5", "x20", "offered req/s"} {
		if !strings.Contains(table, want) {
			t.Errorf("sweep table lacks %q:\n%s", want, table)
		}
	}
	for _, p := range policies {
		if n := strings.Count(table, "  "+p+"  "); n != 3 {
			t.Errorf("%s in %d rows, want 3:\n%s", p, n, table)
		}
	}
	var plain bytes.Buffer
	if code := run(context.Background(), []string{"-requests", "200", "-replicas", "2", "-policies", "round-robin,p2c,default", "-json", "-"}, &plain, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(plain.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	for j, r := range rep.Results {
		if r["goodput_rps"] != sw.Sweep[1].Results[j]["goodput_rps"] || r["missed"] != sw.Sweep[1].Results[j]["missed"] {
			t.Errorf("%s: the x1 point differs from the plain run: %v vs %v", policies[j], sw.Sweep[1].Results[j], r)
		}
	}
}

func TestRunSweepSeeds(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-requests", "100", "-replicas", "2", "-policies", "p2c", "-sweep", "2,3", "-seeds", "2", "-json", "-"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var sw struct {
		Scenario struct {
			Seeds     int     `json:"seeds"`
			RateScale float64 `json:"rate_scale"`
		} `json:"scenario"`
		Sweep []struct {
			Results []struct {
				Requests int `json:"requests"`
			} `json:"results"`
		} `json:"sweep"`
	}
	if err := json.Unmarshal(out.Bytes(), &sw); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if sw.Scenario.Seeds != 2 || len(sw.Sweep) != 2 {
		t.Fatalf("scenario %+v with %d points, want 2 seeds and 2 points", sw.Scenario, len(sw.Sweep))
	}
	for i, p := range sw.Sweep {
		if len(p.Results) != 1 || p.Results[0].Requests != 200 {
			t.Errorf("point %d: %+v, want one result pooling 200 requests", i, p.Results)
		}
	}
}

func TestRunWide(t *testing.T) {
	run1 := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"-requests", "100", "-replicas", "2", "-policies", "p2c"}, args...), &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		return out.String()
	}
	narrow, wide := run1(), run1("-wide")
	for _, col := range []string{"tok/s", "done", "E2E p50"} {
		if strings.Contains(narrow, col) || !strings.Contains(wide, col) {
			t.Errorf("%q: in the narrow table %v, in the wide one %v", col, strings.Contains(narrow, col), strings.Contains(wide, col))
		}
	}
	if !strings.Contains(narrow, "Compare first: SLO and missed") {
		t.Errorf("no legend:\n%s", narrow)
	}
}

// -share runs the routers over share.Groups and says so in the header and
// the JSON; without it, the JSON has no share_ms.
func TestRunShare(t *testing.T) {
	args := []string{"-requests", "300", "-replicas", "3", "-routers", "2", "-policies", "p2c,default", "-json", "-"}
	for _, c := range []struct {
		share string
		want  any
	}{{"", nil}, {"50ms", 50.0}} {
		a := args
		if c.share != "" {
			a = append(a, "-share", c.share)
		}
		var out, errb bytes.Buffer
		if code := run(context.Background(), a, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", a, code, errb.String())
		}
		var rep struct {
			Scenario map[string]any   `json:"scenario"`
			Results  []map[string]any `json:"results"`
		}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out.String())
		}
		if got := rep.Scenario["share_ms"]; got != c.want {
			t.Errorf("-share %q: share_ms %v, want %v", c.share, got, c.want)
		}
		checkResults(t, rep.Results)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), append(args[:len(args)-2], "-share", "50ms"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "2 router(s), scrape 1s, sharing every 50ms") {
		t.Errorf("header does not describe the sharing:\n%s", out.String())
	}
}

// The -share help says when a batch reaches the other routers: at once,
// as no scenario has a network delay (sim.Config.Delay), not a sharing
// interval later.
func TestUsageShare(t *testing.T) {
	for _, s := range sim.Scenarios() {
		if s.Config.Delay != 0 {
			t.Errorf("the %s scenario has a network delay of %v", s.Name, s.Config.Delay)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d", code)
	}
	_, help, _ := strings.Cut(errb.String(), "  -share ")
	help, _, _ = strings.Cut(help, "\n  -")
	if !strings.Contains(help, "at once") || strings.Contains(help, "later") {
		t.Errorf("-share help %q does not say that a batch reaches the other routers at once", help)
	}
}

// -share works between more routers than package share's default
// MaxPeers (64), as every router's Group tracks all the others.
func TestRunShareManyRouters(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-requests", "100", "-replicas", "2", "-routers", "66", "-share", "100ms", "-policies", "default"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "66 router(s), scrape 1s, sharing every 100ms") {
		t.Errorf("header does not describe the sharing:\n%s", out.String())
	}
}

// A trace replay without -kv-blocks gets the default scenario's 512k
// tokens per replica, not a capacity sized from the trace.
func TestRunTraceDefaultKV(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.jsonl")
	var b strings.Builder
	for i := range 20 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 600, "output_length": 20, "hash_ids": [%d, %d]}`+"\n", i*100, i%3, 100+i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-trace", path, "-policies", "p2c"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := fmt.Sprintf("KV %d blocks", sim.DefaultScenarioKVBlocks); !strings.Contains(out.String(), want) {
		t.Errorf("header lacks %q:\n%s", want, out.String())
	}
}

// A run whose replicas preempt more than 1% of its requests is warned
// about, naming the policies; one that preempts fewer is not.
// A trace whose name has no known extension is read in the format its
// content shows, and the header and the JSON name that format.
func TestRunTraceDetectedFormat(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ format, content string }{
		{"mooncake", `{"timestamp": 0, "input_length": 600, "output_length": 20}` + "\n" + `{"timestamp": 500, "input_length": 60, "output_length": 2}` + "\n"},
		{"azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.6805900,37,4\n"},
	}
	for _, c := range cases {
		t.Run(c.format, func(t *testing.T) {
			path := filepath.Join(dir, c.format+".txt")
			if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			if code := run(context.Background(), []string{"-trace", path, "-policies", "p2c"}, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if want := fmt.Sprintf("%s.txt (%s, rate x1)", c.format, c.format); !strings.Contains(out.String(), want) {
				t.Errorf("header lacks %q:\n%s", want, out.String())
			}
			out.Reset()
			if code := run(context.Background(), []string{"-trace", path, "-policies", "p2c", "-json", "-"}, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var rep struct {
				Scenario struct{ Format string } `json:"scenario"`
			}
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Scenario.Format != c.format {
				t.Errorf("JSON format %q (%v), want %q", rep.Scenario.Format, err, c.format)
			}
		})
	}
}

func TestPreemptionWarning(t *testing.T) {
	rs := []*sim.Result{
		{Policy: "a", Requests: 1000, Preemptions: 10},
		{Policy: "b", Requests: 1000, Preemptions: 11},
		{Policy: "c", Requests: 1000, Preemptions: 300},
	}
	got := preemptionWarning(rs, 512, 16)
	want := "llmlb-sim: warning: preemptions exceed 1% of requests (up to 30%) under b, c: 512 blocks of 16 tokens per replica are too few for this load; raise -kv-blocks\n"
	if got != want {
		t.Errorf("warning = %q, want %q", got, want)
	}
	if got := preemptionWarning(rs[:1], 512, 16); got != "" {
		t.Errorf("warning at 1%% = %q, want none", got)
	}

	// End to end: a tiny cache under the prefixes scenario preempts.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-scenario", "prefixes", "-kv-blocks", "200", "-requests", "400", "-policies", "round-robin"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "warning: preemptions exceed 1% of requests") {
		t.Errorf("no preemption warning:\n%s\n%s", errb.String(), out.String())
	}
}

// The tenants scenario prints a row per admission control and a table per
// tenant, before the legend; -admission chooses the controls, in its order.
func TestRunAdmission(t *testing.T) {
	args := []string{"-scenario", "tenants", "-requests", "1500", "-admission", "vtc,none"}
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	legend := strings.Index(text, "\nCompare ")
	if legend < 0 {
		t.Fatalf("no legend:\n%s", text)
	}
	table := text[:legend]
	for _, want := range []string{"admission", "refused", "default        vtc", "default       none", "tenant", "light-4"} {
		if !strings.Contains(table, want) {
			t.Errorf("table before the legend lacks %q:\n%s", want, table)
		}
	}
	if strings.Index(table, " vtc ") > strings.Index(table, " none ") {
		t.Errorf("vtc should come first, as listed:\n%s", table)
	}
	if strings.Contains(table, " rate ") {
		t.Errorf("rate was not asked for:\n%s", table)
	}
	var again bytes.Buffer
	if code := run(context.Background(), args, &again, &errb); code != 0 || again.String() != text {
		t.Errorf("a second run printed something else (exit %d)", code)
	}
}

// The routes scenario prints a row per knowledge of output lengths under
// each policy; -outputs chooses them, in its order, for any scenario, and
// the plain run has no outputs column.
func TestRunOutputs(t *testing.T) {
	args := []string{"-scenario", "routes", "-requests", "1500", "-policies", "least-tokens"}
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	table := out.String()
	i, j, k := strings.Index(table, " allowance "), strings.Index(table, " predict "), strings.Index(table, " true ")
	if !strings.Contains(table, "outputs") || i < 0 || !(i < j && j < k) {
		t.Errorf("want an outputs column and rows allowance, predict, true in that order:\n%s", table)
	}

	out.Reset()
	args = []string{"-requests", "1000", "-policies", "least-tokens", "-outputs", "true,predict", "-output-quantile", "0.9", "-seeds", "2"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	table = out.String()
	if j, k := strings.Index(table, " predict q0.9 "), strings.Index(table, " true "); k < 0 || j < k || strings.Contains(table, "allowance ") {
		t.Errorf("want rows true, then predict q0.9, only:\n%s", table)
	}

	out.Reset()
	args = []string{"-requests", "1000", "-policies", "least-tokens"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "outputs") {
		t.Errorf("a run without -outputs shows the outputs column:\n%s", out.String())
	}
}

func TestParseSpeeds(t *testing.T) {
	cases := []struct {
		list     string
		replicas int
		want     []float64
		err      string
	}{
		{"1,1,0.5,0.5", 4, []float64{1, 1, 0.5, 0.5}, ""},
		{"2x1,6x0.5", 8, []float64{1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, ""},
		{" 2 x 1 , 0.25 ", 3, []float64{1, 1, 0.25}, ""},
		{"1x2", 1, []float64{2}, ""},
		{"2x1,6x0.5", 4, nil, `-speeds "2x1,6x0.5" lists 8 speeds for 4 replicas`},
		{"1,1", 3, nil, `-speeds "1,1" lists 2 speeds for 3 replicas`},
		{"1,-0.5", 2, nil, `speed -0.5 must be a positive finite number`},
		{"1,0", 2, nil, `speed 0 must be a positive finite number`},
		{"NaN,1", 2, nil, `speed NaN must be a positive finite number`},
		{"1,Inf", 2, nil, `speed Inf must be a positive finite number`},
		{"1,fast", 2, nil, `speed "fast" is not a number`},
		{"2x1e309", 2, nil, `speed 1e309 out of range [0.001, 1000]`},
		{"0x1,1", 1, nil, `in "0x1", the count "0" is not a positive whole number`},
		{"-1x1", 1, nil, `the count "-1" is not a positive whole number`},
		{"1.5x1", 1, nil, `the count "1.5" is not a positive whole number`},
		{"2x", 2, nil, `speed "" is not a number`},
		{"1,,1", 2, nil, `want comma-separated speeds, one per replica`},
		{"", 1, nil, `want comma-separated speeds, one per replica`},
		{"5000x1", 5000, nil, `lists more than 4096 speeds`},
		{"1e-300,1", 2, nil, `speed 1e-300 out of range [0.001, 1000]`},
		{"8x1e-12", 8, nil, `speed 1e-12 out of range [0.001, 1000]`},
		{"1,1001", 2, nil, `speed 1001 out of range [0.001, 1000]`},
		{"0.001,1000", 2, []float64{0.001, 1000}, ""},
	}
	for _, c := range cases {
		t.Run(c.list, func(t *testing.T) {
			got, err := parseSpeeds(c.list, c.replicas)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Errorf("parseSpeeds(%q, %d) = %v, %v; want an error holding %q", c.list, c.replicas, got, err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Errorf("parseSpeeds(%q, %d) = %v, %v; want %v", c.list, c.replicas, got, err, c.want)
			}
		})
	}
}

// TestRunSpeeds checks that -speeds and -declare-weights reach the
// simulation of a trace, and that the header says so.
func TestRunSpeeds(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.jsonl")
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 2000, "output_length": 50}`+"\n", i*20)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ttftP50 := func(args ...string) (string, float64) {
		t.Helper()
		jsonPath := filepath.Join(dir, "out.json")
		var out, errb bytes.Buffer
		args = append([]string{"-trace", path, "-replicas", "2", "-policies", "round-robin", "-json", jsonPath}, args...)
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var rep struct {
			Scenario struct {
				Speeds          []float64 `json:"speeds"`
				DeclaredWeights bool      `json:"declared_weights"`
			} `json:"scenario"`
			Results []struct {
				TTFT struct {
					P50 float64 `json:"p50"`
				} `json:"ttft_ms"`
			} `json:"results"`
		}
		data, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Results) != 1 {
			t.Fatalf("%v: %d results", args, len(rep.Results))
		}
		t.Logf("%v: speeds %v, declared %v, TTFT p50 %.1fms", args, rep.Scenario.Speeds, rep.Scenario.DeclaredWeights, rep.Results[0].TTFT.P50)
		return out.String(), rep.Results[0].TTFT.P50
	}
	plainOut, plain := ttftP50()
	if strings.Contains(plainOut, "replica speeds") {
		t.Errorf("header without -speeds names speeds:\n%s", plainOut)
	}
	slowOut, slow := ttftP50("-speeds", "2x0.5")
	if !strings.Contains(slowOut, "replica speeds 2x0.5, not declared to the routers") {
		t.Errorf("header lacks the speeds:\n%s", slowOut)
	}
	if !(slow > 1.5*plain) {
		t.Errorf("TTFT p50 %.1fms at half speed, %.1fms at full speed; want about twice", slow, plain)
	}
	declaredOut, _ := ttftP50("-speeds", "1,0.5", "-declare-weights")
	if !strings.Contains(declaredOut, "replica speeds 1,0.5, declared to the routers as weights") {
		t.Errorf("header lacks the declared speeds:\n%s", declaredOut)
	}
}

// The lora scenario reports its adapter slots and loads; -adapter-slots and
// -adapter-load change them.
func TestRunLoRAFlags(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-scenario", "lora", "-requests", "300", "-policies", "default,default-lora", "-adapter-slots", "2", "-adapter-load", "80ms"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"2 LoRA adapter slots per replica, 80ms per load", " loads", "default-lora"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run(context.Background(), []string{"-scenario", "lora", "-adapter-slots", "-1"}, &out, &errb); code == 0 {
		t.Error("-adapter-slots -1 accepted")
	}
}

// The pd scenario runs its co-located policies once and its disaggregated
// ones under each split of -prefill, with the split and local columns.
func TestRunPrefillSplits(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"-scenario", "pd", "-requests", "300", "-policies", "pd-default-local,default", "-prefill", "1,3"}
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rows []string
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && (f[0] == "default" || f[0] == "pd-default-local") {
			rows = append(rows, f[0]+" "+f[1])
		}
	}
	want := []string{"default co-located", "pd-default-local 1P+7D", "pd-default-local 3P+5D"}
	if !slices.Equal(rows, want) {
		t.Errorf("rows %q, want %q:\n%s", rows, want, out.String())
	}
	if !strings.Contains(out.String(), " local") || !strings.Contains(out.String(), "split: co-located") {
		t.Errorf("output lacks the local column or the split legend:\n%s", out.String())
	}
}

// -iter-time mocker-fused runs the engines on MockerFusedIterTime: its
// iterations that prefill and decode are shorter, so decoding beside
// prefills is faster; the header and the JSON name the model, and an
// unknown model is refused.
func TestRunIterTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.jsonl")
	var b strings.Builder
	for i := range 60 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1500, "output_length": 200}`+"\n", i*150)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	tpotP50 := func(args ...string) (string, string, float64) {
		t.Helper()
		jsonPath := filepath.Join(dir, "out.json")
		var out, errb bytes.Buffer
		args = append([]string{"-trace", path, "-replicas", "1", "-kv-blocks", "4096", "-policies", "round-robin", "-json", jsonPath}, args...)
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var rep struct {
			Scenario struct {
				IterTime string `json:"iter_time"`
			} `json:"scenario"`
			Results []struct {
				TPOT struct {
					P50 float64 `json:"p50"`
				} `json:"tpot_ms"`
			} `json:"results"`
		}
		data, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Results) != 1 {
			t.Fatalf("%v: %d results", args, len(rep.Results))
		}
		return out.String(), rep.Scenario.IterTime, rep.Results[0].TPOT.P50
	}
	sumOut, sumName, sum := tpotP50()
	explicitOut, _, explicit := tpotP50("-iter-time", "mocker")
	fusedOut, fusedName, fused := tpotP50("-iter-time", "mocker-fused")
	t.Logf("TPOT p50: mocker %.2fms, mocker-fused %.2fms", sum, fused)
	if strings.Contains(sumOut, "iteration time") || sumName != "" || explicit != sum || explicitOut != sumOut {
		t.Errorf("the default model is named or differs from -iter-time mocker:\n%s\n%s", sumOut, explicitOut)
	}
	if !strings.Contains(fusedOut, "\niteration time: mocker-fused\n") || fusedName != "mocker-fused" {
		t.Errorf("the fused model is not named (JSON %q):\n%s", fusedName, fusedOut)
	}
	if !(fused < sum) {
		t.Errorf("TPOT p50 %.2fms with mocker-fused, %.2fms with mocker; want lower", fused, sum)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-iter-time", "vllm"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `-iter-time "vllm": want mocker or mocker-fused`) {
		t.Errorf("-iter-time vllm: exit %d, stderr %q", code, errb.String())
	}
}

// TestRunTraceStdin checks that -trace - replays the trace on standard
// input, named stdin in the header.
func TestRunTraceStdin(t *testing.T) {
	old := stdin
	t.Cleanup(func() { stdin = old })
	stdin = strings.NewReader(`{"timestamp": 0, "input_length": 600, "output_length": 20}` + "\n" + `{"timestamp": 500, "input_length": 60, "output_length": 2}` + "\n")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-trace", "-", "-policies", "p2c"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := "scenario stdin (mooncake, rate x1): 2 requests"; !strings.HasPrefix(out.String(), want) {
		t.Errorf("header is not %q:\n%s", want, out.String())
	}
}
