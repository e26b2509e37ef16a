package engine

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// /metrics parses with Prometheus's text parser, under the legacy and the
// UTF-8 name rules alike, with vLLM's names, types and labels; a model
// name with quotes and backslashes is escaped.
func TestMetricsParse(t *testing.T) {
	const name = `org/m "v2" \ é`
	e := newEngine(t, Config{Model: name, KVBlocks: 100, BlockSize: 8})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/completions", `{"prompt":"hello","max_tokens":2}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err := client.Get(url + "/metrics")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	format := expfmt.ResponseFormat(resp.Header)
	assert.Equal(t, expfmt.TypeTextPlain, format.FormatType())

	model := map[string]string{"model_name": name}
	want := []struct {
		name   string
		typ    dto.MetricType
		labels map[string]string
		value  float64
	}{
		{"vllm:num_requests_running", dto.MetricType_GAUGE, model, 0},
		{"vllm:num_requests_waiting", dto.MetricType_GAUGE, model, 0},
		{"vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, model, 0},
		{"vllm:cache_config_info", dto.MetricType_GAUGE, map[string]string{"block_size": "8", "num_gpu_blocks": "100"}, 1},
		{"vllm:prefix_cache_queries_total", dto.MetricType_COUNTER, model, 2},
		{"vllm:prefix_cache_hits_total", dto.MetricType_COUNTER, model, 0},
		{"vllm:num_preemptions_total", dto.MetricType_COUNTER, model, 0},
		{"vllm:request_success_total", dto.MetricType_COUNTER, map[string]string{"model_name": name, "finished_reason": "length"}, 1},
	}
	for _, scheme := range []pmodel.ValidationScheme{pmodel.LegacyValidation, pmodel.UTF8Validation} {
		p := expfmt.NewTextParser(scheme)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		require.NoError(t, err, "%s\n%s", scheme, b)
		assert.Len(t, fams, len(want))
		for _, w := range want {
			f := fams[w.name]
			if !assert.NotNil(t, f, "%s: %s", scheme, w.name) {
				continue
			}
			assert.Equal(t, w.typ, f.GetType(), w.name)
			require.Len(t, f.Metric, 1, w.name)
			m := f.Metric[0]
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			assert.Equal(t, w.labels, labels, w.name)
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			assert.Equal(t, w.value, v, w.name)
		}
	}
}
