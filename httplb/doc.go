// Package httplb connects an llmlb.Balancer to net/http: a [Transport]
// (an [http.RoundTripper]) that routes, retries and accounts for
// OpenAI-compatible requests, and [NewProxy], a streaming
// [httputil.ReverseProxy] built on it.
//
// A [Parser] reads each request body (/v1/completions prompts,
// /v1/chat/completions messages, Anthropic's /v1/messages with its system
// prompt, the Responses API's instructions and input, max_tokens, n (the
// completions of a chat or completion request, [llmlb.Request].Choices),
// model, user, reasoning effort, vLLM's cache_salt, and, for response affinity,
// the Responses API's previous_response_id and store)
// into an llmlb.Request: prompt tokens estimated at [BytesPerToken] bytes a
// token unless a token counter is given, byte-mode prefix hashes of the
// prompt text salted with the model, tenant and cache_salt (package prefix), the affinity
// key from a session header or the body's user, and the Feature, the kind of
// request whose output length a balancer learns: the model and the reasoning
// effort or thinking budget, such as "gpt-oss-120b|effort=high". The body is read up to a cap
// ([ErrBodyTooLarge] beyond it) and restored, re-readable for retries;
// malformed JSON is routed without body information, never refused. Parsing
// happens before admission, so it reads the body in place, in time linear in
// its size and without memory per message or prompt.
//
// The tenant, the principal whose prefix affinity and sessions are kept apart
// from every other's, is what [ParserConfig.Tenant] returns: the caller's
// authentication, never the client's word. By default there is none, and
// every request has the empty tenant; a header set by a trusted component in
// front of the gateway may be named with [ParserConfig.TrustTenantHeader].
// Session keys are scoped by the tenant, for affinity and for the admission
// caps, so equal session keys of different tenants are different sessions.
//
// The Transport picks an endpoint per attempt, rewrites the request URL to
// it (endpoints are [*Endpoint] values, base URLs, unless [Config.URL] maps
// them), and retries connection errors and retryable statuses on other endpoints
// until the response's first event arrives, honouring Retry-After with the
// back-off, budget and pushback rules of package retry, and optionally hedges
// an attempt that is slow to start on another endpoint. The first event
// (of a server-sent event stream, its first event with a "data:" line after
// the preamble events an OpenAI Responses stream starts with before
// generation, once it has ended with its blank line, where a client
// dispatches it; of any other body, its first byte) is the commitment
// point: the pick's
// FirstToken is called and the response is returned; from then on every
// body Read passes straight through, a failure reaches the caller as a read
// error and is never retried, and the
// pick's Done is called exactly once when the body ends, fails or is closed,
// or when the request's context ends first (a handler that panicked while
// relaying it never closes it).
// An event stream is held back to the end of that first event (at most
// [Config.MaxPeekBytes], or to the body's end), all its lines, to tell
// whether it is an error event: the format names an event by its last
// "event:" line before the blank line, which may come after its data. A
// streaming engine writes each event whole, its blank line with its data,
// so the wait costs nothing there. The event's value, which is judged, is
// the value of its first data line; the event-stream format joins an
// event's data lines with a line feed, so a value may spread over several:
// one whose JSON is still open at the end of its line (an object, array or
// string not closed, or no value yet, as after a bare "data") goes on in
// the event's next data line, past comments and other fields, to the line
// where it ends, or to the event's end, and is read as one value. When the
// limit cuts the event short, the value is judged as far as it came. Lines
// end at a line feed, a carriage return or both, as the format has it. A Responses stream's response.created, response.in_progress and
// response.queued events, which vLLM and SGLang send as soon as they accept
// the request, before the prompt is prefilled, are held back with it and
// are no first event: a failure during the prefill is retried, hedges wait
// for the first output, and FirstToken, from which a balancer learns each
// replica's prefill speed, is called at the first output. An error event
// is data with an "error" object at its top level, which vLLM and
// SGLang send after their 200 when generation fails, as OpenAI and
// Anthropic do, or with an "error" string, as Hugging Face
// text-generation-inference sends (with an "error_type"), or with the
// "type" "error" or "response.failed" of the OpenAI Responses API (keys and
// types as JSON decodes them, escapes and all), or a
// line with the field name "error" in place of a data line, as llama.cpp's
// server sends, or an event named "error", as Anthropic's Messages API
// names its error events, whatever its data, all its data lines, or
// without any: Anthropic's SDKs raise such an event on its name alone (see
// [OutputCounter.Failed]). An event is named by its last "event:" line
// before its blank line, before its data or after it, as the event-stream
// format has it: "event: error" names it "error", and a later "event:
// message", or an "event" line without a value, names it otherwise again.
// Such a first event is no
// commitment: nothing reached the client, and the attempt fails like a
// status answer whose status is the error's "code" (429 for OpenAI's
// "rate_limit_exceeded" and "insufficient_quota"; without a code from 100
// to 599, the status of the error's type, 400 for an
// "invalid_request_error", else 500; for text-generation-inference's, the
// status it answers for the error_type: 422 for "validation", 429 for
// "overloaded", 424 for "generation", else 500, and for the {"error":
// {"message": "...", "http_status_code": 422}} of its OpenAI-compatible
// routes, which say 422 for every error, the status it answers for the
// error the message names: 429 for "Model is overloaded", 422 for an
// "Input validation error: ..."; for an event named "error" whose data is
// of no such shape, its top-level "code", or its Anthropic error "type",
// else 500), retried on another
// endpoint if that status is (by default a
// 408, 429, 500, 502, 503 or 504, not a 400). When it is not
// retried, the caller gets the stream as the upstream sent it, the 200 and
// the error event (through [NewProxy], with the event's message made
// generic, as for an error answer: see [NewUpstreamErrorHandler]), and its
// pick ends, as the Reporter is told, with that status as the error. A stream that carried an error event after its
// first is passed on (through NewProxy, with that event's message made
// generic alike), and ends its pick, and the Reporter's count, as a
// failure.
// As the body is read, the output tokens it carries are reported to the pick
// with Generated (see [OutputCounter]): one per event of a server-sent event
// stream (per delta of an OpenAI Responses stream), or the usage count the
// response reports, so that a balancer with llmlb.WithOutputPrediction
// learns output lengths per tenant and Feature.
//
// The Responses API is stateful: vLLM (with its response store enabled)
// and SGLang keep each stored response in the memory of the replica that
// produced it, which answers 404 to a request continuing it
// ("previous_response_id") sent anywhere else, and holds its KV cache. The
// Transport learns, from the first bytes of each 2xx answer to a POST to a
// path ending in /responses (the "id" of a JSON body, if held back with its
// first byte, as vLLM writes it first; the response's "id" in a
// stream's response.created event, held back with the preamble), which
// endpoint produced which response, unless the request asked for none to
// be stored ("store": false). A Responses request continuing a response it
// knows goes to that endpoint only, excluding every other member, and is
// never retried or hedged: the endpoint's answer, a 503 say, is the
// client's. A request continuing a response it does not know (produced
// through another replica of the router, or before a restart, or
// forgotten) is routed as any other, and probes: while the endpoints answer
// 404, which vLLM and SGLang answer for a response they do not hold before
// computing anything, it is sent to the next endpoint not tried yet (not
// hedged, each endpoint at most once, each probe after the first a retry
// for [Config.Retry]'s budget, which bounds what a client sending unknown
// ids can cost), and the endpoint that answers is remembered as the
// response's. The last endpoint's 404 is the answer when none holds it. A
// request continuing a response whose endpoint has left the membership (or
// is excluded by [Config.Adjust]) is routed as any other, without probing.
// A request addressing a stored response by its id in the path, as vLLM
// and SGLang route them (a GET of .../responses/{id}, a retrieve, with
// ?stream=true or not; a POST to .../responses/{id}/cancel) or as the
// OpenAI API does (a DELETE of .../responses/{id}, a GET of
// .../responses/{id}/input_items), goes to the endpoint that produced the
// response alike, and is sent once to it: the pinned endpoint's answer, a
// 404 say, is the client's. For an id it does not know it probes as a
// continuation does, and is not otherwise retried.
// The id is a segment of the decoded path, as the engines' routers read
// it, so that an escaped slash is a slash and "%2F" splits no id. Such a
// request is no new inference: its answer, even an event stream, is
// committed at its first byte, and its output tokens are not counted.
// It remembers at most [Config.MaxResponseIDs] ids, the most recently
// used, each in a fixed few dozen bytes (it keeps seeded hashes, not the
// ids); ids longer than 256 bytes, or with JSON escapes, are ignored.
//
// The first event is also where retries stop: once an attempt has it, no
// retry or hedge starts and no other attempt can commit. An attempt that
// sends nothing at all (only SSE comments or preamble events, say), or
// never ends its first event, is bounded by [Config.FirstEventTimeout], off
// by default.
//
// [NewProxy] wraps a Transport in a ReverseProxy that flushes every event as
// it arrives, and whose error handler, made by [NewErrorHandler], maps
// failures to statuses: 401 when the tenant cannot be established, 413 for a
// body over the cap, 429 with Retry-After when the request is refused under
// load (admission caps, the fair queue), 503 when there is no endpoint to
// send it to, 500 for an endpoint without a usable URL, 502 otherwise. Clients
// get a generic OpenAI-style error with a request id; the detail (addresses,
// TLS and DNS errors) goes to the operator's log under that id. An
// upstream's own 5xx answer is treated alike by [NewUpstreamErrorHandler]:
// its status and Retry-After reach the client, its body only the log; and
// so is its 401, 403 or 429, about its credentials, account or capacity,
// whose message and headers (a managed provider's name the operator's
// organisation) stay in the log, and whose error type and code, if plain
// tokens, reach the client. No answer, a success included, passes on the
// upstream's headers about the operator's account (its organisation,
// project, deployment, region, rate limits), its cookies, or its own
// (Server, Via, its ORCA load report, its origin's HSTS and Alt-Svc),
// whether as headers or as trailers.
//
// Parsers, Transports and Endpoints are safe for concurrent use. Nothing in
// this package starts a goroutine, except a hedging Transport, whose attempt
// goroutines end before RoundTrip returns, and a Transport with both
// [Config.FirstEventTimeout] and an After in [Config.Retry], which waits for
// each attempt's timer on a goroutine that ends with the attempt.
//
// This package's plain data types (Config, ParserConfig) hold no lock: any
// number of goroutines may read a value of one at once, but none may write
// it meanwhile.
package httplb
