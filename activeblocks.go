package llmlb

import (
	"fmt"
	"sort"
	"sync"
)

// ActiveBlocks counts, for each endpoint, the distinct prompt blocks of the
// requests in flight there: NVIDIA Dynamo's active sequences, the decode
// load of its KV cost function ([KVCostConfig].Active). A block held by
// several requests at once, such as a shared system prompt, counts once, as
// it occupies the engine's KV cache once.
//
// A request's blocks are its full prompt blocks: the hashes of
// Request.Prefix, and one private block for each full block beyond it. Add
// and Release must be given the same endpoint key and an equal Request
// (PromptTokens and Prefix). A zero ActiveBlocks is not ready for use; call
// [NewActiveBlocks]. ActiveBlocks is safe for concurrent use; memory is
// proportional to the blocks of the requests in flight.
type ActiveBlocks struct {
	block int // tokens per block

	mu  sync.Mutex // protects eps
	eps map[string]*activeSet
}

// activeSet is the active blocks of one endpoint.
type activeSet struct {
	refs    map[uint64]int32 // block hash -> requests holding it
	private int64            // full prompt blocks beyond the requests' Prefix
}

// NewActiveBlocks returns an empty ActiveBlocks for prompt blocks of
// blockTokens tokens, the block size of Request.Prefix.
func NewActiveBlocks(blockTokens int) (*ActiveBlocks, error) {
	if blockTokens < 1 {
		return nil, fmt.Errorf("%w: active blocks of %d tokens", ErrInvalidPolicy, blockTokens)
	}
	return &ActiveBlocks{block: blockTokens, eps: map[string]*activeSet{}}, nil
}

// split returns r's hashed full prompt blocks and the number of its full
// prompt blocks beyond them.
func (a *ActiveBlocks) split(r *Request) (hashed []uint64, private int64) {
	full := r.PromptTokens / a.block
	hashed = r.Prefix[:min(len(r.Prefix), full)]
	return hashed, int64(full - len(hashed))
}

// Add records that r is in flight at the endpoint key.
func (a *ActiveBlocks) Add(key string, r *Request) {
	if r == nil {
		return
	}
	hashed, private := a.split(r)
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
	s.private += private
}

// Release records that r, added at the endpoint key, has ended. Releasing a
// request that was not added is a no-op for its blocks that are not
// active.
func (a *ActiveBlocks) Release(key string, r *Request) {
	if r == nil {
		return
	}
	hashed, private := a.split(r)
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
	if len(s.refs) == 0 && s.private == 0 {
		delete(a.eps, key)
	}
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
// sum.
func (a *ActiveBlocks) Potential(key string, r *Request) (active, added int) {
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
