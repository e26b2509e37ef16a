package llmlb

import (
	"fmt"
	"sort"
	"sync"

	"github.com/llmlb/llmlb/prefix"
)

// ActiveBlocks counts, for each endpoint, the distinct prompt blocks of the
// requests in flight there: NVIDIA Dynamo's active sequences, the decode
// load of its KV cost function ([KVCostConfig].Active). A block held by
// several requests at once, such as a shared system prompt, counts once, as
// it occupies the engine's KV cache once.
//
// A request's blocks are its full prompt blocks: the hashes of
// Request.Prefix, and one private block for each full block beyond it. The
// policy it is given to ([KVCostConfig].Active) adds each request at the
// endpoint it chooses, and the Balancer releases it when the pick's Done is
// called, so the counts follow the picks with nothing for the caller to do.
// A zero ActiveBlocks is not ready for use; call [NewActiveBlocks]. Policies
// given the same ActiveBlocks count their requests together. It is safe for
// concurrent use; memory is proportional to the blocks of the requests in
// flight. A request's hashes beyond its first 8,192, which a [prefix.Hasher]
// hashes at most by default, count as private blocks, so that a longer
// Request.Prefix costs no more time and memory under the lock that every
// pick of the policies shares.
type ActiveBlocks struct {
	block int // tokens per block

	mu  sync.Mutex // protects eps
	eps map[string]*activeSet
}

// activeSet is the active blocks of one endpoint.
type activeSet struct {
	refs    map[uint64]int32 // block hash -> requests holding it
	private int64            // full prompt blocks beyond the requests' Prefix
	peak    int              // most entries refs has held: a map keeps its buckets
}

// NewActiveBlocks returns an empty ActiveBlocks for prompt blocks of
// blockTokens tokens, the block size of Request.Prefix.
func NewActiveBlocks(blockTokens int) (*ActiveBlocks, error) {
	if blockTokens < 1 {
		return nil, fmt.Errorf("%w: active blocks of %d tokens", ErrInvalidPolicy, blockTokens)
	}
	return &ActiveBlocks{block: blockTokens, eps: map[string]*activeSet{}}, nil
}

// maxActiveHashes is the number of a request's Prefix hashes an
// [ActiveBlocks] tells apart: the blocks a [prefix.Hasher] hashes at most by
// default (its DefaultMaxTokens in blocks of DefaultBlockTokens, 8,192).
// Its full prompt blocks beyond count as private ones.
const maxActiveHashes = prefix.DefaultMaxTokens / prefix.DefaultBlockTokens

// split returns r's hashed full prompt blocks, at most maxActiveHashes, and
// the number of its full prompt blocks beyond them.
func (a *ActiveBlocks) split(r *Request) (hashed []uint64, private int64) {
	full := r.PromptTokens / a.block
	hashed = r.Prefix[:min(len(r.Prefix), full, maxActiveHashes)]
	return hashed, int64(full - len(hashed))
}

// add records that r is in flight at the endpoint key.
func (a *ActiveBlocks) add(key string, r *Request) {
	if r == nil {
		return
	}
	hashed, private := a.split(r)
	a.addBlocks(key, hashed, private)
}

func (a *ActiveBlocks) addBlocks(key string, hashed []uint64, private int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.eps[key]
	if s == nil {
		s = &activeSet{refs: map[uint64]int32{}}
		a.eps[key] = s
	}
	for _, h := range hashed {
		s.refs[h]++
	}
	s.peak = max(s.peak, len(s.refs))
	s.private += private
}

// release records that r, added at the endpoint key, has ended. Releasing a
// request that was not added is a no-op for its blocks that are not
// active.
func (a *ActiveBlocks) release(key string, r *Request) {
	if r == nil {
		return
	}
	hashed, private := a.split(r)
	a.releaseBlocks(key, hashed, private)
}

func (a *ActiveBlocks) releaseBlocks(key string, hashed []uint64, private int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.eps[key]
	if s == nil {
		return
	}
	for _, h := range hashed {
		switch n := s.refs[h]; {
		case n > 1:
			s.refs[h] = n - 1
		case n == 1:
			delete(s.refs, h)
		}
	}
	s.private = max(s.private-private, 0)
	if len(s.refs) == 0 && s.private == 0 && (len(a.eps) > maxIdleActiveSets || s.peak > maxIdleActiveBlocks) {
		// An endpoint with nothing in flight keeps its set, and the set's
		// map its buckets, so that its next request allocates nothing. A
		// map never shrinks, so a set that once held many blocks is
		// dropped, and past maxIdleActiveSets endpoints every idle one
		// is, so that idle memory stays bounded whatever came before and
		// endpoints that come and go cannot grow it.
		delete(a.eps, key)
	}
}

// An ActiveBlocks forgets an endpoint as soon as it has no blocks in flight
// when it tracks more than maxIdleActiveSets endpoints, or when the
// endpoint's set once held more than maxIdleActiveBlocks blocks.
const (
	maxIdleActiveSets   = 1024
	maxIdleActiveBlocks = 1024
)

// activeHold is one picked request's blocks at the endpoint it was sent
// to: a copy, since the caller may reuse its Request once Pick returns. The
// pick's record keeps it until Done releases it.
type activeHold struct {
	a       *ActiveBlocks
	key     string
	hashed  []uint64
	private int64
}

// activeHolds holds the free activeHolds, with their block slices.
var activeHolds = sync.Pool{New: func() any { return new(activeHold) }}

// hold records that r is in flight at the endpoint key and returns the hold
// whose drop releases it.
func (a *ActiveBlocks) hold(key string, r *Request) *activeHold {
	hashed, private := a.split(r)
	h := activeHolds.Get().(*activeHold)
	h.a, h.key, h.hashed, h.private = a, key, append(h.hashed[:0], hashed...), private
	a.addBlocks(key, h.hashed, private)
	return h
}

// drop releases the request of h and frees h.
func (h *activeHold) drop() {
	h.a.releaseBlocks(h.key, h.hashed, h.private)
	h.a, h.key = nil, ""
	activeHolds.Put(h)
}

// Blocks returns the number of distinct active blocks at the endpoint key.
func (a *ActiveBlocks) Blocks(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.blocksLocked(a.eps[key])
}

func (a *ActiveBlocks) blocksLocked(s *activeSet) int {
	if s == nil {
		return 0
	}
	return len(s.refs) + int(s.private)
}

// Potential returns the active blocks at the endpoint key and how many of
// r's blocks are not among them: Dynamo's potential decode blocks are their
// sum. A nil r is a request with no prompt.
func (a *ActiveBlocks) Potential(key string, r *Request) (active, added int) {
	if r == nil {
		r = &Request{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.potentialLocked(key, r)
}

func (a *ActiveBlocks) potentialLocked(key string, r *Request) (active, added int) {
	hashed, private := a.split(r)
	s := a.eps[key]
	if s == nil {
		return 0, len(hashed) + int(private)
	}
	// The blocks are chained hashes and every request adds a whole prefix
	// of its chain, so the active ones among r's form a prefix of hashed.
	held := sort.Search(len(hashed), func(i int) bool { return s.refs[hashed[i]] == 0 })
	return a.blocksLocked(s), len(hashed) - held + int(private)
}
