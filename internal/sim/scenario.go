package sim

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// Scenario is a named preset: a cluster, a synthetic workload and the
// policies to compare on it.
type Scenario struct {
	// Name is the name [LookupScenario] finds the scenario by.
	Name string
	// Doc is a one-line description.
	Doc string
	// Config is the simulated cluster.
	Config Config
	// Workload is the synthetic workload.
	Workload Synthetic
	// Policies are the names of the policies compared by default, in
	// display order.
	Policies []string
	// Herding marks a scenario whose interesting columns are the skew
	// metrics.
	Herding bool
	// Admissions are the admission controls compared by default, each
	// under every policy, in display order; none means a single run
	// without admission control (Config.Admission).
	Admissions []Admission
	// Outputs are the kinds of knowledge of output lengths compared by
	// default, each under every policy and admission control, in display
	// order; none means a single run with Config.Outputs.
	Outputs []OutputKnowledge
	// Prefill are the numbers of prefill workers ([Config].Prefill)
	// compared by default, each under every disaggregated policy, in
	// display order; none means a single run with Config.Prefill.
	Prefill []int
}

// Scenario defaults.
const (
	// DefaultRequests is the request count of the default scenario.
	DefaultRequests = 12000
	// DefaultRate is the long-run arrival rate of the default scenario, in
	// requests per second for 8 replicas.
	DefaultRate = 61.0
	// DefaultScenarioKVBlocks is the KV capacity per replica of the default
	// scenario, in 16-token blocks: 512k tokens, about what an 80 GB GPU
	// holds for an 8B model.
	DefaultScenarioKVBlocks = 32768
	// PrefixRate is the arrival rate of the prefixes scenario, in requests
	// per second for 8 replicas.
	PrefixRate = 37.0
	// SlotsRate is the arrival rate of the slots scenario, in requests per
	// second for 4 replicas.
	SlotsRate = 17.5
	// MixedRate is the arrival rate of the mixed scenario: the default
	// scenario's load per replica, for its capacity of 5 full-speed
	// replicas.
	MixedRate = DefaultRate * 5 / 8
	// SlowdownRate is the arrival rate of the mixed-slowdown scenario: the
	// default scenario's load per replica once one of its full-speed
	// replicas has slowed, a capacity of 4.5 full-speed replicas.
	SlowdownRate = DefaultRate * 4.5 / 8
)

// mixedSpeed is the speed of replicas 0 and 1 (1, H100-class) and 2 to 7
// (0.5) in the mixed scenarios.
var mixedSpeed = []float64{1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}

// mixedPolicies returns the policies the mixed scenarios compare by default.
func mixedPolicies() []string {
	return []string{"round-robin", "least-outstanding", "sglang-cache-aware", "dynamo-kv", "gie-default", "llmd-default", "default-nolearn", "default"}
}

// Scenarios returns the presets, in display order:
//
//   - default: 8 replicas with 512k tokens of KV each behind one router
//     scraping every second; heavy-tailed prompts and outputs, three
//     requests in four the next turn of a conversation paced by its replies
//     ([DefaultSynthetic]), as in the routing chapter's simulated table;
//     load high enough that round robin misses the SLO (TTFT <= 2 s, TPOT
//     <= 50 ms) for half of the requests.
//   - prefixes: 8 replicas with 128k tokens of KV each, when most reuse is
//     a few popular shared prefixes, such as system prompts, which every
//     replica ends up caching
//     ([PrefixSynthetic]).
//   - herding: 5 replicas behind 4 routers that scrape in phase every 10 mean
//     inter-arrival times; compares trusting the stale scrape with
//     correcting it by the router's own dispatches, for a full scan and for
//     P2C.
//   - slots: 4 small replicas with 4 batch slots and 8k tokens of KV each,
//     as llama.cpp serves with --parallel 4, scraped every 100 ms; every
//     prompt is one of 48 shared 512-token heads plus a short question, and
//     outputs are short (median 12 tokens) with a long tail (one in ten
//     over 64), so requests wait for batch slots rather than for KV memory
//     or prefill.
//   - mixed: the default scenario's cluster and workload on two full-speed
//     and six half-speed replicas ([Config.Speed]) that declare no weights,
//     at the default scenario's load per unit of capacity ([MixedRate]).
//   - mixed-slowdown: mixed, but replica 0 slows to half speed halfway
//     through the arrivals ([Config.SpeedChanges]), at the default
//     scenario's load per unit of the capacity left ([SlowdownRate]).
//   - agentic: the default scenario's cluster, agents whose every step fans
//     out into 8 parallel branches of one long history
//     ([AgenticSynthetic]) at [AgenticRate].
//   - rag: the default scenario's cluster, questions after documents
//     retrieved from a shared corpus, prompts of about 10k tokens
//     ([RAGSynthetic]) at [RAGRate].
//   - diurnal: the default scenario, its rate of fresh conversations
//     swinging over a compressed day and bursting ([DiurnalSynthetic]).
//   - tenants: the default scenario's cluster and lengths shared by a heavy
//     tenant whose demand alone is 1.5 times what the cluster serves
//     within the SLO and four light tenants well under their fair share;
//     compares no admission control, per-tenant rate limits and a
//     token-fair queue ([TenantsScenario]).
//   - routes: the default scenario's cluster and workload at [RoutesRate],
//     its requests split among four routes whose outputs differ 100-fold
//     ([RoutesSynthetic]); compares charging the decode allowance, the
//     output lengths learned per route and the true lengths
//     ([Config.Outputs]).
//   - lora: the default scenario's cluster and workload at [LoRARate],
//     every conversation served with one of [LoRAAdapters] Zipf-popular
//     LoRA adapters ([LoRASynthetic]) on replicas with [LoRASlots] adapter
//     slots that stall [DefaultAdapterLoad] per adapter loaded
//     ([Engine].AdapterSlots); compares adapter-blind and adapter-aware
//     routing.
//   - pd: the default scenario's cluster and workload, co-located and
//     disaggregated into prefill and decode workers at equal replica count
//     (2P+6D and 3P+5D, [Scenario].Prefill); compares co-located policies
//     with the disaggregated ones ([PolicySpec].Decode).
//   - pd-long: pd with long fresh prompts and no conversations
//     ([PDLongSynthetic]) at [PDLongRate], split 3P+5D and 4P+4D.
func Scenarios() []Scenario {
	herdRate := 20.0
	herd := PrefixSynthetic(4000, herdRate)
	herd.PrefixShare, herd.SessionShare, herd.FanoutShare = 0, 0, 0
	herd.Prompt.Sigma, herd.Output.Sigma = 0.3, 0.3
	slots := Synthetic{
		Requests:     4000,
		Rate:         SlotsRate,
		ArrivalCV:    1,
		Prompt:       LogNormal{Median: 64, Sigma: 0.1, Min: 16, Max: 128},
		Output:       LogNormal{Median: 12, Sigma: 1.3, Min: 4, Max: 128},
		BlockTokens:  16,
		PrefixShare:  1,
		PrefixGroups: 48,
		PrefixZipf:   1.01,
		PrefixTokens: LogNormal{Median: 512, Min: 512, Max: 512},
	}
	mixed := DefaultSynthetic(DefaultRequests, MixedRate)
	slowdown := DefaultSynthetic(DefaultRequests, SlowdownRate)
	slowAt := time.Duration(float64(slowdown.Requests) / slowdown.Rate / 2 * float64(time.Second))
	all := []Scenario{
		{
			Name:     "default",
			Doc:      "8 replicas, 1 router, heavy-tailed lengths, conversations of 4 turns paced by their replies",
			Config:   Config{Replicas: 8, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}},
			Workload: DefaultSynthetic(DefaultRequests, DefaultRate),
			Policies: DefaultPolicies(),
		},
		{
			Name:     "prefixes",
			Doc:      "8 replicas, 1 router, 60% of fresh requests on 32 Zipf-popular shared prefixes",
			Config:   Config{Replicas: 8, Routers: 1, Scrape: time.Second},
			Workload: PrefixSynthetic(DefaultRequests, PrefixRate),
			Policies: DefaultPolicies(),
		},
		{
			Name:     "herding",
			Doc:      "5 replicas, 4 routers scraping in phase every 10 mean inter-arrival times",
			Config:   Config{Replicas: 5, Routers: 4, Scrape: time.Duration(10 / herdRate * float64(time.Second))},
			Workload: herd,
			Policies: []string{"stale-least-outstanding", "least-outstanding", "stale-p2c", "p2c"},
			Herding:  true,
		},
		{
			Name:     "slots",
			Doc:      "4 replicas with 4 batch slots each, 48 shared prompt heads: requests wait for slots",
			Config:   Config{Replicas: 4, Routers: 1, Scrape: 100 * time.Millisecond, Engine: Engine{MaxRunning: 4, KVBlocks: 512}},
			Workload: slots,
			Policies: DefaultPolicies(),
		},
		{
			Name: "mixed",
			Doc:  "default, on 2 full-speed and 6 half-speed replicas without declared weights",
			Config: Config{Replicas: 8, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks},
				Speed: mixedSpeed},
			Workload: mixed,
			Policies: mixedPolicies(),
		},
		{
			Name: "mixed-slowdown",
			Doc:  "mixed, and full-speed replica 0 slows to half speed halfway through the arrivals",
			Config: Config{Replicas: 8, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks},
				Speed: mixedSpeed, SpeedChanges: []SpeedChange{{Replica: 0, At: slowAt, Speed: 0.5}}},
			Workload: slowdown,
			Policies: mixedPolicies(),
		},
	}
	all = append(all, familyScenarios()...)
	return append(all,
		TenantsScenario(),
		ClassesScenario(),
		routesScenario(),
		loraScenario(),
		pdScenario(),
		pdLongScenario(),
	)
}

// LookupScenario returns the preset named name.
func LookupScenario(name string) (Scenario, error) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
	}
	return Scenario{}, fmt.Errorf("%w: unknown scenario %q", ErrInvalidConfig, name)
}

// Compare simulates reqs under each named policy with the same cfg and
// returns the results in the order of policies. Runs proceed in parallel, at
// most GOMAXPROCS at a time; the results do not depend on it. progress, if
// not nil, is called after each run completes with the number done so far.
func Compare(ctx context.Context, cfg Config, reqs []Request, policies []string, progress func(done, total int, policy string)) ([]*Result, error) {
	specs := make([]PolicySpec, len(policies))
	for i, name := range policies {
		spec, ok := LookupPolicy(name)
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, name)
		}
		specs[i] = spec
	}
	out := make([]*Result, len(specs))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	var mu sync.Mutex // protects done
	done := 0
	for i, spec := range specs {
		g.Go(func() error {
			res, err := simulate(ctx, cfg, reqs, spec)
			if err != nil {
				return err
			}
			out[i] = res
			if progress != nil {
				mu.Lock()
				done++
				progress(done, len(specs), spec.Name)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}
