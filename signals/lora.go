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
// of the update. prometheus_client keeps every label set ever set, so an
// exposition holds one series per combination seen, and the newest, with the
// largest value, is the current one (the Kubernetes inference gateway reads
// it the same way).
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
	var newest *dto.Metric
	latest := math.Inf(-1)
	for _, m := range fam.Metric {
		v, ok := sampleValue(m)
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		if newest == nil || v > latest {
			newest, latest = m, v
		}
	}
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
