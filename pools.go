package llmlb

import "math"

// Pool is a named group of endpoints that serves one class of requests in
// [Segregated].
type Pool struct {
	// Name identifies the pool in errors.
	Name string
	// A request belongs to the pool when its PromptTokens is at least
	// MinPromptTokens or its MaxTokens is at least MinMaxTokens; a zero
	// threshold never matches. A pool with neither threshold is the general
	// pool: it takes the requests no other pool claims.
	MinPromptTokens int
	MinMaxTokens    int
	// Endpoints are the keys of the pool's endpoints. The general pool may
	// leave it empty to mean every endpoint in no other pool.
	Endpoints []string
	// Policy chooses within the pool. Nil means P2C(TokensScore).
	Policy Policy
}

type pool struct {
	Pool
	keys   map[string]bool
	learns bool // Policy learns speeds (see learns)
}

type segregated struct {
	pools   []pool
	general int // index of the general pool, -1 if none
	claimed map[string]bool
	learn   bool // some pool's policy learns speeds
}

// Segregated returns the policy that classifies each request by size into
// the first pool that claims it and balances within that pool, so that a
// 100k-token prompt does not stall the prefill of a pool tuned for chat turns
// (the routing chapter's long-request segregation). Pools are checked in
// order. When the request's pool has no candidate (all excluded or absent),
// the request goes to the general pool, and failing that to any candidate.
// Policies of pools are called with the candidates narrowed to the pool (see
// [Candidates.Narrow]). A pool's policy that learns endpoint speeds
// ([Default]) learns them as it would alone; the requests of other pools
// teach the endpoints' decode speed but not their time to first token,
// whose prefill work they did not price.
func Segregated(pools ...Pool) (Policy, error) {
	s := &segregated{general: -1, claimed: map[string]bool{}}
	for i, p := range pools {
		if p.MinPromptTokens < 0 || p.MinMaxTokens < 0 {
			return nil, policyErrorf("pool %q has a negative threshold", p.Name)
		}
		if p.MinPromptTokens == 0 && p.MinMaxTokens == 0 {
			if s.general >= 0 {
				return nil, policyErrorf("pools %q and %q are both general (no threshold)", pools[s.general].Name, p.Name)
			}
			s.general = i
		} else if len(p.Endpoints) == 0 {
			return nil, policyErrorf("pool %q has thresholds but no endpoints", p.Name)
		}
		if p.Policy == nil {
			p.Policy = P2C(TokensScore)
		}
		keys := make(map[string]bool, len(p.Endpoints))
		for _, k := range p.Endpoints {
			keys[k] = true
			s.claimed[k] = true
		}
		l, ok := p.Policy.(interface{ learns() bool })
		learns := ok && l.learns()
		s.learn = s.learn || learns
		s.pools = append(s.pools, pool{p, keys, learns})
	}
	if len(s.pools) == 0 {
		return nil, policyErrorf("Segregated needs at least one pool")
	}
	return s, nil
}

// learns reports whether the balancer should keep speed estimates: some
// pool's policy learns them (see [DefaultConfig].DisableLearning).
func (s *segregated) learns() bool { return s.learn }

// peakPolicy returns the PeakEWMA of the first pool whose policy is or
// wraps one, if any (see peaked): the balancer measures every endpoint's
// latency with its decay.
func (s *segregated) peakPolicy() *peakEWMA {
	for i := range s.pools {
		if p := peakOf(s.pools[i].Policy); p != nil {
			return p
		}
	}
	return nil
}

func (s *segregated) in(p *pool, key string) bool {
	if len(p.keys) == 0 { // the general pool without a list
		return !s.claimed[key]
	}
	return p.keys[key]
}

func (s *segregated) Choose(c *Candidates) int {
	r := c.req
	chosen := s.general
	for i := range s.pools {
		p := &s.pools[i]
		if (p.MinPromptTokens > 0 && r.PromptTokens >= p.MinPromptTokens) || (p.MinMaxTokens > 0 && r.MaxTokens >= p.MinMaxTokens) {
			chosen = i
			break
		}
	}
	for _, i := range []int{chosen, s.general} {
		if i < 0 {
			continue
		}
		p := &s.pools[i]
		if c.Narrow(func(j int) bool { return s.in(p, c.Key(j)) }) {
			return s.priced(c, p.learns, p.Policy.Choose(c))
		}
	}
	return s.priced(c, false, P2C(TokensScore).Choose(c))
}

// priced returns i, the choice of a pool's policy, which learns speeds if
// learns is set. When another pool's policy learns them, a choice that
// priced no prefill work marks its work unknown, so that its time to first
// token does not teach the chosen endpoint's estimate a prefill of no
// work.
func (s *segregated) priced(c *Candidates, learns bool, i int) int {
	if s.learn && !learns {
		c.work = math.NaN()
	}
	return i
}
