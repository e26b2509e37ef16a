package sim

import (
	"cmp"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmlb/llmlb"
)

// legendWidth is the width, in characters, the legends under the tables
// are wrapped to.
const legendWidth = 108

// column is one column of the results table.
type column struct {
	group   string // a measurement several columns show, such as "TTFT"; may be empty
	head    string // header cell, after the group's name in the group's first column shown
	wide    bool   // shown only by [Report.WriteWideTable]
	herding bool   // shown only for a herding scenario ([ScenarioInfo.Herding])
	roomy   bool   // left out of a herding scenario's narrow table, to make room for the skew columns
	admit   bool   // shown only when a result ran under admission control ([Result].Admission)
	outputs bool   // shown only when a result's routers were told output lengths ([Result].Outputs)
	lora    bool   // shown only when the replicas model LoRA adapters ([ScenarioInfo].AdapterSlots)
	pd      bool   // shown only when a result ran disaggregated ([Result].Prefill)
	cell    func(r *Result) string
}

// columns are the columns of the results table, in display order: what to
// compare first, the latencies, then the rest.
var columns = []column{
	{head: "policy", cell: func(r *Result) string { return r.Policy }},
	{head: "split", pd: true, cell: func(r *Result) string {
		if r.Prefill == 0 {
			return "co-located"
		}
		return strconv.Itoa(r.Prefill) + "P+" + strconv.Itoa(r.Decode) + "D"
	}},
	{head: "admission", admit: true, cell: func(r *Result) string { return r.Admission }},
	{head: "outputs", outputs: true, cell: func(r *Result) string { return cmp.Or(r.Outputs, "untold") }},
	{head: "SLO", cell: func(r *Result) string { return fmtPct(r.SLOAttainment) }},
	{head: "missed", cell: func(r *Result) string { return strconv.Itoa(r.Missed) }},
	{head: "refused", admit: true, cell: func(r *Result) string { return strconv.Itoa(r.Refused) }},
	{head: "goodput", cell: func(r *Result) string { return strconv.FormatFloat(r.GoodputRPS, 'f', 2, 64) + "/s" }},
	{group: "TTFT", head: "p50", cell: func(r *Result) string { return fmtMs(r.TTFT.P50) }},
	{group: "TTFT", head: "p95", wide: true, cell: func(r *Result) string { return fmtMs(r.TTFT.P95) }},
	{group: "TTFT", head: "p99", cell: func(r *Result) string { return fmtMs(r.TTFT.P99) }},
	{group: "TTFT", head: "max", wide: true, cell: func(r *Result) string { return fmtMs(r.TTFT.Max) }},
	{group: "TPOT", head: "p50", roomy: true, cell: func(r *Result) string { return fmtMs(r.TPOT.P50) }},
	{group: "TPOT", head: "p99", cell: func(r *Result) string { return fmtMs(r.TPOT.P99) }},
	{group: "E2E", head: "p50", wide: true, cell: func(r *Result) string { return fmtMs(r.E2E.P50) }},
	{group: "E2E", head: "p99", roomy: true, cell: func(r *Result) string { return fmtMs(r.E2E.P99) }},
	{head: "hit", roomy: true, cell: func(r *Result) string { return fmtPct(r.PrefixHitRate) }},
	{head: "tok/s", wide: true, cell: func(r *Result) string { return strconv.FormatFloat(r.OutputTokensPerS, 'f', 0, 64) }},
	{head: "done", wide: true, cell: func(r *Result) string { return strconv.Itoa(r.Completed) }},
	{head: "gap", cell: func(r *Result) string { return strconv.Itoa(r.AssignmentGap) }},
	{head: "preempt", roomy: true, cell: func(r *Result) string { return strconv.Itoa(r.Preemptions) }},
	{head: "loads", lora: true, cell: func(r *Result) string { return strconv.Itoa(r.AdapterLoads) }},
	{head: "local", pd: true, cell: func(r *Result) string {
		if r.Prefill == 0 || r.Requests == 0 {
			return "-"
		}
		return fmtPct(float64(r.Local) / float64(r.Requests))
	}},
	{head: "peak skew", herding: true, cell: func(r *Result) string { return strconv.Itoa(r.PeakSkew) }},
	{head: "mean skew", herding: true, cell: func(r *Result) string { return strconv.FormatFloat(r.MeanSkew, 'f', 2, 64) }},
	{head: "pile-up", herding: true, cell: func(r *Result) string { return fmtPct(r.PileupShare) }},
}

// WriteTable writes the report as an aligned text table of the columns
// that compare policies, about 110 characters wide: a header describing the
// run, one row per policy, and a legend that says what to compare first
// and defines every column. [Report.WriteWideTable] adds the rest.
func (rep *Report) WriteTable(w io.Writer) error {
	return rep.writeTable(w, false)
}

// WriteWideTable is like [Report.WriteTable] with every column: the TTFT
// p95 and maximum, the median E2E latency, the output token throughput
// and the completed requests as well.
func (rep *Report) WriteWideTable(w io.Writer) error {
	return rep.writeTable(w, true)
}

func (rep *Report) writeTable(w io.Writer, wide bool) error {
	s := &rep.Scenario
	src := s.Name
	if s.Trace != "" {
		src = fmt.Sprintf("%s (%s, rate x%g)", s.Trace, s.Format, s.RateScale)
	}
	per := ""
	if s.Seeds > 1 {
		per = " per seed"
	}
	fmt.Fprintf(w, "scenario %s: %s%s at %.1f req/s, %s\n", src, requestCount(s.Requests), per, s.ArrivalRate, s.cluster())
	fmt.Fprintf(w, "%s\nprefix hits: infinite-cache bound %.1f%%, one cluster-sized LRU cache %.1f%%\n\n",
		s.limits(), 100*s.InfiniteCacheHitRate, 100*s.PooledCacheHitRate)

	admitted, told, tenants, pd := false, false, false, false
	for _, r := range rep.Results {
		admitted = admitted || r.Admission != ""
		told = told || r.Outputs != ""
		tenants = tenants || len(r.Tenants) > 0
		pd = pd || r.Prefill > 0
	}
	var shown []column
	have := make(map[string]bool)
	for _, c := range columns {
		if (c.wide || (c.roomy && s.Herding)) && !wide || c.herding && !s.Herding || c.admit && !admitted || c.outputs && !told || c.lora && s.AdapterSlots == 0 || c.pd && !pd {
			continue
		}
		shown = append(shown, c)
		have[strings.TrimSpace(c.group+" "+c.head)] = true
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, c := range shown {
		head := c.head
		if c.group != "" && (i == 0 || shown[i-1].group != c.group) {
			head = c.group + " " + head
		}
		fmt.Fprint(tw, head, "\t")
	}
	fmt.Fprintln(tw)
	for _, r := range rep.Results {
		for _, c := range shown {
			fmt.Fprint(tw, c.cell(r), "\t")
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if tenants {
		fmt.Fprintln(w)
		if err := writeTenantTable(w, rep.Results, admitted, told); err != nil {
			return err
		}
	}

	// Each group starts a line; a definition is never split across lines.
	lat := []string{"TTFT: time to first token, from arrival;"}
	if have["TPOT p50"] || have["TPOT p99"] {
		lat = append(lat, "TPOT: time per output token after the first;")
	}
	if have["E2E p99"] {
		lat = append(lat, "E2E: end-to-end latency, arrival to last token;")
	}
	if have["TTFT p95"] {
		lat = append(lat, "p50, p95, p99: percentiles; max: the largest;")
	} else {
		lat = append(lat, "p50, p99: percentiles;")
	}
	lat = append(lat, "all in ms, in s from 10 s up.")
	var rest []string
	if tenants {
		rest = append(rest, "Per tenant: req/s: its requests per second;", "SLO, missed, refused, TTFT: of its requests;",
			"tokens: its share of the prompt and output tokens of all completed requests;")
	}
	for _, d := range []struct{ col, def string }{
		{"split", "split: co-located, every replica serving whole requests, or the prefill (P) and decode (D) workers of a disaggregated run, whose gap is the larger of its two pools';"},
		{"admission", "admission: the admission control in front of the routers;"},
		{"outputs", fmt.Sprintf("outputs: the decode work charged per request: allowance, a fixed %d tokens;", llmlb.DefaultDecodeAllowance)},
		{"outputs", "predict, the output length learned per route; true, the true output length;"},
		{"refused", "refused: requests it turned away (they count as missed);"},
		{"hit", "hit: share of prompt tokens served from a prefix cache;"},
		{"tok/s", "tok/s: output tokens per second, all replicas together;"},
		{"done", "done: requests completed;"},
		{"gap", "gap: most minus fewest requests per replica;"},
		{"preempt", "preempt: running requests evicted to free KV memory, to be recomputed;"},
		{"loads", "loads: LoRA adapters loaded into a replica's slots, each stalling the replica;"},
		{"local", "local: share of a disaggregated run's requests prefilled on their decode worker;"},
		{"peak skew", "peak skew: largest difference in outstanding requests between the most and the least loaded replica;"},
		{"mean skew", "mean skew: its mean, sampled at every arrival;"},
		{"pile-up", "pile-up: share of scrape windows with two or more arrivals that all went to one replica;"},
	} {
		if have[d.col] {
			rest = append(rest, d.def)
		}
	}
	if n := len(rest); n > 0 {
		rest[n-1] = strings.TrimSuffix(rest[n-1], ";") + "."
	}
	groups := [][]string{
		{"Compare first: SLO and missed, then goodput, then the TTFT tail (TTFT p99)."},
		{"SLO: share of requests that met both objectives above (unfinished ones miss);",
			"missed: requests that did not;", "goodput: requests per second that did, over the arrival window."},
		lat,
		rest,
	}
	fmt.Fprintln(w)
	for _, g := range groups {
		fmt.Fprint(w, pack(g, legendWidth))
	}
	_, err := fmt.Fprintln(w)
	return err
}

// cluster describes the simulated cluster and the seeds for a header line.
func (s *ScenarioInfo) cluster() string {
	seeds := fmt.Sprintf("seed %d", s.Seed)
	if s.Seeds > 1 {
		seeds = fmt.Sprintf("seeds %d-%d pooled", s.Seed, s.Seed+uint64(s.Seeds)-1)
	}
	stagger := ""
	if s.Stagger {
		stagger = " staggered"
	}
	if s.ShareMs > 0 {
		stagger += fmt.Sprintf(", sharing every %v", time.Duration(s.ShareMs*float64(time.Millisecond)))
	}
	scrape := fmt.Sprintf("scrape %v", time.Duration(s.ScrapeMs*float64(time.Millisecond)))
	if s.SignalIntervalMs > 0 {
		scrape = fmt.Sprintf("every policy's signals every %v", time.Duration(s.SignalIntervalMs*float64(time.Millisecond)))
	}
	return fmt.Sprintf("%d replicas, %d router(s), %s%s, %s",
		s.Replicas, s.Routers, scrape, stagger, seeds)
}

// limits describes the SLO, the KV cache and any unequal or declared speeds
// of the replicas, for the header lines.
func (s *ScenarioInfo) limits() string {
	out := fmt.Sprintf("SLO: TTFT <= %gms and TPOT <= %gms; KV %d blocks x %d tokens per replica",
		s.SLOTTFTMs, s.SLOTPOTMs, s.KVBlocks, s.BlockSize)
	if s.AdapterSlots > 0 {
		out += fmt.Sprintf("; %d LoRA adapter slots per replica, %gms per load", s.AdapterSlots, s.AdapterLoadMs)
	}
	if sp := s.speeds(); sp != "" {
		out += "\n" + sp
	}
	if s.IterTime != "" {
		out += "\niteration time: " + s.IterTime
	}
	return out
}

// pack joins units with spaces into lines of at most width characters,
// breaking lines only between units (a longer unit gets a line of its
// own), each line ending in a newline.
func pack(units []string, width int) string {
	var b strings.Builder
	n := 0
	for _, u := range units {
		if n > 0 && n+1+len(u) > width {
			b.WriteByte('\n')
			n = 0
		}
		if n > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(u)
		n += len(u)
	}
	if n > 0 {
		b.WriteByte('\n')
	}
	return b.String()
}

// fmtMs formats a latency in milliseconds: in seconds from 10 s up, with
// three significant digits or so below.
func fmtMs(v float64) string {
	if v >= 10000 {
		return strconv.FormatFloat(v/1000, 'f', 1, 64) + "s"
	}
	if v >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// fmtPct formats a share as a percentage with one decimal.
func fmtPct(v float64) string {
	return strconv.FormatFloat(100*v, 'f', 1, 64) + "%"
}

// requestCount is n requests in words: "1 request", "12000 requests".
func requestCount(n int) string {
	if n == 1 {
		return "1 request"
	}
	return strconv.Itoa(n) + " requests"
}
