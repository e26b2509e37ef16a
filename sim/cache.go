package sim

// kvPool is the KV-cache memory of one replica, counted in blocks, with a
// prefix cache on top: prompt blocks of finished prefills stay in the pool as
// cache entries keyed by their chained hash. An entry referenced by a running
// sequence is in use; one no sequence references is evictable and sits on an
// LRU list. Every operation is O(1) per entry.
type kvPool struct {
	total     int // capacity in blocks
	used      int // blocks held by running sequences (private + referenced entries)
	evictable int // blocks of unreferenced cache entries

	entries map[uint64]*entry
	lru     entry  // sentinel of the LRU list of unreferenced entries; lru.next is the oldest
	free    *entry // recycled entries, linked through next

	// onEvent, if set, hears every entry stored and evicted.
	onEvent func(hash uint64, stored bool)
}

// entry is one cached prefix block: the KV blocks of BlockTokens prompt
// tokens whose chained hash is hash.
type entry struct {
	hash       uint64
	blocks     int32
	ref        int32
	prev, next *entry // LRU links while ref == 0
}

func newKVPool(total int) *kvPool {
	p := &kvPool{total: total, entries: make(map[uint64]*entry)}
	p.lru.prev, p.lru.next = &p.lru, &p.lru
	return p
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
	for p.total-p.used-p.evictable < n {
		p.evict()
	}
	p.used += n
	return true
}

// release returns n private blocks.
func (p *kvPool) release(n int) { p.used -= n }

func (p *kvPool) evict() {
	e := p.lru.next
	p.unlink(e)
	p.evictable -= int(e.blocks)
	delete(p.entries, e.hash)
	if p.onEvent != nil {
		p.onEvent(e.hash, false)
	}
	*e = entry{next: p.free}
	p.free = e
}

func (p *kvPool) unlink(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// pushNewest puts an unreferenced entry at the most recently used end.
func (p *kvPool) pushNewest(e *entry) {
	e.prev, e.next = p.lru.prev, &p.lru
	p.lru.prev.next = e
	p.lru.prev = e
}

// lookup returns the entry cached under h, or nil.
func (p *kvPool) lookup(h uint64) *entry { return p.entries[h] }

// acquire adds a reference to e, taking it off the LRU list if it was
// evictable.
func (p *kvPool) acquire(e *entry) {
	if e.ref == 0 {
		p.unlink(e)
		p.evictable -= int(e.blocks)
		p.used += int(e.blocks)
	}
	e.ref++
}

// unref drops a reference; an entry left unreferenced becomes evictable as
// the most recently used.
func (p *kvPool) unref(e *entry) {
	e.ref--
	if e.ref == 0 {
		p.used -= int(e.blocks)
		p.evictable += int(e.blocks)
		p.pushNewest(e)
	}
}

// insert turns blocks private blocks of a sequence into the cache entry h,
// referenced once by that sequence. The caller checked that h is not cached.
func (p *kvPool) insert(h uint64, blocks int) *entry {
	e := p.free
	if e != nil {
		p.free = e.next
		e.next = nil
	} else {
		e = new(entry)
	}
	e.hash, e.blocks, e.ref = h, int32(blocks), 1
	p.entries[h] = e
	if p.onEvent != nil {
		p.onEvent(h, true)
	}
	return e
}
