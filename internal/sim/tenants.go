package sim

import (
	"cmp"
	"fmt"
	"github.com/llmlb/llmlb/internal/model"
	"io"
	"math"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/llmlb/llmlb/fair"
)

// TenantShare is one tenant of a [Synthetic] workload split among tenants.
type TenantShare struct {
	// Name is the tenant's name, set as [Request].Tenant on its requests.
	Name string
	// Share is the tenant's part of the workload's requests and rate,
	// relative to the other tenants' shares; positive and finite.
	Share float64
	// Class is the priority class of the tenant's requests
	// ([Request].Class); the zero value is [fair.Standard].
	Class fair.Class
}

// validateTenants checks the tenants of a workload.
func validateTenants(ts []TenantShare) error {
	seen := make(map[string]bool, len(ts))
	for _, t := range ts {
		switch {
		case !(t.Share > 0) || math.IsInf(t.Share, 0):
			return fmt.Errorf("%w: tenant %q has share %v, want positive and finite", ErrInvalidWorkload, t.Name, t.Share)
		case seen[t.Name]:
			return fmt.Errorf("%w: tenant %q listed twice", ErrInvalidWorkload, t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// generateTenants generates a workload split among s.Tenants: each tenant
// its part of the requests at its part of the rate, as a workload of its
// own from a seed of its own, merged in arrival order.
func (s Synthetic) generateTenants(seed uint64) ([]Request, error) {
	total := 0.0
	for _, t := range s.Tenants {
		total += t.Share
	}
	if s.Requests < len(s.Tenants) {
		return nil, fmt.Errorf("%w: %d requests for %d tenants, want at least one per tenant", ErrInvalidWorkload, s.Requests, len(s.Tenants))
	}
	counts := apportion(s.Requests, s.Tenants, total)
	var out []Request
	for k, t := range s.Tenants {
		sub := s
		sub.Tenants = nil
		sub.Requests = counts[k]
		sub.Rate = s.Rate * t.Share / total
		reqs, err := sub.Generate(mix64(seed ^ mix64(uint64(k)+0x7e4a47)))
		if err != nil {
			return nil, fmt.Errorf("tenant %q: %w", t.Name, err)
		}
		for i := range reqs {
			reqs[i].Tenant = t.Name
			reqs[i].Class = t.Class
			if reqs[i].Session != "" {
				reqs[i].Session = t.Name + "/" + reqs[i].Session
			}
		}
		out = append(out, reqs...)
	}
	slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return out, nil
}

// apportion splits n requests, at least one per tenant, among the tenants
// in proportion to their shares, which sum to total: by largest remainder,
// so that the parts add up to n, then a request moved to each tenant left
// without one from the tenant with the most.
func apportion(n int, ts []TenantShare, total float64) []int {
	counts := make([]int, len(ts))
	rest := make([]float64, len(ts))
	given := 0
	for k, t := range ts {
		exact := float64(n) * t.Share / total
		counts[k] = int(exact)
		rest[k] = exact - float64(counts[k])
		given += counts[k]
	}
	order := make([]int, len(ts))
	for k := range order {
		order[k] = k
	}
	// The largest remainders first, ties to the tenant listed first.
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rest[b], rest[a]) })
	for _, k := range order[:min(n-given, len(ts))] {
		counts[k]++
	}
	for k := range counts {
		if counts[k] == 0 {
			counts[k]++
			counts[slices.Index(counts, slices.Max(counts))]--
		}
	}
	return counts
}

// TenantResult is the measurement of one tenant's requests in a [Result].
type TenantResult struct {
	// Tenant is the tenant's name ([Request].Tenant).
	Tenant string `json:"tenant"`
	// Requests is the number of the tenant's requests; RequestRate is
	// their rate over the arrival window of the whole workload.
	Requests    int     `json:"requests"`
	RequestRate float64 `json:"request_rate_rps"`
	// Completed, Refused and Missed are the tenant's requests that
	// finished, that the admission control refused, and that did not meet
	// the SLO (refused and unfinished ones included).
	Completed int `json:"completed"`
	Refused   int `json:"refused"`
	Missed    int `json:"missed"`
	// SLOAttainment is the share of the tenant's requests within the SLO.
	SLOAttainment float64 `json:"slo_attainment"`
	// TTFT is the time to first token of the tenant's completed requests,
	// from arrival (waiting for admission included); it reports P50 and
	// P99 only.
	TTFT Latency `json:"ttft_ms"`
	// Tokens is the prompt and output tokens of the tenant's completed
	// requests, and TokenShare its share of all tenants' Tokens: the
	// tenant's part of the service the cluster gave.
	Tokens     int64   `json:"tokens"`
	TokenShare float64 `json:"token_share"`

	ttfts []float64 // sorted, for Merge
	good  int
}

// tenantResults measures each tenant of a run, in name order, or returns
// nil when every request is of the tenant "".
func (r *runner) tenantResults(window float64) []TenantResult {
	if !slices.ContainsFunc(r.reqs, func(q Request) bool { return q.Tenant != "" }) {
		return nil
	}
	byName := make(map[string]*TenantResult)
	for i := range r.st {
		s := &r.st[i]
		t := byName[s.req.Tenant]
		if t == nil {
			t = &TenantResult{Tenant: s.req.Tenant}
			byName[s.req.Tenant] = t
		}
		t.Requests++
		switch s.State() {
		case model.StateRefused:
			t.Refused++
			continue
		case model.StateDone:
		default:
			continue
		}
		t.Completed++
		t.Tokens += int64(s.req.PromptTokens + s.Generated())
		ttft := s.firstToken - s.req.Arrival
		var per time.Duration
		if s.Generated() > 1 {
			per = (s.finished - s.firstToken) / time.Duration(s.Generated()-1)
		}
		t.ttfts = append(t.ttfts, ms(ttft))
		if ttft <= r.cfg.SLO.TTFT && per <= r.cfg.SLO.TPOT {
			t.good++
		}
	}
	out := make([]TenantResult, 0, len(byName))
	for _, t := range byName {
		slices.Sort(t.ttfts)
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b TenantResult) int { return cmp.Compare(a.Tenant, b.Tenant) })
	summarizeTenants(out, window)
	return out
}

// summarizeTenants fills the fields of ts that follow from their counts,
// TTFTs and the arrival window in seconds.
func summarizeTenants(ts []TenantResult, window float64) {
	var tokens int64
	for i := range ts {
		tokens += ts[i].Tokens
	}
	for i := range ts {
		t := &ts[i]
		t.Missed = t.Requests - t.good
		if t.Requests > 0 {
			t.SLOAttainment = float64(t.good) / float64(t.Requests)
		}
		if window > 0 {
			t.RequestRate = float64(t.Requests) / window
		}
		if tokens > 0 {
			t.TokenShare = float64(t.Tokens) / float64(tokens)
		}
		t.TTFT = Latency{P50: quantile(t.ttfts, .5), P99: quantile(t.ttfts, .99)}
	}
}

// mergeTenants pools the tenants of several runs, by name, over their
// summed arrival window in seconds.
func mergeTenants(rs []*Result, window float64) []TenantResult {
	byName := make(map[string]*TenantResult)
	var ttfts = make(map[string][][]float64)
	for _, r := range rs {
		for _, x := range r.Tenants {
			t := byName[x.Tenant]
			if t == nil {
				t = &TenantResult{Tenant: x.Tenant}
				byName[x.Tenant] = t
			}
			t.Requests += x.Requests
			t.Completed += x.Completed
			t.Refused += x.Refused
			t.Tokens += x.Tokens
			t.good += x.good
			ttfts[x.Tenant] = append(ttfts[x.Tenant], x.ttfts)
		}
	}
	if len(byName) == 0 {
		return nil
	}
	out := make([]TenantResult, 0, len(byName))
	for name, t := range byName {
		t.ttfts = sortedConcat(ttfts[name])
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b TenantResult) int { return cmp.Compare(a.Tenant, b.Tenant) })
	summarizeTenants(out, window)
	return out
}

// writeTenantTable writes a row per tenant of each result that measured
// tenants, with an admission column if admission is set and an outputs
// column if outputs is.
func writeTenantTable(w io.Writer, results []*Result, admission, outputs bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "policy\t")
	if admission {
		fmt.Fprint(tw, "admission\t")
	}
	if outputs {
		fmt.Fprint(tw, "outputs\t")
	}
	fmt.Fprint(tw, "tenant\treq/s\tSLO\tmissed\trefused\tTTFT p50\tp99\ttokens\t\n")
	for _, r := range results {
		for _, t := range r.Tenants {
			fmt.Fprint(tw, r.Policy, "\t")
			if admission {
				fmt.Fprint(tw, r.Admission, "\t")
			}
			if outputs {
				fmt.Fprint(tw, cmp.Or(r.Outputs, "untold"), "\t")
			}
			fmt.Fprint(tw, t.Tenant, "\t", strconv.FormatFloat(t.RequestRate, 'f', 1, 64), "\t", fmtPct(t.SLOAttainment), "\t",
				t.Missed, "\t", t.Refused, "\t", fmtMs(t.TTFT.P50), "\t", fmtMs(t.TTFT.P99), "\t", fmtPct(t.TokenShare), "\t\n")
		}
	}
	return tw.Flush()
}

// Figures of the tenants scenario.
const (
	// TenantsCapacity is the request rate, in requests per second, that the
	// default policy serves within the SLO on the default scenario's
	// cluster and lengths.
	TenantsCapacity = 75.0
	// TenantsHeavy and TenantsLight are the demands of the tenants
	// scenario's heavy tenant and of each of its four light ones, as
	// shares of TenantsCapacity: the light tenants' fair share is a fifth.
	TenantsHeavy = 1.5
	TenantsLight = 0.08
	// TenantsDuration is the tenants scenario's arrival window.
	TenantsDuration = 120 * time.Second
)

// TenantsScenario returns the tenants scenario: the default scenario's
// cluster and workload lengths shared by tenant "heavy", whose demand alone
// is TenantsHeavy times TenantsCapacity, and tenants "light-1" to
// "light-4", each TenantsLight of it. It compares, under the default policy:
//
//   - none: no admission control; the heavy tenant's backlog queues in the
//     engines in front of everyone's requests.
//   - rate: every tenant limited to its fair share of the capacity, a fifth,
//     in requests and in tokens per minute, as an API gateway's per-key
//     limits would be set; the excess is refused.
//   - vtc: a [fair.Queue] capping the requests in flight at 64 per
//     replica, about what a replica serves within the SLO, and each
//     tenant's waiting requests at 32, about half a second of the
//     capacity, the excess refused; every request is of one class.
func TenantsScenario() Scenario {
	w := DefaultSynthetic(0, 0)
	// Conversations ramp up over their first turns: the rate is set so
	// that the arrivals over the window average the demands above.
	demand := TenantsCapacity * (TenantsHeavy + 4*TenantsLight)
	w.Rate = demand * tenantsRamp
	w.Requests = int(demand * TenantsDuration.Seconds())
	w.Tenants = []TenantShare{{Name: "heavy", Share: TenantsHeavy}}
	for k := 1; k <= 4; k++ {
		w.Tenants = append(w.Tenants, TenantShare{Name: "light-" + strconv.Itoa(k), Share: TenantsLight})
	}
	const replicas = 8
	share := TenantsCapacity / 5 * 60 // a fair share in requests per minute
	return Scenario{
		Name:     "tenants",
		Doc:      "default, shared by a heavy tenant at 1.5x the capacity and 4 light ones: admission control compared",
		Config:   Config{Replicas: replicas, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}},
		Workload: w,
		Policies: []string{"default"},
		Admissions: []Admission{
			{Name: "none"},
			{Name: "rate", Kind: RateLimit, RPM: share, TPM: share * tenantsMeanTokens},
			{Name: "vtc", Kind: FairQueue, Queue: fair.Config{MaxInFlight: 64 * replicas, MaxWaitingPerPrincipal: 32}},
		},
	}
}

// tenantsRamp and tenantsMeanTokens are measured on the tenants workload
// (seeds 1 to 4): the nominal rate over the demand, so that the mean rate
// of the arrival window is the demand, and the mean prompt and output
// tokens per request.
const (
	tenantsRamp       = 1.55
	tenantsMeanTokens = 3100
)
