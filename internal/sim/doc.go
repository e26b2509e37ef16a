// Package sim is a deterministic discrete-event simulator that measures
// llmlb's routing policies against each other on the same traffic.
//
// # Model
//
// Routers are real [llmlb.Balancer]s running real policies. Each of the
// Config.Routers routers has its own Balancer and a [llmlb.Signal] that
// returns the replicas' engine metrics (running, waiting, KV usage) as of
// its last scrape, refreshed every Config.Scrape (all routers at the same
// instants unless Config.Stagger); the Balancer corrects that stale view
// with its own dispatches. Arrivals are split among the routers in turn.
// With Config.Share, the routers also share their requests in flight and
// routed prefixes through real [share.Group]s, batches moving between them
// on simulated time.
// A request is charged by Pick, released from prefill by FirstToken at its
// first output token, and finished by Done.
//
// Each replica is one continuous-batching engine ([Engine]): every
// iteration, running sequences get their next prefill chunk or one decode
// token within a token budget (chunked prefill, 8192 by default), waiting
// requests are admitted in arrival order while the budget, the batch limit
// (256) and KV blocks last, and when the KV cache runs out the newest running
// sequence is preempted back to the queue and later recomputes its prompt
// and output so far. KV memory is counted in 16-token blocks. Prompt blocks
// of a finished prefill stay cached under their chained hash ([Request]
// Prefix), and so do the blocks of a finished reply ([Request] Reply), and
// are reused by later prompts with the same prefix; cached blocks
// no sequence uses are evicted least recently used first. Replicas publish
// KV events (a block stored or evicted) to the prefix indexes of the policies
// that subscribe ([PolicyEnv.SubscribeKVEvents]), as vLLM's event stream
// does; the others guess the caches from their own decisions. An iteration's
// duration comes from the engine model's iteration-time function (package
// internal/model), by default the polynomial of NVIDIA Dynamo's mocker
// engine, divided by the replica's
// speed (Config.Speed, 1 by default, changed mid-run by
// Config.SpeedChanges) for fleets of unequal replicas, which declare their
// starting speeds to the routers as endpoint weights only with
// Config.DeclareWeights. The replica's scheduling
// state machine is exported as [Replica], without a clock, so that other
// drivers (such as an emulated engine running in real time) share it.
//
// # Workloads and measurements
//
// Workloads are generated ([Synthetic]: Poisson or Gamma arrivals,
// log-normal lengths, Zipf-popular shared prefixes, conversations paced by
// their replies or unpaced multi-turn sessions, agent fan-out bursts) or replayed ([ReadMooncake], [ReadAzure]). [Compare]
// runs the same requests under each policy (open loop: arrivals never wait
// for the cluster) and returns a [Result] per policy: TTFT, TPOT and E2E
// percentiles, SLO attainment and goodput, prefix hit rate, throughput,
// assignment gap, preemptions, and the herding metrics (skew of outstanding
// requests across replicas, pile-up share). Two references bound the hit
// rates: [InfiniteCacheHitRate] and [PooledCacheHitRate], what one LRU cache
// as large as the whole cluster's would reach. [Report] prints them as a table,
// JSON or SVG, and [Sweep] the results at several arrival rates, a load
// sweep. Policies are looked up by name in [Policies], which includes
// full-info, a greedy policy with perfect knowledge of the replicas and the
// requests' output lengths: a reference for what information buys, not an
// upper bound (under overload the best heuristics beat it);
// [Scenarios] holds the presets of the llmlb-sim command.
//
// [PoolScenarios] model deployments behind APIs instead of engines
// ([Deployment]: a concurrency limit, a rate limit answering 429 with
// Retry-After and OpenAI's rate-limit headers, latency spikes) and compare
// ways of routing to them with real balancers, retry.Ejector cooldowns and
// tiers that spill as package spill does ([RunPool]).
//
// Runs are deterministic for a seed: all randomness comes from seeded PCG
// sources, simulated time never reads the wall clock, and events at equal
// times are processed in the order they were scheduled. A single run's
// figures still carry the luck of its seed: near full SLO attainment two
// good policies differ by a request or two. [Merge] pools runs under
// several seeds into one result, as if they were one longer run.
package sim
