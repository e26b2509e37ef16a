package sim

import (
	"encoding/json"
	"io"
)

// Report is the outcome of comparing policies on one workload, in the JSON
// shape written by [Report.WriteJSON]. Its Write methods only read it, and
// may run concurrently while nothing modifies it.
type Report struct {
	// Scenario describes the run.
	Scenario ScenarioInfo `json:"scenario"`
	// Results holds one result per policy, in the order the policies were
	// compared.
	Results []*Result `json:"results"`
}

// ScenarioInfo describes the run a report measured. [ScenarioInfo.Describe]
// writes to it; do not share one while it runs.
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
	// ArrivalRate is the offered load in requests per second: the requests
	// over the time from the first arrival to the last, the window
	// [Result.GoodputRPS] is measured over, so that a policy meeting the SLO
	// with every request has a goodput equal to it; 0 for fewer than two
	// requests or arrivals all at one instant.
	ArrivalRate float64 `json:"arrival_rate_rps"`
	// Replicas and Routers are [Config.Replicas] and [Config.Routers],
	// defaults filled in.
	Replicas int `json:"replicas"`
	Routers  int `json:"routers"`
	// ScrapeMs is [Config.Scrape] in milliseconds, default filled in: the
	// signal interval of the policies whose preset has none of its own.
	ScrapeMs float64 `json:"scrape_ms"`
	// SignalIntervalMs is [Config.SignalInterval] in milliseconds: the
	// signal interval of every policy, presets included; 0 when each has
	// its own.
	SignalIntervalMs float64 `json:"signal_interval_ms,omitempty"`
	// Stagger is [Config.Stagger].
	Stagger bool `json:"stagger"`
	// ShareMs is [Config.Share] in milliseconds: the routers' sharing
	// interval and delay, 0 when they do not share.
	ShareMs float64 `json:"share_ms,omitempty"`
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
	// IterTime names the engines' iteration-time model (a key of
	// model.IterTimes) when it is not the default mocker; the caller's to
	// set, as Name.
	IterTime string `json:"iter_time,omitempty"`
	// Speeds is every replica's speed at the start of the run
	// ([Config.Speed]); nil when all are 1 and DeclaredWeights is false.
	Speeds []float64 `json:"speeds,omitempty"`
	// DeclaredWeights is [Config.DeclareWeights].
	DeclaredWeights bool `json:"declared_weights,omitempty"`
	// AdapterSlots and AdapterLoadMs are [Engine].AdapterSlots and
	// [Engine].AdapterLoad in milliseconds, default filled in; 0 when
	// adapters are not modelled.
	AdapterSlots  int     `json:"adapter_slots,omitempty"`
	AdapterLoadMs float64 `json:"adapter_load_ms,omitempty"`
}

// Describe fills the fields of info that follow from cfg and reqs.
func (info *ScenarioInfo) Describe(cfg Config, reqs []Request) error {
	if err := cfg.normalize(); err != nil {
		return err
	}
	info.Requests = len(reqs)
	if n := len(reqs); n > 1 {
		if span := (reqs[n-1].Arrival - reqs[0].Arrival).Seconds(); span > 0 {
			info.ArrivalRate = float64(n) / span
		}
	}
	info.Replicas, info.Routers = cfg.Replicas, cfg.Routers
	info.ScrapeMs, info.Stagger, info.Seed = ms(cfg.Scrape), cfg.Stagger, cfg.Seed
	info.ShareMs, info.SignalIntervalMs = ms(cfg.Share), ms(cfg.SignalInterval)
	info.SLOTTFTMs, info.SLOTPOTMs = ms(cfg.SLO.TTFT), ms(cfg.SLO.TPOT)
	info.KVBlocks, info.BlockSize = cfg.Engine.KVBlocks, cfg.Engine.BlockSize
	info.Speeds, info.DeclaredWeights = cfg.startSpeeds(), cfg.DeclareWeights
	info.TokenBudget, info.MaxRunning = cfg.Engine.TokenBudget, cfg.Engine.MaxRunning
	info.AdapterSlots, info.AdapterLoadMs = cfg.Engine.AdapterSlots, ms(cfg.Engine.AdapterLoad)
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
