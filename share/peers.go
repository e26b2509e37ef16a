package share

import (
	"math"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// peers holds the latest snapshot of every peer heard from: of each part
// of its batches (see split), which count as one peer.
type peers struct {
	ttl int64 // nanoseconds a snapshot counts after it arrived, at least
	max int   // senders
	// maxBytes bounds the bytes of one sender's batches (maxSenderBytes;
	// tests lower it).
	maxBytes int

	mu sync.RWMutex // protects list and senders
	// list holds the snapshots by increasing id, so that sums over them
	// are the same whatever the order their batches arrived in.
	list []*peer
	// senders holds, by the ID of the replica that sent them (baseID),
	// the snapshots in list and the bytes of their batches.
	senders map[string]*sender

	// spare is the memory of a snapshot replaced by a newer one, for apply
	// to fill with the next. Only apply uses it, and its caller
	// serializes the calls.
	spare *snap
}

// peer is the latest snapshot of one peer, or of one part of its batches.
type peer struct {
	id   string
	base string // the sender's ID: baseID(id)
	inc  uint64 // incarnation of the sender
	seq  uint64
	seen int64 // local unix nanoseconds the snapshot arrived
	ttl  int64 // nanoseconds it counts after it arrived (see peerTTL)
	size int   // bytes of the batch
	*snap
}

// sender is the snapshots of one peer: one per part of its batches.
type sender struct {
	parts int    // snapshots in list
	bytes int    // of their batches
	inc   uint64 // incarnation of the latest batch applied
}

// maxSenderBytes bounds the bytes of the batches of one peer kept at once,
// over the parts of its batches: a batch of the largest MaxEndpoints, of
// the longest keys and many requests in flight at each, takes several
// times the 8 MiB of a message, and a peer sending more fills no more
// memory than eight peers of the largest messages.
const maxSenderBytes = 8 * maxMessageBytes

// snap is a peer's snapshot as kept: its work per endpoint, as the batch
// carried it, in at most about ten times the batch's bytes (about 4 times
// for its finished counts, 6 for its buckets, and 10 for endpoints that
// carry a single count). The spans of its buckets and the points of its
// finished counts are computed when read.
type snap struct {
	newest  int64 // local unix nanoseconds of the start of the newest bucket
	width   int64 // nanoseconds per bucket
	horizon int
	out     int64 // requests in flight, over every endpoint
	eps     map[string]epWork
	buckets []peerBucket // of every endpoint, back to back
	fin     []peerFin    // of every endpoint, back to back
	// epsMax is the most endpoints eps has held since it was made: its
	// memory, which clearing it keeps.
	epsMax int
}

// epWork locates an endpoint's buckets and finished counts in a snap.
type epWork struct {
	b, nb int32 // buckets[b : b+nb]
	f, nf int32 // fin[f : f+nf]
}

// peerBucket is a bucket of a snap (see bucket), in the bounds the
// decoder enforces.
type peerBucket struct {
	tokens, prefill int64
	age             int32
	out, queued     int32
}

// peerFin is a finished count of a snap (see finCount).
type peerFin struct {
	age, n int32
}

// finPoint says that n requests in flight at time at have finished since.
type finPoint struct {
	at int64
	n  int64
}

// lerp interpolates at t between points given by increasing time.
type lerp struct {
	t    int64
	prev finPoint // the last point given
	n    int      // points given
	v    float64
	done bool
}

// add gives the next point, and reports whether the value is known.
func (l *lerp) add(p finPoint) bool {
	switch {
	case l.n == 0 && l.t <= p.at:
		l.v, l.done = float64(p.n), true
	case l.n > 0 && l.t <= p.at:
		a := l.prev
		f := float64(l.t-a.at) / float64(p.at-a.at)
		l.v, l.done = float64(a.n)+f*float64(p.n-a.n), true
	}
	l.prev = p
	l.n++
	return l.done
}

// value returns the interpolation: after the last point, its count; 0
// without points.
func (l *lerp) value() float64 {
	if l.done {
		return l.v
	}
	return float64(l.prev.n)
}

// span is a peer's requests in flight that were picked in [start, end) on
// this replica's clock (the snapshot's arrival anchors the peer's bucket
// ages). start is math.MinInt64 for requests picked before the peer's ring.
type span struct {
	start, end int64
}

// work is a sum of peers' requests: in flight, and finished since a time;
// out is every live peer's requests in flight, whatever the endpoint.
// waiting and prefill are every request in flight before its first token,
// whenever it was picked, whose prefill its sender reported, and that
// prefill.
type work struct {
	streaming, queued, tokens float64
	finished                  float64
	out                       int64
	waiting, prefill          float64
}

// span returns the pick times of b, of a snapshot received at now.
func (s *snap) span(b *peerBucket, now int64) span {
	if int(b.age) >= s.horizon {
		return span{start: math.MinInt64, end: s.newest - int64(s.horizon-1)*s.width}
	}
	start := s.newest - int64(b.age)*s.width
	return span{start: start, end: min(start+s.width, now)}
}

// finPoints calls yield with the points, by increasing time, of fin, the
// finished counts of one endpoint of s received at now, until yield
// returns false. A boundary of the ring without a count had none finished:
// a zero point goes beside each count whose neighbouring boundary lacks
// one, so that interpolation does not bridge the gap. The batch itself
// comes last: nothing had finished after it.
func (s *snap) finPoints(fin []peerFin, now int64, yield func(finPoint) bool) {
	at := func(age int) int64 { return s.newest - int64(age)*s.width }
	prev := s.horizon // age of the last count given; the ring has none older
	for j := len(fin) - 1; j >= 0; j-- {
		age := int(fin[j].age)
		if prev-1 > age+1 && prev < s.horizon && !yield(finPoint{at: at(prev - 1)}) {
			return
		}
		if prev-1 > age && !yield(finPoint{at: at(age + 1)}) {
			return
		}
		p := finPoint{at: at(age), n: int64(fin[j].n)}
		if age == 0 {
			// The last point, at the start of the newest bucket: zero if
			// that is the batch's time, else followed by the batch.
			if p.at >= now {
				p.n = 0
			}
			if yield(p) && p.n != 0 {
				yield(finPoint{at: now})
			}
			return
		}
		if !yield(p) {
			return
		}
		prev = age
	}
	if prev > 0 && prev < s.horizon {
		yield(finPoint{at: at(prev - 1)})
	}
}

// finished returns the requests of fin (see finPoints) in flight at t that
// have finished since.
func (s *snap) finished(fin []peerFin, now, t int64) float64 {
	var l lerp
	l.t = t
	s.finPoints(fin, now, func(p finPoint) bool { return !l.add(p) })
	return l.value()
}

// build fills p.spare, or a new snap, with m received at now, and returns
// it. Its memory is kept unless it is more than twice what m needs.
func (p *peers) build(m *message, now int64) *snap {
	s := p.spare
	p.spare = nil
	if s == nil {
		s = new(snap)
	}
	neps, nb, nf := 0, 0, 0
	for i := range m.eps {
		e := &m.eps[i]
		if len(e.buckets) > 0 || len(e.fin) > 0 {
			neps++
			nb += len(e.buckets)
			nf += len(e.fin)
		}
	}
	s.newest, s.width, s.horizon, s.out = now-m.phase, m.width, m.horizon, 0
	s.buckets, s.fin = fit(s.buckets, nb), fit(s.fin, nf)
	if s.eps == nil || s.epsMax > 2*neps+256 {
		s.eps, s.epsMax = make(map[string]epWork, neps), 0
	} else {
		clear(s.eps)
	}
	s.epsMax = max(s.epsMax, neps)
	for i := range m.eps {
		e := &m.eps[i]
		if len(e.buckets) == 0 && len(e.fin) == 0 {
			continue
		}
		w := epWork{b: int32(len(s.buckets)), nb: int32(len(e.buckets)), f: int32(len(s.fin)), nf: int32(len(e.fin))}
		for _, b := range e.buckets {
			s.out = satAdd(s.out, b.out)
			s.buckets = append(s.buckets, peerBucket{tokens: b.tokens, prefill: b.prefill, age: int32(b.age), out: int32(b.out), queued: int32(b.queued)})
		}
		for _, f := range e.fin {
			s.fin = append(s.fin, peerFin{age: int32(f.age), n: int32(f.n)})
		}
		s.eps[e.key] = w
	}
	return s
}

// fit returns s emptied, with room for n elements: its own memory unless
// that is too little, or more than twice n and fitSlack bytes. New memory
// has room for a half more, so that a slowly growing n does not allocate
// every time.
func fit[T any](s []T, n int) []T {
	if cap(s) < n || cap(s) > 2*n+fitSlack/int(unsafe.Sizeof(*new(T))) {
		return make([]T, 0, n+n/2)
	}
	return s[:0]
}

// fitSlack is the memory a snapshot's slice may keep beyond twice what it
// needs, so that batches of varying sizes reuse it.
const fitSlack = 64 << 10

// apply stores m, received at now in size bytes, as its sender's snapshot,
// or the snapshot of the part of the sender's batches it is. It reports
// whether the sender is new, and false in ok if m was refused: older than
// the latest of its ID, from a new peer beyond the limit, or a part beyond
// maxParts or maxBytes of its sender's. The parts of one sender's
// batches count as one peer. A batch of a new incarnation of the sender
// (restarted under the same ID) drops the snapshots of the old one, whose
// requests died with it, however many parts its batches had. Its calls
// must not overlap.
func (p *peers) apply(m *message, size int, now int64) (joined, ok bool) {
	s := p.build(m, now)
	p.mu.Lock()
	defer p.mu.Unlock()
	i, found := slices.BinarySearchFunc(p.list, m.id, func(pr *peer, id string) int { return strings.Compare(pr.id, id) })
	if found && p.list[i].inc == m.inc && m.seq <= p.list[i].seq {
		p.spare = s
		return false, false // a late or repeated message
	}
	base := baseID(m.id)
	snd := p.senders[base]
	if snd != nil && snd.inc != m.inc {
		// The sender restarted: the parts of its old incarnation that the
		// new one no longer publishes would count the dead process's
		// requests until they expire.
		p.list = slices.DeleteFunc(p.list, func(pr *peer) bool {
			if pr.base != base || pr.inc == m.inc {
				return false
			}
			snd.parts--
			snd.bytes -= pr.size
			return true
		})
		snd.inc = m.inc
		i, found = slices.BinarySearchFunc(p.list, m.id, func(pr *peer, id string) int { return strings.Compare(pr.id, id) })
	}
	if !found {
		switch {
		case snd == nil && len(p.senders) >= p.max,
			snd != nil && (snd.parts >= maxParts || snd.bytes+size > p.maxBytes):
			if snd != nil && snd.parts == 0 {
				delete(p.senders, base) // all its parts were of an old incarnation
			}
			p.spare = s
			return false, false
		case snd == nil:
			if p.senders == nil {
				p.senders = make(map[string]*sender)
			}
			snd = &sender{inc: m.inc}
			p.senders[base] = snd
			joined = true
		}
		snd.parts++
		snd.bytes += size
		pr := &peer{id: m.id, base: base, inc: m.inc, seq: m.seq, seen: now, ttl: p.peerTTL(0, m.width), size: size, snap: s}
		p.list = slices.Insert(p.list, i, pr)
		return joined, true
	}
	pr := p.list[i]
	if snd.bytes-pr.size+size > p.maxBytes {
		p.spare = s
		return false, false
	}
	snd.bytes += size - pr.size
	pr.size = size
	if pr.inc == m.inc {
		pr.ttl = p.peerTTL(now-pr.seen, m.width)
	} else {
		pr.ttl = p.peerTTL(0, m.width)
	}
	pr.inc, pr.seq, pr.seen = m.inc, m.seq, now
	pr.snap, p.spare = s, pr.snap
	return false, true
}

// dropSpare releases the memory of the spare snapshot. Its calls must not
// overlap apply's.
func (p *peers) dropSpare() { p.spare = nil }

// maxPeerTTL bounds how long a peer's snapshot counts: three of the longest
// Intervals.
const maxPeerTTL = 3 * int64(maxIntervalTime)

// peerTTL returns how long a snapshot counts that arrived gap after the
// sender's previous one (0 if it is the first of its incarnation), from a
// sender whose time buckets are width wide: the receiver's TTL, or three
// times the sender's own period if that is longer, so that replicas
// configured with different Intervals each keep the others' work counted
// between their batches. The period is the gap when there is one, else the
// bucket width, which is at least the sender's Interval.
func (p *peers) peerTTL(gap, width int64) int64 {
	period := gap
	if period <= 0 {
		period = width
	}
	return max(p.ttl, min(3*period, maxPeerTTL))
}

// work sums, over every peer heard from within the TTL before now, the
// requests in flight at key that were picked at or after since, and the
// requests in flight at since that have finished.
func (p *peers) work(key string, since, now int64) (w work, found bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, pr := range p.list {
		if now-pr.seen > pr.ttl {
			continue
		}
		w.out = satAdd(w.out, pr.out)
		ew, ok := pr.eps[key]
		if !ok {
			continue
		}
		if since != math.MinInt64 && ew.nf > 0 {
			if f := pr.finished(pr.fin[ew.f:ew.f+ew.nf], pr.seen, since); f > 0 {
				w.finished += f
				found = true
			}
		}
		for i := range pr.buckets[ew.b : ew.b+ew.nb] {
			b := &pr.buckets[int(ew.b)+i]
			if b.prefill >= 0 && b.queued > 0 {
				found = true
				w.waiting += float64(b.queued)
				w.prefill += float64(b.prefill)
			}
			sp := pr.span(b, pr.seen)
			f := sp.after(since)
			if f == 0 {
				continue
			}
			found = true
			w.streaming += f * float64(int64(b.out)-int64(b.queued))
			w.queued += f * float64(b.queued)
			w.tokens += f * float64(b.tokens)
		}
	}
	return w, found
}

// satAdd returns a+b for non-negative a and b, saturating at the largest
// int64: a peer's counts are bounded by the decoder, not their sums.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// after returns the fraction of s's requests picked at or after since,
// assuming picks spread evenly over the span. Requests picked before the
// peer's ring count in full if since is before the ring's start: an
// observation that old is past the maximum signal age the ring covers.
func (s *span) after(since int64) float64 {
	switch {
	case since >= s.end:
		return 0
	case since <= s.start || s.start == math.MinInt64:
		return 1
	}
	return float64(s.end-since) / float64(s.end-s.start)
}

// live returns the number of peers heard from within the TTL before now,
// each counted once however many parts its batches have.
func (p *peers) live(now int64) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var parts map[string]bool // senders with a live part, of those with parts
	n := 0
	for _, pr := range p.list {
		switch {
		case now-pr.seen > pr.ttl:
		case p.senders[pr.base].parts == 1:
			n++
		case !parts[pr.base]:
			if parts == nil {
				parts = make(map[string]bool)
			}
			parts[pr.base] = true
			n++
		}
	}
	return n
}

// expire forgets the snapshots not heard from within the TTL before now
// and returns the ids of the peers none of whose snapshots is left.
func (p *peers) expire(now int64) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gone []string
	p.list = slices.DeleteFunc(p.list, func(pr *peer) bool {
		if now-pr.seen <= pr.ttl {
			return false
		}
		snd := p.senders[pr.base]
		snd.parts--
		snd.bytes -= pr.size
		if snd.parts == 0 {
			delete(p.senders, pr.base)
			gone = append(gone, pr.base)
		}
		return true
	})
	return gone
}
