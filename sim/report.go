package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Report is the outcome of comparing policies on one workload, in the JSON
// shape written by [Report.WriteJSON].
type Report struct {
	// Scenario describes the run.
	Scenario ScenarioInfo `json:"scenario"`
	// Results holds one result per policy, in the order the policies were
	// compared.
	Results []*Result `json:"results"`
}

// ScenarioInfo describes the run a report measured.
type ScenarioInfo struct {
	// Name is the name of the scenario or, for a replayed trace, what the
	// caller calls it. Like Trace, Format and RateScale, it is the
	// caller's to set; [ScenarioInfo.Describe] leaves them alone.
	Name string `json:"name"`
	// Trace is the file name of a replayed trace; empty for a synthetic
	// workload.
	Trace string `json:"trace,omitempty"`
	// Format is the trace's format, such as [FormatMooncake].
	Format string `json:"format,omitempty"`
	// RateScale is the factor the trace's arrival rate was multiplied by
	// ([TraceOptions.RateScale]).
	RateScale float64 `json:"rate_scale,omitempty"`
	// Requests is the number of requests of the workload.
	Requests int `json:"requests"`
	// ArrivalRate is the mean arrival rate in requests per second: the
	// requests after the first over the time from the first arrival to the
	// last; 0 for fewer than two requests or arrivals all at one instant.
	ArrivalRate float64 `json:"arrival_rate_rps"`
	// Replicas and Routers are [Config.Replicas] and [Config.Routers],
	// defaults filled in.
	Replicas int `json:"replicas"`
	Routers  int `json:"routers"`
	// ScrapeMs is [Config.Scrape] in milliseconds, default filled in.
	ScrapeMs float64 `json:"scrape_ms"`
	// Stagger is [Config.Stagger].
	Stagger bool `json:"stagger"`
	// Seed is [Config.Seed], the first seed when Seeds is above 1.
	Seed uint64 `json:"seed"`
	// Seeds, when above 1, is the number of seeds pooled, from Seed on:
	// each result then merges one run per seed (see [Merge]), and Requests,
	// ArrivalRate and the hit-rate references describe one run on average.
	Seeds int `json:"seeds,omitempty"`
	// SLOTTFTMs and SLOTPOTMs are the bounds of [Config.SLO] in
	// milliseconds, defaults filled in.
	SLOTTFTMs float64 `json:"slo_ttft_ms"`
	SLOTPOTMs float64 `json:"slo_tpot_ms"`
	// KVBlocks, BlockSize, TokenBudget and MaxRunning are the fields of
	// the same names of every replica's [Engine], defaults filled in.
	KVBlocks    int `json:"kv_blocks"`
	BlockSize   int `json:"block_size"`
	TokenBudget int `json:"token_budget"`
	MaxRunning  int `json:"max_running"`
	// InfiniteCacheHitRate bounds every policy's prefix hit rate (see
	// [InfiniteCacheHitRate]).
	InfiniteCacheHitRate float64 `json:"infinite_cache_hit_rate"`
	// PooledCacheHitRate is what one LRU cache as large as all replicas'
	// KV caches together would reach (see [PooledCacheHitRate]).
	PooledCacheHitRate float64 `json:"pooled_cache_hit_rate"`
	// Herding asks the table for the skew columns.
	Herding bool `json:"herding,omitempty"`
}

// Describe fills the fields of info that follow from cfg and reqs.
func (info *ScenarioInfo) Describe(cfg Config, reqs []Request) error {
	if err := cfg.normalize(); err != nil {
		return err
	}
	info.Requests = len(reqs)
	if n := len(reqs); n > 1 {
		if span := (reqs[n-1].Arrival - reqs[0].Arrival).Seconds(); span > 0 {
			info.ArrivalRate = float64(n-1) / span
		}
	}
	info.Replicas, info.Routers = cfg.Replicas, cfg.Routers
	info.ScrapeMs, info.Stagger, info.Seed = ms(cfg.Scrape), cfg.Stagger, cfg.Seed
	info.SLOTTFTMs, info.SLOTPOTMs = ms(cfg.SLO.TTFT), ms(cfg.SLO.TPOT)
	info.KVBlocks, info.BlockSize = cfg.Engine.KVBlocks, cfg.Engine.BlockSize
	info.TokenBudget, info.MaxRunning = cfg.Engine.TokenBudget, cfg.Engine.MaxRunning
	info.InfiniteCacheHitRate = InfiniteCacheHitRate(reqs)
	info.PooledCacheHitRate = PooledCacheHitRate(reqs, cfg.Replicas*cfg.Engine.KVBlocks*cfg.Engine.BlockSize)
	return nil
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteTable writes the report as an aligned text table: a header line
// describing the run, then one row per policy.
func (rep *Report) WriteTable(w io.Writer) error {
	s := &rep.Scenario
	src := s.Name
	if s.Trace != "" {
		src = fmt.Sprintf("%s (%s, rate x%g)", s.Trace, s.Format, s.RateScale)
	}
	seeds, per := fmt.Sprintf("seed %d", s.Seed), ""
	if s.Seeds > 1 {
		seeds, per = fmt.Sprintf("seeds %d-%d pooled", s.Seed, s.Seed+uint64(s.Seeds)-1), " per seed"
	}
	fmt.Fprintf(w, "scenario %s: %d requests%s at %.1f req/s, %d replicas, %d router(s), scrape %v%s, %s\n",
		src, s.Requests, per, s.ArrivalRate, s.Replicas, s.Routers, time.Duration(s.ScrapeMs*float64(time.Millisecond)),
		map[bool]string{true: " staggered", false: ""}[s.Stagger], seeds)
	fmt.Fprintf(w, "SLO: TTFT <= %gms and TPOT <= %gms; KV %d blocks x %d tokens; prefix hits: infinite-cache bound %.1f%%, one cluster-sized LRU cache %.1f%%\n\n",
		s.SLOTTFTMs, s.SLOTPOTMs, s.KVBlocks, s.BlockSize, 100*s.InfiniteCacheHitRate, 100*s.PooledCacheHitRate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\tdone\tTTFT p50\tp95\tp99\tmax\tTPOT p50\tp99\tE2E p50\tp99\tSLO\tmissed\tgoodput\thit\ttok/s\tgap\tpreempt\t"
	if s.Herding {
		head += "peak skew\tmean skew\tpile-up\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%d\t%.2f/s\t%.1f%%\t%.0f\t%d\t%d\t",
			r.Policy, r.Completed,
			fmtMs(r.TTFT.P50), fmtMs(r.TTFT.P95), fmtMs(r.TTFT.P99), fmtMs(r.TTFT.Max),
			fmtMs(r.TPOT.P50), fmtMs(r.TPOT.P99), fmtMs(r.E2E.P50), fmtMs(r.E2E.P99),
			100*r.SLOAttainment, r.Requests-int(math.Round(r.SLOAttainment*float64(r.Requests))), r.GoodputRPS, 100*r.PrefixHitRate, r.OutputTokensPerS, r.AssignmentGap, r.Preemptions)
		if s.Herding {
			fmt.Fprintf(tw, "%d\t%.2f\t%.1f%%\t", r.PeakSkew, r.MeanSkew, 100*r.PileupShare)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\nlatencies in ms (s when >= 10 s); SLO = share of requests within both SLOs; missed = requests outside them;\ngoodput = requests within both SLOs per second; hit = prompt tokens served from prefix cache;\ngap = max - min requests per replica; preempt = KV preemptions")
	fmt.Fprintln(w)
	return err
}

func fmtMs(v float64) string {
	if v >= 10000 {
		return strconv.FormatFloat(v/1000, 'f', 1, 64) + "s"
	}
	if v >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// WriteSVG draws two stacked plots into one SVG document: the TTFT CDF of
// every policy (log-scaled time axis), and the outstanding requests of each
// replica over time under the policy named series (the first result if
// series is empty or unknown).
func (rep *Report) WriteSVG(w io.Writer, series string) error {
	if len(rep.Results) == 0 {
		return fmt.Errorf("%w: no results to plot", ErrInvalidConfig)
	}
	cdf := plot.New()
	cdf.Title.Text = "TTFT CDF (" + rep.Scenario.Name + ")"
	cdf.X.Label.Text = "TTFT (ms)"
	cdf.Y.Label.Text = "share of requests"
	cdf.X.Scale = plot.LogScale{}
	cdf.X.Tick.Marker = plot.LogTicks{Prec: -1}
	cdf.Legend.Top, cdf.Legend.Left = false, false
	cdf.Add(plotter.NewGrid())
	for i, r := range rep.Results {
		pts := cdfPoints(r.TTFTs, r.Requests, 400)
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("sim: plot: %w", err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		l.Width = vg.Points(1.2)
		cdf.Add(l)
		cdf.Legend.Add(r.Policy, l)
	}

	pick := rep.Results[0]
	for _, r := range rep.Results {
		if r.Policy == series {
			pick = r
		}
	}
	out := plot.New()
	out.Title.Text = "outstanding requests per replica (" + pick.Policy + ")"
	out.X.Label.Text = "time (s)"
	out.Y.Label.Text = "requests"
	out.Add(plotter.NewGrid())
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
			l.Color = plotutil.Color(j)
			out.Add(l)
			out.Legend.Add("replica "+strconv.Itoa(j), l)
		}
	}
	out.Legend.Top = true

	const width, height = 8 * vg.Inch, 10 * vg.Inch
	img := vgsvg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align([][]*plot.Plot{{cdf}, {out}}, tiles, dc)
	cdf.Draw(canvases[0][0])
	out.Draw(canvases[1][0])
	_, err := img.WriteTo(w)
	return err
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
