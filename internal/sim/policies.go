package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// PolicyEnv is what a policy constructor may use. A constructor is called
// once per router per run, so a policy may keep per-run state. A run is
// simulated on one goroutine: call the methods from the constructor, and
// expect the functions registered with them on that goroutine too.
type PolicyEnv struct {
	// Replicas is the number of replicas; candidate member m of a pick is
	// replica m. For a pool of a disaggregated run, they are the pool's:
	// member m of the decode pool is replica [Config].Prefill+m.
	Replicas int
	// BlockTokens is the number of prompt tokens per Request.Prefix hash
	// of the workload; a prefix index for the policy must use it.
	BlockTokens int
	// LongShare is the share of the workload's prompt tokens in prompts of
	// at least SegregatedLongPrompt tokens.
	LongShare float64
	// Router is the index of the router the policy serves.
	Router int
	// Slots is the replicas' batch slots ([Engine.MaxRunning]), which an
	// operator knows from the engines' configuration.
	Slots int
	// SLO is the run's objective ([Config].SLO), which an operator may
	// declare to a policy.
	SLO SLO
	// Stale returns the router's last scraped observation of replica m,
	// without the Balancer's correction for its own dispatches.
	Stale func(m int) llmlb.Load

	run       *runner       // true state, for full-info only
	decisions *prefix.Index // the policy's index of its own decisions, if any
	lo        int           // the replica of member 0: a disaggregated run's decode pool starts at Config.Prefill
	prefill   bool          // the policy routes a disaggregated run's prefill pool
}

// SubscribeKVEvents feeds ix every replica's KV events from now on (in a
// disaggregated run, those of the replicas of the policy's pool): a
// [prefix.Index.Stored] when a prompt block enters a replica's prefix cache
// and a [prefix.Index.Removed] when it is evicted, applied at once, as an
// engine's event stream would with negligible delay. ix's block size must be
// BlockTokens. A policy that subscribes knows what the engines hold instead
// of guessing it from its own decisions.
func (e *PolicyEnv) SubscribeKVEvents(ix *prefix.Index) error {
	switch {
	case e.run == nil:
		return fmt.Errorf("%w: SubscribeKVEvents on a PolicyEnv the simulator did not create", ErrInvalidConfig)
	case ix == nil:
		return fmt.Errorf("%w: SubscribeKVEvents of a nil index", ErrInvalidConfig)
	}
	if ix.BlockSize() != e.BlockTokens {
		return fmt.Errorf("%w: index block size %d, workload %d tokens per hash", ErrInvalidConfig, ix.BlockSize(), e.BlockTokens)
	}
	r := e.run
	if len(r.kvSubs) == 0 {
		var rev []uint64 // scratch: a run of stored blocks, newest first
		for _, rep := range r.reps {
			key, bt, m := replicaKey(rep.idx), e.BlockTokens, rep.idx
			rep.SetKVEventsHandler(func(hs []uint64, stored bool) {
				for _, sub := range r.kvSubs {
					if m < sub.lo || m >= sub.hi {
						continue
					}
					switch {
					case !stored:
						_ = sub.ix.Removed(key, bt, hs...)
					case len(hs) == 1:
						_ = sub.ix.Stored(key, bt, hs[0])
					case len(hs) <= sub.ix.Capacity(key):
						// Stored touches its blocks last first: storing the
						// run newest first touches them in the order they
						// were stored, as one event each would. (Beyond the
						// endpoint's capacity, only the first blocks of
						// one event are kept.)
						rev = append(rev[:0], hs...)
						slices.Reverse(rev)
						_ = sub.ix.Stored(key, bt, rev...)
					default:
						for _, h := range hs {
							_ = sub.ix.Stored(key, bt, h)
						}
					}
				}
			})
		}
	}
	r.kvSubs = append(r.kvSubs, kvSub{ix: ix, lo: e.lo, hi: e.lo + e.Replicas})
	return nil
}

// kvSub is an index fed the KV events of replicas lo to hi-1.
type kvSub struct {
	ix     *prefix.Index
	lo, hi int
}

// endSub is a function told when a request ends; in a disaggregated run,
// prefill ones are told when its prefill ends, with the prefill replica.
type endSub struct {
	fn      func(m int, r *llmlb.Request)
	prefill bool
}

// OnRequestEnd registers fn to be called, synchronously, when a request this
// router picked ends (done or rejected), after its Pick.Done, with the
// replica m it went to and the request as given to Pick. A policy that
// tracks requests in flight by their prompt, as Dynamo's active sequences
// do, releases them here. For the prefill pool of a disaggregated run, a
// request ends when its KV reached its decode worker, m being its prefill
// worker.
func (e *PolicyEnv) OnRequestEnd(fn func(m int, r *llmlb.Request)) error {
	switch {
	case e.run == nil:
		return fmt.Errorf("%w: OnRequestEnd on a PolicyEnv the simulator did not create", ErrInvalidConfig)
	case fn == nil:
		return fmt.Errorf("%w: OnRequestEnd(nil)", ErrInvalidConfig)
	}
	r := e.run
	for len(r.endSubs) <= e.Router {
		r.endSubs = append(r.endSubs, nil)
	}
	r.endSubs[e.Router] = append(r.endSubs[e.Router], endSub{fn: fn, prefill: e.prefill})
	return nil
}

// release tells the router that picked s's replica that s ended.
func (r *runner) release(s *reqState) { r.releasePool(s, false, s.replica) }

// releasePool tells the router that picked s's replica m, in the prefill
// pool or not, that s ended there.
func (r *runner) releasePool(s *reqState, prefill bool, m int) {
	if s.router >= len(r.endSubs) || len(r.endSubs[s.router]) == 0 {
		return
	}
	lr := llmlb.Request{PromptTokens: s.req.PromptTokens, Prefix: s.req.Prefix}
	for _, sub := range r.endSubs[s.router] {
		if sub.prefill == prefill {
			sub.fn(m, &lr)
		}
	}
}

// applySignal sets the scrape interval of a run of spec: SignalInterval if
// set, else the preset's own, else Scrape as given.
func (c *Config) applySignal(spec PolicySpec) {
	switch {
	case c.SignalInterval > 0:
		c.Scrape = c.SignalInterval
	case spec.Scrape > 0:
		c.Scrape = spec.Scrape
		if c.MaxSignalAge == 0 {
			c.MaxSignalAge = spec.MaxSignalAge
		}
	}
}

// Signal freshness of the gie-default preset: the endpoint picker polls each
// engine's metrics every 50 ms (--refresh-metrics-interval, in
// pkg/epp/server/options.go of gateway-api-inference-extension v1.5.0) and
// scores the last metrics it holds however old they are: its
// --metrics-staleness-threshold (2 s) only feeds its logs, and the
// scheduler lists candidates with AllPodsPredicate
// (pkg/epp/requestcontrol/candidates.go). GIEMaxSignalAge, an hour, stands
// for that "however old": no observation of a run gets near it.
const (
	GIEScrape       = 50 * time.Millisecond
	GIEMaxSignalAge = time.Hour
)

// The llmd-default preset's prefix blocks: llm-d's router hashes blocks of
// the engine's size, at least LLMDMinBlockTokens (minBlockSizeTokens), and
// matches up to LLMDMaxPrefixTokens of a prompt (defaultMaxPrefixTokens), in
// pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix of
// llm-d/llm-d-router v0.10.0.
const (
	LLMDMinBlockTokens  = 64
	LLMDMaxPrefixTokens = 131072
)

// SGLangTreeBlocks is the capacity per replica of the sglang-* presets'
// prefix index: SGLang's router bounds each worker's approximate radix tree
// to --max-tree-size 67108864 characters (2^26, the router's command-line
// default), about 2^20 blocks of 16 tokens at 4 characters a token, and
// evicts by size, not age.
const SGLangTreeBlocks = 1 << 20

// noTTL is the TTL of an index whose recorded blocks never expire, as the
// approximate indexes of SGLang's router and of the inference gateway's
// picker (both LRUs bounded by size only).
const noTTL = time.Duration(math.MaxInt64)

// PolicySpec names a policy constructor.
type PolicySpec struct {
	// Name is the policy's name on the command line and in results.
	Name string
	// Doc is a one-line description.
	Doc string
	// New builds the policy for one router of one run.
	New func(env *PolicyEnv) (llmlb.Policy, error)
	// Herding marks the policies that exist to show herding; they run in the
	// herding scenario and are left out of the default list.
	Herding bool
	// Variant marks a variant of another policy that isolates one design
	// choice, such as default-no-slots; it runs only when named and is left
	// out of the default list.
	Variant bool
	// Scrape is the interval at which the system the preset models
	// refreshes its engine signals by default; 0 means [Config.Scrape].
	// [Config.SignalInterval] overrides it.
	Scrape time.Duration
	// MaxSignalAge is the age after which that system stops trusting an
	// observation; 0 means 3*Scrape. It applies with Scrape.
	MaxSignalAge time.Duration
	// Decode, if not nil, makes the policy disaggregated: New builds the
	// policy of the prefill pool (the first [Config].Prefill replicas) and
	// Decode that of the decode pool (the others), each in its own
	// Balancer, which [llmlb.NewDisaggregated] composes with Disagg.
	// Disaggregated policies run only when named.
	Decode func(env *PolicyEnv) (llmlb.Policy, error)
	// Disagg configures the composition of a disaggregated policy.
	Disagg llmlb.DisaggConfig
}

// Policies returns every policy the simulator knows, in display order. It
// returns a new slice on each call.
func Policies() []PolicySpec {
	return []PolicySpec{
		{Name: "round-robin", Doc: "deal requests in turn", New: plain(llmlb.RoundRobin)},
		{Name: "random", Doc: "uniform random", New: plain(llmlb.Random)},
		{Name: "least-outstanding", Doc: "fewest requests (scrape + own dispatches), full scan", New: plain(llmlb.LeastOutstanding)},
		{Name: "p2c", Doc: "power of two choices over requests (scrape + own dispatches)", New: func(*PolicyEnv) (llmlb.Policy, error) { return llmlb.P2C(llmlb.RequestsScore), nil }},
		{Name: "least-tokens", Doc: "least outstanding token work of this router", New: plain(llmlb.LeastTokens)},
		{Name: "least-kv", Doc: "lowest KV usage plus queued work", New: plain(llmlb.LeastKV)},
		{Name: "weighted-least-request", Doc: "Envoy weighted least request, bias 1", New: func(*PolicyEnv) (llmlb.Policy, error) {
			return llmlb.WeightedLeastRequest(llmlb.DefaultActiveRequestBias)
		}},

		{Name: "consistent-hash", Doc: "bounded-load consistent hashing on the session key (c = 1.25)", New: func(*PolicyEnv) (llmlb.Policy, error) {
			return llmlb.ConsistentHash(llmlb.HashConfig{})
		}},
		{Name: "sglang-prefix-hash", Doc: "SGLang prefix_hash: first 256 tokens on a ring, load factor 1.25 on the router's in-flight counts", New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return llmlb.PrefixHash(llmlb.PrefixHashConfig{BlockTokens: env.BlockTokens})
		}},
		{Name: "sglang-cache-aware", Doc: "SGLang cache_aware today (abs 64, rel 1.5, match 0.3; a miss goes to the least loaded; router's in-flight counts)", New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newSGLangCacheAware(env, false)
		}},
		{Name: "sglang-cache-aware-v0", Doc: "SGLang cache_aware before PR 14650 (Dec 2025): a miss goes to the smallest tree", Variant: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newSGLangCacheAware(env, true)
		}},
		{Name: "prefix-aware", Doc: "cache-aware with load among holders and locality under imbalance", New: func(env *PolicyEnv) (llmlb.Policy, error) {
			ix, err := newIndex(env)
			if err != nil {
				return nil, err
			}
			return llmlb.PrefixAware(llmlb.PrefixAwareConfig{Index: ix})
		}},
		{Name: "dynamo-kv", Doc: "NVIDIA Dynamo KV-block cost function, published defaults, cache state from KV events, unique active blocks", New: newDynamoKV},
		{Name: "gie-default", Doc: "Gateway API Inference Extension v1.5.0 default scorers (queue 2, KV 2, prefix 3), metrics polled every 50 ms",
			Scrape: GIEScrape, MaxSignalAge: GIEMaxSignalAge, New: func(env *PolicyEnv) (llmlb.Policy, error) {
				// The picker's approximate index: an LRU per replica sized
				// from the engines' KV blocks (the policy sizes it from
				// the signal), no TTL, the first 256 blocks of a prompt.
				ix, err := env.decisionIndex(prefix.IndexConfig{BlockSize: env.BlockTokens, TTL: noTTL})
				if err != nil {
					return nil, err
				}
				return llmlb.GIEDefault(llmlb.GIEConfig{Index: ix})
			}},
		{Name: "llmd-default", Doc: "llm-d's router v0.10.0, the inference gateway's picker since its v1.6.0: gie-default's scorers and 50 ms polls, prefix blocks of at least 64 tokens matched over up to 131,072 tokens",
			Scrape: GIEScrape, MaxSignalAge: GIEMaxSignalAge, New: func(env *PolicyEnv) (llmlb.Policy, error) {
				// The same LRU per replica, one entry per engine KV block
				// however large the picker's blocks (minBlockSizeTokens 64
				// and defaultMaxPrefixTokens 131072 in llm-d/llm-d-router
				// v0.10.0, pkg/epp/framework/plugins/requestcontrol/
				// dataproducer/approximateprefix).
				ix, err := env.decisionIndex(prefix.IndexConfig{BlockSize: env.BlockTokens, TTL: noTTL})
				if err != nil {
					return nil, err
				}
				block := max(env.BlockTokens, LLMDMinBlockTokens)
				return llmlb.GIEDefault(llmlb.GIEConfig{Index: ix, MinBlockTokens: LLMDMinBlockTokens,
					MaxPrefixBlocks: LLMDMaxPrefixTokens / block})
			}},
		{Name: "segregated", Doc: "prompts >= 8k tokens to a pool sized by their token share; least tokens in each pool", New: newSegregated},
		{Name: "default", Doc: "llmlb.Default: queued prefill + k x uncached prompt + KV footprint, k grows under overload; caches from KV events and its decisions; replicas' speeds measured and priced when they differ", New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newEventsDefault(env, llmlb.DefaultConfig{Slots: env.Slots})
		}},
		{Name: "default-slo", Doc: "llmlb.Default as default, told the run's TTFT and TPOT objectives (DefaultConfig.TTFTObjective, TPOTObjective): a cache miss also costs the decode stall its prefill causes", Variant: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newEventsDefault(env, llmlb.DefaultConfig{Slots: env.Slots, TTFTObjective: env.SLO.TTFT, TPOTObjective: env.SLO.TPOT})
		}},
		{Name: "default-full", Doc: "llmlb.Default as default, scoring every replica however many (DefaultConfig.Sampled negative) where default samples 16 beyond 64", Variant: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newEventsDefault(env, llmlb.DefaultConfig{Slots: env.Slots, Sampled: -1})
		}},
		{Name: "default-nolearn", Doc: "llmlb.Default as default, with DisableLearning: prices in prefill tokens only, every replica at the pool's average speed", Variant: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newEventsDefault(env, llmlb.DefaultConfig{Slots: env.Slots, DisableLearning: true})
		}},
		{Name: "default-no-slots", Doc: "llmlb.Default as default, but not told the engines' batch slots", Variant: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return newEventsDefault(env, llmlb.DefaultConfig{})
		}},
		{Name: "default-lora", Doc: "llmlb.AdapterAffinity over default: a request's LoRA adapter to replicas holding it, spreading a hot one as its holders load up", Variant: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			p, err := newEventsDefault(env, llmlb.DefaultConfig{Slots: env.Slots})
			if err != nil {
				return nil, err
			}
			return llmlb.AdapterAffinity(p, llmlb.AdapterConfig{})
		}},
		{Name: "least-outstanding-lora", Doc: "llmlb.AdapterAffinity over least-outstanding", Variant: true, New: func(*PolicyEnv) (llmlb.Policy, error) {
			return llmlb.AdapterAffinity(llmlb.LeastOutstanding(), llmlb.AdapterConfig{})
		}},
		{Name: "default-approx", Doc: "llmlb.Default with cache state guessed from its own decisions, for engines that publish no KV events", New: func(env *PolicyEnv) (llmlb.Policy, error) {
			ix, err := newIndex(env)
			if err != nil {
				return nil, err
			}
			return llmlb.Default(llmlb.DefaultConfig{Index: ix, Slots: env.Slots})
		}},

		{Name: "pd-default", Doc: "disaggregated: llmlb.Default on the prefill pool and on the decode pool, every prompt prefilled remotely",
			New: newPDDefault, Decode: newPDDefault},
		{Name: "pd-default-local", Doc: "pd-default with Dynamo's conditional disaggregation: a prompt whose uncached part is under 2048 tokens and 70% prefills on its decode worker",
			New: newPDDefault, Decode: newPDDefault, Disagg: llmlb.DisaggConfig{LocalPrefillTokens: PDLocalPrefillTokens}},
		{Name: "pd-round-robin", Doc: "disaggregated: round robin on both pools",
			New: plain(llmlb.RoundRobin), Decode: plain(llmlb.RoundRobin)},
		{Name: "pd-dynamo", Doc: "disaggregated as Dynamo routes it: dynamo-kv's cost without the decode term on the prefill pool, and without the overlap credit and with every active prompt counted in full (load only) on the decode pool",
			New: newDynamoPrefill, Decode: newDynamoDecode},
		{Name: "pd-default-least-kv", Doc: "pd-default with llmlb.LeastKV on the decode pool", Variant: true,
			New: newPDDefault, Decode: plain(llmlb.LeastKV)},
		{Name: "pd-default-least-tokens", Doc: "pd-default with llmlb.LeastTokens on the decode pool", Variant: true,
			New: newPDDefault, Decode: plain(llmlb.LeastTokens)},
		{Name: "full-info", Doc: "perfect knowledge of replica state, cache and output lengths, deciding greedily (a reference, not a bound)", New: newOracle},
		{Name: "stale-least-outstanding", Doc: "fewest running+waiting in the last scrape only (no own-dispatch correction)", Herding: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return llmlb.LeastScore(staleScore(env)), nil
		}},
		{Name: "stale-p2c", Doc: "P2C over running+waiting in the last scrape only", Herding: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return llmlb.P2C(staleScore(env)), nil
		}},
	}
}

// newSGLangCacheAware returns SGLang's cache_aware policy with an index
// like its router's approximate tree: no TTL, SGLangTreeBlocks per replica.
// smallestTree selects the rule before SGLang PR 14650.
func newSGLangCacheAware(env *PolicyEnv, smallestTree bool) (llmlb.Policy, error) {
	ix, err := env.decisionIndex(prefix.IndexConfig{BlockSize: env.BlockTokens, Capacity: SGLangTreeBlocks, TTL: noTTL})
	if err != nil {
		return nil, err
	}
	return llmlb.SGLangCacheAware(llmlb.PrefixAwareConfig{Index: ix, MissToSmallestTree: smallestTree})
}

// newDynamoKV returns Dynamo's KV cost function with its defaults: cache
// state from the replicas' KV events, and the decode term counting each
// replica's distinct active prompt blocks, released as requests end.
func newDynamoKV(env *PolicyEnv) (llmlb.Policy, error) {
	ix, err := newEventIndex(env)
	if err != nil {
		return nil, err
	}
	active, err := llmlb.NewActiveBlocks(env.BlockTokens)
	if err != nil {
		return nil, err
	}
	cfg := llmlb.DynamoKVCostConfig()
	cfg.Index, cfg.Active = ix, active
	return llmlb.KVCost(cfg)
}

// newIndex returns a prefix index for the workload's block size, fed by the
// policy's own decisions.
func newIndex(env *PolicyEnv) (*prefix.Index, error) {
	return env.decisionIndex(prefix.IndexConfig{BlockSize: env.BlockTokens})
}

// decisionIndex returns a prefix index for cfg that the policy records its
// own decisions in; with [Config.Share], the router's Group records its
// peers' decisions in it too.
func (e *PolicyEnv) decisionIndex(cfg prefix.IndexConfig) (*prefix.Index, error) {
	ix, err := prefix.NewIndex(cfg)
	if err == nil {
		e.decisions = ix
	}
	return ix, err
}

// newEventIndex returns a prefix index for the workload's block size that
// holds exactly what the replicas' KV events report.
func newEventIndex(env *PolicyEnv) (*prefix.Index, error) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: env.BlockTokens, EventsOnly: true})
	if err != nil {
		return nil, err
	}
	return ix, env.SubscribeKVEvents(ix)
}

// SegregatedLongPrompt is the prompt length from which the segregated
// policy sends a request to the long-request pool.
const SegregatedLongPrompt = 8192

// newSegregated puts the replicas in two pools, one for prompts of
// SegregatedLongPrompt tokens or more and one for the rest, sized by the
// long prompts' share of the workload's prompt tokens (at least one replica
// each); both balance by outstanding tokens.
func newSegregated(env *PolicyEnv) (llmlb.Policy, error) {
	if env.Replicas < 2 {
		return llmlb.LeastTokens(), nil
	}
	long := min(max(int(math.Round(float64(env.Replicas)*env.LongShare)), 1), env.Replicas-1)
	var keys []string
	for m := env.Replicas - long; m < env.Replicas; m++ {
		keys = append(keys, replicaKey(m))
	}
	return llmlb.Segregated(
		llmlb.Pool{Name: "long", MinPromptTokens: SegregatedLongPrompt, Endpoints: keys, Policy: llmlb.LeastTokens()},
		llmlb.Pool{Name: "general", Policy: llmlb.LeastTokens()},
	)
}

// plain adapts a constructor without arguments.
func plain(f func() llmlb.Policy) func(*PolicyEnv) (llmlb.Policy, error) {
	return func(*PolicyEnv) (llmlb.Policy, error) { return f(), nil }
}

// staleScore scores a candidate by the requests its last scrape reported,
// ignoring everything the router sent since.
func staleScore(env *PolicyEnv) llmlb.Score {
	return func(c *llmlb.Candidates, i int, _ *llmlb.EndpointLoad) float64 {
		l := env.Stale(c.Member(i))
		return float64(l.Running+l.Waiting) + 1
	}
}

// LookupPolicy returns the policy named name.
func LookupPolicy(name string) (PolicySpec, bool) {
	for _, p := range Policies() {
		if p.Name == name {
			return p, true
		}
	}
	return PolicySpec{}, false
}

// DefaultPolicies returns the names of the policies compared by default: all
// of them except those that exist to show herding, the variants and the
// disaggregated ones.
func DefaultPolicies() []string {
	var out []string
	for _, p := range Policies() {
		if !p.Herding && !p.Variant && p.Decode == nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// newEventsDefault returns llmlb.Default configured by cfg with a decisions
// index and an index fed by the replicas' KV events, as the default preset
// runs it. Default only reads its events index, so the routers of a run
// share one (see sharedEventIndex).
func newEventsDefault(env *PolicyEnv, cfg llmlb.DefaultConfig) (llmlb.Policy, error) {
	ix, err := newIndex(env)
	if err != nil {
		return nil, err
	}
	events, err := env.sharedEventIndex()
	if err != nil {
		return nil, err
	}
	cfg.Index, cfg.Events = ix, events
	return llmlb.Default(cfg)
}
