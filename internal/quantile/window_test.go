package quantile

import (
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
		{0.5, 873 * time.Millisecond},
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
