package signals

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// vLLM reports the LoRA adapters in use with an info gauge (PrometheusStatLogger
// in vllm/v1/metrics/loggers.py; "LoRA Metrics" in docs/design/metrics.md):
//
//	vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7e+09
//
// The labels name the adapters of the running and waiting requests, joined
// by commas, and the engine's --max-loras; the value is the wall-clock time
// of the update (set_to_current_time). prometheus_client keeps every label
// set ever set, so an exposition holds one series per combination seen, and
// the newest is the current one (the Kubernetes inference gateway reads it
// the same way).
//
// The gauge is declared with multiprocess_mode="sum" (loggers.py, since
// vLLM 0.9, with the comment "This metric might be incorrect in case of
// using multiple api_server counts which uses prometheus mp"): with
// --api-server-count above 1, each API server process sets the label sets
// of its own requests, and the exposition holds, for each label set, the
// sum of the last times every process that ever set it did so. A label set
// two processes set an hour ago then adds up to twice the value of the one
// a single process set just now, so the largest value is not the newest.
// newestSeries undoes the sums: see there.
const loraInfo = "vllm:lora_requests_info"

// Bounds on what an adapter report may carry; beyond them it is garbage.
const (
	maxAdapterNames = 1024    // distinct adapters in use on one replica
	maxAdapterName  = 1 << 10 // bytes of one adapter name
	maxLoRA         = 1 << 16 // adapters served in one batch
)

// adapters returns the distinct adapters of the running and waiting
// requests, and max_lora, from the newest series of fam; nil and 0 if fam
// is nil or has no series with a finite value. A max_lora that is not a
// number in range, or more or longer names than plausible, is an error
// wrapping [ErrInvalidValue].
func adapters(fam *dto.MetricFamily) ([]string, int, error) {
	if fam == nil {
		return nil, 0, nil
	}
	newest := newestSeries(fam.Metric)
	if newest == nil {
		return nil, 0, nil
	}
	maxLoRAs := 0
	if s := labelValue(newest, "max_lora"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > maxLoRA {
			return nil, 0, fmt.Errorf("%w: %s label max_lora=%q is not a count in [0, %d]", ErrInvalidValue, loraInfo, s, maxLoRA)
		}
		maxLoRAs = n
	}
	names := []string{}
	seen := map[string]bool{} // linear in the label's length, however often names repeat
	for _, label := range []string{"running_lora_adapters", "waiting_lora_adapters"} {
		for name := range strings.SplitSeq(labelValue(newest, label), ",") {
			name = strings.TrimSpace(name)
			if name == "" || seen[name] {
				continue
			}
			if len(name) > maxAdapterName || len(names) == maxAdapterNames {
				return nil, 0, fmt.Errorf("%w: %s label %s names more or longer adapters than plausible", ErrInvalidValue, loraInfo, label)
			}
			seen[name] = true
			names = append(names, name)
		}
	}
	return names, maxLoRAs, nil
}

// Bounds on reading the sums of a multiprocess exposition (see loraInfo).
const (
	// maxWriters is the most processes whose times one value may sum:
	// vLLM's API server processes.
	maxWriters = 16
	// minWriteTime is the earliest plausible time of an update, in Unix
	// seconds (2001-09-09): a value below it is not a sum of times.
	minWriteTime = 1e9
	// sumTolerance is how far from a whole multiple of the common time T
	// (see newestSeries) a value may be, in units of T. A sum of k times
	// reads right while they differ from T by up to sumTolerance/k of it:
	// about 300/k days at 1.7e9 s. A wrong T, a rational multiple of the
	// right one with a denominator up to maxWriters, leaves some value at
	// least 1/maxWriters, 4 tolerances, from a whole multiple.
	sumTolerance = 1.0 / (4 * maxWriters)
)

// newestSeries returns the series of ms whose label set was set last, or
// nil if none has a finite value.
//
// A value is either one process's time of update or, in a multiprocess
// exposition, the sum of k such times, k the number of processes that set
// that label set (see loraInfo). Times of one server differ from each other
// by a tiny fraction of their size, so each value is close to a whole
// multiple k of a common time T: newestSeries looks for the largest T, the
// smallest value divided by c for c = 1, 2, ... up to maxWriters, such that
// every value is within sumTolerance of a whole multiple of T, and compares
// the values divided by their multiples, the mean time of update of each
// label set. For a single process every multiple is 1 (c = 1 fits), and the
// rule is the largest value. For several processes, a label set's mean
// time is the best the sum tells: the exposition cannot say which process
// set it last, nor give the union of the processes' adapters. Should c be
// larger than the true multiple of the smallest value (when every label
// set was set by an even number of processes, say), every mean time is
// scaled by the same factor, and the order holds. Values that fit no T of
// at least minWriteTime (not Unix times, as a test server may send, or
// times too far apart) are compared as they are. Ties go to the first
// series.
func newestSeries(ms []*dto.Metric) *dto.Metric {
	lo := math.Inf(1)
	for _, m := range ms {
		if v, ok := finiteValue(m); ok {
			lo = min(lo, v)
		}
	}
	if math.IsInf(lo, 1) {
		return nil
	}
	unit := 0.0 // the common time T; 0 to compare values as they are
	for c := 1.0; c <= maxWriters && lo/c >= minWriteTime; c++ {
		if fitsMultiples(ms, lo/c) {
			unit = lo / c
			break
		}
	}
	var newest *dto.Metric
	latest := math.Inf(-1)
	for _, m := range ms {
		v, ok := finiteValue(m)
		if !ok {
			continue
		}
		if unit > 0 {
			v /= math.Round(v / unit)
		}
		if newest == nil || v > latest {
			newest, latest = m, v
		}
	}
	return newest
}

// fitsMultiples reports whether every finite value of ms is within
// sumTolerance of a whole multiple of unit.
func fitsMultiples(ms []*dto.Metric, unit float64) bool {
	for _, m := range ms {
		if v, ok := finiteValue(m); ok {
			x := v / unit
			if math.Abs(x-math.Round(x)) > sumTolerance {
				return false
			}
		}
	}
	return true
}

// finiteValue returns the value of m, and false if it has none or it is
// not finite.
func finiteValue(m *dto.Metric) (float64, bool) {
	v, ok := sampleValue(m)
	return v, ok && !math.IsNaN(v) && !math.IsInf(v, 0)
}
