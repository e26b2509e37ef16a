package sim

import (
	"fmt"
	"github.com/llmlb/llmlb/internal/model"
	"math"
	"slices"
	"time"
)

// Result is the measurement of one policy on one workload. Latencies are in
// milliseconds. Goodput is per second of the arrival window (first to last
// arrival); output tokens per second is over the run's span, from the first
// arrival to the last completion.
type Result struct {
	// Policy is the name of the policy measured.
	Policy string `json:"policy"`
	// Admission is the name of the admission control in front of the
	// routers ([Admission].Name); empty without one.
	Admission string `json:"admission,omitempty"`
	// Outputs is what the routers knew of output lengths
	// ([OutputKnowledge.String], followed by the quantile charged, such as
	// "predict q0.9", when [Config].Prediction charges one); empty for
	// [OutputsUntold].
	Outputs string `json:"outputs,omitempty"`
	// Prefill and Decode are the prefill and decode workers of a
	// disaggregated run ([Config].Prefill); both are 0 for a co-located
	// one.
	Prefill int `json:"prefill_workers,omitempty"`
	Decode  int `json:"decode_workers,omitempty"`
	// Requests is the number of requests of the workload, rejected ones
	// included.
	Requests int `json:"requests"`
	// Completed is the number of requests that finished.
	Completed int `json:"completed"`
	// Rejected counts requests larger than a replica's whole KV cache.
	Rejected int `json:"rejected"`
	// Refused counts requests the admission control refused
	// ([Config.Admission]).
	Refused int `json:"refused,omitempty"`

	// TTFT is the time to first token of the completed requests, from
	// arrival to the first output token.
	TTFT Latency `json:"ttft_ms"`
	// TPOT is the time per output token after the first of the completed
	// requests, (E2E - TTFT) / (output tokens - 1), and 0 for a one-token
	// output; it reports P50 and P99 only.
	TPOT Latency `json:"tpot_ms"`
	// E2E is the end-to-end latency of the completed requests, from arrival
	// to the last output token; it reports P50 and P99 only.
	E2E Latency `json:"e2e_ms"`

	// SLOAttainment is the share of requests whose TTFT and TPOT are both
	// within the SLO; unfinished requests miss it.
	SLOAttainment float64 `json:"slo_attainment"`
	// Missed is the number of requests that did not meet the SLO:
	// Requests minus those within it, so unfinished and rejected requests
	// count.
	Missed int `json:"missed"`
	// GoodputRPS is the number of requests meeting the SLO per second of
	// the arrival window (first to last arrival).
	GoodputRPS float64 `json:"goodput_rps"`
	// PrefixHitRate is the share of prompt tokens served from a replica's
	// prefix cache at the request's first admission.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// OutputTokensPerS is the number of tokens generated for the completed
	// requests per second of SpanSeconds.
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// AssignmentGap is the largest minus the smallest number of requests
	// assigned to a replica.
	AssignmentGap int `json:"assignment_gap"`
	// Preemptions is the number of times a replica preempted a running
	// sequence to free KV blocks, summed over the replicas.
	Preemptions int `json:"preemptions"`
	// AdapterLoads is the number of LoRA adapters the replicas loaded into
	// their slots ([Engine].AdapterSlots), each stalling its replica.
	AdapterLoads int `json:"adapter_loads,omitempty"`
	// Local counts the requests of a disaggregated run that prefilled on
	// their decode worker ([llmlb.DisaggConfig].LocalPrefillTokens).
	Local int `json:"local_prefills,omitempty"`

	// PeakSkew and MeanSkew are the largest and the mean difference between
	// the most and the least loaded replica in outstanding requests, sampled
	// at every arrival. PileupShare is the share of scrape windows with at
	// least two arrivals in which every arrival went to one replica.
	PeakSkew    int     `json:"peak_skew"`
	MeanSkew    float64 `json:"mean_skew"`
	PileupShare float64 `json:"pileup_share"`

	// SpanSeconds is the simulated span the rates are computed over.
	SpanSeconds float64 `json:"span_s"`

	// Tenants measures each tenant's requests apart, in name order, when
	// the workload's requests carry tenants ([Request].Tenant).
	Tenants []TenantResult `json:"tenants,omitempty"`

	// TTFTs holds every completed request's TTFT in milliseconds, sorted.
	TTFTs []float64 `json:"-"`
	// Series is the outstanding requests of each replica over time, at
	// most 1024 samples (see Config.Series).
	Series []Sample `json:"-"`

	// raw holds what [Merge] pools; it is nil in a Result decoded from
	// JSON.
	raw *rawResult
}

// rawResult is a run's per-request data and the sums behind its rates.
type rawResult struct {
	tpots, e2es            []float64 // sorted, like TTFTs
	good                   int
	window                 float64 // arrival window in seconds
	prompt, cached, output int64
	skewSum                float64
	skewN                  int
	windows, pileups       int
}

// Latency summarizes a latency distribution in milliseconds. Fields that a
// measurement does not report are zero.
type Latency struct {
	// P50 is the median, by the nearest-rank method like the other
	// percentiles.
	P50 float64 `json:"p50"`
	// P95 is the 95th percentile.
	P95 float64 `json:"p95,omitempty"`
	// P99 is the 99th percentile.
	P99 float64 `json:"p99"`
	// Max is the largest latency.
	Max float64 `json:"max,omitempty"`
}

// Sample is the number of outstanding requests of every replica at one
// instant.
type Sample struct {
	// At is the simulated time of the sample, from the start of the run.
	At time.Duration
	// Outstanding holds, for each replica in index order, the requests
	// dispatched to it that have not finished.
	Outstanding []int
}

// quantile returns the q-quantile of sorted xs by the nearest-rank method.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *runner) result(policy string) *Result {
	res := &Result{Policy: policy, Admission: r.cfg.Admission.Name, Outputs: r.cfg.outputsLabel(), Requests: len(r.reqs)}
	ttft := make([]float64, 0, len(r.reqs))
	tpot := make([]float64, 0, len(r.reqs))
	e2e := make([]float64, 0, len(r.reqs))
	var prompt, cached, output int64
	good := 0
	first := r.reqs[0].Arrival
	last := first
	for i := range r.st {
		s := &r.st[i]
		prompt += int64(s.req.PromptTokens)
		if s.pd != nil && s.pd.prefill >= 0 {
			cached += int64(s.pd.pre.Cached()) // the prompt was computed there
		} else {
			cached += int64(s.Cached())
		}
		if s.pd != nil && s.pd.prefill < 0 {
			res.Local++
		}
		switch s.State() {
		case model.StateRejected:
			res.Rejected++
			continue
		case model.StateRefused:
			res.Refused++
			continue
		case model.StateDone:
		default:
			continue
		}
		res.Completed++
		output += int64(s.Generated())
		last = max(last, s.finished)
		t := s.firstToken - s.req.Arrival
		var per time.Duration
		if s.Generated() > 1 {
			per = (s.finished - s.firstToken) / time.Duration(s.Generated()-1)
		}
		ttft = append(ttft, ms(t))
		tpot = append(tpot, ms(per))
		e2e = append(e2e, ms(s.finished-s.req.Arrival))
		if t <= r.cfg.SLO.TTFT && per <= r.cfg.SLO.TPOT {
			good++
		}
	}
	slices.Sort(ttft)
	slices.Sort(tpot)
	slices.Sort(e2e)
	res.TTFT = Latency{P50: quantile(ttft, .5), P95: quantile(ttft, .95), P99: quantile(ttft, .99), Max: quantile(ttft, 1)}
	res.TPOT = Latency{P50: quantile(tpot, .5), P99: quantile(tpot, .99)}
	res.E2E = Latency{P50: quantile(e2e, .5), P99: quantile(e2e, .99)}
	span := (last - first).Seconds()
	res.SpanSeconds = span
	res.SLOAttainment = float64(good) / float64(len(r.reqs))
	res.Missed = len(r.reqs) - good
	// Goodput is over the arrival window, the same for every policy on one
	// trace, so that it ranks policies by the requests they serve within the
	// SLO and not by when their last straggler finishes.
	window := (r.reqs[len(r.reqs)-1].Arrival - first).Seconds()
	if window <= 0 {
		window = span
	}
	if window > 0 {
		res.GoodputRPS = float64(good) / window
	}
	if span > 0 {
		res.OutputTokensPerS = float64(output) / span
	}
	if prompt > 0 {
		res.PrefixHitRate = float64(cached) / float64(prompt)
	}
	for _, rep := range r.reps {
		res.Preemptions += int(rep.Stats().Preemptions)
		res.AdapterLoads += int(rep.Stats().AdapterLoads)
	}
	if r.routers[0].dis != nil {
		// The gap within each pool: a prefill worker serves more requests
		// than a decode worker by design.
		p := r.cfg.Prefill
		res.Prefill, res.Decode = p, r.cfg.Replicas-p
		res.AssignmentGap = max(assignmentGap(r.reps[:p]), assignmentGap(r.reps[p:]))
	} else {
		res.AssignmentGap = assignmentGap(r.reps)
	}
	res.PeakSkew = r.skewPeak
	if r.skewN > 0 {
		res.MeanSkew = r.skewSum / float64(r.skewN)
	}
	if r.windows > 0 {
		res.PileupShare = float64(r.pileups) / float64(r.windows)
	}
	res.Tenants = r.tenantResults(window)
	res.TTFTs = ttft
	res.Series = r.samples
	res.raw = &rawResult{
		tpots: tpot, e2es: e2e, good: good, window: window,
		prompt: prompt, cached: cached, output: output,
		skewSum: r.skewSum, skewN: r.skewN, windows: r.windows, pileups: r.pileups,
	}
	return res
}

// assignmentGap returns the most minus the fewest requests assigned to one
// of reps.
func assignmentGap(reps []*replica) int {
	lo, hi := reps[0].assigned, reps[0].assigned
	for _, rep := range reps {
		lo, hi = min(lo, rep.assigned), max(hi, rep.assigned)
	}
	return hi - lo
}

// Merge pools the results of one policy on several runs, such as one
// workload under several seeds, as if they were a single run: latency
// quantiles and SLO attainment over every request of every run, the hit rate
// over every prompt token, goodput and throughput over the runs' summed
// arrival windows and spans, preemptions summed, and the assignment gap and
// peak skew the largest of any run, and each tenant's figures pooled the
// same way. Series is the first run's. The results must name the same
// policy, admission control, output knowledge and split into prefill and
// decode workers and come from this process's simulations: one decoded
// from JSON holds no per-request data.
// Merge does not modify them.
func Merge(rs ...*Result) (*Result, error) {
	if len(rs) == 0 {
		return nil, fmt.Errorf("%w: no results to merge", ErrInvalidConfig)
	}
	for _, r := range rs {
		switch {
		case r == nil:
			return nil, fmt.Errorf("%w: nil result", ErrInvalidConfig)
		case r.raw == nil:
			return nil, fmt.Errorf("%w: result for %q holds no per-request data (decoded, not simulated)", ErrInvalidConfig, r.Policy)
		case r.Policy != rs[0].Policy:
			return nil, fmt.Errorf("%w: cannot merge results of %q and %q", ErrInvalidConfig, rs[0].Policy, r.Policy)
		case r.Admission != rs[0].Admission:
			return nil, fmt.Errorf("%w: cannot merge results of %q under admission %q and %q", ErrInvalidConfig, r.Policy, rs[0].Admission, r.Admission)
		case r.Outputs != rs[0].Outputs:
			return nil, fmt.Errorf("%w: cannot merge results of %q with outputs %q and %q", ErrInvalidConfig, r.Policy, rs[0].Outputs, r.Outputs)
		case r.Prefill != rs[0].Prefill || r.Decode != rs[0].Decode:
			return nil, fmt.Errorf("%w: cannot merge results of %q with %d+%d and %d+%d prefill and decode workers", ErrInvalidConfig, r.Policy, rs[0].Prefill, rs[0].Decode, r.Prefill, r.Decode)
		}
	}
	out := &Result{Policy: rs[0].Policy, Admission: rs[0].Admission, Outputs: rs[0].Outputs, Prefill: rs[0].Prefill, Decode: rs[0].Decode, Series: rs[0].Series, raw: &rawResult{}}
	m := out.raw
	var ttft, tpot, e2e [][]float64
	for _, r := range rs {
		x := r.raw
		out.Requests += r.Requests
		out.Completed += r.Completed
		out.Rejected += r.Rejected
		out.Refused += r.Refused
		out.Preemptions += r.Preemptions
		out.AdapterLoads += r.AdapterLoads
		out.Local += r.Local
		out.AssignmentGap = max(out.AssignmentGap, r.AssignmentGap)
		out.PeakSkew = max(out.PeakSkew, r.PeakSkew)
		out.SpanSeconds += r.SpanSeconds
		ttft, tpot, e2e = append(ttft, r.TTFTs), append(tpot, x.tpots), append(e2e, x.e2es)
		m.good += x.good
		m.window += x.window
		m.prompt += x.prompt
		m.cached += x.cached
		m.output += x.output
		m.skewSum += x.skewSum
		m.skewN += x.skewN
		m.windows += x.windows
		m.pileups += x.pileups
	}
	out.TTFTs, m.tpots, m.e2es = sortedConcat(ttft), sortedConcat(tpot), sortedConcat(e2e)
	out.Tenants = mergeTenants(rs, m.window)
	out.TTFT = Latency{P50: quantile(out.TTFTs, .5), P95: quantile(out.TTFTs, .95), P99: quantile(out.TTFTs, .99), Max: quantile(out.TTFTs, 1)}
	out.TPOT = Latency{P50: quantile(m.tpots, .5), P99: quantile(m.tpots, .99)}
	out.E2E = Latency{P50: quantile(m.e2es, .5), P99: quantile(m.e2es, .99)}
	if out.Requests > 0 {
		out.SLOAttainment = float64(m.good) / float64(out.Requests)
	}
	out.Missed = out.Requests - m.good
	if m.window > 0 {
		out.GoodputRPS = float64(m.good) / m.window
	}
	if out.SpanSeconds > 0 {
		out.OutputTokensPerS = float64(m.output) / out.SpanSeconds
	}
	if m.prompt > 0 {
		out.PrefixHitRate = float64(m.cached) / float64(m.prompt)
	}
	if m.skewN > 0 {
		out.MeanSkew = m.skewSum / float64(m.skewN)
	}
	if m.windows > 0 {
		out.PileupShare = float64(m.pileups) / float64(m.windows)
	}
	return out, nil
}

func sortedConcat(xs [][]float64) []float64 {
	var out []float64
	for _, x := range xs {
		out = append(out, x...)
	}
	slices.Sort(out)
	return out
}
