package share

import (
	"math"
	"slices"
	"strings"
	"sync"
)

// peers holds the latest snapshot of every peer heard from.
type peers struct {
	ttl int64 // nanoseconds a snapshot counts after it arrived, at least
	max int

	mu sync.RWMutex // protects list
	// list holds the peers by increasing id, so that sums over them are
	// the same whatever the order their batches arrived in.
	list []*peer
}

// peer is the latest snapshot of one peer.
type peer struct {
	id   string
	inc  uint64 // incarnation of the sender
	seq  uint64
	seen int64              // local unix nanoseconds the snapshot arrived
	ttl  int64              // nanoseconds it counts after it arrived (see peerTTL)
	eps  map[string]*peerEP // per endpoint
	out  int64              // requests in flight, over every endpoint
}

// peerEP is a peer's work at one endpoint.
type peerEP struct {
	spans []span     // requests in flight, by pick time
	fin   []finPoint // requests finished since each time, ascending
}

// finPoint says that n requests in flight at time at have finished since.
type finPoint struct {
	at int64
	n  int64
}

// interpolate returns the requests in flight at t that have finished
// since, interpolating linearly between pts (ascending). Before the first
// point it is the first's count; after the last, the last's.
func interpolate(pts []finPoint, t int64) float64 {
	if len(pts) == 0 {
		return 0
	}
	if t <= pts[0].at {
		return float64(pts[0].n)
	}
	for i := 1; i < len(pts); i++ {
		if a, b := pts[i-1], pts[i]; t <= b.at {
			f := float64(t-a.at) / float64(b.at-a.at)
			return float64(a.n) + f*float64(b.n-a.n)
		}
	}
	return float64(pts[len(pts)-1].n)
}

// span is a peer's requests in flight that were picked in [start, end) on
// this replica's clock (the snapshot's arrival anchors the peer's bucket
// ages). start is math.MinInt64 for requests picked before the peer's ring.
type span struct {
	start, end int64
	out        int64
	queued     int64
	tokens     int64
	prefill    int64 // -1: unknown
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

// spans converts the buckets of a snapshot received at now.
func spans(m *message, buckets []bucket, now int64) []span {
	newest := now - m.phase // start of the newest bucket
	out := make([]span, len(buckets))
	for i, b := range buckets {
		s := &out[i]
		s.out, s.queued, s.tokens, s.prefill = b.out, b.queued, b.tokens, b.prefill
		if b.age >= m.horizon {
			s.start, s.end = math.MinInt64, newest-int64(m.horizon-1)*m.width
			continue
		}
		s.start = newest - int64(b.age)*m.width
		s.end = min(s.start+m.width, now)
	}
	return out
}

// finPoints converts the finished counts fin of a snapshot received at now
// to points by increasing time. A boundary of the ring without a count had
// none finished: a zero point goes beside each count whose neighbouring
// boundary lacks one, so that interpolation does not bridge the gap. The
// batch itself comes last: nothing had finished after it.
func finPoints(m *message, fin []finCount, now int64) []finPoint {
	newest := now - m.phase // start of the newest bucket
	at := func(age int) int64 { return newest - int64(age)*m.width }
	pts := make([]finPoint, 0, 3*len(fin)+1)
	prev := m.horizon // age of the last count added; the ring has none older
	for j := len(fin) - 1; j >= 0; j-- {
		f := fin[j]
		if prev-1 > f.age+1 && prev < m.horizon {
			pts = append(pts, finPoint{at: at(prev - 1)})
		}
		if prev-1 > f.age {
			pts = append(pts, finPoint{at: at(f.age + 1)})
		}
		pts = append(pts, finPoint{at: at(f.age), n: f.n})
		prev = f.age
	}
	if prev > 0 {
		pts = append(pts, finPoint{at: at(prev - 1)})
	}
	switch last := &pts[len(pts)-1]; {
	case last.at >= now:
		last.n = 0
	case last.n != 0:
		pts = append(pts, finPoint{at: now})
	}
	return pts
}

// apply stores m, received at now, as its sender's snapshot. It reports
// whether the sender is new, and false in ok if m was refused: older than
// the sender's latest, or from a new peer beyond the limit.
func (p *peers) apply(m *message, now int64) (joined, ok bool) {
	eps := make(map[string]*peerEP, len(m.eps))
	var out int64
	for i := range m.eps {
		e := &m.eps[i]
		if len(e.buckets) == 0 && len(e.fin) == 0 {
			continue
		}
		for _, b := range e.buckets {
			out = satAdd(out, b.out)
		}
		pe := &peerEP{spans: spans(m, e.buckets, now)}
		if len(e.fin) > 0 {
			pe.fin = finPoints(m, e.fin, now)
		}
		eps[e.key] = pe
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	i, found := slices.BinarySearchFunc(p.list, m.id, func(pr *peer, id string) int { return strings.Compare(pr.id, id) })
	pr := &peer{id: m.id, inc: m.inc, seq: m.seq, seen: now, eps: eps, out: out}
	if found && p.list[i].inc == m.inc {
		pr.ttl = p.peerTTL(now-p.list[i].seen, m.width)
	} else {
		pr.ttl = p.peerTTL(0, m.width)
	}
	switch {
	case !found:
		if len(p.list) >= p.max {
			return false, false
		}
		p.list = slices.Insert(p.list, i, pr)
		return true, true
	case p.list[i].inc == m.inc && m.seq <= p.list[i].seq:
		return false, false // a late or repeated message
	}
	p.list[i] = pr
	return false, true
}

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
		pe := pr.eps[key]
		if pe == nil {
			continue
		}
		if since != math.MinInt64 {
			if f := interpolate(pe.fin, since); f > 0 {
				w.finished += f
				found = true
			}
		}
		for _, s := range pe.spans {
			if s.prefill >= 0 && s.queued > 0 {
				found = true
				w.waiting += float64(s.queued)
				w.prefill += float64(s.prefill)
			}
			f := s.after(since)
			if f == 0 {
				continue
			}
			found = true
			w.streaming += f * float64(s.out-s.queued)
			w.queued += f * float64(s.queued)
			w.tokens += f * float64(s.tokens)
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

// live returns the number of peers heard from within the TTL before now.
func (p *peers) live(now int64) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := 0
	for _, pr := range p.list {
		if now-pr.seen <= pr.ttl {
			n++
		}
	}
	return n
}

// expire forgets the peers not heard from within the TTL before now and
// returns their ids.
func (p *peers) expire(now int64) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gone []string
	p.list = slices.DeleteFunc(p.list, func(pr *peer) bool {
		if now-pr.seen > pr.ttl {
			gone = append(gone, pr.id)
			return true
		}
		return false
	})
	return gone
}
