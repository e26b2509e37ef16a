// Package signals supplies engine load signals to an [llmlb.Balancer]: it
// scrapes the Prometheus metrics of vLLM, SGLang, TensorRT-LLM, Triton and
// llama.cpp replicas, parses ORCA load reports, and accepts observations
// pushed from anywhere.
//
// A [Store] holds the newest observation ([Observation], an [llmlb.Load] plus
// engine counters) of each endpoint and implements [llmlb.Signal]; anyone may
// record into it, and the newest observation by time wins, field by field:
// an ORCA report updates the fields it carries and leaves the others, such
// as a scrape's running requests, KV capacity and adapters, in place. A [Scraper] polls
// each target's metrics URL on its own jittered phase, parses the exposition
// with prometheus/common/expfmt ([Parse]), maps it with the engine's profile
// (detected from the metric names unless configured), and records good
// observations into a Store; a failed scrape leaves the last good observation
// in place and is reported by [Scraper.Status]. [ParseOrca] reads the
// endpoint-load-metrics response header in its TEXT, JSON and BIN forms, and
// [Store.RecordResponse] records it as a push observation.
//
// Metrics read per engine (several series of one metric are summed, KV usage
// fractions and block sizes averaged; the newest name first where versions
// differ):
//
//	engine    running                          waiting                           KV usage                              KV capacity
//	vllm      vllm:num_requests_running        vllm:num_requests_waiting         vllm:kv_cache_usage_perc              vllm:cache_config_info labels num_gpu_blocks, block_size
//	                                                                             (0.8: vllm:gpu_cache_usage_perc,
//	                                                                             deprecated 0.9, gone by 0.11)
//	sglang    sglang:num_running_reqs          sglang:num_queue_reqs             sglang:token_usage                    sglang:num_pages, sglang:page_size
//	          {priority=""}                    {priority=""}                                                           (before 0.5.12: sglang:max_total_num_tokens
//	                                           + disaggregation queues                                                 in pages of sglang:cache_config_info's
//	                                           (see below)                                                             page_size, or without it of 1 token)
//	trtllm    trtllm_num_scheduled_requests    trtllm_num_requests_waiting       trtllm_kv_cache_utilization           trtllm_kv_cache_max_blocks, trtllm_kv_cache_tokens_per_block
//	          (before it: all of               + the unscheduled rest of
//	          trtllm_num_requests_running)     trtllm_num_requests_running
//	triton    nv_trt_llm_request_metrics       nv_trt_llm_request_metrics        nv_trt_llm_kv_cache_block_metrics     nv_trt_llm_kv_cache_block_metrics
//	          {request_type="scheduled"}       {request_type="waiting"}          {kv_cache_block_type="fraction"}      {kv_cache_block_type="max"|"tokens_per"}
//	llamacpp  llamacpp:requests_processing     llamacpp:requests_deferred        llamacpp:kv_cache_usage_ratio
//	                                                                             (older builds: llama-server dropped
//	                                                                             it in 2025; not reported since)
//
// For vLLM, vllm:num_preemptions_total and vllm:prefix_cache_queries_total /
// vllm:prefix_cache_hits_total (0.8: vllm:gpu_prefix_cache_queries_total /
// vllm:gpu_prefix_cache_hits_total, exported beside the new names by 0.9
// and 0.10, gone by 0.11) are also read into the Observation,
// vllm:lora_requests_info into its adapters, and vllm:engine_fully_awake,
// or where it is absent vllm:engine_sleep_state{sleep_state="awake"}, into
// Asleep. The older gauge cannot tell a partial wake-up from a full one:
// vLLM's wake_up sets it to awake whatever the tags, so after a wake-up of
// the weights alone (LLM.wake_up(tags=["weights"]), or the tags of POST
// /wake_up) an engine whose KV cache is still released reads as awake, with
// the counts of an idle replica, until the kv_cache wake-up; nothing in that
// exposition shows it (GET /is_sleeping does: true until every tag is
// awake). Nor does it show a scheduler paused without sleep
// (AsyncLLM.pause_generation). vllm:engine_fully_awake, where vLLM exports
// it, is 0 in both cases.
//
// SGLang's prefill/decode disaggregation queues hold requests a server has
// admitted but not yet put in its waiting queue, and count as waiting: a
// prefill server's sglang:num_prefill_bootstrap_queue_reqs (before the
// rename sglang:num_prefill_prealloc_queue_reqs) and a decode server's
// sglang:num_decode_prealloc_queue_reqs (requests waiting for KV memory, so
// that a decode server short of it does not look idle) and
// sglang:num_decode_transfer_queue_reqs, each the series with priority="".
// A prefill server's sglang:num_prefill_inflight_queue_reqs (prefilled
// requests whose cache is being sent) is not.
//
// Copies of one value count once (the largest): SGLang's schedulers of one
// data-parallel rank, which with --enable-metrics-for-all-schedulers all
// report the same batch in series that differ only in tp_rank, pp_rank and
// moe_ep_rank; and vLLM's vllm:kv_cache_usage_perc written by each API
// server process (label pid) with --api-server-count above 1 in vLLM 0.9
// and 0.10; and vLLM's vllm:cache_config_info, which the API server writes
// once per engine (label engine), each series with its num_gpu_blocks
// already summed over the engines. Data-parallel ranks (vLLM's engine
// label, SGLang's dp_rank) add up their requests and SGLang's KV capacity,
// and average their KV usage, a fraction of pools of equal size. SGLang's per-priority request counts
// (--enable-priority-scheduling) are left out: the total is the series
// with priority="". TensorRT-LLM's running requests are those in the
// batch, as its Triton backend reports them: trtllm-serve's
// trtllm_num_requests_running counts every request the executor has taken
// in, and those of them not scheduled in the iteration wait, with the queued
// (without trtllm_num_scheduled_requests, in releases before it, all of
// them run). trtllm-serve's gauges are written through prometheus_client's
// multiprocess mode, a copy per process (label pid), which count once, the
// largest. trtllm-serve publishes its Prometheus metrics at
// /prometheus/metrics (its /metrics is JSON), and llama.cpp's router mode
// needs /metrics?model=<id>: point the Scraper's URL there.
//
// Two series of one metric with the same labels make the exposition
// malformed ([ErrParse]): summing them would count one value twice.
//
// Nothing in this package starts a goroutine except [Scraper.Run], which
// returns when its context is done. Stores and Scrapers are safe for
// concurrent use; reading an observation takes no lock.
//
// This package's plain data types (Config, Observation, OrcaReport, Status,
// StoreConfig) hold no lock: any number of goroutines may read a value of
// one at once, but none may write it meanwhile.
package signals
