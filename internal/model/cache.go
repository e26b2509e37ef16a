package model

// kvPool is the KV-cache memory of one replica, counted in blocks, with a
// prefix cache on top: prompt blocks of finished prefills stay in the pool as
// cache entries keyed by their chained hash. An entry referenced by a running
// sequence is in use; one no sequence references is evictable and sits on an
// LRU list. Every operation is O(1) per entry.
//
// Entries live in one slice and refer to each other by index, found by hash
// in a table of indexes (hashIndex): the pool holds no pointers, so however
// many blocks the replicas cache, the garbage collector does not scan them.
type kvPool struct {
	total     int // capacity in blocks
	used      int // blocks held by running sequences (private + referenced entries)
	evictable int // blocks of unreferenced cache entries

	// onEvents, if set, hears the same events as onEvent in batches:
	// each run of events of one kind, in order, when the run ends or the
	// replica flushes them, at the end of each Plan, Finish and Receive.
	onEvents      func(hashes []uint64, stored bool)
	pending       []uint64 // the hashes of the current run
	pendingStored bool     // the kind of the current run

	// ents[0] is the sentinel of the LRU list of unreferenced entries:
	// ents[0].next is the oldest. Index 0 is no entry elsewhere.
	ents  []entry
	index hashIndex // entries by hash
	// free holds the entries evicted, for insert to reuse, last evicted
	// first: kept apart from the entries, so that reusing one only writes
	// it.
	free []int32
	// warmed keeps the reads of the warm-ups (see warmAhead).
	warmed uint64

	// onEvent, if set, hears every entry stored and evicted, at once.
	onEvent func(hash uint64, stored bool)
}

// entry is one cached prefix block: the KV blocks of BlockTokens prompt
// tokens whose chained hash is hash.
type entry struct {
	hash       uint64
	blocks     int32
	ref        int32
	prev, next int32 // LRU links while ref == 0
}

func newKVPool(total int) *kvPool {
	p := new(kvPool)
	p.init(total)
	return p
}

// init makes p an empty pool of total blocks.
func (p *kvPool) init(total int) {
	*p = kvPool{total: total, ents: make([]entry, 1, 16)}
}

// available is the number of blocks that can be allocated, evicting cached
// entries if needed.
func (p *kvPool) available() int { return p.total - p.used }

// alloc takes n blocks for a sequence's private use, evicting the least
// recently used cache entries if needed. It reports false, taking nothing,
// when fewer than n blocks are available.
func (p *kvPool) alloc(n int) bool {
	if n <= 0 {
		return true
	}
	if p.total-p.used < n {
		return false
	}
	if short := n - (p.total - p.used - p.evictable); short > 0 {
		p.evictBlocks(short)
	}
	p.used += n
	return true
}

// evictBlocks evicts the least recently used entries until short more
// blocks are free; the caller checked that enough blocks are evictable.
func (p *kvPool) evictBlocks(short int) {
	if int(p.ents[p.ents[0].next].blocks) < short {
		// Several entries go. In a simulation of many replicas, each
		// entry and its slot in the index are cache misses: walk the
		// entries first, reading each one's slot as it goes, so that
		// the misses of the slots overlap those of the walk.
		p.warmed += p.warmOldest(short)
	}
	for short > 0 {
		short -= p.evict()
	}
}

// warmOldest reads the least recently used entries that hold short blocks,
// and their slots in the index; it returns a value of the reads for the
// caller to keep.
func (p *kvPool) warmOldest(short int) uint64 {
	var acc uint64
	for i := p.ents[0].next; i != 0 && short > 0; i = p.ents[i].next {
		e := &p.ents[i]
		short -= int(e.blocks)
		acc += p.index.warmOne(e.hash)
	}
	return acc
}

// release returns n private blocks.
func (p *kvPool) release(n int) { p.used -= n }

// evict evicts the least recently used entry and returns its blocks.
func (p *kvPool) evict() int {
	i := p.ents[0].next
	e := &p.ents[i]
	p.unlink(i)
	blocks := int(e.blocks)
	p.evictable -= blocks
	h := e.hash
	p.index.del(h)
	*e = entry{}
	p.free = append(p.free, i)
	p.event(h, false)
	return blocks
}

// event reports that the entry of h was stored or evicted.
func (p *kvPool) event(h uint64, stored bool) {
	if p.onEvent != nil {
		p.onEvent(h, stored)
	}
	if p.onEvents != nil {
		if len(p.pending) > 0 && p.pendingStored != stored {
			p.flush()
		}
		p.pending = append(p.pending, h)
		p.pendingStored = stored
	}
}

// flush hands the pending events to onEvents.
func (p *kvPool) flush() {
	if len(p.pending) > 0 {
		p.onEvents(p.pending, p.pendingStored)
		p.pending = p.pending[:0]
	}
}

func (p *kvPool) unlink(i int32) {
	e := &p.ents[i]
	p.ents[e.prev].next, p.ents[e.next].prev = e.next, e.prev
	e.prev, e.next = 0, 0
}

// pushNewest puts unreferenced entry i at the most recently used end.
func (p *kvPool) pushNewest(i int32) {
	last := p.ents[0].prev
	p.ents[i].prev, p.ents[i].next = last, 0
	p.ents[last].next = i
	p.ents[0].prev = i
}

// warm reads entries es, each read independent of the others, so that the
// processor fetches them from memory in parallel before they are used; it
// returns a value of the reads for the caller to keep.
func (p *kvPool) warm(es []int32) uint64 {
	var acc uint64
	for _, i := range es {
		acc += uint64(p.ents[i].ref)
	}
	return acc
}

// lookup returns the entry cached under h, or 0.
func (p *kvPool) lookup(h uint64) int32 { return p.index.get(h) }

// acquire adds a reference to entry i, taking it off the LRU list if it
// was evictable.
func (p *kvPool) acquire(i int32) {
	e := &p.ents[i]
	if e.ref == 0 {
		p.unlink(i)
		p.evictable -= int(e.blocks)
		p.used += int(e.blocks)
	}
	e.ref++
}

// unref drops a reference to entry i; an entry left unreferenced becomes
// evictable as the most recently used.
func (p *kvPool) unref(i int32) {
	e := &p.ents[i]
	e.ref--
	if e.ref == 0 {
		p.used -= int(e.blocks)
		p.evictable += int(e.blocks)
		p.pushNewest(i)
	}
}

// insert turns blocks private blocks of a sequence into the cache entry h,
// referenced once by that sequence, and returns it. The caller checked that
// h is not cached.
func (p *kvPool) insert(h uint64, blocks int) int32 {
	var i int32
	if n := len(p.free); n > 0 {
		i = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		i = int32(len(p.ents))
		p.ents = append(p.ents, entry{})
	}
	p.ents[i] = entry{hash: h, blocks: int32(blocks), ref: 1}
	p.index.put(h, i)
	p.event(h, true)
	return i
}
