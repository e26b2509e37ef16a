// Package lru is a least-recently-used list of uint64 keys, each with an
// int64 value, that allocates nothing once at its capacity: the per-endpoint
// block lists of package prefix's index and the simulator's reference cache.
package lru

import "math/rand/v2"

// LRU is a recency list of keys, each with a value. It is a doubly linked
// list threaded through a slice of nodes and found through an
// open-addressing table of node indices, so that adding a key, touching it
// or evicting one allocates nothing once the list is at its capacity, and
// a key costs 24 bytes of node and 16 to 32 bytes of table instead of a
// heap entry and a map slot.
//
// It keeps the semantics of golang-lru's simplelru: Add and Get make a key
// the most recently used, Peek does not, adding a key beyond the capacity
// evicts the least recently used one, and every key leaving the list
// (evicted, removed, purged or dropped by Resize) is passed to the eviction
// callback. A property test checks it against simplelru. Besides, a key
// can be marked (GetMark), until its value is set again or it leaves. It
// is not safe for concurrent use, except for concurrent Peek, PeekMarked,
// Len and Keys.
type LRU struct {
	// slots is the table: 0 when empty, else the key's tag in the high
	// 32 bits, its mark in bit 31 and its node index in the bits below.
	// Its length is a power of two at least twice the keys held, so a
	// probe always ends.
	slots []uint64
	// nodes[0] is the list's sentinel: its next is the most recently used
	// key, its prev the least recently used.
	nodes   []lruNode
	free    uint32 // first unused node, chained through next; 0 if none
	n       int    // keys held
	size    int    // the capacity
	seed    uint64 // mixed into every tag, so that layouts are unpredictable
	onEvict func(uint64)
}

// lruNode is one key of an LRU, or the sentinel.
type lruNode struct {
	key        uint64
	val        int64
	prev, next uint32
}

// minLRUSlots is the smallest table of a non-empty LRU.
const minLRUSlots = 16

// marked is the bit of a table slot that marks its key; the node indices
// are below it.
const marked = 1 << 31

// MaxSize is the largest capacity of an LRU.
const MaxSize = marked - 2

// New returns an empty list of capacity size (at least 1, at most MaxSize)
// that passes every key leaving it to onEvict, if not nil. onEvict must not
// use the list.
func New(size int, onEvict func(key uint64)) *LRU {
	return &LRU{nodes: make([]lruNode, 1), size: min(max(size, 1), MaxSize), seed: rand.Uint64(), onEvict: onEvict}
}

// tag returns the tag of key: its table position is the tag modulo the
// table's length, and equal tags are checked against the node's key. The
// list's random seed is mixed in, so that keys chosen to share a position
// (prompts ground to collide, making every lookup probe a long run) cannot
// be chosen without knowing it.
func (l *LRU) tag(key uint64) uint32 {
	x := (key ^ l.seed) * 0x9e3779b97f4a7c15
	x ^= x >> 32
	x *= 0xd6e8feb86659fd93
	return uint32(x >> 32)
}

// find returns the table position of key and its node, or the empty
// position where key would go and node 0.
func (l *LRU) find(key uint64) (pos int, node uint32) {
	if len(l.slots) == 0 {
		return -1, 0
	}
	tag := l.tag(key)
	mask := len(l.slots) - 1
	for i := int(tag) & mask; ; i = (i + 1) & mask {
		s := l.slots[i]
		if s == 0 {
			return i, 0
		}
		if uint32(s>>32) == tag && l.nodes[uint32(s)&^marked].key == key {
			return i, uint32(s) &^ marked
		}
	}
}

// Warm reads the table slot of each key's home position and, if the slot
// holds the key's tag, its node, each key's reads independent of the
// others', so that the processor fetches them from memory in parallel
// instead of one miss after another; Get, Add or Remove of the same keys
// right after then find them in cache. (A slot holding another tag names
// another key's node, which those calls do not read.) It also reads the
// first unused node, which the next Add of a new key takes. It changes
// nothing and returns a value computed from the reads, which the caller
// should keep (store it) so that they are not optimized away.
func (l *LRU) Warm(keys []uint64) uint64 {
	if len(l.slots) == 0 {
		return 0
	}
	mask := uint32(len(l.slots) - 1)
	acc := uint64(l.nodes[l.free].next)
	for _, k := range keys {
		tag := l.tag(k)
		s := l.slots[tag&mask]
		nd := uint32(s) &^ marked
		if uint32(s>>32) != tag {
			nd = 0 // the sentinel, in cache
		}
		acc += l.nodes[nd].key
	}
	return acc
}

// Len returns the number of keys held.
func (l *LRU) Len() int { return l.n }

// Peek returns the value of key without changing its recency.
func (l *LRU) Peek(key uint64) (val int64, ok bool) {
	if _, nd := l.find(key); nd != 0 {
		return l.nodes[nd].val, true
	}
	return 0, false
}

// PeekMarked returns the value of key and whether it is marked, without
// changing its recency.
func (l *LRU) PeekMarked(key uint64) (val int64, isMarked, ok bool) {
	if pos, nd := l.find(key); nd != 0 {
		return l.nodes[nd].val, l.slots[pos]&marked != 0, true
	}
	return 0, false, false
}

// Get returns the value of key and makes it the most recently used.
func (l *LRU) Get(key uint64) (val int64, ok bool) {
	_, nd := l.find(key)
	if nd == 0 {
		return 0, false
	}
	l.moveToFront(nd)
	return l.nodes[nd].val, true
}

// GetMark is Get, and marks key. The mark stays until Add sets the value
// of key or key leaves the list.
func (l *LRU) GetMark(key uint64) (val int64, ok bool) {
	pos, nd := l.find(key)
	if nd == 0 {
		return 0, false
	}
	l.slots[pos] |= marked
	l.moveToFront(nd)
	return l.nodes[nd].val, true
}

// Add sets the value of key, unmarking it, and makes it the most recently
// used, evicting the least recently used key if key is new and the list is
// full.
func (l *LRU) Add(key uint64, val int64) {
	pos, nd := l.find(key)
	if nd != 0 {
		l.slots[pos] &^= marked
		l.nodes[nd].val = val
		l.moveToFront(nd)
		return
	}
	if l.n >= l.size {
		// The evicted key's node is the next free one; its removal may
		// shift the table, so key's position is looked up again.
		l.removeNode(l.nodes[0].prev)
		pos, _ = l.find(key)
	}
	if 2*(l.n+1) > len(l.slots) {
		l.rehash(max(2*len(l.slots), minLRUSlots))
		pos, _ = l.find(key)
	}
	nd = l.newNode()
	l.nodes[nd] = lruNode{key: key, val: val}
	l.slots[pos] = uint64(l.tag(key))<<32 | uint64(nd)
	l.linkFront(nd)
	l.n++
}

// Oldest returns the least recently used key and its value, or false if
// the list is empty.
func (l *LRU) Oldest() (key uint64, val int64, ok bool) {
	nd := l.nodes[0].prev
	if nd == 0 {
		return 0, 0, false
	}
	return l.nodes[nd].key, l.nodes[nd].val, true
}

// AppendOldest appends to dst the keys of the least recently used entries,
// oldest first, as long as their value is at most maxVal, up to n keys, and
// returns the extended slice: the keys that n calls of RemoveOldest, each
// after checking that Oldest's value is at most maxVal, would drop. It
// changes nothing. Reading the keys first lets a caller fetch what their
// removal touches (see Warm) in parallel, before removing them.
func (l *LRU) AppendOldest(dst []uint64, n int, maxVal int64) []uint64 {
	for nd := l.nodes[0].prev; nd != 0 && n > 0; nd = l.nodes[nd].prev {
		if l.nodes[nd].val > maxVal {
			break
		}
		dst = append(dst, l.nodes[nd].key)
		n--
	}
	return dst
}

// RemoveOldest drops the least recently used key, if any.
func (l *LRU) RemoveOldest() {
	if nd := l.nodes[0].prev; nd != 0 {
		l.removeNode(nd)
	}
}

// Remove drops key, if held.
func (l *LRU) Remove(key uint64) {
	if _, nd := l.find(key); nd != 0 {
		l.removeNode(nd)
	}
}

// Purge drops every key and releases the storage.
func (l *LRU) Purge() {
	for nd := l.nodes[0].next; nd != 0; nd = l.nodes[nd].next {
		if l.onEvict != nil {
			l.onEvict(l.nodes[nd].key)
		}
	}
	*l = LRU{nodes: make([]lruNode, 1), size: l.size, seed: l.seed, onEvict: l.onEvict}
}

// Resize sets the capacity (at least 1), evicting the least recently used
// keys beyond it. A list shrunk well below the storage it had is compacted.
func (l *LRU) Resize(size int) {
	size = max(size, 1)
	for l.n > size {
		l.removeNode(l.nodes[0].prev)
	}
	l.size = size
	if len(l.nodes) > 2*(size+1) && len(l.nodes) > 64 {
		l.compact()
	}
}

// Keys returns the keys held, least recently used first.
func (l *LRU) Keys() []uint64 {
	keys := make([]uint64, 0, l.n)
	for nd := l.nodes[0].prev; nd != 0; nd = l.nodes[nd].prev {
		keys = append(keys, l.nodes[nd].key)
	}
	return keys
}

// newNode returns an unused node, growing the nodes up to the capacity.
func (l *LRU) newNode() uint32 {
	if nd := l.free; nd != 0 {
		l.free = l.nodes[nd].next
		return nd
	}
	if len(l.nodes) == cap(l.nodes) {
		grown := make([]lruNode, len(l.nodes), min(max(2*cap(l.nodes), 64), l.size+1))
		copy(grown, l.nodes)
		l.nodes = grown
	}
	l.nodes = append(l.nodes, lruNode{})
	return uint32(len(l.nodes) - 1)
}

// removeNode unlinks node nd, clears its table slot, chains it as free and
// passes its key to onEvict.
func (l *LRU) removeNode(nd uint32) {
	key := l.nodes[nd].key
	pos, _ := l.find(key)
	l.deleteSlot(pos)
	l.unlink(nd)
	l.nodes[nd] = lruNode{next: l.free}
	l.free = nd
	l.n--
	if l.onEvict != nil {
		l.onEvict(key)
	}
}

// deleteSlot empties table position i, shifting back the entries after it
// whose probe passed through i (backward-shift deletion), so that lookups
// never need tombstones.
func (l *LRU) deleteSlot(i int) {
	mask := len(l.slots) - 1
	for {
		l.slots[i] = 0
		j := i
		for {
			j = (j + 1) & mask
			s := l.slots[j]
			if s == 0 {
				return
			}
			// The entry at j may move to i if its home position is not
			// cyclically within (i, j].
			h := int(uint32(s>>32)) & mask
			if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
				l.slots[i] = s
				i = j
				break
			}
		}
	}
}

func (l *LRU) unlink(nd uint32) {
	n := &l.nodes[nd]
	l.nodes[n.prev].next = n.next
	l.nodes[n.next].prev = n.prev
}

func (l *LRU) linkFront(nd uint32) {
	head := l.nodes[0].next
	l.nodes[nd].prev, l.nodes[nd].next = 0, head
	l.nodes[head].prev = nd
	l.nodes[0].next = nd
}

func (l *LRU) moveToFront(nd uint32) {
	if l.nodes[0].next != nd {
		l.unlink(nd)
		l.linkFront(nd)
	}
}

// rehash moves the table's entries into a new table of n slots.
func (l *LRU) rehash(n int) {
	old := l.slots
	l.slots = make([]uint64, n)
	mask := n - 1
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := int(uint32(s>>32)) & mask
		for l.slots[i] != 0 {
			i = (i + 1) & mask
		}
		l.slots[i] = s
	}
}

// compact rebuilds the nodes and the table for the keys held, in the
// same order and with the same marks, dropping the storage freed since.
func (l *LRU) compact() {
	old, oldSlots := l.nodes, l.slots
	var marks map[uint64]bool // nil until a mark is found
	for _, s := range oldSlots {
		if s&marked != 0 {
			if marks == nil {
				marks = make(map[uint64]bool)
			}
			marks[old[uint32(s)&^marked].key] = true
		}
	}
	l.nodes = make([]lruNode, 1, l.n+1)
	l.free = 0
	slots := minLRUSlots
	for slots < 2*l.n {
		slots *= 2
	}
	l.slots = make([]uint64, slots)
	mask := slots - 1
	for nd := old[0].prev; nd != 0; nd = old[nd].prev { // oldest first
		key := old[nd].key
		l.nodes = append(l.nodes, lruNode{key: key, val: old[nd].val})
		id := uint32(len(l.nodes) - 1)
		l.linkFront(id)
		tag := l.tag(key)
		i := int(tag) & mask
		for l.slots[i] != 0 {
			i = (i + 1) & mask
		}
		l.slots[i] = uint64(tag)<<32 | uint64(id)
		if marks[key] {
			l.slots[i] |= marked
		}
	}
}
