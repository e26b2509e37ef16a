package retry

import (
	"slices"
	"sync"
	"time"
)

const (
	// ttftSamples is how many recent times-to-first-token are kept.
	ttftSamples = 256
	// ttftMinSamples is how many must be seen before a quantile is used.
	ttftMinSamples = 20
	// ttftRefresh is how many new samples make the cached quantile stale.
	ttftRefresh = 16
)

// ttftWindow keeps the last ttftSamples times-to-first-token and answers a
// quantile of them, recomputed every ttftRefresh samples. The zero value is
// ready to use.
type ttftWindow struct {
	mu      sync.Mutex // protects the fields below
	buf     [ttftSamples]time.Duration
	n       int // samples seen
	q       float64
	cached  time.Duration
	cachedN int // n when cached was computed; 0 = never
	scratch []time.Duration
}

func (w *ttftWindow) add(d time.Duration) {
	if d < 0 {
		d = 0
	}
	w.mu.Lock()
	w.buf[w.n%ttftSamples] = d
	w.n++
	w.mu.Unlock()
}

// quantile returns the q-quantile (nearest rank) of the kept samples, or
// false if fewer than ttftMinSamples were seen.
func (w *ttftWindow) quantile(q float64) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n < ttftMinSamples {
		return 0, false
	}
	if w.cachedN != 0 && w.q == q && w.n-w.cachedN < ttftRefresh {
		return w.cached, true
	}
	k := min(w.n, ttftSamples)
	w.scratch = append(w.scratch[:0], w.buf[:k]...)
	slices.Sort(w.scratch)
	i := min(int(q*float64(k)), k-1)
	w.q, w.cached, w.cachedN = q, w.scratch[i], w.n
	return w.cached, true
}
