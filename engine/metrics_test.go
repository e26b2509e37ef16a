package engine

import (
	"bytes"
	"io"
	"math"
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

	// As vLLM's: every series labelled with the model and the engine core's
	// index. prometheus_client names a counter's family without _total
	// and its sample with it, which Prometheus's text parser reads as an
	// untyped family of the sample's name.
	model := map[string]string{"model_name": name, "engine": "0"}
	want := []struct {
		name   string
		typ    dto.MetricType
		labels map[string]string
		value  float64
	}{
		{"vllm:num_requests_running", dto.MetricType_GAUGE, model, 0},
		{"vllm:num_requests_waiting", dto.MetricType_GAUGE, model, 0},
		{"vllm:kv_cache_usage_perc", dto.MetricType_GAUGE, model, 0},
		{"vllm:cache_config_info", dto.MetricType_GAUGE, map[string]string{"block_size": "8", "num_gpu_blocks": "100", "engine": "0"}, 1},
		{"vllm:prefix_cache_queries_total", dto.MetricType_UNTYPED, model, 2},
		{"vllm:prefix_cache_hits_total", dto.MetricType_UNTYPED, model, 0},
		{"vllm:num_preemptions_total", dto.MetricType_UNTYPED, model, 0},
		{"vllm:request_success_total", dto.MetricType_UNTYPED, map[string]string{"model_name": name, "engine": "0", "finished_reason": "length"}, 1},
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
			v := m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			assert.Equal(t, w.value, v, w.name)
		}
	}
}

// The exposition reads as vLLM's, written by prometheus_client: counters
// typed under their name without _total, and values written as Python
// floats.
func TestMetricsText(t *testing.T) {
	e := newEngine(t, Config{Model: "m", KVBlocks: 100, BlockSize: 8})
	url, _ := serve(t, e)
	resp, err := client.Get(url + "/metrics")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, line := range []string{
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\",engine=\"0\"} 0.0\n",
		"vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.0\n",
		"vllm:cache_config_info{block_size=\"8\",num_gpu_blocks=\"100\",engine=\"0\"} 1.0\n",
		"# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=\"m\",engine=\"0\"} 0.0\n",
		"# TYPE vllm:request_success counter\nvllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"length\"} 0.0\n",
	} {
		assert.Contains(t, string(b), line)
	}
}

// promFloat writes what prometheus_client's floatToGoString writes (the
// values below are Python's).
func TestPromFloat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{
		{0, "0.0"}, {1, "1.0"}, {3, "3.0"}, {0.25, "0.25"}, {1e-5, "1e-05"}, {0.0001, "0.0001"},
		{123456, "123456.0"}, {1234567, "1.234567e+06"}, {12345678, "1.2345678e+07"}, {1e7, "1e+07"},
		{1e10, "1e+010"}, {1e15, "1e+015"}, {1e16, "1e+16"}, {1.5e17, "1.5e+17"}, {0.1, "0.1"},
		{2.5e-7, "2.5e-07"}, {1.0 / 3, "0.3333333333333333"}, {99999999999, "9.9999999999e+010"},
		{-2, "-2.0"}, {math.Inf(1), "+Inf"}, {math.Inf(-1), "-Inf"}, {math.NaN(), "NaN"},
	} {
		assert.Equal(t, c.want, promFloat(c.v), "%v", c.v)
	}
}
