package sim

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// PoolScenarios returns the presets of deployments behind APIs that the
// llmlb-sim command runs by name: providers (one model on four managed
// deployments with rate limits and latency spikes, routed by several
// policies with and without cooldowns) and spill (a self-hosted pool with
// a managed provider to spill to, against the pool alone and one pool over
// both) and spill-queue8 (the same with servers that let 8 requests wait,
// not 2).
func PoolScenarios() []PoolScenario {
	deep := spillScenario()
	deep.Name = "spill-queue8"
	for i := range deep.Tiers[0] {
		deep.Tiers[0][i].QueueLimit = 8
	}
	return []PoolScenario{providersScenario(), spillScenario(), deep}
}

// LookupPoolScenario returns the preset of [PoolScenarios] named name.
func LookupPoolScenario(name string) (PoolScenario, bool) {
	for _, s := range PoolScenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return PoolScenario{}, false
}

// chatWorkload is the traffic of both pool presets at the given rates:
// ten minutes, prompts of a few hundred to a few thousand tokens (median
// 1000), heavy-tailed outputs (median 150 tokens, mean about 250).
func chatWorkload(rate float64, bursts ...PoolBurst) PoolWorkload {
	return PoolWorkload{
		Duration: 10 * time.Minute, Rate: rate, Bursts: bursts,
		PromptMedian: 1000, PromptSigma: 0.8,
		OutputMedian: 150, OutputSigma: 1,
	}
}

// providerDeployment is a managed deployment with room for 64 requests at
// once, a rate limit of rpm, and a latency spike (5x) of 10 s about once a
// minute.
func providerDeployment(name string, rpm float64, ttft, perToken time.Duration) Deployment {
	return Deployment{
		Name: name, Concurrency: 64, RPM: rpm,
		TTFT: ttft, PerPromptToken: 100 * time.Microsecond, PerOutputToken: perToken,
		SpikeEvery: time.Minute, SpikeLength: 10 * time.Second, SpikeFactor: 5,
	}
}

// providersScenario: one model on four managed deployments of unequal
// speed and quota, 1200 requests per minute in all, one of which runs out
// of quota for two minutes and asks for an hour's wait meanwhile.
func providersScenario() PoolScenario {
	d := []Deployment{
		providerDeployment("east", 360, 300*time.Millisecond, 20*time.Millisecond),
		providerDeployment("west", 360, 400*time.Millisecond, 25*time.Millisecond),
		providerDeployment("fast", 240, 250*time.Millisecond, 15*time.Millisecond),
		providerDeployment("slow", 240, 500*time.Millisecond, 30*time.Millisecond),
	}
	d[3].Exhausted.From, d[3].Exhausted.To = 5*time.Minute, 7*time.Minute
	d[3].ExhaustedRetryAfter = time.Hour
	var rs []PoolRouting
	for _, cool := range []bool{false, true} {
		for _, p := range []string{"round-robin", "least-outstanding", "peak-ewma"} {
			rs = append(rs, PoolRouting{Name: p, Policies: []string{p}, Cooldown: cool})
		}
	}
	for _, p := range []string{"least-outstanding", "peak-ewma"} {
		rs = append(rs, PoolRouting{Name: p + ", RPM weights", Policies: []string{p}, Cooldown: true, Weights: true})
	}
	rs = append(rs, PoolRouting{Name: "peak-ewma, quota headroom", Policies: []string{"peak-ewma-quota"}, Cooldown: true})
	return PoolScenario{
		Name:  "providers",
		Tiers: [][]Deployment{d},
		Workload: chatWorkload(12,
			PoolBurst{From: 2 * time.Minute, To: 2*time.Minute + 30*time.Second, Rate: 24},
			PoolBurst{From: 6 * time.Minute, To: 6*time.Minute + 30*time.Second, Rate: 24}),
		Routings:    rs,
		MaxCooldown: time.Minute,
		SLO:         SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond},
	}
}

// spillScenario: four self-hosted servers (16 requests at once, 2
// waiting, then 429 with Retry-After: 1: a full queue waits well under the
// TTFT objective) in front of two deployments of a managed provider (300
// requests per minute each), under traffic that bursts past the
// self-hosted capacity twice.
func spillScenario() PoolScenario {
	var own []Deployment
	for i := range 4 {
		own = append(own, Deployment{
			Name: "gpu-" + strconv.Itoa(i), Concurrency: 16, QueueLimit: 2,
			TTFT: 150 * time.Millisecond, PerPromptToken: 50 * time.Microsecond, PerOutputToken: 25 * time.Millisecond,
		})
	}
	api := []Deployment{
		providerDeployment("api-east", 300, 400*time.Millisecond, 20*time.Millisecond),
		providerDeployment("api-west", 300, 400*time.Millisecond, 20*time.Millisecond),
	}
	return PoolScenario{
		Name:  "spill",
		Tiers: [][]Deployment{own, api},
		Workload: chatWorkload(7,
			PoolBurst{From: 2 * time.Minute, To: 3 * time.Minute, Rate: 16},
			PoolBurst{From: 6 * time.Minute, To: 7 * time.Minute, Rate: 16}),
		Routings: []PoolRouting{
			{Name: "self-hosted only", Policies: []string{"least-outstanding"}, Cooldown: true},
			{Name: "round-robin over both", Policies: []string{"round-robin"}, Flat: true, Cooldown: true},
			{Name: "least-outstanding over both", Policies: []string{"least-outstanding"}, Flat: true, Cooldown: true},
			{Name: "spill to provider", Policies: []string{"least-outstanding", "peak-ewma"}, Cooldown: true},
		},
		MaxCooldown: time.Minute,
		SLO:         SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond},
	}
}

// WritePoolTable writes results of sc, pooled over seeds from seed, as an
// aligned text table: a header describing the run, one row per routing,
// and a legend that starts with "Compare first".
func WritePoolTable(w io.Writer, sc *PoolScenario, seed uint64, seeds int, results []*PoolResult) error {
	wl := &sc.Workload
	reqs := 0
	for _, r := range results {
		reqs = max(reqs, r.Requests)
	}
	seedText := fmt.Sprintf("seed %d", seed)
	per := ""
	if seeds > 1 {
		seedText = fmt.Sprintf("seeds %d-%d pooled", seed, seed+uint64(seeds)-1)
		per = " per seed"
		reqs /= seeds
	}
	var tiers []string
	deps := 0
	for _, t := range sc.Tiers {
		var names []string
		for _, d := range t {
			names = append(names, d.Name)
		}
		tiers = append(tiers, strings.Join(names, " "))
		deps += len(t)
	}
	var bursts []string
	for _, b := range wl.Bursts {
		bursts = append(bursts, fmt.Sprintf("%.0f req/s %v-%v", b.Rate, b.From, b.To))
	}
	fmt.Fprintf(w, "scenario %s: %d requests%s over %v at %.0f req/s, bursts %s; %s\n",
		sc.Name, reqs, per, wl.Duration, wl.Rate, strings.Join(bursts, ", "), seedText)
	fmt.Fprintf(w, "%d deployments in %d tier(s): %s\n", deps, len(sc.Tiers), strings.Join(tiers, " | "))
	fmt.Fprintf(w, "SLO: TTFT <= %gms and TPOT <= %gms; cooldowns capped at %v\n\n",
		ms(sc.SLO.TTFT), ms(sc.SLO.TPOT), sc.MaxCooldown)

	tiered := len(sc.Tiers) > 1
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "routing\tcooldown\tdone\trefused\t"
	if tiered {
		head += "offload\t"
	}
	fmt.Fprintln(tw, head+"429s\tspiked\tSLO\tgoodput\tTTFT p50\tp99\tTPOT p99\tE2E p99\t")
	for _, r := range results {
		cool := "no"
		if r.Cooldown {
			cool = "yes"
		}
		share := func(n int) string {
			if r.Completed == 0 {
				return "-"
			}
			return fmtPct(float64(n) / float64(r.Completed))
		}
		row := fmt.Sprintf("%s\t%s\t%d\t%d\t", r.Routing, cool, r.Completed, r.Refused)
		if tiered {
			row += share(r.Offloaded) + "\t"
		}
		slo := "-"
		if r.Requests > 0 {
			slo = fmtPct(float64(r.MetSLO) / float64(r.Requests))
		}
		fmt.Fprintf(tw, "%s%d\t%s\t%s\t%s/s\t%s\t%s\t%s\t%s\t\n", row, r.Throttled, share(r.Spiked), slo,
			strconv.FormatFloat(r.GoodputRPS(), 'f', 2, 64),
			fmtMs(quantile(r.TTFT, 0.5)), fmtMs(quantile(r.TTFT, 0.99)), fmtMs(quantile(r.TPOT, 0.99)), fmtMs(quantile(r.E2E, 0.99)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	legend := []string{
		"Compare first: refused, then SLO and goodput, then the TTFT tail (TTFT p99).",
		"done: requests completed; refused: requests the client got a 429 for, every attempt and tier refused or cooling;",
	}
	if tiered {
		legend = append(legend, "offload: share of the completed requests served by a later tier's deployments;")
	}
	legend = append(legend,
		"429s: answers the deployments refused (each retried or spilled while attempts last);",
		"spiked: share of the completed requests served during a latency spike of their deployment;",
		"SLO: share of all requests that met both objectives; goodput: requests per second that did;",
		"TTFT: time to first token, from arrival, retries included; TPOT: time per output token after the first;",
		"E2E: arrival to last token; p50, p99: percentiles; all in ms, in s from 10 s up.")
	fmt.Fprintln(w)
	fmt.Fprint(w, pack(legend, legendWidth))
	_, err := fmt.Fprintln(w)
	return err
}
