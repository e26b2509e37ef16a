// Package engine is an emulated LLM inference server: a real HTTP server that
// speaks the OpenAI-compatible completions API and exposes vLLM's metrics,
// driven in real time by a continuous-batching model, so that gateways and
// routers can be tried and tested on loopback without GPUs.
//
// An [Engine] serves POST /v1/completions and /v1/chat/completions (with
// "stream": true as server-sent events, otherwise one JSON answer), GET
// /metrics (vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, vllm:cache_config_info with num_gpu_blocks and
// block_size, vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total,
// vllm:num_preemptions_total, in the Prometheus text format), GET /health and
// GET /v1/models.
//
// The model is the simulator's replica, [sim.Replica], run against the wall
// clock with the same parameters ([sim.Engine]) and iteration-time model:
// each iteration gives every running sequence its next prefill chunk or one
// decode token within a token budget, admits waiting requests in order while
// the budget, the batch limit and KV blocks last, and preempts the newest
// sequence when KV blocks run out; the engine then sleeps for the iteration
// time of [sim.Engine.IterTime] (NVIDIA Dynamo's mocker polynomial by
// default) divided by [Config.Speedup]. A request's prompt is counted at
// [BytesPerToken] bytes a token; its text (the prompt, or each chat message's
// role and content in order) is cut into blocks of BlockSize tokens' worth of
// bytes, hashed with package prefix, and the prompt blocks of a finished
// prefill stay in the prefix cache on free KV blocks, evicted least recently
// used first, so a later prompt with the same head skips that prefill. The
// first token is emitted at the end of the prefill, then one per iteration,
// up to the request's max_tokens (or [Config.DefaultMaxTokens]).
//
// Creating an Engine starts nothing: [Engine.Run] runs the batching loop
// until its context ends, and [Engine.Serve] runs it together with an HTTP
// server on a listener. An Engine is safe for concurrent use.
package engine
