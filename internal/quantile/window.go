// Package quantile keeps the last durations of a stream and answers their
// quantiles: the time to first token of the winning attempts, from which
// package retry's Loop and package httplb's Transport set a percentile hedge
// delay.
//
// A [Window] keeps the last [Samples] durations in a ring. A quantile is
// answered only once [MinSamples] have been seen, by sorting a copy of the
// ring; the answer is cached until [Refresh] more durations have been added,
// so that a request asks for it at the cost of a lock most of the time.
// A Window takes a lock while operating, and is therefore safe for
// concurrent use.
package quantile

import (
	"math"
	"slices"
	"sync"
	"time"
)

const (
	// Samples is how many recent durations a Window keeps.
	Samples = 256
	// MinSamples is how many durations must have been added before a
	// Window answers a quantile.
	MinSamples = 20
	// Refresh is how many new durations make a cached quantile stale.
	Refresh = 16
)

// Window keeps the last [Samples] durations added and answers a quantile of
// them. The zero value is an empty window, ready to use. A Window must not
// be copied after first use.
type Window struct {
	mu      sync.Mutex // protects the fields below
	buf     [Samples]time.Duration
	n       int // durations added
	q       float64
	cached  time.Duration
	cachedN int // n when cached was computed; 0 = never
	scratch []time.Duration
}

// Add adds d; a negative d counts as 0.
func (w *Window) Add(d time.Duration) {
	d = max(d, 0)
	w.mu.Lock()
	w.buf[w.n%Samples] = d
	w.n++
	w.mu.Unlock()
}

// Quantile returns the q-quantile (nearest rank, q in [0, 1)) of the kept
// durations, or false if fewer than [MinSamples] were added. A q of 1 or
// more answers the largest, and a negative q or NaN the smallest. The
// answer is recomputed every [Refresh] additions, or when q changes.
func (w *Window) Quantile(q float64) (time.Duration, bool) {
	if !(q > 0) {
		q = 0 // negative or NaN
	}
	q = min(q, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n < MinSamples {
		return 0, false
	}
	if w.cachedN != 0 && w.q == q && w.n-w.cachedN < Refresh {
		return w.cached, true
	}
	k := min(w.n, Samples)
	w.scratch = append(w.scratch[:0], w.buf[:k]...)
	slices.Sort(w.scratch)
	// Nearest rank: the smallest duration that at least q of the kept
	// ones do not exceed, the ceil(q*k)-th smallest. The product is
	// rounded down by far less than 1/k first, so that an exact rank that
	// q's binary approximation puts just above (0.28 of 25 is
	// 7.000000000000001) stays that rank.
	i := min(max(int(math.Ceil(q*float64(k)-1e-9))-1, 0), k-1)
	w.q, w.cached, w.cachedN = q, w.scratch[i], w.n
	return w.cached, true
}
