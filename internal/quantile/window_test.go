package quantile

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	var w Window
	if _, ok := w.Quantile(0.5); ok {
		t.Fatal("quantile with no samples")
	}
	for i := 1; i <= 1000; i++ {
		w.Add(time.Duration(i) * time.Millisecond)
	}
	// The last 256 samples: 745..1000 ms.
	cases := []struct {
		q    float64
		want time.Duration
	}{
		{0, 745 * time.Millisecond},
		{0.5, 872 * time.Millisecond},
		{0.999, 1000 * time.Millisecond},
	}
	for _, c := range cases {
		if got, ok := w.Quantile(c.q); !ok || got != c.want {
			t.Errorf("Quantile(%v) = %v, %v; want %v", c.q, got, ok, c.want)
		}
	}
}

func TestWindowMinSamples(t *testing.T) {
	var w Window
	for i := range MinSamples {
		if _, ok := w.Quantile(0.5); ok {
			t.Fatalf("quantile after %d samples", i)
		}
		w.Add(-time.Second) // counts as 0
	}
	if q, ok := w.Quantile(0.5); !ok || q != 0 {
		t.Fatalf("Quantile(0.5) = %v, %v; want 0, true", q, ok)
	}
}

// A cached quantile is kept for Refresh additions, then recomputed.
func TestWindowRefresh(t *testing.T) {
	var w Window
	for range MinSamples {
		w.Add(time.Millisecond)
	}
	if q, _ := w.Quantile(0.9); q != time.Millisecond {
		t.Fatalf("Quantile(0.9) = %v", q)
	}
	for range Refresh - 1 {
		w.Add(time.Hour)
	}
	if q, _ := w.Quantile(0.9); q != time.Millisecond {
		t.Fatalf("Quantile(0.9) = %v before the refresh, want the cached 1ms", q)
	}
	w.Add(time.Hour)
	if q, _ := w.Quantile(0.9); q != time.Hour {
		t.Fatalf("Quantile(0.9) = %v after the refresh, want 1h (16 of 36 samples)", q)
	}
	if q, _ := w.Quantile(0.5); q != time.Millisecond {
		t.Fatalf("Quantile(0.5) = %v: a new q is computed at once", q)
	}
}

func TestWindowConcurrent(t *testing.T) {
	var w Window
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				w.Add(time.Duration(g*i) * time.Microsecond)
				w.Quantile(0.9)
			}
		})
	}
	wg.Wait()
	if _, ok := w.Quantile(0.5); !ok {
		t.Fatal("no quantile after 2000 samples")
	}
}

// A quantile out of [0, 1), infinite or NaN answers the smallest or the
// largest kept duration.
func TestWindowQuantileOutOfRange(t *testing.T) {
	var w Window
	for i := 1; i <= MinSamples; i++ {
		w.Add(time.Duration(i) * time.Millisecond)
	}
	smallest, largest := time.Millisecond, MinSamples*time.Millisecond
	cases := []struct {
		q    float64
		want time.Duration
	}{
		{math.NaN(), smallest},
		{-0.5, smallest},
		{math.Inf(-1), smallest},
		{1, largest},
		{2, largest},
		{math.Inf(1), largest},
	}
	for _, c := range cases {
		if got, ok := w.Quantile(c.q); !ok || got != c.want {
			t.Errorf("Quantile(%v) = %v, %v; want %v", c.q, got, ok, c.want)
		}
	}
}

// The q-quantile is the nearest rank, the ceil(q*n)-th smallest of the n
// kept durations: with 20 kept, where 2 are slow, the p90 is the 18th, a
// fast one, and the p95 the 19th.
func TestWindowNearestRank(t *testing.T) {
	var w Window
	for i := 1; i <= MinSamples; i++ {
		w.Add(time.Duration(i) * time.Millisecond)
	}
	cases := []struct {
		q    float64
		want time.Duration
	}{
		{0.05, time.Millisecond},
		{0.5, 10 * time.Millisecond},
		{0.51, 11 * time.Millisecond},
		{0.9, 18 * time.Millisecond},
		{0.95, 19 * time.Millisecond},
		{0.96, 20 * time.Millisecond},
	}
	for _, c := range cases {
		if got, ok := w.Quantile(c.q); !ok || got != c.want {
			t.Errorf("Quantile(%v) of 1..20 ms = %v, %v; want %v", c.q, got, ok, c.want)
		}
	}
	// 0.28*25 is 7.000000000000001 in floating point; the rank is 7.
	for i := MinSamples + 1; i <= 25; i++ {
		w.Add(time.Duration(i) * time.Millisecond)
	}
	if got, ok := w.Quantile(0.28); !ok || got != 7*time.Millisecond {
		t.Errorf("Quantile(0.28) of 1..25 ms = %v, %v; want 7ms", got, ok)
	}
}

// FuzzWindow checks Quantile against a direct reading of the last Samples
// durations added (negative ones as 0), sorted, at the nearest rank, for
// any q: every answer is a kept duration, the ceil(q*n)-th smallest, or the
// smallest or largest for q out of (0, 1], NaN and infinities included.
func FuzzWindow(f *testing.F) {
	f.Add([]byte{1, 2, 3}, 0.9)
	f.Add(make([]byte, 8*300), 0.5)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, math.NaN())
	f.Fuzz(func(t *testing.T, data []byte, q float64) {
		var w Window
		var added []time.Duration
		for len(data) > 0 {
			var b [8]byte
			data = data[copy(b[:], data):]
			d := time.Duration(binary.LittleEndian.Uint64(b[:]))
			w.Add(d)
			added = append(added, max(d, 0))
		}
		got, ok := w.Quantile(q)
		if ok != (len(added) >= MinSamples) {
			t.Fatalf("%d added: ok %v", len(added), ok)
		}
		if !ok {
			return
		}
		kept := slices.Clone(added[max(len(added)-Samples, 0):])
		slices.Sort(kept)
		var want time.Duration
		switch {
		case !(q > 0):
			want = kept[0]
		case q >= 1:
			want = kept[len(kept)-1]
		default:
			// The smallest kept duration that at least q of them do not
			// exceed, counted up from the smallest (with the tolerance
			// for q*n falling just above a whole rank).
			for i, d := range kept {
				if float64(i+1) >= q*float64(len(kept))-1e-9 {
					want = d
					break
				}
			}
		}
		if got != want {
			t.Fatalf("Quantile(%v) of %d durations = %v, want %v", q, len(added), got, want)
		}
	})
}
