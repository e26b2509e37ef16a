// Package llmlb routes LLM inference requests across the replicas of a model
// server (vLLM, SGLang, TensorRT-LLM, llama.cpp), inside your own Go process.
//
// Round robin and least connections assume requests cost the same and
// replicas are stateless. LLM requests break both assumptions: their cost
// varies by orders of magnitude with prompt and output length, the output
// length is unknown at dispatch, and each replica keeps a prefix (KV) cache,
// so where a request goes decides how much prefill work it needs. A
// [Balancer] makes that decision with exact accounting of the work it has
// sent, a [Policy] that scores the candidates, and optionally an engine
// [Signal] that it corrects for staleness.
//
// # How a request flows
//
// Create a Balancer with a policy, give it endpoints, then for each request:
//
//	p, err := b.Pick(ctx, &llmlb.Request{PromptTokens: 1200, MaxTokens: 512})
//	// send the request to p.Endpoint()
//	p.FirstToken() // when the first token streams back
//	p.Done(err)    // when the response ends, successfully or not
//
// Pick charges the request to the chosen endpoint: one outstanding request,
// its prompt tokens as pending prefill work, and its expected output tokens as
// decode work (Request.OutputTokens, else the decode allowance, capped by
// MaxTokens, times its Choices). FirstToken releases the prefill charge: the prompt has been
// processed and the request is now only decoding. It is also the commitment
// point: before it a request may be retried or hedged elsewhere invisibly,
// after it not. Done releases the rest. Every accepted but unfinished request
// counts as load, including one still queued inside the engine, which holds no
// KV blocks yet but will.
//
// # Policies
//
// Policies are values built by constructors; pass one to [New]:
//
//   - [RoundRobin] and [Random]: baselines that ignore load.
//   - [LeastOutstanding], [LeastTokens], [LeastKV]: full scans for the lowest
//     [RequestsScore], [TokensScore] or [KVScore]; [LeastScore] for any other
//     [Score].
//   - [P2C]: power of two choices over any [Score]: sample two candidates,
//     keep the lower. Constant cost, and it does not herd when several
//     balancers share a stale view.
//   - [WeightedLeastRequest]: Envoy's policy for replicas of unequal capacity
//     (an Endpoint may implement Weight() float64).
//   - [PeakEWMA]: Finagle's latency-aware policy, for endpoints without
//     metrics to read, such as managed APIs: it learns from the latency they
//     answer with.
//   - [ConsistentHash] (bounded loads, on Request.AffinityKey) and
//     [PrefixHash] (SGLang's prefix_hash): locality without an index.
//   - [PrefixAware] and [SGLangCacheAware], [KVCost] (NVIDIA Dynamo's cost
//     function) and [GIEDefault] (the Kubernetes inference gateway's
//     scorers): cache-aware policies over a prefix index (package prefix),
//     fed by their own decisions or by engine KV events.
//   - [Segregated]: pools of endpoints per request size class.
//   - [AdapterAffinity]: wraps a policy to send requests naming a LoRA
//     adapter to the endpoints holding it, spreading a hot adapter.
//   - [NewDisaggregated] is not a policy but a pair of balancers: it picks a
//     prefill worker and a decode worker for each request, for engines that
//     split the two phases.
//   - [Default]: the recommended policy. It prices queueing and cache
//     misses in the same unit (prefill tokens), so locality yields to load
//     exactly when the queue in front of a prefix holder costs more than its
//     cache saves, and holds on to locality when every queue is long. Given
//     an index of engine KV events ([DefaultConfig].Events) it credits only
//     what the engines hold, and more, at nominal load.
//
// Ties are always broken at random, never by position. A custom Policy
// implements Choose over [Candidates], which exposes each candidate's
// [EndpointLoad], the request, and the balancer's random source and clock.
//
// # Signals and staleness
//
// An engine reports the load of the whole replica, including other routers'
// work, but the report is old by the time it is read. With [WithSignal] the
// estimate of an endpoint is the last observation, plus this balancer's own
// dispatches sent after it and still outstanding, minus its own requests the
// observation counted that have finished since, so the correction never
// counts a request twice. An observation older than the maximum age is
// dropped and the endpoint falls back to this balancer's own counts: a stale
// endpoint never looks idler than this balancer's own requests make it, and
// [KVScore] prices its KV usage at the mean of the candidates that report
// one.
//
// # Slow start and health
//
// An endpoint that joins after the first membership, or is marked healthy
// again with [Balancer.SetHealthy], has no outstanding work and a cold cache;
// load-based policies would flood it. [WithSlowStart] ramps its effective
// weight as Envoy does. Unhealthy endpoints are skipped; busy ones are not:
// a saturated replica stays in the pool and only scores worse, because
// removing busy replicas concentrates load on the rest.
//
// # Time, randomness, concurrency
//
// [WithClock] and [WithRand] inject the clock and the random source, so tests
// and the simulator are deterministic. The Balancer starts no goroutines. All
// its methods and those of [Pick] are safe for concurrent use; Pick,
// FirstToken and Done never block on I/O and do not allocate for the
// count-based policies.
//
// This package's plain data types (AdapterConfig, DefaultConfig,
// DisaggConfig, DoneInfo, EndpointLoad, EndpointStats, FirstTokenInfo,
// GIEConfig, HashConfig, KVCostTerms, Load, OutputConfig, PeakEWMAConfig,
// PickInfo, Pool, PrefixAwareConfig, PrefixHashConfig, Request, SlowStart)
// hold no lock: any number of goroutines may read a value of one at once,
// but none may write it meanwhile.
package llmlb
