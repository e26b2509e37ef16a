package sim

import (
	"errors"
	"strings"
	"testing"
)

// A rate so low that the arrivals would outrun time.Duration is refused
// before any request is generated, in words that name the rate.
func TestSyntheticRateSpan(t *testing.T) {
	for _, rate := range []float64{1e-300, 1e-8} {
		w := DefaultSynthetic(100, rate)
		reqs, err := w.Generate(1)
		if !errors.Is(err, ErrInvalidWorkload) || !strings.Contains(err.Error(), "requests/s spreads 100 requests") {
			t.Errorf("rate %v: %d requests, error %v; want ErrInvalidWorkload naming the rate", rate, len(reqs), err)
		}
	}
	// 1e9 seconds in all is still valid.
	if _, err := DefaultSynthetic(10, 1e-8).Generate(1); err != nil {
		t.Errorf("10 requests at 1e-8/s: %v", err)
	}
}
