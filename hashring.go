package llmlb

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Defaults of the hashing policies.
const (
	// DefaultHashBalance is the bounded-load factor c of [ConsistentHash]:
	// no endpoint takes more than ceil(c*m/n) of m outstanding requests.
	DefaultHashBalance = 1.25
	// DefaultRingReplicas is the number of points each endpoint has on the
	// hash ring.
	DefaultRingReplicas = 160
	// DefaultPrefixHashTokens is how many leading prompt tokens
	// [PrefixHash] hashes, as SGLang's prefix_hash policy
	// (PrefixHashConfig::default, prefix_token_count 256, in
	// sgl-model-gateway/src/policies/prefix_hash.rs).
	DefaultPrefixHashTokens = 256
	// DefaultPrefixHashLoadFactor is the load factor of [PrefixHash]
	// (SGLang's load_factor default, same file).
	DefaultPrefixHashLoadFactor = 1.25
	// DefaultBlockTokens is the number of prompt tokens per block of
	// Request.Prefix assumed when a policy's configuration does not say
	// (the default of package prefix, like vLLM).
	DefaultBlockTokens = 16
)

// maxRingPoints bounds the points of one hash ring, whatever the
// membership: with more than maxRingPoints/Replicas endpoints each has
// maxRingPoints/n points (at least one), so a ring takes at most about
// 96 MiB (12 bytes a point). It is Envoy's default and largest
// maximum_ring_size, 8M entries (ring_hash.proto, v1.29).
const maxRingPoints = 1 << 23

// ring is a consistent-hash ring over the members of one membership.
type ring struct {
	gen    uint64
	points []uint64 // sorted
	owner  []int32  // member index of each point
}

// ringCache builds and keeps the ring of the current membership.
type ringCache struct {
	replicas int
	// weighted gives each member points in proportion to its static
	// weight, the largest weight having replicas points, as Envoy's ring
	// hash does (source/extensions/load_balancing_policies/ring_hash/
	// ring_hash_lb.cc: hashes per host = normalized weight * scale).
	weighted bool
	cur      atomic.Pointer[ring]
	mu       sync.Mutex // serializes builds
}

func (rc *ringCache) get(c *Candidates) *ring {
	if r := rc.cur.Load(); r != nil && r.gen == c.Generation() {
		return r
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if r := rc.cur.Load(); r != nil && r.gen == c.Generation() {
		return r
	}
	n := c.Members()
	type point struct {
		h uint64
		m int32
	}
	per := ringReplicas(rc.replicas, n)
	most := 0.0
	if rc.weighted && !c.snap.unit {
		for _, st := range c.snap.eps {
			most = max(most, st.staticWeight())
		}
	}
	pts := make([]point, 0, n*per)
	buf := make([]byte, 0, 64)
	for m := 0; m < n; m++ {
		key := c.MemberKey(m)
		points := per
		if most > 0 {
			// At least one point, and at most per: the ring stays within
			// maxRingPoints.
			points = int(min(max(math.Round(float64(per)*(c.snap.eps[m].staticWeight()/most)), 1), float64(per)))
		}
		for v := 0; v < points; v++ {
			buf = append(append(append(buf[:0], key...), '#'), strconv.Itoa(v)...)
			pts = append(pts, point{xxhash.Sum64(buf), int32(m)})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return int(a.m - b.m)
	})
	r := &ring{gen: c.Generation(), points: make([]uint64, len(pts)), owner: make([]int32, len(pts))}
	for i, p := range pts {
		r.points[i], r.owner[i] = p.h, p.m
	}
	rc.cur.Store(r)
	return r
}

// ringReplicas returns the points each of n members has on a ring of
// replicas points per member, bounded to maxRingPoints in all.
func ringReplicas(replicas, n int) int {
	if n > 0 && replicas > maxRingPoints/n {
		return max(maxRingPoints/n, 1)
	}
	return replicas
}

// walk calls accept for the candidates in ring order starting at hash h,
// each once, until accept returns true; it returns that candidate or -1.
func (r *ring) walk(c *Candidates, h uint64, accept func(i int) bool) int {
	cand := c.memberToCandidate()
	start, _ := slices.BinarySearch(r.points, h)
	seen := 0
	visited := c.visitedScratch()
	for k := 0; k < len(r.points) && seen < c.Len(); k++ {
		m := r.owner[(start+k)%len(r.points)]
		i := cand[m]
		if i < 0 || visited[m] {
			continue
		}
		visited[m] = true
		seen++
		if accept(int(i)) {
			return int(i)
		}
	}
	return -1
}

// HashConfig configures [ConsistentHash].
type HashConfig struct {
	// Balance is the bounded-load factor c >= 1: an endpoint accepts a key
	// while its requests, counting this one, are at most ceil(c*m/n) for m
	// requests in all on n candidates of equal weight; with unequal
	// effective weights, ceil(c*m*w/W) for an endpoint of weight w out of
	// W in all. Zero means [DefaultHashBalance]; +Inf disables the bound
	// (plain consistent hashing).
	Balance float64
	// Replicas is the number of ring points per endpoint, at most 65,536.
	// Zero means [DefaultRingReplicas]. A ring has at most 8,388,608
	// points (Envoy's maximum_ring_size): beyond that, each endpoint has
	// fewer.
	Replicas int
	// Fallback chooses for requests without an AffinityKey. Nil means
	// P2C(RequestsScore). A Fallback that learns endpoint speeds
	// ([Default]) learns them as it would alone, but for the time to
	// first token of keyed requests, whose prefill work it did not price.
	Fallback Policy
}

type consistentHash struct {
	balance  float64
	rings    ringCache
	fallback Policy
	learn    bool // fallback learns speeds (see learns)
}

// ConsistentHash returns consistent hashing with bounded loads (Mirrokni,
// Thorup and Zadimoghaddam) on Request.AffinityKey: the key's point on the
// ring names its endpoint, and an endpoint already holding more than its
// share ceil(c*m/n) passes the key to the next one on the ring. Adding an
// endpoint moves about 1/(n+1) of the keys; a hot key spills to its
// neighbours instead of burying one replica. Use it for session affinity:
// a conversation's turns share a prefix by construction. Weights are
// respected as in Envoy's ring hash with a hash balance factor: an
// endpoint has ring points in proportion to its weight, and its share of
// the requests is in proportion to its effective weight, so that an
// endpoint in slow start ([WithSlowStart]) passes keys on beyond its
// ramped share. Give each Balancer its own policy.
func ConsistentHash(cfg HashConfig) (Policy, error) {
	if cfg.Balance == 0 {
		cfg.Balance = DefaultHashBalance
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = DefaultRingReplicas
	}
	if !(cfg.Balance >= 1) {
		return nil, policyErrorf("hash balance %v must be at least 1", cfg.Balance)
	}
	if cfg.Replicas < 1 || cfg.Replicas > 1<<16 {
		return nil, policyErrorf("ring replicas %d out of range [1, 65536]", cfg.Replicas)
	}
	if cfg.Fallback == nil {
		cfg.Fallback = P2C(RequestsScore)
	}
	l, ok := cfg.Fallback.(interface{ learns() bool })
	return &consistentHash{balance: cfg.Balance, rings: ringCache{replicas: cfg.Replicas, weighted: true},
		fallback: cfg.Fallback, learn: ok && l.learns()}, nil
}

// learns reports whether the balancer should keep speed estimates: the
// fallback learns them (see [DefaultConfig].DisableLearning).
func (p *consistentHash) learns() bool { return p.learn }

// peakPolicy returns the fallback's PeakEWMA, if any (see peaked).
func (p *consistentHash) peakPolicy() *peakEWMA { return peakOf(p.fallback) }

func (p *consistentHash) Choose(c *Candidates) int {
	key := c.req.AffinityKey
	if key == "" {
		return p.fallback.Choose(c)
	}
	if p.learn {
		// The ring prices no prefill work: the time to first token of
		// a keyed request teaches the fallback's estimates nothing.
		c.work = math.NaN()
	}
	return boundedWalk(c, p.rings.get(c), xxhash.Sum64String(key), p.balance)
}

// boundedWalk walks the ring from h to the first candidate whose requests,
// counting this one, fit in ceil(balance*m*w/W), its share by effective
// weight w of W in all (ceil(balance*m/n) for equal weights), as Envoy
// bounds a host's slots by its normalized weight
// (source/common/upstream/thread_aware_lb_impl.cc,
// BoundedLoadHashingLoadBalancer::hostOverloadFactor: slots =
// ceil(total_slots * weight)).
func boundedWalk(c *Candidates, r *ring, h uint64, balance float64) int {
	n := c.Len()
	var total int64 = 1
	unit := c.unitWeights()
	weights := float64(n)
	if !unit {
		weights = 0
		for i := 0; i < n; i++ {
			weights += c.Weight(i)
		}
	}
	for i := 0; i < n; i++ {
		total = addSat(total, c.requests(i))
	}
	m := balance * float64(total)
	i := r.walk(c, h, func(i int) bool {
		w := 1.0
		if !unit {
			w = c.Weight(i)
		}
		return float64(c.requests(i))+1 <= math.Ceil(m*w/weights)
	})
	if i < 0 { // unreachable for balance >= 1: some candidate is at most average
		return argmin(c, byRequests)
	}
	return i
}

// PrefixHashConfig configures [PrefixHash].
type PrefixHashConfig struct {
	// PrefixTokens is how many leading prompt tokens decide the endpoint.
	// Zero means [DefaultPrefixHashTokens].
	PrefixTokens int
	// BlockTokens is the number of tokens per block of Request.Prefix.
	// Zero means [DefaultBlockTokens].
	BlockTokens int
	// LoadFactor: the owner of the prefix takes the request while its
	// requests in flight from this balancer are at most (total+1)/n *
	// LoadFactor; otherwise the least loaded candidate does. Zero means
	// [DefaultPrefixHashLoadFactor].
	LoadFactor float64
	// Replicas is the number of ring points per endpoint, at most 65,536.
	// Zero means [DefaultRingReplicas]. A ring has at most 8,388,608
	// points (Envoy's maximum_ring_size): beyond that, each endpoint has
	// fewer.
	Replicas int
}

type prefixHash struct {
	block      int // index of the block that covers PrefixTokens
	loadFactor float64
	rings      ringCache
}

// PrefixHash returns SGLang's prefix_hash policy: the chained hash of the
// first PrefixTokens tokens of the prompt (the Request.Prefix block that
// covers them, or the last one of a shorter prompt) is placed on a
// consistent-hash ring, and its owner takes the request unless it holds more
// than LoadFactor times the mean load, in which case the least loaded
// candidate does. As in SGLang, load is the router's own count of its
// requests in flight ([EndpointLoad.Outstanding], SGLang's Worker::load()),
// never an engine signal. SGLang's fallback takes the least loaded worker
// within the bound, and the owner if every worker exceeded it; the least
// loaded candidate is always within the bound (min <= mean < LoadFactor *
// (total+1)/n), so that is the least loaded overall, chosen here at random
// among ties where SGLang takes the first. A request without Prefix is
// hashed on its AffinityKey, and one with neither goes to the least loaded
// candidate. It is lighter than [PrefixAware] (no index) and keeps no memory
// per prompt. Give each Balancer its own policy.
func PrefixHash(cfg PrefixHashConfig) (Policy, error) {
	if cfg.PrefixTokens == 0 {
		cfg.PrefixTokens = DefaultPrefixHashTokens
	}
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = DefaultBlockTokens
	}
	if cfg.LoadFactor == 0 {
		cfg.LoadFactor = DefaultPrefixHashLoadFactor
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = DefaultRingReplicas
	}
	switch {
	case cfg.PrefixTokens < 1:
		return nil, policyErrorf("prefix hash tokens %d must be positive", cfg.PrefixTokens)
	case cfg.BlockTokens < 1:
		return nil, policyErrorf("prefix hash block tokens %d must be positive", cfg.BlockTokens)
	case !(cfg.LoadFactor >= 1) || math.IsInf(cfg.LoadFactor, 0):
		return nil, policyErrorf("prefix hash load factor %v must be finite and at least 1", cfg.LoadFactor)
	case cfg.Replicas < 1 || cfg.Replicas > 1<<16:
		return nil, policyErrorf("ring replicas %d out of range [1, 65536]", cfg.Replicas)
	}
	return &prefixHash{
		block:      max(cfg.PrefixTokens/cfg.BlockTokens, 1) - 1,
		loadFactor: cfg.LoadFactor,
		rings:      ringCache{replicas: cfg.Replicas},
	}, nil
}

func (p *prefixHash) Choose(c *Candidates) int {
	var h uint64
	switch r := c.req; {
	case len(r.Prefix) > 0:
		h = r.Prefix[min(p.block, len(r.Prefix)-1)]
	case r.AffinityKey != "":
		h = xxhash.Sum64String(r.AffinityKey)
	default:
		return argmin(c, byRequests)
	}
	n := c.Len()
	c.loads = growLoads(c.loads, n)
	var total int64
	for i := 0; i < n; i++ {
		c.loadInto(i, &c.loads[i])
		total = addSat(total, c.loads[i].Outstanding)
	}
	limit := (float64(total) + 1) / float64(n) * p.loadFactor
	owner := p.rings.get(c).walk(c, h, func(int) bool { return true })
	if float64(c.loads[owner].Outstanding) <= limit {
		return owner
	}
	return pickBy(c, func(i int) (float64, float64) { return float64(c.loads[i].Outstanding), 0 })
}
