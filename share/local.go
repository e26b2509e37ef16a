package share

import (
	"cmp"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/llmlb/llmlb"
)

// local is this replica's own work in flight per endpoint, bucketed by pick
// time, and the prefix blocks of its picks since the last batch. The
// observer's functions update it; the Run goroutine snapshots it.
type local struct {
	width     int64 // nanoseconds per bucket
	horizon   int   // buckets kept per endpoint before merging into older
	maxEPs    int
	maxBlocks int // per batch; 0: blocks are not shared

	mu     sync.Mutex // protects the fields below
	eps    map[string]*localEP
	out    int64 // requests in flight, over every endpoint
	epoch  int64 // peer batches received
	routes []localRoute
	blocks []uint64         // the blocks of routes, back to back
	sent   map[sentKey]bool // routes already in this batch, by endpoint and last block
	epIdx  map[string]int   // snapshot's scratch: a routed endpoint's index in the message
	// untracked counts, by endpoint, the requests in flight picked while
	// the endpoint had no entry and the table was full: their FirstToken
	// and Done must release nothing, though an entry may be free by then.
	// An endpoint is in eps or in untracked, never both, so that no
	// request is taken for another; nil when empty.
	untracked map[string]int64

	dropped atomic.Uint64 // picks not buffered: table or block buffer full
}

// localEP is the work in flight at one endpoint.
type localEP struct {
	key     string
	buckets []localBucket // non-empty, by increasing index
	older   localBucket   // requests picked before every bucket
	out     int64         // totals over the buckets and older
	queued  int64
	tokens  int64
	// picks, picked and prefill are the picks since the peer batch epoch
	// arrived, their tokens and, of those, their prompt tokens to prefill.
	epoch                  int64
	picks, picked, prefill int64
	// fin[k mod len] counts the requests picked before the bucket
	// boundary k*width that finished after it: the engine counted them
	// in an observation taken at that time, and they are gone. It covers
	// the boundaries of the horizon; nil until a request finishes.
	fin []finSlot
}

// finSlot is the count of one boundary of localEP.fin.
type finSlot struct {
	k int64 // the boundary's index; the slot is stale if it is another
	n int64
}

// localBucket is the requests picked in one time bucket and not yet done.
type localBucket struct {
	idx     int64 // pick time / width
	out     int64
	queued  int64
	prefill int64 // prompt tokens of the queued requests, net of cache hits
	decode  int64 // expected decode tokens of the outstanding requests
}

type localRoute struct {
	key    string
	off, n int
}

type sentKey struct {
	key  string
	last uint64
}

func (b *localBucket) merge(o *localBucket) {
	b.out += o.out
	b.queued += o.queued
	b.prefill += o.prefill
	b.decode += o.decode
}

// firstToken moves one of b's queued requests to streaming and returns the
// prefill tokens released, an average over b's queued requests: the
// observer does not say which request of the bucket it was.
func (b *localBucket) firstToken() int64 {
	p := b.prefill / b.queued
	if b.queued == 1 {
		p = b.prefill
	}
	b.prefill -= p
	b.queued--
	return p
}

// done releases one of b's outstanding requests and returns the tokens
// released.
func (b *localBucket) done(queued bool) int64 {
	var p int64
	if queued {
		p = b.firstToken()
	}
	d := b.decode / b.out
	if b.out == 1 {
		d = b.decode
	}
	b.decode -= d
	b.out--
	return p + d
}

// find returns the bucket that holds a request picked in bucket idx, or nil:
// the bucket itself, else a neighbour (the observer's latencies and this
// package's clock readings may straddle a bucket boundary), else older.
// streaming selects a bucket with a streaming request, otherwise one with a
// queued request.
func (e *localEP) find(idx int64, streaming bool) *localBucket {
	ok := func(b *localBucket) bool {
		if streaming {
			return b.out > b.queued
		}
		return b.queued > 0
	}
	i := sort.Search(len(e.buckets), func(i int) bool { return e.buckets[i].idx >= idx })
	for _, j := range [...]int{i, i - 1, i + 1} {
		if j >= 0 && j < len(e.buckets) && e.buckets[j].idx >= idx-1 && e.buckets[j].idx <= idx+1 && ok(&e.buckets[j]) {
			return &e.buckets[j]
		}
	}
	if ok(&e.older) {
		return &e.older
	}
	// Not where expected (a clock that jumped): release any request, so the
	// totals stay exact.
	for j := len(e.buckets) - 1; j >= 0; j-- {
		if ok(&e.buckets[j]) {
			return &e.buckets[j]
		}
	}
	return nil
}

// compact drops empty buckets and merges those older than the horizon
// before now into older.
func (e *localEP) compact(now int64, width int64, horizon int) {
	first := now/width - int64(horizon) + 1
	e.buckets = slices.DeleteFunc(e.buckets, func(b localBucket) bool {
		if b.idx < first && b.out > 0 {
			e.older.merge(&b)
			return true
		}
		return b.out == 0
	})
}

func (l *local) init(width int64, horizon, maxEPs, maxBlocks int) {
	l.width, l.horizon, l.maxEPs, l.maxBlocks = width, horizon, maxEPs, maxBlocks
	l.eps = make(map[string]*localEP)
	l.sent = make(map[sentKey]bool)
	if maxBlocks > 0 {
		l.blocks = make([]uint64, 0, maxBlocks)
	}
}

// charges returns the prefill and decode tokens the balancer charged for a
// pick.
func charges(info *llmlb.PickInfo) (prefill, decode int64) {
	if r := info.Request; r != nil {
		prefill = int64(r.PromptTokens - min(info.CachedTokens, r.PromptTokens))
	}
	return prefill, int64(info.DecodeTokens)
}

// pick records a successful pick made at now (unix nanoseconds). A pick at
// a key longer than the wire carries is dropped: a batch with it would be
// refused whole.
func (l *local) pick(info *llmlb.PickInfo, now int64) {
	key := info.Endpoint.Key()
	if len(key) > maxKeyBytes {
		l.dropped.Add(1)
		return
	}
	prefill, decode := charges(info)
	idx := now / l.width
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.eps[key]
	if e == nil {
		if l.untracked[key] > 0 || len(l.eps) >= l.maxEPs {
			// Not tracked, and no entry is made for key until every
			// untracked request at it is done: the Done of one must not
			// release a tracked one.
			if l.untracked == nil {
				l.untracked = make(map[string]int64)
			}
			l.untracked[key]++
			l.dropped.Add(1)
			return
		}
		e = &localEP{key: key}
		l.eps[key] = e
	}
	var b *localBucket
	if n := len(e.buckets); n > 0 && e.buckets[n-1].idx >= idx {
		// The newest bucket, or, for a clock that went back, whichever
		// holds idx or the newest.
		b = &e.buckets[n-1]
		if i, ok := slices.BinarySearchFunc(e.buckets, idx, func(b localBucket, idx int64) int { return cmp.Compare(b.idx, idx) }); ok {
			b = &e.buckets[i]
		}
	} else {
		if len(e.buckets) >= l.horizon {
			e.older.merge(&e.buckets[0])
			e.buckets = slices.Delete(e.buckets, 0, 1)
		}
		e.buckets = append(e.buckets, localBucket{idx: idx})
		b = &e.buckets[len(e.buckets)-1]
	}
	b.out++
	b.queued++
	b.prefill += prefill
	b.decode += decode
	l.out++
	if e.epoch != l.epoch {
		e.epoch, e.picks, e.picked, e.prefill = l.epoch, 0, 0, 0
	}
	e.picks++
	e.picked += prefill + decode
	e.prefill += prefill
	e.out++
	e.queued++
	e.tokens += prefill + decode
	if r := info.Request; r != nil && len(r.Prefix) > 0 && l.maxBlocks > 0 {
		l.route(e.key, r.Prefix)
	}
}

// route buffers the blocks of a pick to key, cut to the room left in the
// batch. The caller holds l.mu.
func (l *local) route(key string, blocks []uint64) {
	room := l.maxBlocks - len(l.blocks)
	if room <= 0 {
		l.dropped.Add(1)
		return
	}
	blocks = blocks[:min(len(blocks), room)]
	// A chained hash names its whole prefix: a route whose last block was
	// already sent to the same endpoint in this batch adds nothing.
	sk := sentKey{key, blocks[len(blocks)-1]}
	if l.sent[sk] {
		return
	}
	l.sent[sk] = true
	l.routes = append(l.routes, localRoute{key: key, off: len(l.blocks), n: len(blocks)})
	l.blocks = append(l.blocks, blocks...)
}

// firstToken records the first token of a request picked at picked.
func (l *local) firstToken(key string, picked int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.eps[key]
	if e == nil {
		return // its pick was dropped, as every one in flight at key
	}
	if b := e.find(picked/l.width, false); b != nil {
		e.tokens -= b.firstToken()
		e.queued--
	}
}

// done records the end, at now, of a request picked at picked; sent
// reports whether it reached the engine, whose observations then counted
// it while it was in flight.
func (l *local) done(key string, picked, now int64, streamed, sent bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.untracked[key]; n > 0 {
		// Its pick was dropped, as every one in flight at key.
		if n == 1 {
			delete(l.untracked, key)
			if len(l.untracked) == 0 {
				l.untracked = nil // the memory of a burst is not kept
			}
		} else {
			l.untracked[key] = n - 1
		}
		return
	}
	e := l.eps[key]
	if e == nil {
		return
	}
	b := e.find(picked/l.width, streamed)
	if b == nil {
		return
	}
	e.tokens -= b.done(!streamed)
	e.out--
	l.out--
	if !streamed {
		e.queued--
	}
	if !sent {
		return
	}
	// The request was in flight at every boundary in (picked, now].
	last := floorDiv(now, l.width)
	first := max(floorDiv(picked, l.width)+1, last-int64(l.horizon)+1)
	if first > last {
		return
	}
	if e.fin == nil {
		e.fin = make([]finSlot, l.horizon)
	}
	for k := first; k <= last; k++ {
		f := &e.fin[mod(k, len(e.fin))]
		if f.k != k {
			*f = finSlot{k: k}
		}
		f.n++
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func mod(k int64, n int) int {
	m := int(k % int64(n))
	if m < 0 {
		m += n
	}
	return m
}

// live reports whether e has any finished count within the horizon before
// newest.
func (e *localEP) live(newest int64, horizon int) bool {
	for _, f := range e.fin {
		if f.n > 0 && f.k > newest-int64(horizon) {
			return true
		}
	}
	return false
}

// recent returns this replica's picks at key since the last peer batch
// arrived (the last call of newBatch), with their tokens and, of those,
// their prompt tokens to prefill, and its requests in flight at every
// endpoint.
func (l *local) recent(key string) (picks, tokens, prefill, out int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.eps[key]; e != nil && e.epoch == l.epoch {
		return e.picks, e.picked, e.prefill, l.out
	}
	return 0, 0, 0, l.out
}

// newBatch records that a peer batch arrived: the picks since the previous
// one are known to the peers now, or will be with their next batch.
func (l *local) newBatch() {
	l.mu.Lock()
	l.epoch++
	l.mu.Unlock()
}

// totals returns this replica's requests in flight at key: streaming, queued
// and tokens.
func (l *local) totals(key string) (streaming, queued, tokens int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.eps[key]; e != nil {
		return e.out - e.queued, e.queued, e.tokens
	}
	return 0, 0, 0
}

// snapshot fills m with the work in flight at now and the routes buffered
// since the last snapshot, which it clears. It reuses m's slices.
func (l *local) snapshot(m *message, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m.width, m.horizon = l.width, l.horizon
	m.phase = now - now/l.width*l.width
	if m.phase < 0 { // times before 1970
		m.phase += l.width
	}
	newest := floorDiv(now, l.width)
	m.eps = m.eps[:0]
	// Only routes need an endpoint's index in the message: without any,
	// a batch builds no map.
	epIdx := l.epIdx
	if len(l.routes) > 0 {
		if epIdx == nil {
			epIdx = make(map[string]int, len(l.eps))
			l.epIdx = epIdx
		}
		clear(epIdx)
	}
	for key, e := range l.eps {
		e.compact(now, l.width, l.horizon)
		if e.out == 0 {
			e.tokens = 0 // any rounding residue
			if !e.live(newest, l.horizon) {
				delete(l.eps, key)
				continue
			}
		}
		m.eps = slices.Grow(m.eps, 1)[:len(m.eps)+1]
		s := &m.eps[len(m.eps)-1]
		s.key, s.buckets, s.fin = key, s.buckets[:0], s.fin[:0]
		// Newest first, so ages increase.
		for k := newest; k > newest-int64(l.horizon) && e.fin != nil; k-- {
			if f := e.fin[mod(k, len(e.fin))]; f.k == k && f.n > 0 {
				s.fin = append(s.fin, finCount{age: int(newest - k), n: f.n})
			}
		}
		// Newest first, so ages increase.
		for i := len(e.buckets) - 1; i >= 0; i-- {
			b := &e.buckets[i]
			age := max(newest-b.idx, 0)
			if age >= int64(l.horizon) {
				age = int64(l.horizon) - 1 // compact keeps at most horizon buckets
			}
			if n := len(s.buckets); n > 0 && s.buckets[n-1].age >= int(age) {
				last := &s.buckets[n-1] // a bucket ahead of now: fold it in
				last.out, last.queued, last.tokens, last.prefill = last.out+b.out, last.queued+b.queued, last.tokens+b.prefill+b.decode, last.prefill+b.prefill
				continue
			}
			s.buckets = append(s.buckets, bucket{age: int(age), out: b.out, queued: b.queued, tokens: b.prefill + b.decode, prefill: b.prefill})
		}
		if o := &e.older; o.out > 0 {
			s.buckets = append(s.buckets, bucket{age: l.horizon, out: o.out, queued: o.queued, tokens: o.prefill + o.decode, prefill: o.prefill})
		}
		if len(l.routes) > 0 {
			epIdx[key] = len(m.eps) - 1
		}
	}
	m.routes = m.routes[:0]
	// The routes' blocks are copied once, for the message to outlive the
	// buffer that is reused for the next batch.
	m.blocks = append(m.blocks[:0], l.blocks...)
	for _, r := range l.routes {
		i, ok := epIdx[r.key]
		if !ok {
			m.eps = append(m.eps, epSnap{key: r.key}) // routes only
			i = len(m.eps) - 1
			epIdx[r.key] = i
		}
		m.routes = append(m.routes, route{ep: i, blocks: m.blocks[r.off : r.off+r.n : r.off+r.n]})
	}
	l.routes = l.routes[:0]
	l.blocks = l.blocks[:0]
	clear(l.sent)
}
