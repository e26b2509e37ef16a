package sim

import "github.com/llmlb/llmlb"

// PolicyEnv is what a policy constructor may use. A constructor is called
// once per router per run, so a policy may keep per-run state.
type PolicyEnv struct {
	// Replicas is the number of replicas; candidate member m of a pick is
	// replica m.
	Replicas int
	// Router is the index of the router the policy serves.
	Router int
	// Stale returns the router's last scraped observation of replica m,
	// without the Balancer's correction for its own dispatches.
	Stale func(m int) llmlb.Load

	run *runner // true state, for the oracle only
}

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

		// Policies of the root package's later constructors are added here,
		// one line each, in the form:
		//	{Name: "prefix-aware", Doc: "...", New: plain(llmlb.PrefixAware)},
		// (consistent-hash, prefix-hash, prefix-aware, sglang-cache-aware,
		// dynamo-kv, gie-default, segregated, default).

		{Name: "oracle", Doc: "perfect knowledge of replica state, cache and output lengths (upper bound)", New: newOracle},
		{Name: "stale-least-outstanding", Doc: "fewest running+waiting in the last scrape only (no own-dispatch correction)", Herding: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return llmlb.LeastScore(staleScore(env)), nil
		}},
		{Name: "stale-p2c", Doc: "P2C over running+waiting in the last scrape only", Herding: true, New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return llmlb.P2C(staleScore(env)), nil
		}},
	}
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
// of them except those that exist to show herding.
func DefaultPolicies() []string {
	var out []string
	for _, p := range Policies() {
		if !p.Herding {
			out = append(out, p.Name)
		}
	}
	return out
}
