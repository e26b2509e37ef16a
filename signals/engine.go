package signals

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Engine names an inference engine's metrics dialect. The zero value,
// [EngineAuto], detects the engine from the metric names in each exposition.
// Like every enumerated value of this package, it is safe to use from any
// goroutine.
type Engine int

// Engines whose Prometheus expositions this package maps to a load.
const (
	// EngineAuto detects the engine from the metric names present.
	EngineAuto Engine = iota
	// EngineVLLM is vLLM (vllm:* metrics).
	EngineVLLM
	// EngineSGLang is SGLang (sglang:* metrics).
	EngineSGLang
	// EngineTRTLLM is TensorRT-LLM's trtllm-serve (trtllm_* metrics).
	EngineTRTLLM
	// EngineTriton is Triton Inference Server with the TensorRT-LLM backend
	// (nv_trt_llm_* metrics selected by label).
	EngineTriton
	// EngineLlamaCpp is the llama.cpp server (llamacpp:* metrics).
	EngineLlamaCpp
	numEngines
)

var engineNames = [numEngines]string{"auto", "vllm", "sglang", "trtllm", "triton", "llamacpp"}

// String returns the engine's short name, such as "vllm".
func (e Engine) String() string {
	if e < 0 || e >= numEngines {
		return "Engine(" + strconv.Itoa(int(e)) + ")"
	}
	return engineNames[e]
}

// ParseEngine returns the engine named s (as returned by [Engine.String]).
func ParseEngine(s string) (Engine, error) {
	for i, n := range engineNames {
		if n == s {
			return Engine(i), nil
		}
	}
	return EngineAuto, fmt.Errorf("%w: unknown engine %q", ErrInvalidConfig, s)
}

// series selects the samples of one metric: every series of family name, or
// only those whose label has value (an empty value also selects the series
// without the label). With info set, the number is read from
// the label named info instead of the sample value (for info metrics such as
// vllm:cache_config_info).
type series struct {
	name         string
	label, value string
	info         string
	// copies are labels that tell apart copies of one count: samples that
	// differ only in them report the same requests, so they count once
	// (their largest value).
	copies []string
}

// sglangCopies are the labels of SGLang's scheduler metrics that tell
// apart the schedulers of one data-parallel rank. SchedulerMetricsCollector
// labels every scheduler series with model_name, engine_type, tp_rank,
// pp_rank and (in newer releases) moe_ep_rank, dp_rank with data parallelism,
// and the user's --extra-metric-labels (sgl-project/sglang
// python/sglang/srt/observability/scheduler_metrics_mixin.py, init_metrics;
// python/sglang/srt/managers/ before the move). Only the first
// tensor-parallel rank of each data-parallel rank reports by default; with
// --enable-metrics-for-all-schedulers every rank does, each with the same
// batch and with its own tp_rank and moe_ep_rank.
var sglangCopies = []string{"tp_rank", "pp_rank", "moe_ep_rank"}

// sglangPriority is the label that SGLang adds, with
// --enable-priority-scheduling, to its request-count gauges: the total is
// the series with priority="" and each priority level has a series of its
// own besides (SchedulerMetricsCollector._log_gauge_queue_count). Only the
// total is read; without the flag the label is absent, which reads as "".
const sglangPriority = "priority"

// sglangQueued are the queues of SGLang's prefill/decode disaggregation
// (--disaggregation-mode prefill or decode) that hold requests the server
// has admitted and not yet put in its waiting queue, counted as waiting: a
// prefill server's bootstrap queue (requests waiting for the handshake with
// their decode server), and a decode server's prealloc queue (requests
// waiting for KV memory to receive the prefilled cache into: a decode
// server short of memory queues here, not in sglang:num_queue_reqs) and
// transfer queue (requests whose KV cache is on its way). The scheduler
// reports each beside num_queue_reqs, with the same labels and the same
// per-priority breakdown (SchedulerStats and
// SchedulerMetricsCollector.log_stats in
// python/sglang/srt/observability/metrics_collector.py at 016d860;
// report_prefill_stats and report_decode_stats in scheduler_metrics_mixin.py,
// whose _build_queued_request_metrics counts the same queues as queued).
// Releases before the rename name the bootstrap queue
// sglang:num_prefill_prealloc_queue_reqs (scheduler_metrics_mixin.py at
// 00eef54). The prefill server's inflight queue is left out: its requests
// are prefilled and only wait for their cache to leave, whose memory
// sglang:token_usage counts. Unified servers report the queues as 0.
var sglangQueued = [][]series{
	{
		{name: "sglang:num_prefill_bootstrap_queue_reqs", label: sglangPriority, value: "", copies: sglangCopies},
		{name: "sglang:num_prefill_prealloc_queue_reqs", label: sglangPriority, value: "", copies: sglangCopies},
	},
	{{name: "sglang:num_decode_prealloc_queue_reqs", label: sglangPriority, value: "", copies: sglangCopies}},
	{{name: "sglang:num_decode_transfer_queue_reqs", label: sglangPriority, value: "", copies: sglangCopies}},
}

// sglangCaps are the ways SGLang reports the size of its KV pool, newest
// first. Since sgl-project/sglang#24197 (v0.5.12 on, as
// llm-d/llm-d-router#2294 found) each scheduler writes, once at start-up,
// sglang:page_size (--page-size) and sglang:num_pages (its
// max_total_num_tokens // page_size) with the labels of its other gauges
// (SchedulerMetricsCollector.emit_constants in
// python/sglang/srt/observability/metrics_collector.py, called by the
// scheduler in python/sglang/srt/managers/scheduler.py). Every release with
// metrics writes sglang:max_total_num_tokens, the pool in tokens. From
// #17273 to #24197 the page size was only a label of
// sglang:cache_config_info, whose one series carries page_size and
// num_pages and none of the scheduler's labels, so that the identical
// pools of several data-parallel ranks read as one: there the tokens,
// which count every rank's pool, are divided into pages of that size.
// Without a page size the tokens are blocks of 1.
var sglangCaps = []kvCap{
	{
		blocks:    series{name: "sglang:num_pages", copies: sglangCopies},
		blockSize: series{name: "sglang:page_size", copies: sglangCopies},
	},
	{
		blocks:      series{name: "sglang:max_total_num_tokens", copies: sglangCopies},
		blockSize:   series{name: "sglang:cache_config_info", info: "page_size"},
		tokenBlocks: true,
	},
}

// vllmCopies are the labels that tell apart copies of one vLLM gauge
// written by several processes. With --api-server-count above 1 (vLLM 0.9
// on) prometheus_client runs in multiprocess mode, and a gauge without a
// multiprocess_mode (mode "all") is exported once per API server process,
// labelled pid: vllm:kv_cache_usage_perc in 0.9 and 0.10
// (vllm/v1/metrics/loggers.py at 005a810; "mostrecent", one series, since).
// The copies describe one engine: they count once, the largest, since a
// process that has not received the engine's statistics exports 0.
var vllmCopies = []string{"pid"}

// vllmCacheCopies are the labels that tell apart copies of vLLM's
// vllm:cache_config_info. The API server writes one series per engine
// (data-parallel rank) it serves, every one with the labels of its own
// CacheConfig (PrometheusStatLogger.log_metrics_info in
// vllm/v1/metrics/loggers.py at 005a810, and since), and that config's
// num_gpu_blocks is the sum over those engines: the server adds up the
// blocks each engine reports when it starts ("Sum values from all engines
// in DP case", wait_for_engine_startup in vllm/v1/engine/utils.py; the
// client's _apply_ready_response in vllm/v1/engine/core_client.py in later
// releases). The series are copies of the server's capacity, so they count
// once; summing them would count it once per engine.
var vllmCacheCopies = []string{"engine"}

// trtllmCopies are the labels that tell apart copies of one trtllm-serve
// gauge written by several processes. trtllm-serve serves
// /prometheus/metrics from prometheus_client's MultiProcessCollector, and
// its gauges take the default multiprocess_mode, "all": each is exported
// once per process that wrote it, labelled pid (NVIDIA/TensorRT-LLM
// tensorrt_llm/serve/openai_server.py, mount_metrics;
// tensorrt_llm/metrics/collector.py at 050f80d, MetricsCollector). The
// copies describe one engine, so they count once, the largest, as vLLM's
// do.
var trtllmCopies = []string{"pid"}

// kvCap is one way an engine reports its KV capacity: blocks of blockSize
// tokens, or with tokenBlocks a count of tokens, which blockSize, if
// present, groups into blocks (of 1 token if not).
type kvCap struct {
	blocks, blockSize series
	tokenBlocks       bool
}

// profile maps one engine's exposition to an Observation.
type profile struct {
	engine             Engine
	running, waiting   series
	kv                 []series // the first present wins (renames across versions)
	caps               []kvCap  // the first whose blocks are present wins (renames across versions)
	preempt            series
	prefixQ, prefixHit []series // the first present wins (renames across versions)
	lora               string   // the info gauge of LoRA adapters in use, if the engine has one
	// scheduled, if the exposition has it, counts the requests of running
	// that are in this iteration's batch: the others count as waiting
	// (see [profile.observe]).
	scheduled series
	// queued are the engine's queues of requests it has admitted but not
	// yet put in waiting (see sglangQueued): each present one adds to
	// Waiting. Within one entry the first present name wins (renames
	// across versions).
	queued [][]series
	// awake, if the engine exports it, is 1 while the engine is awake and
	// 0 while it sleeps (see [Observation].Asleep); the first present
	// wins.
	awake []series
}

var profiles = [numEngines]*profile{
	EngineVLLM: {
		engine:  EngineVLLM,
		running: series{name: "vllm:num_requests_running"},
		waiting: series{name: "vllm:num_requests_waiting"},
		// vllm:gpu_cache_usage_perc (the V1 engine of 0.8) was deprecated
		// in 0.9 for the new name and is gone by 0.11.
		kv: []series{
			{name: "vllm:kv_cache_usage_perc", copies: vllmCopies},
			{name: "vllm:gpu_cache_usage_perc", copies: vllmCopies},
		},
		caps: []kvCap{{
			blocks:    series{name: "vllm:cache_config_info", info: "num_gpu_blocks", copies: vllmCacheCopies},
			blockSize: series{name: "vllm:cache_config_info", info: "block_size", copies: vllmCacheCopies},
		}},
		preempt: series{name: "vllm:num_preemptions_total"},
		// Named gpu_prefix_cache_* by the V1 engine of vLLM 0.8, and also
		// exported, deprecated, beside the new names by 0.9 and 0.10; gone
		// by 0.11.
		prefixQ:   []series{{name: "vllm:prefix_cache_queries_total"}, {name: "vllm:gpu_prefix_cache_queries_total"}},
		prefixHit: []series{{name: "vllm:prefix_cache_hits_total"}, {name: "vllm:gpu_prefix_cache_hits_total"}},
		lora:      loraInfo,
		// vllm:engine_sleep_state is a state set, one series per state
		// (awake, weights_offloaded, discard_all) and engine index:
		// PrometheusStatLogger.record_sleep_state sets awake to 0 on every
		// engine of the server when AsyncLLM.sleep puts them to sleep, at
		// any level (0, 1 or 2), and back to 1 on wake_up
		// (vllm/v1/metrics/loggers.py and vllm/v1/engine/async_llm.py;
		// added by vllm-project/vllm#24176, exported outside dev mode
		// since #27867). SGLang exports no such gauge for
		// release_memory_occupation (python/sglang/srt/observability/
		// metrics_collector.py at 44cedc2).
		//
		// The gauge cannot tell a partial wake-up from a full one:
		// AsyncLLM.wake_up records the awake state whatever tags it was
		// given (record_sleep_state(0, 0) in vllm/v1/engine/async_llm.py
		// at 00080ee), so after wake_up(tags=["weights"]) the exposition
		// reads awake 1, weights_offloaded 0 and discard_all 0, exactly as
		// after a full wake-up, while the KV cache is still released and
		// the engine cannot serve. Where vLLM exports
		// vllm:engine_fully_awake (docs/design/engine_sleep_state.md at
		// 13cbd44: 1 only while the scheduler runs and both weights and KV
		// cache are resident, 0 after a partial wake; its Rust frontend
		// exports it without the older gauge), that is read instead.
		awake: []series{
			{name: "vllm:engine_fully_awake"},
			{name: "vllm:engine_sleep_state", label: "sleep_state", value: "awake"},
		},
	},
	EngineSGLang: {
		engine:  EngineSGLang,
		running: series{name: "sglang:num_running_reqs", label: sglangPriority, value: "", copies: sglangCopies},
		waiting: series{name: "sglang:num_queue_reqs", label: sglangPriority, value: "", copies: sglangCopies},
		kv:      []series{{name: "sglang:token_usage", copies: sglangCopies}},
		caps:    sglangCaps,
		queued:  sglangQueued,
	},
	// trtllm-serve's MetricsCollector.log_iteration_stats sets
	// trtllm_num_requests_running to the executor's numActiveRequests (every
	// request it has taken in: scheduled, paused, or waiting for KV blocks)
	// and trtllm_num_requests_waiting to numQueuedRequests (those not yet
	// taken in), and trtllm_num_scheduled_requests to the batch's
	// numScheduledRequests (NVIDIA/TensorRT-LLM
	// tensorrt_llm/metrics/collector.py at 050f80d). Running is read as the
	// Triton backend reports it: the scheduled requests, the other active
	// ones waiting with the queued; releases without the scheduled gauge
	// count every active request as running. Either way running plus
	// waiting is every request the replica holds. (With pipeline
	// parallelism the scheduled requests are one micro-batch's; with
	// attention data parallelism trtllm-serve logs a row per rank into each
	// gauge, so the counts are one rank's: tensorrt_llm/_torch/pyexecutor/
	// adp_iter_stats.py.)
	EngineTRTLLM: {
		engine:    EngineTRTLLM,
		running:   series{name: "trtllm_num_requests_running", copies: trtllmCopies},
		waiting:   series{name: "trtllm_num_requests_waiting", copies: trtllmCopies},
		scheduled: series{name: "trtllm_num_scheduled_requests", copies: trtllmCopies},
		kv:        []series{{name: "trtllm_kv_cache_utilization", copies: trtllmCopies}},
		caps: []kvCap{{
			blocks:    series{name: "trtllm_kv_cache_max_blocks", copies: trtllmCopies},
			blockSize: series{name: "trtllm_kv_cache_tokens_per_block", copies: trtllmCopies},
		}},
	},
	// The TensorRT-LLM Triton backend exports request_type "scheduled" (the
	// batch's numScheduledRequests), "waiting" (numActiveRequests less the
	// scheduled), "active", "context" and "max": scheduled and waiting add
	// up to the active requests (NVIDIA/TensorRT-LLM
	// triton_backend/inflight_batcher_llm/src/model_instance_state.cc at
	// c8c6df0, WaitForStats). The executor's queue (numQueuedRequests) is
	// not exported.
	EngineTriton: {
		engine:  EngineTriton,
		running: series{name: "nv_trt_llm_request_metrics", label: "request_type", value: "scheduled"},
		waiting: series{name: "nv_trt_llm_request_metrics", label: "request_type", value: "waiting"},
		kv:      []series{{name: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", value: "fraction"}},
		caps: []kvCap{{
			blocks:    series{name: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", value: "max"},
			blockSize: series{name: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", value: "tokens_per"},
		}},
	},
	EngineLlamaCpp: {
		engine:  EngineLlamaCpp,
		running: series{name: "llamacpp:requests_processing"},
		waiting: series{name: "llamacpp:requests_deferred"},
		kv:      []series{{name: "llamacpp:kv_cache_usage_ratio"}},
	},
}

// detectOrder is the order in which auto-detection tries the profiles.
var detectOrder = [...]Engine{EngineVLLM, EngineSGLang, EngineTRTLLM, EngineTriton, EngineLlamaCpp}

// Plausibility bounds: a value beyond them is garbage, not load.
const (
	maxRequests  = 1 << 24 // requests running or waiting on one replica
	maxBlocks    = 1 << 31 // KV blocks
	maxBlockSize = 1 << 20 // tokens per KV block
	maxCounter   = 1e18    // cumulative counters
	kvSlack      = 1e-6    // rounding slack above 1 tolerated in KV fractions
)

type families map[string]*dto.MetricFamily

// detect returns the engine whose running-requests metric is present.
func detect(fams families) (*profile, error) {
	for _, e := range detectOrder {
		if _, ok := fams[profiles[e].running.name]; ok {
			return profiles[e], nil
		}
	}
	return nil, fmt.Errorf("%w: no known engine metrics (looked for %s, %s, %s, %s, %s)", ErrMissingMetric,
		profiles[EngineVLLM].running.name, profiles[EngineSGLang].running.name, profiles[EngineTRTLLM].running.name,
		profiles[EngineTriton].running.name, profiles[EngineLlamaCpp].running.name)
}

// sum returns the sum of the selected samples, how many there were, and
// an error naming the metric if one is not a finite non-negative number.
func (s series) sum(fams families) (sum float64, n int, err error) {
	if s.name == "" {
		return 0, 0, nil
	}
	fam := fams[s.name]
	if fam == nil {
		// OpenMetrics names a counter family without its _total suffix.
		if base, ok := strings.CutSuffix(s.name, "_total"); ok {
			fam = fams[base]
		}
		if fam == nil {
			return 0, 0, nil
		}
	}
	var copies map[string]float64 // with s.copies: the largest value of each group of copies
	for _, m := range fam.Metric {
		if s.label != "" && labelValue(m, s.label) != s.value {
			continue
		}
		var v float64
		if s.info != "" {
			str := labelValue(m, s.info)
			if str == "" || str == "None" { // vLLM writes None before it has profiled memory
				continue
			}
			v, err = strconv.ParseFloat(str, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("%w: %s label %s=%q is not a number", ErrInvalidValue, s.name, s.info, str)
			}
		} else {
			var ok bool
			if v, ok = sampleValue(m); !ok {
				continue
			}
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return 0, 0, fmt.Errorf("%w: %s is %v", ErrInvalidValue, s.describe(), v)
		}
		if len(s.copies) > 0 && len(fam.Metric) > 1 && hasLabel(m, s.copies) {
			if copies == nil {
				copies = make(map[string]float64)
			}
			k := otherLabels(m, s.copies)
			if old, ok := copies[k]; ok {
				copies[k] = max(old, v)
				continue
			}
			copies[k] = v
			n++
			continue
		}
		sum += v
		n++
	}
	for _, v := range copies {
		sum += v
	}
	return sum, n, nil
}

// hasLabel reports whether m has one of the labels names.
func hasLabel(m *dto.Metric, names []string) bool {
	for _, lp := range m.Label {
		if slices.Contains(names, lp.GetName()) {
			return true
		}
	}
	return false
}

// otherLabels returns m's labels other than names, as one string that is
// equal for two samples exactly when those labels are.
func otherLabels(m *dto.Metric, names []string) string {
	pairs := make([]string, 0, len(m.Label))
	for _, lp := range m.Label {
		if !slices.Contains(names, lp.GetName()) {
			pairs = append(pairs, strconv.Quote(lp.GetName())+"="+strconv.Quote(lp.GetValue()))
		}
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

func (s series) describe() string {
	switch {
	case s.label != "" && s.value != "":
		return fmt.Sprintf("%s{%s=%q}", s.name, s.label, s.value)
	case s.info != "":
		return s.name + " label " + s.info
	}
	return s.name
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.Label {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// sampleValue returns the value of a gauge, counter or untyped sample.
func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// observe maps fams to an observation with p. At is left zero.
func (p *profile) observe(fams families) (Observation, error) {
	o := Observation{Engine: p.engine}
	var err error
	if o.Running, err = p.count(fams, p.running, maxRequests, true, false); err != nil {
		return Observation{}, err
	}
	if o.Waiting, err = p.count(fams, p.waiting, maxRequests, true, false); err != nil {
		return Observation{}, err
	}
	for _, names := range p.queued {
		for _, s := range names {
			sum, n, err := s.sum(fams)
			if err != nil {
				return Observation{}, err
			}
			if n == 0 {
				continue
			}
			if sum > maxRequests {
				return Observation{}, fmt.Errorf("%w: %s is %v, above the plausible limit %v", ErrInvalidValue, s.describe(), sum, float64(maxRequests))
			}
			o.Waiting += int(math.Round(sum))
			break
		}
	}
	if p.scheduled.name != "" {
		// The gauges are set one after another and may be scraped between
		// two iterations' values: the scheduled requests are no more than
		// the running ones.
		sum, n, err := p.scheduled.sum(fams)
		switch {
		case err != nil:
			return Observation{}, err
		case sum > maxRequests:
			return Observation{}, fmt.Errorf("%w: %s is %v, above the plausible limit %v", ErrInvalidValue, p.scheduled.describe(), sum, float64(maxRequests))
		case n > 0:
			if scheduled := int(math.Round(sum)); scheduled < o.Running {
				o.Waiting += o.Running - scheduled
				o.Running = scheduled
			}
		}
	}
	// Each count is within the limit; their sum may not be.
	if o.Waiting > maxRequests {
		return Observation{}, fmt.Errorf("%w: %d requests waiting, above the plausible limit %v", ErrInvalidValue, o.Waiting, float64(maxRequests))
	}
	o.KVUsage = math.NaN()
	for _, s := range p.kv {
		sum, n, err := s.sum(fams)
		if err != nil {
			return Observation{}, err
		}
		if n == 0 {
			continue
		}
		// Several series (one per model or data-parallel rank) are averaged:
		// a fraction of equal-sized pools.
		kv := sum / float64(n)
		if kv > 1+kvSlack {
			return Observation{}, fmt.Errorf("%w: %s is %v, above 1", ErrInvalidValue, s.describe(), kv)
		}
		o.KVUsage = min(kv, 1)
		break
	}
	if o.KVBlocks, o.BlockSize, err = p.capacity(fams); err != nil {
		return Observation{}, err
	}
	if o.Preemptions, err = counter(fams, p.preempt); err != nil {
		return Observation{}, err
	}
	if o.PrefixQueries, err = counter(fams, p.prefixQ...); err != nil {
		return Observation{}, err
	}
	if o.PrefixHits, err = counter(fams, p.prefixHit...); err != nil {
		return Observation{}, err
	}
	// vLLM adds a request's tokens to the queries and the tokens it found
	// cached, at most all but the last, to the hits (get_computed_blocks in
	// vllm/v1/core/kv_cache_manager.py), and PrometheusStatLogger.record
	// (vllm/v1/metrics/loggers.py, 0.9 to 2026) increments the queries
	// counter before the hits one: more hits than queries is not a count.
	// A scrape that reads them so (prometheus_client's multiprocess files,
	// with several API servers, read while another process writes them)
	// reports neither, rather than failing, which would lose its queue and
	// KV usage too.
	if o.PrefixHits > o.PrefixQueries { // false when either is NaN
		o.PrefixHits, o.PrefixQueries = math.NaN(), math.NaN()
	}
	if p.lora != "" {
		if o.Adapters, o.MaxAdapters, err = adapters(fams[p.lora]); err != nil {
			return Observation{}, err
		}
	}
	// Asleep when every engine index reports awake 0; an exposition
	// without the gauge (releases before it) is of an awake engine.
	for _, s := range p.awake {
		awake, n, err := s.sum(fams)
		if err != nil {
			return Observation{}, err
		}
		if n > 0 {
			o.Asleep = awake == 0
			break
		}
	}
	return o, nil
}

// capacity returns the KV blocks and block size of the first of p.caps
// whose blocks are present (the last one if none is), 0 for what is
// missing.
func (p *profile) capacity(fams families) (blocks, size int, err error) {
	for i, c := range p.caps {
		if i < len(p.caps)-1 {
			if _, n, err := c.blocks.sum(fams); err != nil {
				return 0, 0, err
			} else if n == 0 {
				continue
			}
		}
		if blocks, err = p.count(fams, c.blocks, maxBlocks, false, false); err != nil {
			return 0, 0, err
		}
		// Every series (one per data-parallel rank or model) reports its
		// own engine's block size, a size and not a count: it is averaged.
		if size, err = p.count(fams, c.blockSize, maxBlockSize, false, true); err != nil {
			return 0, 0, err
		}
		if c.tokenBlocks && blocks > 0 {
			if size > 0 {
				blocks /= size
			} else {
				size = 1
			}
		}
		return blocks, size, nil
	}
	return 0, 0, nil
}

// count returns the sum of s's samples, or with mean their average, as an
// integer no larger than limit. A missing metric is an error if required and
// 0 otherwise.
func (p *profile) count(fams families, s series, limit float64, required, mean bool) (int, error) {
	sum, n, err := s.sum(fams)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		if required {
			return 0, fmt.Errorf("%w: %s exposition has no %s", ErrMissingMetric, p.engine, s.describe())
		}
		return 0, nil
	}
	if mean {
		sum /= float64(n)
	}
	if sum > limit {
		return 0, fmt.Errorf("%w: %s is %v, above the plausible limit %v", ErrInvalidValue, s.describe(), sum, limit)
	}
	return int(math.Round(sum)), nil
}

// counter returns the sum of a cumulative counter, read from the first of
// names that is present, NaN if none is.
func counter(fams families, names ...series) (float64, error) {
	for _, s := range names {
		sum, n, err := s.sum(fams)
		switch {
		case err != nil:
			return 0, err
		case n == 0:
			continue
		case sum > maxCounter:
			return 0, fmt.Errorf("%w: %s is %v, above the plausible limit %v", ErrInvalidValue, s.describe(), sum, maxCounter)
		}
		return sum, nil
	}
	return math.NaN(), nil
}
