// Package extproc is an endpoint picker (EPP) for Gateway API Inference
// Extension gateways: an Envoy external processor
// (envoy.service.ext_proc.v3.ExternalProcessor) that routes each request
// with an llmlb.Balancer.
//
// A gateway built on Envoy (Envoy Gateway, kgateway, Istio, GKE) opens one
// ext_proc stream per HTTP request to the InferencePool's endpoint picker and
// sends it the request's headers and body. A [Server] reads the OpenAI body
// with an [httplb.Parser] (prompt tokens, max_tokens, prefix hashes salted with
// the model and the tenant, the session key, and the Feature: the model and
// the reasoning effort or thinking budget), asks the admission caps, picks
// an endpoint and answers with its address in the x-gateway-destination-endpoint
// header and in the envoy.lb dynamic metadata, as the endpoint picker
// protocol (version [ProtocolVersion], docs/proposals/004-endpoint-picker-protocol
// in kubernetes-sigs/gateway-api-inference-extension) requires. With a
// subset hint from the data plane, the picked endpoint and its fallbacks
// are among the hint's hosts, even while the pool changes. It then
// watches the response on the same stream: the pick's FirstToken is called at
// the end of the first event of a server-sent event stream, its blank line
// (the first byte of any other body), past the events an OpenAI Responses
// stream starts with before generation (those named response.created,
// response.in_progress or response.queued by their last "event:" line,
// which vLLM and SGLang send before the prompt is prefilled) and past an
// event named "error", which produced nothing, as package httplb takes it; and its Done when the response ends,
// fails, or the stream is cancelled, so the balancer's accounting is exact
// and returns to zero.
// The output tokens of the response body chunks it is sent are reported with
// the pick's Generated, counted by an [httplb.OutputCounter] (one per event,
// or the usage count the response reports), so that a balancer with
// llmlb.WithOutputPrediction learns output lengths per tenant and Feature;
// with response_body_mode NONE the picker sees no output and reports none,
// and the stream's close ends the response: one whose response headers the
// picker is not sent either (response_header_mode SKIP) ends as neither a
// success nor a failure (see [Server.Process]).
//
// The request body arrives in the mode the gateway's ext_proc filter is
// configured with, which Envoy announces in the stream's first message
// (since v1.34.0; for an older Envoy, [Config.Protocol] names it):
//
//   - FULL_DUPLEX_STREAMED, the mode the protocol requires and the inference
//     extension's charts configure: the body is gathered (up to the parser's
//     cap) until its end, the request is routed, and the headers response and
//     then the body, unchanged but for the model rewrite below, are streamed
//     back.
//   - BUFFERED and BUFFERED_PARTIAL: the headers are let through at once,
//     less any destination header the client sent, and the route is set in
//     the response to the buffered body.
//   - STREAMED and NONE: the headers go upstream before any body reaches the
//     picker, so the request is routed on its headers alone (session key,
//     tenant), without prompt information.
//
// A stream that announces another mode (GRPC, which de-frames gRPC
// messages) fails with FAILED_PRECONDITION before anything is picked.
//
// A destination header the client sent is replaced by the route, or
// removed where the route goes in the metadata alone (a BUFFERED request
// that ends with trailers and no body), so that a client cannot choose its
// endpoint. With the request headers not sent to the picker
// (request_header_mode SKIP), the first answer to the body sets the header:
// it takes effect where the data plane still holds the headers, and a data
// plane that sends them upstream unseen (body modes STREAMED and NONE, or no
// body) must remove the header itself.
//
// A request that names a model in [ModelRewriteHeader] (or its former name,
// [OldModelRewriteHeader]), as llm-d's picker reads it, has the value of its
// body's "model" replaced with it before the body is parsed and sent back,
// every other byte unchanged and Content-Length set to match, so that the
// new name is also what it is routed, and its prefix salted, with. Only a
// whole body the picker holds is rewritten (not in STREAMED or NONE mode,
// nor a BUFFERED_PARTIAL body cut short). The response then names the
// model the client asked for, as llm-d's picker renames it back: each
// "model" member whose value is the new name, unless the body is
// compressed. In response body mode FULL_DUPLEX_STREAMED (a member cut
// across chunks included) and BUFFERED the whole body is renamed. In
// STREAMED and BUFFERED_PARTIAL, where Envoy replaces each piece it sends
// the picker with the answer to it, each piece is renamed on its own (as
// upstream renames each chunk), so a member cut across two STREAMED
// chunks keeps the new name: holding its start back until the next chunk
// could lose it, as a body that ends with trailers has no last chunk to
// add it to and the answer to trailers carries no body. The rest of a
// BUFFERED_PARTIAL body, past the piece, reaches the client unseen and
// unrenamed. In mode NONE the body passes unchanged.
//
// An OpenAI Responses API request that continues a stored response
// ("previous_response_id"), or retrieves, cancels or deletes one by the
// id in its path (decoded as httplb and the engines decode it: "%5F" is
// '_', and "%2F" a slash that leaves no id), is routed to the endpoint that produced it, as package
// httplb's Transport routes it: vLLM and SGLang keep stored responses in
// the memory of the process, and any other endpoint would answer 404. The
// Server reads each response's id in the answers to Responses requests
// that it sees (the response.created event of a stream, the top-level "id"
// of a JSON body, within the first 64 KiB, which count against
// [Config.MaxBufferedBytes] while it looks: with no room left, the id is
// not learned) and remembers the endpoint of
// the last [httplb.DefaultMaxResponseIDs] ids; a request naming an id it
// does not remember, or whose endpoint has left the pool or lies outside
// the subset hint, is routed as any other.
//
// Refusals become immediate responses with an OpenAI-style JSON error that
// names no internal detail: 429 with Retry-After when an admission cap is
// reached or the request bodies and headers the Server holds would exceed
// [Config.MaxBufferedBytes], 503 when no endpoint may take the request
// (none, none healthy, or none in the data plane's subset hint: the
// balancer's panic mode, which picks among unhealthy endpoints when no
// healthy one is left, is not used), both with llm-d's
// [DroppedReasonHeader], 408 for a body not received within
// [Config.BodyTimeout], 413 for a body over the cap, 401 when the tenant
// cannot be established, 400 for a request the balancer rejects.
//
// A Server is safe for concurrent use; every stream runs on the goroutine
// gRPC calls [Server.Process] on, and the Server starts no goroutine of its
// own: a stream's body deadline is a [time.AfterFunc] timer, stopped when
// the request is routed.
//
// This package's plain data type, Config, holds no lock: any number of
// goroutines may read a value of it at once, but none may write it
// meanwhile.
package extproc
