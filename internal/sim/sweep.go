package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Sweep is the outcome of comparing policies on one workload at several
// arrival rates, a load sweep, in the JSON shape written by
// [Sweep.WriteJSON]. Every point should hold the same policies in the same
// order. Its Write methods only read it, and may run concurrently while
// nothing modifies it.
type Sweep struct {
	// Scenario describes the workload at its own rate (rate scale 1),
	// whether or not the sweep has that point.
	Scenario ScenarioInfo `json:"scenario"`
	// Points holds one point per rate scale, in increasing order.
	Points []SweepPoint `json:"sweep"`
}

// SweepPoint is the comparison at one arrival rate of a [Sweep].
type SweepPoint struct {
	// RateScale is the factor the workload's arrival rate was multiplied
	// by.
	RateScale float64 `json:"rate_scale"`
	// ArrivalRate is the offered load in requests per second, measured as
	// [ScenarioInfo.ArrivalRate] is (the mean over the seeds when they are
	// pooled).
	ArrivalRate float64 `json:"arrival_rate_rps"`
	// Results holds one result per policy, as [Report.Results] does.
	Results []*Result `json:"results"`
}

// WriteJSON writes the sweep as indented JSON.
func (sw *Sweep) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(sw)
}

// sweepMetric is one table of [Sweep.WriteTable].
type sweepMetric struct {
	title string
	cell  func(r *Result) string
}

// WriteTable writes the sweep as three aligned text tables, goodput,
// missed requests and TTFT p99, each with one row per policy and one column
// per rate scale, headed by the offered load; then a legend.
func (sw *Sweep) WriteTable(w io.Writer) error {
	s := &sw.Scenario
	src := "scenario " + s.Name
	if s.Trace != "" {
		src = fmt.Sprintf("trace %s (%s)", s.Trace, s.Format)
	}
	per := ""
	if s.Seeds > 1 {
		per = " per seed"
	}
	fmt.Fprintf(w, "load sweep, %s: %s%s at %.1f req/s times each rate scale, %s\n",
		src, requestCount(s.Requests), per, s.ArrivalRate, s.cluster())
	fmt.Fprintf(w, "%s\n", s.limits())
	missedOf := s.Requests
	if s.Seeds > 1 {
		missedOf *= s.Seeds
	}
	metrics := []sweepMetric{
		{"goodput: requests per second that met the SLO (higher is better; the offered load if every request met it)",
			func(r *Result) string { return strconv.FormatFloat(r.GoodputRPS, 'f', 2, 64) }},
		{fmt.Sprintf("missed: requests that did not meet the SLO, of %d (lower is better)", missedOf),
			func(r *Result) string { return strconv.Itoa(r.Missed) }},
		{"TTFT p99: 99th percentile time to first token in ms, s from 10 s up (lower is better)",
			func(r *Result) string { return fmtMs(r.TTFT.P99) }},
	}
	for _, m := range metrics {
		fmt.Fprintf(w, "\n%s\n", m.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "rate scale\t")
		for _, p := range sw.Points {
			fmt.Fprintf(tw, "x%g\t", p.RateScale)
		}
		fmt.Fprint(tw, "\noffered req/s\t")
		for _, p := range sw.Points {
			fmt.Fprintf(tw, "%.1f\t", p.ArrivalRate)
		}
		fmt.Fprintln(tw)
		for i, name := range sw.policies() {
			fmt.Fprint(tw, name, "\t")
			for _, p := range sw.Points {
				cell := "-"
				if i < len(p.Results) {
					cell = m.cell(p.Results[i])
				}
				fmt.Fprint(tw, cell, "\t")
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, pack([]string{
		"Compare where each policy's goodput falls behind the offered load and its misses and TTFT p99 rise.",
		"SLO: TTFT and TPOT both within the objectives above (unfinished requests miss);",
		"TTFT: time to first token, from arrival;", "TPOT: time per output token after the first;",
		"offered req/s: the arrival rate at that rate scale.",
	}, legendWidth))
	_, err := fmt.Fprintln(w)
	return err
}

// policies returns the policy names of the sweep's rows: those of the
// point with the most results.
func (sw *Sweep) policies() []string {
	var most []*Result
	for _, p := range sw.Points {
		if len(p.Results) > len(most) {
			most = p.Results
		}
	}
	names := make([]string, len(most))
	for i, r := range most {
		names[i] = r.Policy
	}
	return names
}

// WriteSVG draws two stacked plots into one SVG document, against the
// offered load (the rate scale if a point has no measured arrival rate):
// each policy's goodput, with the offered load itself for reference, and
// each policy's TTFT p99 (log-scaled), with the TTFT objective. The legend
// is beside the plots, outside the plot areas.
func (sw *Sweep) WriteSVG(w io.Writer) error {
	if len(sw.Points) == 0 {
		return fmt.Errorf("%w: no sweep points to plot", ErrInvalidConfig)
	}
	xLabel, x := "offered load (requests/s)", func(p SweepPoint) float64 { return p.ArrivalRate }
	for _, p := range sw.Points {
		if !(p.ArrivalRate > 0) {
			xLabel, x = "rate scale", func(p SweepPoint) float64 { return p.RateScale }
			break
		}
	}
	s := &sw.Scenario
	src := fmt.Sprintf("scenario %q", s.Name)
	if s.Trace != "" {
		src = "trace " + s.Trace
	}
	src += fmt.Sprintf("; SLO: TTFT <= %gms, TPOT <= %gms", s.SLOTTFTMs, s.SLOTPOTMs)
	if s.IterTime != "" {
		src += "; iteration time " + s.IterTime
	}
	good := newPlot("Goodput of each policy against offered load\n"+src, xLabel, "goodput (requests/s within the SLO)")
	good.Y.Min = 0
	tail := newPlot("TTFT p99 of each policy against offered load\n"+src, xLabel, "TTFT p99 (ms)")
	tail.Y.Scale = plot.LogScale{}
	tail.Y.Tick.Marker = logTicks{}
	legend := newLegend()

	lo, hi := x(sw.Points[0]), x(sw.Points[len(sw.Points)-1])
	if xLabel != "rate scale" {
		offered, err := plotter.NewLine(plotter.XYs{{X: lo, Y: lo}, {X: hi, Y: hi}})
		if err != nil {
			return fmt.Errorf("sim: plot: %w", err)
		}
		offered.LineStyle = referenceStyle
		good.Add(offered)
		legend.Add("offered load", offered)
	}
	if s.SLOTTFTMs > 0 {
		slo, err := plotter.NewLine(plotter.XYs{{X: lo, Y: s.SLOTTFTMs}, {X: hi, Y: s.SLOTTFTMs}})
		if err != nil {
			return fmt.Errorf("sim: plot: %w", err)
		}
		slo.LineStyle = referenceStyle
		slo.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		tail.Add(slo)
		legend.Add("TTFT objective", slo)
	}
	for i, name := range sw.policies() {
		var gpts, tpts plotter.XYs
		for _, p := range sw.Points {
			if i < len(p.Results) {
				r := p.Results[i]
				gpts = append(gpts, plotter.XY{X: x(p), Y: r.GoodputRPS})
				tpts = append(tpts, plotter.XY{X: x(p), Y: math.Max(r.TTFT.P99, 0.1)})
			}
		}
		var thumbs []plot.Thumbnailer
		for _, pl := range []struct {
			p   *plot.Plot
			pts plotter.XYs
		}{{good, gpts}, {tail, tpts}} {
			l, pts, err := plotter.NewLinePoints(pl.pts)
			if err != nil {
				return fmt.Errorf("sim: plot: %w", err)
			}
			l.LineStyle = policyStyle(i)
			pts.Shape = plotutil.Shape(i)
			pts.Color = l.Color
			pl.p.Add(l, pts)
			thumbs = []plot.Thumbnailer{l, pts}
		}
		legend.Add(name, thumbs...)
	}
	return drawSVG(w, 9*vg.Inch, []*plot.Plot{good, tail}, []*plot.Legend{legend, nil})
}
