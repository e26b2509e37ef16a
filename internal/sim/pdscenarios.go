package sim

import "time"

// PDLongRate is the arrival rate of the pd-long scenario, in requests per
// second for 8 replicas, at which the decode batches of co-located
// replicas begin to miss the TPOT objective behind long prefill chunks.
const PDLongRate = 13.0

// pdPolicies are the policies the disaggregation scenarios compare by
// default: co-located, then disaggregated.
func pdPolicies() []string {
	return []string{"round-robin", "default", "pd-round-robin", "pd-dynamo", "pd-default", "pd-default-local"}
}

// pdScenario is the default scenario's cluster and workload, co-located
// and split into prefill and decode workers.
func pdScenario() Scenario {
	return Scenario{
		Name:     "pd",
		Doc:      "default's cluster and workload, co-located and disaggregated into 2 or 3 prefill and 6 or 5 decode workers",
		Config:   Config{Replicas: 8, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}},
		Workload: DefaultSynthetic(DefaultRequests, DefaultRate),
		Policies: pdPolicies(),
		Prefill:  []int{2, 3},
	}
}

// PDLongSynthetic returns the workload of the pd-long scenario: n requests
// at rate requests per second, long fresh prompts (median 8k tokens,
// capped at 32k) and outputs of a few hundred tokens (median 300, capped
// at 2k), as in summarization or retrieval-augmented answers over long
// documents; a request in five starts with one of 32 shared prefixes, and
// there are no conversations.
func PDLongSynthetic(n int, rate float64) Synthetic {
	w := PrefixSynthetic(n, rate)
	w.Prompt = LogNormal{Median: 8192, Sigma: 0.6, Min: 1024, Max: 32768}
	w.Output = LogNormal{Median: 300, Sigma: 0.7, Min: 16, Max: 2048}
	w.PrefixShare, w.SessionShare, w.Sessions, w.FanoutShare = 0.2, 0, 0, 0
	return w
}

// pdLongScenario is pd with long prompts.
func pdLongScenario() Scenario {
	sc := pdScenario()
	sc.Name = "pd-long"
	sc.Doc = "pd with long prompts (median 8k tokens) and outputs of a few hundred tokens, no conversations"
	sc.Workload = PDLongSynthetic(DefaultRequests/2, PDLongRate)
	sc.Policies = []string{"round-robin", "default", "pd-round-robin", "pd-dynamo", "pd-default"}
	sc.Prefill = []int{3, 4}
	return sc
}
