package prefix

import (
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/llmlb/llmlb/internal/lru"
	"github.com/llmlb/llmlb/internal/timeline"
)

// Defaults and limits of [IndexConfig].
const (
	// DefaultCapacity is the default number of blocks indexed per endpoint:
	// 16384 blocks, 256k tokens at 16 tokens a block, about 1.4 MB of index
	// (see [BytesPerBlock]). Size it from the engine's KV-cache capacity
	// with [Index.SetCapacity].
	DefaultCapacity = 1 << 14
	// MaxCapacity is the largest capacity accepted for one endpoint.
	MaxCapacity = 1 << 24
	// DefaultTTL is how long a block recorded from a routing decision keeps
	// matching: 2 minutes, the block TTL of NVIDIA Dynamo's router without
	// KV events (router_ttl_secs) and SGLang's cache-aware eviction interval
	// (eviction_interval_secs).
	DefaultTTL = 2 * time.Minute
	// DefaultMaxEndpoints is the default and largest number of endpoints
	// an index tracks.
	DefaultMaxEndpoints = 4096
	// BytesPerBlock bounds the heap used by one indexed block of one
	// endpoint, in bytes, on 64-bit platforms. It is made of the endpoint's
	// LRU node (24 bytes, up to twice that while the endpoint's storage
	// grows toward its capacity), its slot in the endpoint's table (8
	// bytes in a table kept between 1/4 and 1/2 full) and the block's entry
	// in the index-wide holder table (a 24-byte slot in a table that grows
	// to 3/8 full when it reaches 3/4, one per block and group of 64
	// endpoints, shared by the endpoints of the group that hold the block):
	// at most 144 bytes, to which the bound adds 16 for what the count
	// leaves out. Measured: 45 bytes when 8 endpoints share every block,
	// 80-87 bytes when no block is shared, 120 bytes just after an
	// endpoint's storage doubled; a test checks the bound over a million
	// blocks. While it fills, the index as a whole stays below the sum of
	// the endpoints' capacities times BytesPerBlock, plus about a kilobyte
	// per endpoint and 10 KB. Removing endpoints or lowering capacities
	// frees their blocks; the holder table then shrinks as it empties,
	// halving the parts of it that fall below 1/8 full (parts of up to 64
	// slots keep their memory, at most 384 KB, so that small indexes do not
	// allocate as their load moves), and an endpoint's storage is compacted
	// when its capacity falls below half of it. So the index then stays
	// below about 1.6 times the sum of the new capacities times
	// BytesPerBlock: up to 230 bytes per block of capacity were measured
	// after lowering the capacities of a full index by factors from 1.2 to
	// 60, and a test checks the worst of them.
	BytesPerBlock = 160
)

// never is the expiry of blocks reported by engine events.
const never = math.MaxInt64

// recordSlack sets how stale an expiry may be before Record updates it:
// a block recorded again within TTL/recordSlack of its previous Record keeps
// the earlier expiry, which saves an LRU update per block on hot prefixes.
const recordSlack = 64

// IndexConfig configures an [Index]. The zero value is valid and selects
// every default.
type IndexConfig struct {
	// BlockSize is the number of tokens per block of the indexed hashes:
	// [Hasher.BlockTokens] of the hasher that produces them, and the block
	// size engine KV events must report. Zero means [DefaultBlockTokens].
	// A router hashing in byte mode receives no engine events and may leave
	// it zero.
	BlockSize int
	// Capacity is the number of blocks indexed per endpoint until
	// [Index.SetCapacity] sets another. Zero means [DefaultCapacity]; at
	// most [MaxCapacity].
	Capacity int
	// TTL is how long a block recorded by [Index.Record] keeps matching
	// after its last Record. A Record less than TTL/64 after the previous
	// one keeps the earlier expiry (it only refreshes recency), so a block
	// may stop matching up to TTL/64 early. Blocks reported by engine events
	// do not expire. Zero means [DefaultTTL]; negative values are rejected.
	TTL time.Duration
	// MaxEndpoints bounds the number of endpoints tracked. Zero means
	// [DefaultMaxEndpoints], which is also the largest value accepted.
	MaxEndpoints int
	// EventsOnly makes [Index.Record] a no-op, so that the index holds
	// exactly what engine KV events report, as NVIDIA Dynamo's router does
	// when its workers publish events. Otherwise an index fed by events also
	// records the router's decisions, so a request that arrives while an
	// earlier one with the same prefix is still in prefill already sees
	// where that prefix is going; the events report it only once the
	// prefill is done. Each has its price: in llmlb's simulator, events
	// alone gave the shorter TTFT tail at nominal load and collapsed under
	// overload, where requests for a prefix in prefill went elsewhere and
	// prefilled it again. llmlb.Default can read both, an events-only index
	// next to the one it records its decisions in (DefaultConfig.Events),
	// and weigh each where it pays.
	EventsOnly bool
}

// Match is the longest cached prefix of a prompt on one endpoint.
type Match struct {
	// Endpoint is the endpoint's key.
	Endpoint string
	// Blocks is the number of leading blocks of the prompt believed cached
	// on the endpoint, at least 1.
	Blocks int
}

// Index records which endpoints hold which prefix blocks and finds, for a
// prompt, the longest cached prefix on every endpoint at once.
//
// Each endpoint has its own LRU of block hashes, bounded by its capacity. An
// index-wide table from block hash to the set of endpoints holding it (a
// bitset per group of 64 endpoints, the groups' entries of a block side by
// side) is kept consistent with the LRUs through their eviction callbacks,
// so [Index.Match] walks the prompt's blocks once, intersecting the set of
// endpoints still matching: one probe run of one table per block, however
// many endpoints.
//
// An endpoint's blocks are fed approximately by [Index.Record] (the router's
// own decisions; they expire after the TTL, and [Index.Unrecord] takes back
// a decision whose request was not sent) or precisely by
// [Index.Stored], [Index.Removed] and [Index.Cleared] (the engine's KV
// events; they do not expire). Both may feed the same endpoint: a block's
// expiry is the latest of the two. A block recorded at time t matches while
// now < t + TTL. A Record first drops blocks that expired from the least
// recently used end of the endpoint's LRU, so that the index holds about
// the blocks recorded within the TTL, however long it runs. Those are the
// blocks an eviction would take first, so expiry never changes which
// unexpired blocks an LRU keeps; expired blocks elsewhere in it stay until
// evicted or recorded again.
//
// Times are the caller's clock, passed to each call. They should not go
// backwards: a Match at a time earlier than a preceding Record's may treat a
// block that expired between the two times as expired already, and a
// Record of such a block gives it the expiry of the Record's own time even
// if it was recorded to expire later. Readings
// that carry the monotonic clock, as time.Now's do, are measured on it, so
// a step of the wall clock neither expires every recorded block nor keeps
// them past their TTL. The index cannot place the zero time.Time, nor any
// other time before late 1677, where int64 Unix nanoseconds begin; a clock
// returning one was not set. A Record at such a time is refused (its blocks
// would be expired at every real time, yet take the room of live ones),
// and a Match or MatchLen there takes it as later than every expiry, so
// that only blocks reported by engine events match.
//
// Index is safe for concurrent use. Match, MatchLen, Len and Capacity take a
// read lock, so concurrent matches proceed in parallel; every other method
// takes the write lock. No caller-supplied code runs under a lock, and no
// goroutine is started: expiry is evaluated when matching. The zero Index is
// not usable; create one with [NewIndex].
type Index struct {
	blockSize    int
	defCapacity  int
	ttl          int64
	maxEndpoints int
	eventsOnly   bool
	aheadEntries int           // matchAheadEntries; tests lower it
	records      atomic.Uint64 // Record calls that recorded blocks

	mu        sync.RWMutex // protects the fields below
	endpoints map[string]*endpoint
	slots     []*endpoint // by slot; nil when free
	occupied  []uint64    // bitset of non-nil slots
	warmed    uint64      // keeps the reads of touchLocked's warm-up
	// matchWarmed keeps the reads of Match's read-ahead. Match holds only
	// the read lock, so it is atomic; it is next to never written.
	matchWarmed atomic.Uint64
	// holders maps each block and group of 64 slots to the endpoints of
	// the group that hold the block.
	holders holderTable
	fpSeed  maphash.Seed // keys the fingerprints of lastTouch
	// line places Record's and Match's times: readings that carry the
	// monotonic clock expire on it, whatever the wall clock does.
	line timeline.Line
}

// endpoint is the state of one endpoint.
type endpoint struct {
	key      string
	slot     int
	capacity int // the LRU's size
	// lru maps block hash to expiry (Unix nanoseconds; never for blocks
	// reported by events). Its eviction callback keeps Index.holders
	// consistent.
	lru *lru.LRU
	// gen counts the changes of lru; last describes the blocks the latest
	// touch left at its front (see touchLocked).
	gen  uint64
	last lastTouch
}

// lastTouch describes an endpoint's latest touch of n blocks: their
// fingerprint (see fingerprint), the least expiry it left them with, and
// the endpoint's gen after it. While gen is unchanged those blocks are the
// n most recently used, in order, and touching the same blocks again would
// change nothing until an expiry needs refreshing, once they are marked:
// the first repeat of a touch marks them (see touchLocked), and the later
// ones are skipped.
type lastTouch struct {
	n      int
	print  uint64
	minExp int64
	gen    uint64
	marked bool
}

// fingerprint returns a hash of blocks, in order, keyed with seed. A touch
// of blocks with the previous touch's fingerprint is skipped (see
// touchLocked), and clients choose their prompts, hence the blocks: a
// fingerprint computable without a secret would let a client find offline
// a prompt with its previous prompt's fingerprint (in about 2^32 hashes for
// any 64-bit one; at once for a multiply-xorshift chain, where flipping a
// block's top bit flips two fixed bits of the state, which the next block
// can flip back) and so keep that prompt from being recorded. Keyed by a
// random seed per index through hash/maphash (the runtime's AES-based hash
// where the processor has AES instructions, a wyhash-like one elsewhere),
// a collision can only be sought by sending prompts, of which one in 2^64
// would be skipped. It is cheap next to the touch it may save, a table
// lookup and a list move per block: maphash hashes 16 blocks (128 bytes)
// per runtime call, a cycle or two a block with AES, and allocates
// nothing.
func fingerprint(seed maphash.Seed, blocks []uint64) uint64 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blocks))), 8*len(blocks))
	return maphash.Bytes(seed, b)
}

// holder is the set of endpoints, within one group of 64 slots, that hold a
// block. It is stored in Index.holders under the block's hash and the
// group.
//
// bits may omit endpoints whose copy of the block is known to have expired
// (their LRU entry stays until evicted, so that expiry never changes which
// blocks an LRU evicts); it never includes an endpoint whose LRU lacks the
// block.
type holder struct {
	bits uint64 // slot%64 of each holder
	// minExp is at most the expiry of every holder in bits. When it is in
	// the past, Match checks each holder's own expiry.
	minExp int64
}

// NewIndex returns an empty Index for c, or an error wrapping
// [ErrInvalidConfig] if a field is out of range.
func NewIndex(c IndexConfig) (*Index, error) {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockTokens
	}
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.MaxEndpoints == 0 {
		c.MaxEndpoints = DefaultMaxEndpoints
	}
	switch {
	case c.BlockSize < 0 || c.BlockSize > maxBlockTokens:
		return nil, fmt.Errorf("%w: BlockSize %d out of range [1, %d]", ErrInvalidConfig, c.BlockSize, maxBlockTokens)
	case c.Capacity < 0 || c.Capacity > MaxCapacity:
		return nil, fmt.Errorf("%w: Capacity %d out of range [1, %d]", ErrInvalidConfig, c.Capacity, MaxCapacity)
	case c.TTL < 0:
		return nil, fmt.Errorf("%w: TTL %v is negative", ErrInvalidConfig, c.TTL)
	case c.MaxEndpoints < 0 || c.MaxEndpoints > DefaultMaxEndpoints:
		return nil, fmt.Errorf("%w: MaxEndpoints %d out of range [1, %d]", ErrInvalidConfig, c.MaxEndpoints, DefaultMaxEndpoints)
	}
	return &Index{
		blockSize:    c.BlockSize,
		defCapacity:  c.Capacity,
		ttl:          int64(c.TTL),
		maxEndpoints: c.MaxEndpoints,
		eventsOnly:   c.EventsOnly,
		aheadEntries: matchAheadEntries,
		endpoints:    make(map[string]*endpoint),
		occupied:     make([]uint64, (c.MaxEndpoints+63)/64),
		holders:      holderTable{seed: rand.Uint64()},
		fpSeed:       maphash.MakeSeed(),
	}, nil
}

// EventsOnly reports whether the index ignores [Index.Record] and holds only
// what engine KV events report ([IndexConfig.EventsOnly]).
func (x *Index) EventsOnly() bool { return x.eventsOnly }

// BlockSize returns the number of tokens per block the index expects.
func (x *Index) BlockSize() int { return x.blockSize }

// endpointLocked returns the endpoint with key, adding it if create is set.
// x.mu must be held for writing when create is set.
func (x *Index) endpointLocked(key string, create bool) (*endpoint, error) {
	if e := x.endpoints[key]; e != nil || !create {
		return e, nil
	}
	if key == "" {
		return nil, fmt.Errorf("%w: empty endpoint key", ErrInvalidArgument)
	}
	if len(x.endpoints) >= x.maxEndpoints {
		return nil, fmt.Errorf("%w: %q would be endpoint %d of at most %d", ErrTooManyEndpoints, key, len(x.endpoints)+1, x.maxEndpoints)
	}
	slot := 0
	for w, occ := range x.occupied {
		if occ != math.MaxUint64 {
			slot = 64*w + bits.TrailingZeros64(^occ)
			break
		}
	}
	e := &endpoint{key: key, slot: slot, capacity: x.defCapacity}
	w, bit := slot/64, uint64(1)<<(slot%64)
	e.lru = lru.New(x.defCapacity, func(h uint64) { x.unlink(h, w, bit) })
	x.endpoints[key] = e
	for len(x.slots) <= slot {
		x.slots = append(x.slots, nil)
	}
	x.slots[slot] = e
	x.occupied[w] |= bit
	return e, nil
}

// unlink removes the holder bit of group w from block h, deleting the
// entry when no holder is left.
func (x *Index) unlink(h uint64, w int, bit uint64) { x.holders.clear(h, w, bit) }

// SetCapacity sets the number of blocks indexed for endpoint, adding the
// endpoint if it is new; the least recently used blocks beyond the new
// capacity are dropped. Size it from the engine's KV cache: the engine's
// block count times its block size divided by [Index.BlockSize]. It returns
// an error wrapping [ErrInvalidArgument] if blocks is outside
// [1, MaxCapacity] or endpoint is empty, or [ErrTooManyEndpoints].
func (x *Index) SetCapacity(endpoint string, blocks int) error {
	if blocks < 1 || blocks > MaxCapacity {
		return fmt.Errorf("%w: capacity %d out of range [1, %d]", ErrInvalidArgument, blocks, MaxCapacity)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e, err := x.endpointLocked(endpoint, true)
	if err != nil {
		return err
	}
	e.lru.Resize(blocks)
	e.capacity = blocks
	e.gen++
	return nil
}

// Capacity returns the number of blocks indexed at most for endpoint, or 0
// if the index does not track it.
func (x *Index) Capacity(endpoint string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e := x.endpoints[endpoint]
	if e == nil {
		return 0
	}
	return e.capacity
}

// Len returns the number of blocks indexed for endpoint, expired ones not
// yet dropped included, or 0 if the index does not track it.
func (x *Index) Len(endpoint string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if e := x.endpoints[endpoint]; e != nil {
		return e.lru.Len()
	}
	return 0
}

// Record notes that blocks (the chained hashes of a prompt head, in order)
// were just sent to endpoint, adding the endpoint if it is new. The blocks
// match until now plus the TTL, or longer if they were already held for
// longer. Blocks are touched tail first, so the head of the prompt is the
// most recently used and the last evicted. If there are more blocks than
// the endpoint's capacity, only the leading ones that fit are recorded. With
// [IndexConfig.EventsOnly] set, Record only adds the endpoint.
//
// Record returns an error wrapping [ErrInvalidArgument] for an empty
// endpoint key or a time the index cannot place (the zero time.Time; see
// [Index]), or [ErrTooManyEndpoints]; it then changes nothing.
func (x *Index) Record(endpoint string, blocks []uint64, now time.Time) error {
	t, exp, err := x.expiry("Record", now)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e, err := x.endpointLocked(endpoint, true)
	if err != nil || x.eventsOnly || len(blocks) == 0 {
		return err
	}
	x.records.Add(1)
	x.touchLocked(e, blocks, exp, x.ttl/recordSlack, t)
	return nil
}

// expiry returns now on x's time line and the expiry of the blocks a
// Record at now adds, or an error naming op for a time the index cannot
// place.
func (x *Index) expiry(op string, now time.Time) (t, exp int64, err error) {
	t = x.unixNano(now)
	if t == math.MinInt64 {
		return 0, 0, fmt.Errorf("%w: %s at %v, a time the index cannot place (zero, or before 1677-09-21)", ErrInvalidArgument, op, now)
	}
	exp = t + x.ttl
	if exp < t { // overflow
		exp = never - 1
	}
	return t, exp, nil
}

// Unrecord undoes a [Index.Record] of blocks at endpoint at time now, for a
// request that was not sent after all: it removes those of blocks whose
// expiry is the one that Record gave them, unless another Record has
// touched them since (a request with the same prefix that went to the same
// endpoint) or an engine event reported them. Blocks the endpoint held
// before that Record and that it only refreshed stay too, unless their
// expiry was renewed by it; so pass only the blocks the endpoint did not
// hold before it, the blocks beyond a [Index.Match] of the prompt at the
// time. Unknown endpoints and blocks are ignored. Unrecord returns an error
// wrapping [ErrInvalidArgument] for a time the index cannot place, as
// Record does.
//
// A Record less than TTL/64 after another keeps the earlier expiry of the
// blocks both touch (see [IndexConfig.TTL]); it marks them instead, which
// is how Unrecord tells them apart.
func (x *Index) Unrecord(endpoint string, blocks []uint64, now time.Time) error {
	_, exp, err := x.expiry("Unrecord", now)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.endpoints[endpoint]
	if e == nil {
		return nil
	}
	removed := false
	for _, h := range blocks {
		if v, marked, ok := e.lru.PeekMarked(h); ok && v == exp && !marked {
			e.lru.Remove(h)
			removed = true
		}
	}
	if removed {
		e.gen++
	}
	return nil
}

// Records returns how many placements have been recorded in the index: the
// calls of [Index.Record] that recorded at least one block, by every caller
// (the policies that record their decisions, and a share.Group that records
// its peers'). A call that returned an error, or was made on an index with
// [IndexConfig.EventsOnly] set, recorded nothing and is not counted. A
// policy compares it with its own decisions to learn which part of all
// placements it knows of.
func (x *Index) Records() uint64 { return x.records.Load() }

// Stored applies an engine KV event: endpoint now holds the blocks, which
// do not expire until [Index.Removed] or [Index.Cleared] reports them gone
// or the endpoint's LRU evicts them. blockSize is the block size of the
// event, in tokens; if it differs from [Index.BlockSize] the event is not
// applied and the error wraps [ErrBlockSizeMismatch].
//
// The hashes must be the chained hashes a [Hasher] with the same block size
// computes for the same tokens and salt, in prompt order. Engines publish
// their own block hashes (vLLM's, SGLang's and Dynamo's all differ from
// these and from each other), so the caller translates them. vLLM's
// BlockStored event carries the blocks' token IDs and the hash of their
// parent block: keep a bounded map from engine hash to router hash, look up
// the parent's router hash (the salt's [Hasher.Root] when there is no
// parent), and continue the chain with [Hasher.AppendTokens](dst,
// parentRouterHash, tokenIDs). Hashes that correspond to no prompt the router
// hashes are harmless: they never match. As with Record, the blocks are
// touched tail first and at most the endpoint's capacity of them is kept.
func (x *Index) Stored(endpoint string, blockSize int, hashes ...uint64) error {
	if err := x.checkBlockSize(blockSize); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	e, err := x.endpointLocked(endpoint, true)
	if err != nil {
		return err
	}
	x.touchLocked(e, hashes, never, 0, math.MinInt64)
	return nil
}

// Removed applies an engine KV event: endpoint evicted the blocks. Unknown
// endpoints and blocks are ignored. A blockSize other than [Index.BlockSize]
// returns an error wrapping [ErrBlockSizeMismatch] and changes nothing.
func (x *Index) Removed(endpoint string, blockSize int, hashes ...uint64) error {
	if err := x.checkBlockSize(blockSize); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.endpoints[endpoint]; e != nil {
		if x.large() {
			// Read the blocks' table slots, nodes and holder entries
			// ahead, so that their misses overlap (see warmBlocks).
			x.warmed += x.holders.warm(hashes) + e.lru.Warm(hashes)
		}
		for _, h := range hashes {
			e.lru.Remove(h)
		}
		e.gen++
	}
	return nil
}

// Cleared applies an engine KV event: endpoint dropped its whole cache (for
// example after a restart or a weight update). The endpoint stays tracked
// with its capacity. Unknown endpoints are ignored.
func (x *Index) Cleared(endpoint string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.endpoints[endpoint]; e != nil {
		e.lru.Purge()
		e.gen++
	}
}

// RemoveEndpoint forgets endpoint and all its blocks, freeing its place
// among [IndexConfig.MaxEndpoints]. Call it when the endpoint leaves the
// pool. Unknown endpoints are ignored.
func (x *Index) RemoveEndpoint(endpoint string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.endpoints[endpoint]
	if e == nil {
		return
	}
	e.lru.Purge()
	delete(x.endpoints, endpoint)
	x.slots[e.slot] = nil
	x.occupied[e.slot/64] &^= 1 << (e.slot % 64)
}

// unixNano returns now on x's time line, at most never-1: blocks reported by
// engine events, whose expiry is never, outlast every time, even a reading
// such as time.Unix(0, math.MaxInt64). It is math.MinInt64 for every time
// the index cannot place: the zero time.Time and every other time up to
// time.Unix(0, math.MinInt64), in 1677.
func (x *Index) unixNano(now time.Time) int64 {
	return min(x.line.UnixNano(now), never-1)
}

// matchNano is unixNano for Match and MatchLen, which take a time they
// cannot place as later than every expiry: blocks reported by engine events
// match there, recorded blocks do not.
func (x *Index) matchNano(now time.Time) int64 {
	if t := x.unixNano(now); t > math.MinInt64 {
		return t
	}
	return never - 1
}

func (x *Index) checkBlockSize(blockSize int) error {
	if blockSize != x.blockSize {
		return fmt.Errorf("%w: event block size %d, index block size %d", ErrBlockSizeMismatch, blockSize, x.blockSize)
	}
	return nil
}

// warmBlocks is the least number of blocks a touch reads ahead (see
// lru.LRU.Warm): an index larger than the processor's caches waits for
// memory at each block's holder entry, table slot and list node, and
// reading them all first lets those misses overlap.
const warmBlocks = 8

// expiredBatch is how many expired blocks a Record drops beyond the blocks
// it records.
const expiredBatch = 16

// dropChunk is how many blocks an index at least as large as
// aheadEntries drops at once, their table slots and holder entries read
// ahead (see dropExpiredLocked).
const dropChunk = 32

// large reports whether the holder table is large enough that the index
// likely misses the processor's caches, so that reading ahead pays: the
// threshold of Match's read-ahead. x.mu must be held.
func (x *Index) large() bool { return x.holders.len() >= x.aheadEntries }

// dropExpiredLocked drops up to limit blocks of e that expired at now, from
// the least recently used end, stopping at the first unexpired one. In a
// large index the blocks are listed first, a chunk at a time, and their
// table slots and holder entries read ahead, so that the misses of their
// removals overlap instead of coming one after another. x.mu must be
// held for writing.
func (x *Index) dropExpiredLocked(e *endpoint, limit int, now int64) {
	if !x.large() {
		for ; limit > 0; limit-- {
			_, v, ok := e.lru.Oldest()
			if !ok || v > now {
				return
			}
			e.lru.RemoveOldest()
		}
		return
	}
	var buf [dropChunk]uint64
	for limit > 0 {
		want := min(limit, len(buf))
		keys := e.lru.AppendOldest(buf[:0], want, now)
		if len(keys) == 0 {
			return
		}
		x.warmed += x.holders.warm(keys) + e.lru.Warm(keys)
		for range keys {
			e.lru.RemoveOldest()
		}
		if len(keys) < want {
			return // the next one has not expired
		}
		limit -= len(keys)
	}
}

// touchLocked makes e hold blocks[:capacity], touching them tail first, with
// expiry exp, or the expiry they already have if it is at least exp-slack.
// now is the time used to refresh the expiry summary of each block's holder
// entry and, unless it is math.MinInt64, to drop expired blocks from the
// least recently used end first. x.mu must be held for writing.
func (x *Index) touchLocked(e *endpoint, blocks []uint64, exp, slack, now int64) {
	n := min(len(blocks), e.capacity)
	if n == 0 {
		return
	}
	// The same blocks touched again, with nothing changed at the endpoint
	// since and every expiry still recent enough, would be left exactly
	// as they are: a popular prompt recorded on its holder costs a
	// fingerprint instead of a map lookup and a list move per block.
	if now > math.MinInt64 {
		// Blocks recorded in turn expire in turn, from the least recently
		// used end: drop those, so that an endpoint's storage follows the
		// blocks recorded within the TTL instead of every block recorded
		// since it was added. They are the blocks an eviction would take
		// first, so which unexpired blocks the LRU keeps does not change.
		// At most n+expiredBatch go per call, which keeps up with the n
		// blocks a call may add and bounds the work of one call.
		x.dropExpiredLocked(e, n+expiredBatch, now)
	}
	fp := fingerprint(x.fpSeed, blocks[:n])
	l := &e.last
	repeat := l.gen == e.gen && l.n == n && l.print == fp && l.minExp >= exp-slack && l.minExp > now
	if repeat && l.marked {
		return
	}
	w, bit := e.slot/64, uint64(1)<<(e.slot%64)
	t := &x.holders
	if n >= warmBlocks {
		x.warmed += t.warm(blocks[:n]) + e.lru.Warm(blocks[:n])
	}
	if over := e.lru.Len() + n - e.capacity; over > 0 && x.large() {
		// Adding the blocks the endpoint lacks evicts as many of its
		// least recently used ones: read theirs ahead too.
		var buf [dropChunk]uint64
		keys := e.lru.AppendOldest(buf[:0], min(over, len(buf)), math.MaxInt64)
		x.warmed += t.warm(keys) + e.lru.Warm(keys)
	}
	minExp := int64(math.MaxInt64)
	for i := n - 1; i >= 0; i-- {
		h := blocks[i]
		hd := t.get(h, w)
		// A listed endpoint holds the block (see holder), so only then can
		// its expiry be recent enough to keep; an unlisted one either
		// lacks it or holds a copy that expired, and a single Add inserts
		// or refreshes it.
		listed := hd.bits&bit != 0
		v := exp
		if !listed {
			e.lru.Add(h, v) // may evict another block, unlinking it
		} else if old, _ := e.lru.GetMark(h); old >= exp-slack && old > now { // GetMark makes h the most recently used
			// Recent enough, or held longer: no update needed, only the
			// mark (for Unrecord). An expired copy, which can be recent
			// enough only at the end of time, is recorded afresh.
			v = old
		} else {
			e.lru.Add(h, v)
		}
		minExp = min(minExp, v)
		switch {
		case hd.bits&^bit == 0:
			hd = holder{bits: bit, minExp: v}
		case listed && hd.minExp > now:
			// Already listed, and minExp <= old <= v still holds.
			continue
		default:
			hd.bits |= bit
			hd.minExp = min(hd.minExp, v)
			if hd.minExp <= now {
				hd = x.refresh(h, w, hd, now)
			}
		}
		t.put(h, w, hd)
	}
	e.gen++
	e.last = lastTouch{n: n, print: fp, minExp: minExp, gen: e.gen, marked: repeat}
}

// refresh recomputes the expiry summary of the holders of block h in group
// w at time now: holders whose copy expired are dropped from bits and
// minExp becomes the least expiry of the others.
func (x *Index) refresh(h uint64, w int, hd holder, now int64) holder {
	hd.minExp = never
	for b := hd.bits; b != 0; b &= b - 1 {
		i := bits.TrailingZeros64(b)
		exp, _ := x.slots[64*w+i].lru.Peek(h)
		if exp <= now {
			hd.bits &^= 1 << i
		} else {
			hd.minExp = min(hd.minExp, exp)
		}
	}
	return hd
}

// maxGroups is the number of 64-endpoint groups of the largest index.
const maxGroups = DefaultMaxEndpoints / 64

// [Index.Match] reads blocks ahead in an index whose holder table holds at
// least matchAheadEntries entries (2 to 4 MB of table, more than a core's
// share of the processor's caches; below that, reading ahead only costs
// time). There each block's holder entries are likely a cache miss, and
// the walk's branches on the entries it reads keep the processor from
// running far ahead, so that the misses come mostly one after another.
// Reading the home slots of a window of blocks first, each read
// independent of the others, lets those misses overlap, and the walk then
// finds the entries in cache. Reads beyond the block where the match ends
// are wasted, so the first window is one block (most matches in a large
// cluster end there), the next is matchAhead blocks, and each next one
// twice as long, up to maxMatchAhead. In the simulator's cluster of 512
// replicas behind 16 routers, timed call by call against the walk without
// reading ahead, Match took 10 to 13% less time, reading 14% more slots
// than the walk needed (when each group of 64 endpoints had a holder table
// of its own); windows from 4 blocks up to 32 read 73% more and took
// longer than no read-ahead. The gain is bounded because each read is in
// a different page of a table that spans gigabytes, so it waits for a
// page-table walk as well, and few of those proceed at once.
const (
	matchAheadEntries = 1 << 16
	matchAhead        = 8
	maxMatchAhead     = 16
)

// Match appends to dst, for each endpoint holding at least the first of
// blocks, the number of leading blocks it holds unexpired at now, and
// returns the extended slice. Each endpoint's match stops at its first
// missing or expired block; endpoints that match no block are omitted. At
// a time the index cannot place, such as the zero time.Time, only blocks
// reported by engine events match (see [Index]). The
// appended matches are in decreasing order of Blocks; the order of equal
// matches is unspecified, so a policy should break ties at random.
//
// Match walks blocks once, checking all endpoints together, and stops when
// none is left matching. It takes the read lock and does not allocate when
// dst has room for the result.
func (x *Index) Match(blocks []uint64, now time.Time, dst []Match) []Match {
	if len(blocks) == 0 {
		return dst
	}
	t := x.matchNano(now)
	start := len(dst)
	var st matchState
	x.mu.RLock()
	defer x.mu.RUnlock()
	for w, occ := range x.occupied {
		if occ != 0 {
			st.alive[w] = occ
			st.active[st.na] = uint8(w)
			st.na++
		}
	}
	tab := &x.holders
	// An index larger than the caches is walked in windows of blocks, each
	// read ahead first (see matchAhead): one block, then matchAhead, then
	// twice as many each time.
	ahead := tab.len() >= x.aheadEntries
	var warmed uint64
	k := 1
	for i := 0; i < len(blocks) && st.na > 0; {
		end := len(blocks)
		if ahead {
			end = min(i+k, end)
			k = min(max(2*k, matchAhead), maxMatchAhead)
			warmed += tab.warm(blocks[i:end])
		}
		for i < end && st.na > 0 {
			if st.na > 1 {
				i, dst = x.walkGroups(blocks, i, end, &st, t, dst)
				continue
			}
			// One group left: always so up to 64 endpoints, and for
			// most blocks beyond.
			w := int(st.active[0])
			if i, st.alive[w], dst = x.walkGroup(blocks, i, end, w, st.alive[w], t, dst); st.alive[w] == 0 {
				st.na = 0
			}
		}
	}
	if warmed == 1 {
		// Not expected ever, but the compiler cannot rule it out: so the
		// read-ahead's reads are used and stay in the compiled code.
		x.matchWarmed.Store(warmed)
	}
	for _, w8 := range st.active[:st.na] {
		dst = x.appendMatches(dst, int(w8), st.alive[w8], len(blocks))
	}
	// Matches were appended shortest first.
	for i, j := start, len(dst)-1; i < j; i, j = i+1, j-1 {
		dst[i], dst[j] = dst[j], dst[i]
	}
	return dst
}

// matchState is the state of Match's walk: alive[w] is the set of
// endpoints of group w still matching, and active[:na] lists the groups
// whose set is not empty, in increasing order.
type matchState struct {
	alive  [maxGroups]uint64
	active [maxGroups]uint8
	na     int
}

// walkGroup is Match's walk of blocks[i:end] while group w is the only one
// with endpoints still matching, set: it appends to dst the endpoints of
// set that stop matching at a block, with the number of blocks before it,
// and returns the index after the last block walked, the endpoints still
// matching and dst. It stops after the first block none of set holds. A
// function of its own, the walk compiles to a loop that keeps its values
// in registers.
func (x *Index) walkGroup(blocks []uint64, i, end, w int, set uint64, now int64, dst []Match) (int, uint64, []Match) {
	tab := &x.holders
	seed := tab.seed
	for ; i < end; i++ {
		h := blocks[i]
		sl := tab.lookup(h, spreadKey(seed, h), w)
		next := set & sl.bits
		if next != 0 && sl.minExp() <= now {
			next = x.unexpired(h, w, next, now)
		}
		if gone := set &^ next; gone != 0 && i > 0 {
			dst = x.appendMatches(dst, w, gone, i)
		}
		if set = next; set == 0 {
			return i + 1, 0, dst
		}
	}
	return i, set, dst
}

// walkGroups is Match's walk of blocks[i:end] while several groups have
// endpoints still matching: as walkGroup, for the groups of st, in
// increasing order. It returns after a block that leaves at most one group
// matching, or at end.
func (x *Index) walkGroups(blocks []uint64, i, end int, st *matchState, now int64, dst []Match) (int, []Match) {
	tab := &x.holders
	seed := tab.seed
	for ; i < end && st.na > 1; i++ {
		h := blocks[i]
		sp := spreadKey(seed, h)
		n := 0
		for _, w8 := range st.active[:st.na] {
			// The block's entries in every group lie in one probe run
			// (see holderTable), so after the first group's lookup the
			// others' are in cache.
			w := int(w8)
			cur := st.alive[w]
			sl := tab.lookup(h, sp, w)
			next := cur & sl.bits
			if next != 0 && sl.minExp() <= now {
				next = x.unexpired(h, w, next, now)
			}
			if gone := cur &^ next; gone != 0 && i > 0 {
				dst = x.appendMatches(dst, w, gone, i)
			}
			st.alive[w] = next
			if next != 0 {
				st.active[n] = w8
				n++
			}
		}
		st.na = n
	}
	return i, dst
}

// unexpired returns the endpoints of set (group w) whose copy of block h
// has not expired at now.
func (x *Index) unexpired(h uint64, w int, set uint64, now int64) uint64 {
	for b := set; b != 0; b &= b - 1 {
		i := bits.TrailingZeros64(b)
		if exp, _ := x.slots[64*w+i].lru.Peek(h); exp <= now {
			set &^= 1 << i
		}
	}
	return set
}

func (x *Index) appendMatches(dst []Match, w int, set uint64, n int) []Match {
	for ; set != 0; set &= set - 1 {
		e := x.slots[64*w+bits.TrailingZeros64(set)]
		dst = append(dst, Match{Endpoint: e.key, Blocks: n})
	}
	return dst
}

// MatchLen returns the number of leading blocks endpoint holds unexpired at
// now: [Index.Match] for one endpoint. It is 0 for unknown endpoints.
func (x *Index) MatchLen(endpoint string, blocks []uint64, now time.Time) int {
	t := x.matchNano(now)
	x.mu.RLock()
	defer x.mu.RUnlock()
	e := x.endpoints[endpoint]
	if e == nil {
		return 0
	}
	for i, h := range blocks {
		if exp, ok := e.lru.Peek(h); !ok || exp <= t {
			return i
		}
	}
	return len(blocks)
}
