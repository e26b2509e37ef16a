// Package engine is an emulated LLM inference server: a real HTTP server that
// speaks the OpenAI-compatible completions and responses APIs and exposes
// vLLM's metrics, driven in real time by a continuous-batching model, so
// that gateways and routers can be tried and tested on loopback without
// GPUs.
//
// An [Engine] serves POST /v1/completions, /v1/chat/completions and
// /v1/responses (with "stream": true as server-sent events, otherwise one
// JSON answer), GET
// /metrics (vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, vllm:cache_config_info with num_gpu_blocks and
// block_size, vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total,
// vllm:num_preemptions_total, vllm:request_success_total with
// finished_reason "length", the only way a request here finishes, in the
// Prometheus text format as vLLM's prometheus_client writes it: every series
// labelled model_name and engine "0", counters typed under their name
// without _total, values written as Python floats such as "3.0" and
// "1.234567e+06"), GET /health (200, or as vLLM's 503 once the
// engine is dead: its [Engine.Run] has returned) and GET /v1/models. As
// vLLM, /v1/completions reads the prompt and /v1/chat/completions the
// messages, and a request without its own field is refused (400); a
// completions request carries one prompt, a string or a list of one: a
// batch of several, or token IDs, is refused too, as is an n other than 1
// (one choice a request). As vLLM, a request naming a model
// other than the one the engine serves ([Config].Model, which GET
// /v1/models lists) gets 404 with vLLM's error: type "NotFoundError", param
// "model", message "The model `NAME` does not exist."; the engine serves no
// LoRA adapters, so their names are refused too. Every error answer has
// the shape of vLLM's, {"error": {"message", "type", "param", "code"}}, with
// vLLM's type: "Bad Request" for a body vLLM's request models would not
// validate, "BadRequestError" for one its handler refuses (a context too
// long has param "input_tokens" or "max_tokens" and vLLM's message, and so
// has an output length below 1, of whichever field, param "max_tokens" and
// vLLM's "max_tokens must be at least 1, got N."), otherwise the status's
// reason phrase. A request whose model is
// "", null or absent is for the served model, and every answer names the
// served model; the model is checked before the prompt is read, as vLLM
// checks it before rendering the prompt. Chat messages are checked as vLLM
// checks them: each is an object with a string role, and its content, if
// any, a string or a list of content parts (strings, or objects of a type
// vLLM knows, text parts with a string text), or null in an assistant
// message or a function message with a name; anything else is refused with
// 400 and the message's index, not read as empty text.
//
// As vLLM's, an answer's id (in every chunk of a stream) is "cmpl-", or
// "chatcmpl-" for a chat request, and the request's X-Request-Id header (of
// at most 1 KiB: a stream repeats it in every chunk), or otherwise a random
// UUID in hex; the header is not echoed, as vLLM echoes it only with
// --enable-request-id-headers.
//
// A stream (of Content-Type "text/event-stream; charset=utf-8", as
// vLLM's, from Starlette, and, as vLLM's, no other header such as
// Cache-Control) sends one chunk a token, then "data: [DONE]"; as
// vLLM's, a chat stream's first token is preceded, in the same write, by a
// chunk whose delta is {"role": "assistant", "content": ""}. As vLLM's, it
// reports
// usage only when asked: with "stream_options" (include_usage is true
// unless set false or null, so {} asks too) a last chunk, with no choices,
// carries the request's usage (prompt_tokens, completion_tokens,
// total_tokens), and with "continuous_usage_stats": true as well every
// chunk carries the usage so far (none yet in the role chunk).
// stream_options other than null or {} without "stream": true are refused
// (400). A non-streaming answer always carries its usage. Every choice has
// the members vLLM writes for a request without logprobs or token IDs:
// index, the text, message or delta, "logprobs": null, finish_reason
// ("length", or null in a chunk before the last), "stop_reason": null (in a
// chat stream only in the last chunk), and vLLM's token tracing members as
// null: "token_ids" (not in a chat stream's role chunk), in a completions
// choice "prompt_token_ids", and in a non-streaming choice, which has every
// member of vLLM's model, "prompt_logprobs" (completions) and
// "routed_experts"; a non-streaming message has "refusal", "annotations",
// "audio", "function_call" and "reasoning" null. A non-streaming answer
// has every member of vLLM's answer model too: "service_tier",
// "system_fingerprint" (as from vLLM with --fingerprint-mode none),
// "kv_transfer_params" and "metrics" null, a chat answer
// "prompt_logprobs", "prompt_token_ids" and "prompt_text" null as well,
// and its usage "prompt_tokens_details" null.
//
// A chat or completions stream in progress when the engine's Run returns
// ends as vLLM's ends when its engine dies: after the chunks sent so far,
// one event with vLLM's error, {"error": {"message": "EngineCore
// encountered an issue. See stack trace (above) for the root cause.",
// "type": "InternalServerError", "param": null, "code": 500}}, then
// "data: [DONE]"; a responses stream breaks, as vLLM's does. A request
// that does not stream gets 500 then, with the same error, and so does any
// request after that, streaming or not, as vLLM refuses every request once
// its engine is dead (GET /health answers 503).
//
// POST /v1/responses is the Responses API as vLLM serves it without a
// reasoning or tool parser. Its prompt is the chat request of the same
// messages, and costs and caches as that request: the instructions as a
// system message, then a string input as a user message, or a list of
// input items (messages of role user, assistant, system or developer whose
// content is a string or a list of content parts, function calls, function
// call outputs as tool messages, reasoning items); an input of another
// shape is refused with 400 and the item's index, before the model is
// checked, as vLLM's request model refuses it. Its output length is
// max_output_tokens, checked against the context and capped as a chat
// request's max_tokens. As vLLM with its response store on
// (VLLM_ENABLE_RESPONSES_API_STORE=1), the engine stores each complete
// response whose request does not set "store" to false, in its memory
// only, keeping the 4,096 most recently used within 64 MiB (vLLM keeps
// every one): GET /v1/responses/{response_id} answers its response
// object (a stream of it, with ?stream=true, breaks after its 200, as
// vLLM's does for a response not made in background mode), POST
// /v1/responses/{response_id}/cancel answers 400, since it is complete,
// and a request whose previous_response_id names it continues its
// conversation: the request's instructions, the earlier messages but their
// system message, the earlier output as an assistant message, then the
// input. An id it does not hold is answered 404 with vLLM's error
// ("Response with id '...' not found."). Background mode is not emulated:
// it is refused (400) as by vLLM without a store. The
// answer is vLLM's response object: id "resp_" and a random UUID in hex
// (or the body's request_id), object "response", one assistant message of
// one output_text part, and usage with input_tokens, its cached_tokens
// (the prompt tokens found in the prefix cache), output_tokens and
// total_tokens; since every request here ends at its output limit, its
// status is "incomplete", with incomplete_details {"reason":
// "max_output_tokens"}, as vLLM reports a request that ends so. A stream
// sends vLLM's events, each as an "event:" line and a "data:" line with
// its type and sequence_number (from 0): response.created and
// response.in_progress, then response.output_item.added,
// response.content_part.added, one response.output_text.delta a token,
// response.output_text.done, response.content_part.done,
// response.output_item.done, and response.completed with the final
// response; no "data: [DONE]".
//
// A request's body must arrive within [Config.ReadTimeout] of its header,
// so that a client trickling its body cannot hold a handler or a
// connection for ever: past it a completions or responses request gets 408
// and its connection closes (over HTTP/2 only its stream ends), and any
// other request, whose body the engine does not read, gets its answer and
// its connection closes. Answers are not bounded, so that a stream lasts as
// long as its tokens take.
//
// The model is the simulator's replica, run against the wall clock with the
// same parameters ([Config.TokenBudget], [Config.MaxRunning],
// [Config.KVBlocks], [Config.BlockSize]) and iteration-time model:
// each iteration gives every running sequence its next prefill chunk or one
// decode token within a token budget, admits waiting requests in order while
// the budget, the batch limit and KV blocks last, and preempts the newest
// sequence when KV blocks run out; the engine then sleeps for the iteration
// time of NVIDIA Dynamo's mocker polynomial (prefill ms = 4.209989e-7*T^2 +
// 1.518344e-2*T + 16.50142 for T batched prefill tokens, decode ms =
// max(1, -25.74*u^2 + 54.01*u + 5.74) at active KV fraction u) divided by
// [Config.Speedup]. A request's prompt is counted at
// [BytesPerToken] bytes a token; its text (the prompt, or each chat message's
// role and content in order) is cut into blocks of BlockSize tokens' worth of
// bytes, hashed with package prefix, and the prompt blocks of a finished
// prefill stay in the prefix cache on free KV blocks, evicted least recently
// used first, so a later prompt with the same head skips that prefill. The
// first token is emitted at the end of the prefill, then one per iteration,
// up to the request's max_tokens (a chat request's max_completion_tokens,
// if set, wins over it, as in vLLM; at most [Config.MaxTokensCap]). As
// vLLM's, a completions request without max_tokens asks for 16 tokens,
// checked against the context as an explicit max_tokens is, and reads no
// max_completion_tokens. A request that sets no output length (a chat
// request, a responses request, or a completions request whose max_tokens
// is null) gets [Config.DefaultMaxTokens] as far as the context has room:
// vLLM gives it the rest of the context, which a model ends sooner at its
// end-of-sequence token, or the model's generation config's
// max_new_tokens; the engine, whose output has no end but its length,
// stands for either with DefaultMaxTokens.
//
// Creating an Engine starts nothing: [Engine.Run] runs the batching loop
// until its context ends, and [Engine.Serve] runs it together with an HTTP
// server on a listener; when Serve's context ends, it closes every
// connection before it stops the batching loop, so that its streams break
// as a killed server's do, not with the event of a dead engine. With
// [Config].ShutdownTimeout it drains first, as vLLM with --shutdown-timeout
// does: it refuses new requests with 503 and lets those in progress finish
// for up to that long. An Engine is safe for concurrent use.
//
// This package's plain data types (Config, Stats) hold no lock: any number
// of goroutines may read a value of one at once, but none may write it
// meanwhile.
package engine
