package sim

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WriteSVG draws two stacked plots into one SVG document: the TTFT CDF of
// every policy (log-scaled time axis), and the outstanding requests of each
// replica over time under the policy named series (the first result if
// series is empty or unknown), in the first seed's run when seeds are
// pooled, which the title then says. Each plot's legend is beside it, outside
// the plot area. The legend tells apart a policy's runs under several
// splits, admission controls or knowledges of output lengths. When no
// request completed, the CDF plot is empty and its title says so.
func (rep *Report) WriteSVG(w io.Writer, series string) error {
	if len(rep.Results) == 0 {
		return fmt.Errorf("%w: no results to plot", ErrInvalidConfig)
	}
	cdf := newPlot(fmt.Sprintf("TTFT CDF of each policy: %s", rep.Scenario.source()),
		"TTFT (ms)", "share of requests")
	cdf.X.Scale = plot.LogScale{}
	cdf.X.Tick.Marker = logTicks{}
	cdfLegend := newLegend()
	lines := 0
	for i, r := range rep.Results {
		pts := cdfPoints(r.TTFTs, r.Requests, 400)
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("sim: plot: %w", err)
		}
		l.LineStyle = policyStyle(i)
		cdf.Add(l)
		cdfLegend.Add(r.label(), l)
		lines++
	}
	if lines == 0 {
		// No TTFT to plot: a log scale needs a positive range, which no
		// data gives it.
		cdf.Title.Text += "\nno request completed"
		cdf.X.Min, cdf.X.Max = 1, max(rep.Scenario.SLOTTFTMs, 10)
		cdf.Y.Min, cdf.Y.Max = 0, 1
	}

	pick := rep.Results[0]
	for _, r := range rep.Results {
		if r.Policy == series {
			pick = r
		}
	}
	title := fmt.Sprintf("Outstanding requests of each replica under policy %s", pick.label())
	if rep.Scenario.Seeds > 1 {
		// Merge keeps the first run's series: a series is not pooled.
		title += fmt.Sprintf(", seed %d (the first of %d pooled)", rep.Scenario.Seed, rep.Scenario.Seeds)
	}
	out := newPlot(title, "time (s)", "outstanding requests")
	outLegend := newLegend()
	if len(pick.Series) > 0 {
		for j := range pick.Series[0].Outstanding {
			pts := make(plotter.XYs, len(pick.Series))
			for k, s := range pick.Series {
				pts[k] = plotter.XY{X: s.At.Seconds(), Y: float64(s.Outstanding[j])}
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("sim: plot: %w", err)
			}
			l.LineStyle = policyStyle(j)
			l.Width = vg.Points(1)
			out.Add(l)
			outLegend.Add("replica "+strconv.Itoa(j), l)
		}
	}
	return drawSVG(w, 10*vg.Inch, []*plot.Plot{cdf, out}, []*plot.Legend{cdfLegend, outLegend})
}

// label names r in a plot: its policy, then its split into prefill and
// decode workers, admission control and knowledge of output lengths, those
// it has, which tell apart the runs of one policy as the table's columns
// do.
func (r *Result) label() string {
	s := r.Policy
	if r.Prefill > 0 {
		s += fmt.Sprintf(", %dP+%dD", r.Prefill, r.Decode)
	}
	if r.Admission != "" {
		s += ", admission " + r.Admission
	}
	if r.Outputs != "" {
		s += ", outputs " + r.Outputs
	}
	return s
}

// source names the workload of a run for a plot title: the scenario and
// its arrival rate, or the trace file and its rate scale.
func (s *ScenarioInfo) source() string {
	if s.Trace != "" {
		return fmt.Sprintf("trace %s, rate x%g, %.1f req/s", s.Trace, s.RateScale, s.ArrivalRate)
	}
	return fmt.Sprintf("scenario %q, %.1f req/s", s.Name, s.ArrivalRate)
}

// newPlot returns a plot with a grid and the given title and axis labels.
func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Add(plotter.NewGrid())
	return p
}

// newLegend returns an empty legend for [drawSVG] to draw beside a plot.
func newLegend() *plot.Legend {
	l := plot.NewLegend()
	l.TextStyle.Font = font.From(plot.DefaultFont, vg.Points(10))
	l.Top, l.Left = true, true
	l.Padding = vg.Points(2)
	return &l
}

// policyStyle is the line style of the i-th policy or replica: a color,
// and after every color was used once, a dash pattern.
func policyStyle(i int) draw.LineStyle {
	return draw.LineStyle{
		Color:  plotutil.Color(i),
		Dashes: plotutil.Dashes(i / len(plotutil.DefaultColors)),
		Width:  vg.Points(1.2),
	}
}

// referenceStyle is the line style of a reference line, such as an
// objective.
var referenceStyle = draw.LineStyle{
	Color:  color.Gray{Y: 110},
	Dashes: []vg.Length{vg.Points(2), vg.Points(3)},
	Width:  vg.Points(1),
}

// drawSVG writes an SVG document 8 inches wide and height high with plots
// stacked top to bottom, their plot areas aligned, and the legend of each,
// if not nil, in a column to the right of all plots (see [layout]).
func drawSVG(w io.Writer, height vg.Length, plots []*plot.Plot, legends []*plot.Legend) error {
	img := vgsvg.New(8*vg.Inch, height)
	plotCs, legendCs := layout(draw.New(img), plots, legends)
	for i, p := range plots {
		p.Draw(plotCs[i])
		if i < len(legends) && legends[i] != nil {
			legends[i].Draw(legendCs[i])
		}
	}
	_, err := img.WriteTo(w)
	return err
}

// layout splits dc into a canvas for each of plots, stacked top to bottom
// with their plot areas aligned, and a canvas for each legend in a column
// to the right of all of them, its top level with the top of the plot's
// data area, so that no legend covers data.
func layout(dc draw.Canvas, plots []*plot.Plot, legends []*plot.Legend) (plotCs, legendCs []draw.Canvas) {
	const pad = 2 * vg.Millimeter
	var legendW vg.Length
	for _, l := range legends {
		if l != nil {
			legendW = max(legendW, l.Rectangle(draw.Canvas{}).Size().X)
		}
	}
	if legendW > 0 {
		// A viewer without the SVG's font draws wider text than
		// measured here: leave it room.
		legendW = legendW*5/4 + 4*vg.Millimeter
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: 6 * vg.Millimeter,
		PadTop: pad, PadBottom: pad, PadLeft: pad, PadRight: pad}
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	aligned := plot.Align(grid, tiles, draw.Crop(dc, 0, -legendW, 0, 0))
	plotCs = make([]draw.Canvas, len(plots))
	legendCs = make([]draw.Canvas, len(legends))
	for i := range plots {
		plotCs[i] = aligned[i][0]
		if i < len(legends) {
			strip := draw.Crop(dc, dc.Max.X-dc.Min.X-legendW+pad, 0, 0, 0)
			strip.Max.Y = plots[i].DataCanvas(plotCs[i]).Max.Y
			legendCs[i] = strip
		}
	}
	return plotCs, legendCs
}

// logTicks marks a log-scaled axis at 1, 2 and 5 times each power of ten,
// labeled, and at the other integer multiples, unlabeled.
type logTicks struct{}

// Ticks returns the ticks between lo and hi.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi >= lo) || math.IsInf(hi, 0) {
		return nil
	}
	var ticks []plot.Tick
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for m := 1; m < 10; m++ {
			v := float64(m) * p
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// cdfPoints returns at most n points of the empirical CDF of sorted xs, as a
// share of total requests (so unfinished requests keep the curve below 1).
func cdfPoints(xs []float64, total, n int) plotter.XYs {
	if len(xs) == 0 || total == 0 {
		return nil
	}
	step := max(1, len(xs)/n)
	pts := make(plotter.XYs, 0, len(xs)/step+2)
	for i := 0; i < len(xs); i += step {
		pts = append(pts, plotter.XY{X: math.Max(xs[i], 0.1), Y: float64(i+1) / float64(total)})
	}
	pts = append(pts, plotter.XY{X: math.Max(xs[len(xs)-1], 0.1), Y: float64(len(xs)) / float64(total)})
	return pts
}
