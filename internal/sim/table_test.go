package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// tableReport is a report with a row per default policy and figures as
// wide as the default scenario's, without simulating.
func tableReport(herding bool) *Report {
	rep := &Report{Scenario: ScenarioInfo{Name: "default", Requests: 12000, ArrivalRate: 50.9, Replicas: 8, Routers: 1,
		ScrapeMs: 1000, Seed: 1, SLOTTFTMs: 2000, SLOTPOTMs: 50, KVBlocks: 32768, BlockSize: 16, Herding: herding}}
	for i, name := range DefaultPolicies() {
		rep.Results = append(rep.Results, &Result{Policy: name, Requests: 12000, Completed: 12000 - i,
			TTFT: Latency{P50: 104, P95: 525, P99: 2543, Max: 14209}, TPOT: Latency{P50: 51.5, P99: 92.3},
			E2E: Latency{P50: 6423, P99: 61300}, SLOAttainment: 0.478, Missed: 6265 + i, GoodputRPS: 24.31,
			PrefixHitRate: 0.16, OutputTokensPerS: 10252, AssignmentGap: 1572, Preemptions: 14,
			PeakSkew: 15, MeanSkew: 9.53, PileupShare: 0.806})
	}
	return rep
}

func TestWriteTable(t *testing.T) {
	cases := []struct {
		name    string
		herding bool
		wide    bool
		heads   []string // in the header line, in order
		absent  []string // not in the header line
		defined []string // defined in the legend
		cells   []string // in round robin's row
	}{
		{"narrow", false, false,
			[]string{"policy", "SLO", "missed", "goodput", "TTFT p50", "p99", "TPOT p50", "p99", "E2E p99", "hit", "gap", "preempt"},
			[]string{"p95", "max", "E2E p50", "tok/s", "done", "skew", "pile-up"},
			[]string{"SLO:", "missed:", "goodput:", "TTFT:", "TPOT:", "E2E:", "p50, p99:", "hit:", "gap:", "preempt:"},
			[]string{"47.8%", "6265", "24.31/s", "104", "2543", "51.5", "92.3", "61.3s", "16.0%", "1572", "14"}},
		{"wide", false, true,
			[]string{"policy", "SLO", "missed", "goodput", "TTFT p50", "p95", "p99", "max", "TPOT p50", "p99", "E2E p50", "p99", "hit", "tok/s", "done", "gap", "preempt"},
			[]string{"skew", "pile-up"},
			[]string{"SLO:", "missed:", "goodput:", "TTFT:", "TPOT:", "E2E:", "p50, p95, p99:", "max:", "hit:", "tok/s:", "done:", "gap:", "preempt:"},
			[]string{"525", "14.2s", "6423", "10252", "12000"}},
		{"herding", true, false,
			[]string{"policy", "SLO", "missed", "goodput", "TTFT p50", "p99", "TPOT p99", "gap", "peak skew", "mean skew", "pile-up"},
			[]string{"hit", "preempt", "E2E"},
			[]string{"SLO:", "missed:", "goodput:", "TTFT:", "TPOT:", "gap:", "peak skew:", "mean skew:", "pile-up:"},
			[]string{"15", "9.53", "80.6%"}},
		{"herding wide", true, true,
			[]string{"policy", "SLO", "missed", "TTFT p50", "p95", "TPOT p50", "E2E p50", "hit", "tok/s", "preempt", "peak skew", "mean skew", "pile-up"},
			nil,
			[]string{"hit:", "tok/s:", "preempt:", "peak skew:", "mean skew:", "pile-up:"},
			nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := tableReport(c.herding)
			var b bytes.Buffer
			write := rep.WriteTable
			if c.wide {
				write = rep.WriteWideTable
			}
			if err := write(&b); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			lines := strings.Split(out, "\n")
			var head, row string
			legend := -1
			for i, l := range lines {
				switch {
				case strings.HasSuffix(strings.TrimSpace(l), "preempt") || strings.HasSuffix(strings.TrimSpace(l), "pile-up"):
					head = l
				case strings.HasPrefix(strings.TrimSpace(l), "round-robin "):
					row = l
				case strings.HasPrefix(l, "Compare first: SLO and missed, then goodput, then the TTFT tail (TTFT p99)."):
					legend = i
				}
			}
			if head == "" || row == "" || legend < 0 {
				t.Fatalf("no header, round-robin row or legend:\n%s", out)
			}
			rest := head
			for _, h := range c.heads {
				i := strings.Index(rest, h)
				if i < 0 {
					t.Fatalf("header %q lacks %q (in order)", head, h)
				}
				rest = rest[i+len(h):]
			}
			for _, h := range c.absent {
				if strings.Contains(head, h) {
					t.Errorf("header %q holds %q", head, h)
				}
			}
			text := strings.Join(lines[legend:], " ")
			for _, d := range c.defined {
				if n := strings.Count(text, d); n != 1 {
					t.Errorf("legend defines %q %d times, want once:\n%s", d, n, text)
				}
			}
			for _, cell := range c.cells {
				if !strings.Contains(" "+row+" ", " "+cell+" ") {
					t.Errorf("row %q lacks %q", row, cell)
				}
			}
			if !c.wide {
				for _, l := range lines {
					if len(l) > 115 {
						t.Errorf("line of %d characters, want at most 115:\n%s", len(l), l)
					}
				}
			}
		})
	}
}

func TestWriteTableDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if err := tableReport(true).WriteTable(&a); err != nil {
		t.Fatal(err)
	}
	if err := tableReport(true).WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Errorf("two tables of one report differ:\n%s\n%s", a.String(), b.String())
	}
}

func TestPack(t *testing.T) {
	cases := []struct {
		units []string
		width int
		want  string
	}{
		{nil, 10, ""},
		{[]string{"a;", "b;", "c."}, 10, "a; b; c.\n"},
		{[]string{"aaaa;", "bbbb;", "cc."}, 11, "aaaa; bbbb;\ncc.\n"}, {[]string{"aaaa;", "bbbb;", "cc."}, 10, "aaaa;\nbbbb; cc.\n"},
		{[]string{"a;", "a unit longer than the width;", "b."}, 10, "a;\na unit longer than the width;\nb.\n"},
	}
	for _, c := range cases {
		if got := pack(c.units, c.width); got != c.want {
			t.Errorf("pack(%q, %d) = %q, want %q", c.units, c.width, got, c.want)
		}
	}
}

// sweepOf is a sweep of the given rate scales with a result per policy at
// each, without simulating; the goodput of policy j at rate x is x*10/(j+1).
func sweepOf(scales []float64, policies ...string) *Sweep {
	sw := &Sweep{Scenario: ScenarioInfo{Name: "default", Requests: 100, ArrivalRate: 10, Replicas: 2, Routers: 1,
		ScrapeMs: 1000, Seed: 1, SLOTTFTMs: 2000, SLOTPOTMs: 50, KVBlocks: 64, BlockSize: 16}}
	for _, x := range scales {
		p := SweepPoint{RateScale: x, ArrivalRate: 10 * x}
		for j, name := range policies {
			p.Results = append(p.Results, &Result{Policy: name, Requests: 100, GoodputRPS: 10 * x / float64(j+1),
				Missed: int(x * float64(10*j)), TTFT: Latency{P99: 100 * x * float64(j+1)}})
		}
		sw.Points = append(sw.Points, p)
	}
	return sw
}

func TestSweepWriteTable(t *testing.T) {
	sw := sweepOf([]float64{0.5, 1, 2.5}, "round-robin", "default")
	var b bytes.Buffer
	if err := sw.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"load sweep, scenario default: 100 requests at 10.0 req/s times each rate scale",
		"goodput: requests per second that met the SLO",
		"missed: requests that did not meet the SLO, of 100",
		"TTFT p99: 99th percentile time to first token",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	fields := func(prefix string) []string {
		var rows [][]string
		tables, _, _ := strings.Cut(out, "\nCompare where")
		for _, l := range strings.Split(tables, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				rows = append(rows, strings.Fields(l))
			}
		}
		if len(rows) != 3 {
			t.Fatalf("%d rows start with %q, want one per table:\n%s", len(rows), prefix, out)
		}
		var all []string
		for _, r := range rows {
			all = append(all, strings.Join(r, " "))
		}
		return all
	}
	for _, got := range fields("rate scale") {
		if got != "rate scale x0.5 x1 x2.5" {
			t.Errorf("header %q", got)
		}
	}
	for _, got := range fields("offered req/s") {
		if got != "offered req/s 5.0 10.0 25.0" {
			t.Errorf("offered load %q", got)
		}
	}
	want := []string{"default 2.50 5.00 12.50", "default 5 10 25", "default 100 200 500"}
	for i, got := range fields("default") {
		if got != want[i] {
			t.Errorf("default's row %d = %q, want %q", i, got, want[i])
		}
	}
}

func TestSweepWriteJSON(t *testing.T) {
	sw := sweepOf([]float64{0.5, 1}, "p2c", "oracle")
	var b bytes.Buffer
	if err := sw.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Scenario map[string]any `json:"scenario"`
		Sweep    []struct {
			RateScale   float64          `json:"rate_scale"`
			ArrivalRate float64          `json:"arrival_rate_rps"`
			Results     []map[string]any `json:"results"`
		} `json:"sweep"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Scenario["name"] != "default" || len(got.Sweep) != 2 {
		t.Fatalf("scenario %v, %d points", got.Scenario, len(got.Sweep))
	}
	for i, p := range got.Sweep {
		if p.RateScale != sw.Points[i].RateScale || p.ArrivalRate != sw.Points[i].ArrivalRate || len(p.Results) != 2 {
			t.Errorf("point %d: %+v", i, p)
		}
		for j, r := range p.Results {
			if r["policy"] != sw.Points[i].Results[j].Policy || r["missed"] != float64(sw.Points[i].Results[j].Missed) {
				t.Errorf("point %d result %d: %v", i, j, r)
			}
		}
	}
}

func TestSweepWriteSVG(t *testing.T) {
	var b bytes.Buffer
	if err := sweepOf([]float64{0.5, 1, 2}, "p2c", "oracle").WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "Goodput of each policy against offered load", "TTFT p99 of each policy against offered load",
		"offered load (requests/s)", "oracle", "TTFT objective"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if err := (&Sweep{}).WriteSVG(&b); err == nil {
		t.Error("an empty sweep plotted")
	}
}

func TestReportSVGTitles(t *testing.T) {
	rep := tableReport(false)
	rep.Results[1].TTFTs = []float64{10, 20, 30}
	var b bytes.Buffer
	if err := rep.WriteSVG(&b, rep.Results[1].Policy); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`TTFT CDF of each policy: scenario &#34;default&#34;`, "under policy " + rep.Results[1].Policy} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(b.String(), "pooled") {
		t.Error("one seed's SVG speaks of pooled seeds")
	}
	// Pooled seeds: the series is the first seed's, and the title says so.
	rep.Scenario.Seed, rep.Scenario.Seeds = 9, 8
	b.Reset()
	if err := rep.WriteSVG(&b, rep.Results[1].Policy); err != nil {
		t.Fatal(err)
	}
	if want := "seed 9 (the first of 8 pooled)"; !strings.Contains(b.String(), want) {
		t.Errorf("SVG of pooled seeds lacks %q", want)
	}
}

// A policy compared under several admission controls, knowledges of
// output lengths or splits has a line for each, and the legend tells them
// apart as the table's columns do.
func TestReportSVGLegendNamesVariants(t *testing.T) {
	rep := tableReport(false)
	base := *rep.Results[0]
	base.TTFTs = []float64{10, 20, 30}
	variant := func(f func(r *Result)) *Result {
		r := base
		f(&r)
		return &r
	}
	rep.Results = []*Result{
		variant(func(r *Result) { r.Policy, r.Admission = "default", "none" }),
		variant(func(r *Result) { r.Policy, r.Admission = "default", "vtc" }),
		variant(func(r *Result) { r.Policy, r.Outputs = "default", "predict" }),
		variant(func(r *Result) { r.Policy, r.Prefill, r.Decode = "pd-default", 2, 6 }),
		variant(func(r *Result) { r.Policy, r.Prefill, r.Decode = "pd-default", 3, 5 }),
	}
	var b bytes.Buffer
	if err := rep.WriteSVG(&b, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{">default, admission none<", ">default, admission vtc<", ">default, outputs predict<",
		">pd-default, 2P+6D<", ">pd-default, 3P+5D<", "under policy default, admission none<"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

// A run in which no request completed, every one rejected for want of KV
// memory, has no TTFT to plot: the CDF is drawn empty, on a time axis of
// its own, and says why.
func TestReportSVGNoCompletedRequest(t *testing.T) {
	rep := tableReport(false)
	for _, r := range rep.Results {
		r.Completed, r.Rejected, r.TTFTs = 0, r.Requests, nil
	}
	var b bytes.Buffer
	if err := rep.WriteSVG(&b, ""); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "no request completed") {
		t.Errorf("SVG does not say that no request completed")
	}
}

// The legends are drawn in a column right of every plot, so they cover no
// data, and each is wide enough for its entries.
func TestLayoutLegendsBesidePlots(t *testing.T) {
	dc := draw.New(vgsvg.New(8*vg.Inch, 9*vg.Inch))
	plots := []*plot.Plot{newPlot("a", "x", "y"), newPlot("b", "x", "y")}
	long := newLegend()
	short := newLegend()
	for i := range 17 {
		long.Add(fmt.Sprintf("a rather long policy name %d", i), lineThumb{})
	}
	short.Add("r", lineThumb{})
	plotCs, legendCs := layout(dc, plots, []*plot.Legend{long, short})
	for i, lc := range legendCs {
		for j, pc := range plotCs {
			if lc.Min.X < pc.Max.X {
				t.Errorf("legend %d starts at x=%v, inside plot %d, which ends at %v", i, lc.Min.X, j, pc.Max.X)
			}
		}
		if lc.Max.X > dc.Max.X || lc.Min.X >= lc.Max.X {
			t.Errorf("legend %d spans x %v-%v, outside the image's %v", i, lc.Min.X, lc.Max.X, dc.Max.X)
		}
		if top := plots[i].DataCanvas(plotCs[i]).Max.Y; lc.Max.Y != top {
			t.Errorf("legend %d tops at %v, want the data area's top %v", i, lc.Max.Y, top)
		}
	}
	if w := long.Rectangle(draw.Canvas{}).Size().X; legendCs[0].Size().X < w {
		t.Errorf("legend column %v wide, narrower than its legend's %v", legendCs[0].Size().X, w)
	}
}

// lineThumb is a legend thumbnail that draws nothing.
type lineThumb struct{}

func (lineThumb) Thumbnail(*draw.Canvas) {}

// TestHeaderCountsRequests checks the header's grammar: one request is not
// "1 requests".
func TestHeaderCountsRequests(t *testing.T) {
	for n, want := range map[int]string{1: "scenario default: 1 request at", 2: "scenario default: 2 requests at"} {
		rep := tableReport(false)
		rep.Scenario.Requests = n
		var b bytes.Buffer
		if err := rep.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(b.String(), want) {
			t.Errorf("%d requests: header %q, want it to begin %q", n, strings.SplitN(b.String(), "\n", 2)[0], want)
		}
	}
}
