package signals_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	"github.com/llmlb/llmlb/signals"
)

const (
	textType = "text/plain; version=0.0.4; charset=utf-8"
	omType   = "application/openmetrics-text; version=1.0.0; charset=utf-8"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestParseFixtures(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		file        string
		contentType string
		engine      signals.Engine
		running     int
		waiting     int
		kv          float64
		blocks      int
		blockSize   int
		preempt     float64
		queries     float64
		hits        float64
	}{
		{"vllm.prom", textType, signals.EngineVLLM, 12, 3, 0.42, 27153, 16, 17, 4.8213e6, 2.9011e6},
		{"vllm_v0.prom", textType, signals.EngineVLLM, 5, 0, 0.9, 27153, 16, 17, nan, nan},
		{"vllm_openmetrics.prom", omType, signals.EngineVLLM, 12, 3, 0.42, 27153, 16, 17, 4.8213e6, 2.9011e6},
		{"sglang.prom", textType, signals.EngineSGLang, 7, 2, 0.28, 0, 0, nan, nan, nan},
		// Two data-parallel ranks of four schedulers each (every one
		// exporting), with priority scheduling; the KV capacity is in
		// tokens, summed over the data-parallel ranks.
		{"sglang_dp_priority.prom", textType, signals.EngineSGLang, 11, 4, 0.3, 2 * 573440, 1, nan, nan, nan},
		// Prefill/decode disaggregation: a decode server short of KV
		// memory (tp 2, every scheduler exporting) with 12 requests in its
		// prealloc queue and 3 in its transfer queue and none in
		// num_queue_reqs; a prefill server with priority scheduling whose
		// 7 requests in the bootstrap queue wait with the 5 queued (the 9
		// prefilled and sending their cache do not).
		{"sglang_pd_decode.prom", textType, signals.EngineSGLang, 48, 15, 0.97, 400000, 1, nan, nan, nan},
		{"sglang_pd_prefill_priority.prom", textType, signals.EngineSGLang, 2, 12, 0.42, 400000, 1, nan, nan, nan},
		// SGLang of 2026 (v0.5.12 on) with --page-size 64: its capacity in
		// pages of 64 tokens (sglang:num_pages, sglang:page_size).
		{"sglang_2026.prom", textType, signals.EngineSGLang, 36, 4, 0.71, 6272, 64, nan, nan, nan},
		{"trtllm.prom", textType, signals.EngineTRTLLM, 9, 4, 0.55, 8192, 32, nan, nan, nan},
		// trtllm-serve of 2026, through prometheus_client's multiprocess
		// collector (gauges labelled pid): 14 active requests, 11 of them
		// scheduled, and 3 queued.
		{"trtllm_2026.prom", textType, signals.EngineTRTLLM, 11, 6, 0.6125, 9600, 32, nan, nan, nan},
		{"triton.prom", textType, signals.EngineTriton, 5, 2, 0.369629, 4096, 64, nan, nan, nan},
		{"llamacpp.prom", "", signals.EngineLlamaCpp, 2, 1, 0.125, 0, 0, nan, nan, nan},
		// llama-server as built since 2025 (tools/server/server-context.cpp)
		// exports no KV usage.
		{"llamacpp_2026.prom", "text/plain; version=0.0.4", signals.EngineLlamaCpp, 3, 5, nan, 0, 0, nan, nan, nan},
	}
	for _, c := range cases {
		for _, engine := range []signals.Engine{signals.EngineAuto, c.engine} {
			t.Run(c.file+"/engine="+engine.String(), func(t *testing.T) {
				o, err := signals.Parse(strings.NewReader(string(fixture(t, c.file))), c.contentType, engine)
				require.NoError(t, err)
				assert.Equal(t, c.engine, o.Engine)
				assert.True(t, o.At.IsZero(), "Parse leaves At to the caller")
				assert.Equal(t, c.running, o.Running)
				assert.Equal(t, c.waiting, o.Waiting)
				assertNaNOr(t, c.kv, o.KVUsage, "KV usage")
				assert.Equal(t, c.blocks, o.KVBlocks)
				assert.Equal(t, c.blockSize, o.BlockSize)
				assertNaNOr(t, c.preempt, o.Preemptions, "preemptions")
				assertNaNOr(t, c.queries, o.PrefixQueries, "prefix queries")
				assertNaNOr(t, c.hits, o.PrefixHits, "prefix hits")
			})
		}
	}
}

func assertNaNOr(t *testing.T, want, got float64, what string) {
	t.Helper()
	if math.IsNaN(want) {
		assert.True(t, math.IsNaN(got), "%s: want NaN, got %v", what, got)
		return
	}
	assert.InDelta(t, want, got, 1e-9, what)
}

func TestParseWrongEngine(t *testing.T) {
	_, err := signals.Parse(strings.NewReader(string(fixture(t, "sglang.prom"))), textType, signals.EngineVLLM)
	require.ErrorIs(t, err, signals.ErrMissingMetric)
	assert.Contains(t, err.Error(), "vllm:num_requests_running")
}

func TestParseSumsSeries(t *testing.T) {
	in := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3
vllm:num_requests_running{engine="1",model_name="a"} 4
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 1
vllm:num_requests_waiting{engine="1",model_name="a"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.6
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="2000"} 1
vllm:cache_config_info{engine="1",block_size="16",num_gpu_blocks="2000"} 1
`
	o, err := signals.Parse(strings.NewReader(in), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 7, o.Running)
	assert.Equal(t, 3, o.Waiting)
	assert.InDelta(t, 0.4, o.KVUsage, 1e-12, "fractions are averaged")
	assert.Equal(t, 2000, o.KVBlocks, "every engine's series carries the server's total")
	assert.Equal(t, 16, o.BlockSize, "a block size is a size, the same on every rank: not summed")

	trt := `trtllm_num_requests_running{rank="0"} 1
trtllm_num_requests_waiting{rank="0"} 0
trtllm_kv_cache_max_blocks{rank="0"} 500
trtllm_kv_cache_max_blocks{rank="1"} 500
trtllm_kv_cache_tokens_per_block{rank="0"} 32
trtllm_kv_cache_tokens_per_block{rank="1"} 32
`
	o, err = signals.Parse(strings.NewReader(trt), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 1000, o.KVBlocks)
	assert.Equal(t, 32, o.BlockSize)
}

func TestParseBadInput(t *testing.T) {
	const head = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n# TYPE vllm:num_requests_waiting gauge\n"
	cases := []struct {
		name        string
		body        string
		contentType string
		want        error
		mention     string
	}{
		{"empty", "", textType, signals.ErrMissingMetric, "no known engine"},
		{"malformed", "vllm:num_requests_running{model_name=\"a\" 1\n", textType, signals.ErrParse, ""},
		{"garbage value", head + "vllm:num_requests_waiting one\n", textType, signals.ErrParse, ""},
		{"html page", "<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n", textType, signals.ErrParse, ""},
		{"html content type", "<html></html>", "text/html; charset=utf-8", signals.ErrParse, "text/html"},
		{"json content type", "{}", "application/json", signals.ErrParse, "application/json"},
		{"bad content type", "x", "text/plain; ;;", signals.ErrParse, ""},
		{"unknown text version", head, "text/plain; version=9.9", signals.ErrParse, ""},
		{"NaN", head + "vllm:num_requests_waiting NaN\n", textType, signals.ErrInvalidValue, "vllm:num_requests_waiting"},
		{"+Inf", head + "vllm:num_requests_waiting +Inf\n", textType, signals.ErrInvalidValue, "vllm:num_requests_waiting"},
		{"-Inf", head + "vllm:num_requests_waiting -Inf\n", textType, signals.ErrInvalidValue, "vllm:num_requests_waiting"},
		{"negative", head + "vllm:num_requests_waiting -3\n", textType, signals.ErrInvalidValue, "vllm:num_requests_waiting"},
		{"huge", head + "vllm:num_requests_waiting 1e30\n", textType, signals.ErrInvalidValue, "vllm:num_requests_waiting"},
		{"missing waiting", head, textType, signals.ErrMissingMetric, "vllm:num_requests_waiting"},
		{"kv above 1", head + "vllm:num_requests_waiting 0\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 1.5\n", textType, signals.ErrInvalidValue, "vllm:kv_cache_usage_perc"},
		{"kv NaN", head + "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc NaN\n", textType, signals.ErrInvalidValue, "vllm:kv_cache_usage_perc"},
		{"bad info label", head + "vllm:num_requests_waiting 0\nvllm:cache_config_info{num_gpu_blocks=\"many\"} 1\n", textType, signals.ErrInvalidValue, "num_gpu_blocks"},
		{"huge blocks", head + "vllm:num_requests_waiting 0\nvllm:cache_config_info{num_gpu_blocks=\"1e12\"} 1\n", textType, signals.ErrInvalidValue, "vllm:cache_config_info"},
		{"counter NaN", head + "vllm:num_requests_waiting 0\nvllm:num_preemptions_total NaN\n", textType, signals.ErrInvalidValue, "vllm:num_preemptions_total"},
		{"openmetrics exemplar", head + "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1 # {trace_id=\"x\"} 1\n# EOF\n", omType, signals.ErrParse, ""},
		{"openmetrics stateset type", "# TYPE vllm:num_requests_running stateset\nvllm:num_requests_running 1\n# EOF\n", omType, signals.ErrParse, ""},
		// The parser's cost grows with the square of a line's labels: this
		// line took it seconds, a 4 MiB body of them hours.
		{"labels by the thousand", head + "vllm:num_requests_waiting{" + manyLabels(10000) + "} 1\n", textType, signals.ErrParse, "too many labels"},
		{"binary garbage", "\x00\x01\x02", textType, signals.ErrParse, "line 1"},
		{"json body", "{\"running\": 1}\n", "", signals.ErrParse, ""},
		{"protobuf huge length", "\xff\xff\xff\xff\xff\xff\xff\x7f", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited", signals.ErrParse, ""},
		{"protobuf garbage", "\x05\x01\x02", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited", signals.ErrParse, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := signals.Parse(strings.NewReader(c.body), c.contentType, signals.EngineAuto)
			require.Error(t, err)
			assert.True(t, errors.Is(err, c.want), "want %v, got %v", c.want, err)
			assert.True(t, strings.HasPrefix(err.Error(), "signals: "), "unprefixed error %q", err)
			assert.Contains(t, err.Error(), c.mention)
		})
	}
}

func TestParseInvalidEngine(t *testing.T) {
	_, err := signals.Parse(strings.NewReader(""), textType, signals.Engine(42))
	require.ErrorIs(t, err, signals.ErrInvalidConfig)
}

func TestEngineNames(t *testing.T) {
	for _, e := range []signals.Engine{signals.EngineAuto, signals.EngineVLLM, signals.EngineSGLang,
		signals.EngineTRTLLM, signals.EngineTriton, signals.EngineLlamaCpp} {
		got, err := signals.ParseEngine(e.String())
		require.NoError(t, err)
		assert.Equal(t, e, got)
	}
	_, err := signals.ParseEngine("tgi")
	require.ErrorIs(t, err, signals.ErrInvalidConfig)
	assert.Equal(t, "Engine(42)", signals.Engine(42).String())
}

// OpenMetrics names the info metric's family without _info; the sample is
// still read.
func TestParseOpenMetricsInfo(t *testing.T) {
	in := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 2
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 1
# TYPE vllm:cache_config info
vllm:cache_config_info{block_size="32",num_gpu_blocks="100"} 1
# EOF
`
	o, err := signals.Parse(strings.NewReader(in), omType, signals.EngineVLLM)
	require.NoError(t, err)
	assert.Equal(t, 100, o.KVBlocks)
	assert.Equal(t, 32, o.BlockSize)
	assert.True(t, math.IsNaN(o.KVUsage))
}

// Lines no profile reads are not parsed, but must still look like lines of
// an exposition.
func TestParseIgnoresUnreadLines(t *testing.T) {
	in := string(fixture(t, "llamacpp.prom")) + "other_metric{le=\"x\" 1\n# random comment\n\n"
	o, err := signals.Parse(strings.NewReader(in), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 2, o.Running)
}

// A parse error names the line of the body as received.
func TestParseErrorLine(t *testing.T) {
	body := string(fixture(t, "llamacpp.prom"))
	n := strings.Count(body, "\n") + 1
	_, err := signals.Parse(strings.NewReader(body+"llamacpp:requests_deferred{ 1\n"), textType, signals.EngineAuto)
	require.ErrorIs(t, err, signals.ErrParse)
	assert.Contains(t, err.Error(), fmt.Sprintf("line %d:", n))
}

// The delimited protobuf format gives the same observation as the text one.
func TestParseProtobuf(t *testing.T) {
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(strings.NewReader(string(fixture(t, "vllm.prom"))))
	require.NoError(t, err)
	var buf strings.Builder
	format := expfmt.NewFormat(expfmt.TypeProtoDelim)
	enc := expfmt.NewEncoder(&buf, format)
	for _, mf := range fams {
		require.NoError(t, enc.Encode(mf))
	}
	o, err := signals.Parse(strings.NewReader(buf.String()), string(format), signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, signals.EngineVLLM, o.Engine)
	assert.Equal(t, 12, o.Running)
	assert.Equal(t, 3, o.Waiting)
	assert.InDelta(t, 0.42, o.KVUsage, 1e-12)
	assert.Equal(t, 27153, o.KVBlocks)
	assert.InDelta(t, 17, o.Preemptions, 0)
}

// TestParseProtobufBounded: a protobuf body costs a few times its size (its
// reading included) whatever it holds: families no profile reads are not decoded (a body of
// empty messages cost the decoder a hundred times its size, one of unread
// families thirty times), and the series of those read are bounded.
func TestParseProtobufBounded(t *testing.T) {
	format := string(expfmt.NewFormat(expfmt.TypeProtoDelim))
	const size = 4 << 20
	fill := func(mf func(i int) *dto.MetricFamily) []byte {
		var b bytes.Buffer
		for i := 0; b.Len() < size-100; i++ {
			_, err := protodelim.MarshalTo(&b, mf(i))
			require.NoError(t, err)
		}
		return b.Bytes()
	}
	one := func(m *dto.Metric) []byte {
		var b bytes.Buffer
		_, err := protodelim.MarshalTo(&b, &dto.MetricFamily{Name: proto.String("vllm:num_requests_running"), Metric: []*dto.Metric{m}})
		require.NoError(t, err)
		return b.Bytes()
	}
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"empty messages", bytes.Repeat([]byte{0}, size), signals.ErrMissingMetric},
		{"unread families", fill(func(i int) *dto.MetricFamily {
			return &dto.MetricFamily{Name: proto.String(strconv.Itoa(i)), Metric: []*dto.Metric{{}}}
		}), signals.ErrMissingMetric},
		{"series by the million", fill(func(int) *dto.MetricFamily {
			return &dto.MetricFamily{Name: proto.String("vllm:num_requests_running"), Metric: make([]*dto.Metric, 64)}
		}), signals.ErrParse},
		// One series of two million empty labels, or buckets: two bytes
		// each, and an allocation each for the decoder.
		{"labels by the million", one(&dto.Metric{Label: empty[dto.LabelPair](size / 2)}), signals.ErrParse},
		{"buckets by the million", one(&dto.Metric{Histogram: &dto.Histogram{Bucket: empty[dto.Bucket](size / 2)}}), signals.ErrParse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := signals.Parse(bytes.NewReader(c.body), format, signals.EngineAuto)
			runtime.ReadMemStats(&after)
			require.ErrorIs(t, err, c.want)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*size {
				t.Errorf("parsing %d bytes allocated %d", len(c.body), alloc)
			}
		})
	}
}

// manyLabels returns n label pairs, l0="0",l1="1",...
func manyLabels(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "l%d=\"%d\",", i, i)
	}
	return b.String()
}

// empty returns n pointers to zero messages.
func empty[T any](n int) []*T {
	s := make([]*T, n)
	for i := range s {
		s[i] = new(T)
	}
	return s
}

// TestParseTextLabelsBounded: a text body costs a few times its size
// whatever its lines' labels, also when each line has too few of them to
// count in the bound on a line's labels (the parser allocates for each
// label, and a set of the line's labels once it has more than 8).
func TestParseTextLabelsBounded(t *testing.T) {
	const size = 4 << 20
	for _, n := range []int{2, 8, 16} {
		t.Run(fmt.Sprintf("labels=%d", n), func(t *testing.T) {
			var labels strings.Builder
			for i := range n - 1 {
				fmt.Fprintf(&labels, "l%d=\"\",", i)
			}
			var b strings.Builder
			b.WriteString("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")
			for i := 0; b.Len() < size-200; i++ {
				fmt.Fprintf(&b, "vllm:kv_cache_usage_perc{%sz=\"%d\"} 0\n", labels.String(), i)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := signals.Parse(strings.NewReader(b.String()), textType, signals.EngineVLLM)
			runtime.ReadMemStats(&after)
			require.ErrorIs(t, err, signals.ErrParse)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 12*size {
				t.Errorf("parsing %d bytes of %d-label lines allocated %d", b.Len(), n, alloc)
			}
		})
	}
}

// TestParseWideSeries: the bound on labels leaves room for the widest
// series engines write (vllm:cache_config_info, about 30 labels, one series
// per rank) and for labels that contain '=' and quotes.
func TestParseWideSeries(t *testing.T) {
	var b strings.Builder
	b.WriteString("vllm:num_requests_running 1\nvllm:num_requests_waiting{model_name=\"a=\\\"b\\\"=c\"} 2\n")
	for rank := range 64 {
		fmt.Fprintf(&b, "vllm:cache_config_info{engine=\"%d\",block_size=\"16\",num_gpu_blocks=\"6400\",%s} 1\n", rank, manyLabels(40))
	}
	o, err := signals.Parse(strings.NewReader(b.String()), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 6400, o.KVBlocks)
	assert.Equal(t, 2, o.Waiting)
}

// TestParseVLLMDataParallelCapacity: a vLLM server with several
// data-parallel engines writes vllm:cache_config_info once per engine, and
// every series carries the server's CacheConfig, whose num_gpu_blocks the
// server has summed over the engines as they started
// (PrometheusStatLogger.log_metrics_info in vllm/v1/metrics/loggers.py;
// wait_for_engine_startup in vllm/v1/engine/utils.py). The capacity is that
// sum, not the sum of the series.
func TestParseVLLMDataParallelCapacity(t *testing.T) {
	// vllm serve MODEL --data-parallel-size 4, 12000 blocks per engine.
	var b strings.Builder
	b.WriteString("# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\n")
	for e := range 4 {
		fmt.Fprintf(&b, "vllm:num_requests_running{engine=\"%d\",model_name=\"m\"} 2.0\n", e)
	}
	b.WriteString("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\n")
	for e := range 4 {
		fmt.Fprintf(&b, "vllm:num_requests_waiting{engine=\"%d\",model_name=\"m\"} 1.0\n", e)
	}
	b.WriteString("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	for e := range 4 {
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"%d\","+
			"gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"48000\",num_gpu_blocks_override=\"None\","+
			"prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\"} 1.0\n", e)
	}
	for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineVLLM} {
		o, err := signals.Parse(strings.NewReader(b.String()), textType, engine)
		require.NoError(t, err)
		assert.Equal(t, 8, o.Running, "requests add up over engines")
		assert.Equal(t, 4, o.Waiting)
		assert.Equal(t, 48000, o.KVBlocks, "the server's capacity, counted once")
		assert.Equal(t, 16, o.BlockSize)
	}
}

// TestParseSGLangSchedulerCopies checks that SGLang's schedulers of one
// data-parallel rank, which all report the same batch when every scheduler
// exports metrics, count once, and that data-parallel ranks add up.
func TestParseSGLangSchedulerCopies(t *testing.T) {
	in := `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 5
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 5
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 3
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 4
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 2
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 2
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 1
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 1
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.5
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 0.1
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 0.1
`
	o, err := signals.Parse(strings.NewReader(in), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, signals.EngineSGLang, o.Engine)
	assert.Equal(t, 9, o.Running, "one count per data-parallel rank, the largest of its copies")
	assert.Equal(t, 3, o.Waiting)
	assert.InDelta(t, 0.3, o.KVUsage, 1e-12, "the data-parallel ranks' fractions are averaged")

	// Without the flag only each rank's first scheduler reports: the same.
	one := `sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 5
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 4
sglang:num_queue_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 2
sglang:num_queue_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 1
`
	o, err = signals.Parse(strings.NewReader(one), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 9, o.Running)
	assert.Equal(t, 3, o.Waiting)
}

// TestParseVLLMPrefixCacheRenames: the prefix-cache counters are read under
// the names of every vLLM version: gpu_prefix_cache_* (the V1 engine of
// 0.8), both (0.9 and 0.10 export the old names, deprecated, beside the
// new), or the new ones only; the new names win when both are present.
func TestParseVLLMPrefixCacheRenames(t *testing.T) {
	const head = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0
`
	const old = `# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 500
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 200
`
	const cur = `# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 8000
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 3000
`
	const oldOM = `# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 500
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 200
# EOF
`
	cases := []struct {
		name, body, contentType string
		queries, hits           float64
	}{
		{"0.8", head + old, textType, 500, 200},
		{"0.8 OpenMetrics", head + oldOM, omType, 500, 200},
		{"0.9", head + old + cur, textType, 8000, 3000},
		{"0.11", head + cur, textType, 8000, 3000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineVLLM} {
				o, err := signals.Parse(strings.NewReader(c.body), c.contentType, engine)
				require.NoError(t, err)
				assert.Equal(t, c.queries, o.PrefixQueries, "engine %v", engine)
				assert.Equal(t, c.hits, o.PrefixHits, "engine %v", engine)
			}
		})
	}
}

// TestParseSGLangEPRankCopies: SGLang labels its scheduler series with
// moe_ep_rank too, which differs between the schedulers of one
// data-parallel rank as tp_rank does: with
// --enable-metrics-for-all-schedulers they report one batch, counted once.
func TestParseSGLangEPRankCopies(t *testing.T) {
	in := `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 5.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 2.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.25
sglang:token_usage{model_name="m",engine_type="unified",tp_rank="1",pp_rank="0",moe_ep_rank="1"} 0.25
`
	o, err := signals.Parse(strings.NewReader(in), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 5, o.Running)
	assert.Equal(t, 2, o.Waiting)
	assert.InDelta(t, 0.25, o.KVUsage, 1e-12)
}

// TestParseSGLangPriorityTotal: with --enable-priority-scheduling SGLang
// writes each request count's total under priority="" and a series per
// priority level beside it; only the total is read.
func TestParseSGLangPriorityTotal(t *testing.T) {
	in := `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 6.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="0"} 4.0
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="10"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority=""} 3.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="0"} 3.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",priority="10"} 0.0
`
	for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineSGLang} {
		o, err := signals.Parse(strings.NewReader(in), textType, engine)
		require.NoError(t, err)
		assert.Equal(t, 6, o.Running, "engine %v", engine)
		assert.Equal(t, 3, o.Waiting, "engine %v", engine)
	}

	// Without a total the count is missing, and the error names the metric.
	_, err := signals.Parse(strings.NewReader(`sglang:num_running_reqs{priority="1"} 4
sglang:num_queue_reqs{priority=""} 0
`), textType, signals.EngineSGLang)
	require.ErrorIs(t, err, signals.ErrMissingMetric)
	assert.Contains(t, err.Error(), "no sglang:num_running_reqs")
}

// TestParseVLLMAPIServerCopies: with --api-server-count above 1, vLLM 0.9
// and 0.10 export vllm:kv_cache_usage_perc once per API server process,
// labelled pid; a process that has not received the engine's statistics
// exports 0. The copies are one engine's usage, not several to average.
func TestParseVLLMAPIServerCopies(t *testing.T) {
	in := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 8.0
vllm:num_requests_running{model_name="m",engine="1"} 6.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 1.0
vllm:num_requests_waiting{model_name="m",engine="1"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0",pid="4187"} 0.6
vllm:kv_cache_usage_perc{model_name="m",engine="1",pid="4187"} 0.2
vllm:kv_cache_usage_perc{model_name="m",engine="0",pid="4188"} 0.0
vllm:kv_cache_usage_perc{model_name="m",engine="1",pid="4188"} 0.0
`
	o, err := signals.Parse(strings.NewReader(in), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 14, o.Running)
	assert.Equal(t, 1, o.Waiting)
	assert.InDelta(t, 0.4, o.KVUsage, 1e-12, "the two engines averaged, each process's copy counted once")
}

// TestParseTRTLLMServeScheduled: trtllm-serve's trtllm_num_requests_running
// counts the executor's active requests, scheduled or not, and
// trtllm_num_requests_waiting its queue. Where trtllm_num_scheduled_requests
// is exported, running reads as the Triton backend reports it (its
// request_type="scheduled"), and the active requests left out of the batch
// wait with the queued ones; the total stays the same.
func TestParseTRTLLMServeScheduled(t *testing.T) {
	const head = `# HELP trtllm_num_requests_running Multiprocess metric
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="undefined",model_name="undefined",pid="2731"} 14.0
# HELP trtllm_num_requests_waiting Multiprocess metric
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="undefined",model_name="undefined",pid="2731"} 3.0
`
	scheduled := func(v string) string {
		return "# HELP trtllm_num_scheduled_requests Multiprocess metric\n# TYPE trtllm_num_scheduled_requests gauge\n" +
			`trtllm_num_scheduled_requests{engine_type="undefined",model_name="undefined",pid="2731"} ` + v + "\n"
	}
	cases := []struct {
		name             string
		body             string
		running, waiting int
	}{
		{"scheduled", head + scheduled("11.0"), 11, 6},
		{"all scheduled", head + scheduled("14.0"), 14, 3},
		{"none scheduled", head + scheduled("0.0"), 0, 17},
		// The gauges are set one by one: a scrape may read the scheduled
		// requests of a later iteration than the active ones.
		{"more scheduled than active", head + scheduled("16.0"), 14, 3},
		// Releases before the scheduled gauge count every active request
		// as running.
		{"no scheduled gauge", head, 14, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineTRTLLM} {
				o, err := signals.Parse(strings.NewReader(c.body), textType, engine)
				require.NoError(t, err)
				assert.Equal(t, signals.EngineTRTLLM, o.Engine)
				assert.Equal(t, c.running, o.Running, "engine %v", engine)
				assert.Equal(t, c.waiting, o.Waiting, "engine %v", engine)
			}
		})
	}

	for _, bad := range []string{"NaN", "-1", "1e30"} {
		_, err := signals.Parse(strings.NewReader(head+scheduled(bad)), textType, signals.EngineTRTLLM)
		require.ErrorIs(t, err, signals.ErrInvalidValue, bad)
		assert.Contains(t, err.Error(), "trtllm_num_scheduled_requests", bad)
	}
}

// TestParseTRTLLMServeProcessCopies: trtllm-serve's gauges are in
// prometheus_client's default multiprocess mode, one series per process
// that wrote it, labelled pid. They describe one engine: each counts once,
// the largest.
func TestParseTRTLLMServeProcessCopies(t *testing.T) {
	in := `# HELP trtllm_num_requests_running Multiprocess metric
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="undefined",model_name="undefined",pid="2731"} 14.0
trtllm_num_requests_running{engine_type="undefined",model_name="undefined",pid="2907"} 0.0
# HELP trtllm_num_requests_waiting Multiprocess metric
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="undefined",model_name="undefined",pid="2731"} 3.0
trtllm_num_requests_waiting{engine_type="undefined",model_name="undefined",pid="2907"} 0.0
# HELP trtllm_kv_cache_utilization Multiprocess metric
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="undefined",model_name="undefined",pid="2731"} 0.6
trtllm_kv_cache_utilization{engine_type="undefined",model_name="undefined",pid="2907"} 0.0
# HELP trtllm_kv_cache_max_blocks Multiprocess metric
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{engine_type="undefined",model_name="undefined",pid="2731"} 9600.0
trtllm_kv_cache_max_blocks{engine_type="undefined",model_name="undefined",pid="2907"} 9600.0
# HELP trtllm_num_scheduled_requests Multiprocess metric
# TYPE trtllm_num_scheduled_requests gauge
trtllm_num_scheduled_requests{engine_type="undefined",model_name="undefined",pid="2731"} 11.0
trtllm_num_scheduled_requests{engine_type="undefined",model_name="undefined",pid="2907"} 0.0
`
	o, err := signals.Parse(strings.NewReader(in), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 11, o.Running)
	assert.Equal(t, 6, o.Waiting)
	assert.InDelta(t, 0.6, o.KVUsage, 1e-12)
	assert.Equal(t, 9600, o.KVBlocks)
}

// TestParseTritonRequestTypes: the TensorRT-LLM Triton backend's "waiting"
// is its active requests less the scheduled ones, so scheduled and waiting
// are read and "active" (their sum) is not added; "context" (part of the
// scheduled) and "max" (a capacity) are not requests to add either.
// The text is the form of the backend's README (triton-inference-server
// tensorrtllm_backend README.md, Triton Metrics).
func TestParseTritonRequestTypes(t *testing.T) {
	in := `# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 2
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 9
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 12
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.4875
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 3042
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 3197
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} 811
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6239
`
	for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineTriton} {
		o, err := signals.Parse(strings.NewReader(in), textType, engine)
		require.NoError(t, err)
		assert.Equal(t, signals.EngineTriton, o.Engine)
		assert.Equal(t, 9, o.Running, "engine %v", engine)
		assert.Equal(t, 3, o.Waiting, "engine %v", engine)
		assert.Equal(t, 12, o.Running+o.Waiting, "the active requests, once")
		assert.InDelta(t, 0.4875, o.KVUsage, 1e-12)
		assert.Equal(t, 6239, o.KVBlocks)
		assert.Equal(t, 64, o.BlockSize)
	}
}

// TestParseSGLangDPAttention: with --enable-dp-attention every attention
// data-parallel rank runs its own scheduler, batch and KV pool, and the
// data-parallel controller gives each tensor-parallel rank's scheduler its
// dp_rank (sgl-project/sglang
// python/sglang/srt/managers/data_parallel_controller.py,
// launch_tensor_parallel_group: compute_dp_attention_world_info), which
// labels its series (python/sglang/srt/observability/
// scheduler_metrics_mixin.py, init_metrics). With --tp 4 --dp 4 each rank
// is its own data-parallel rank: four batches to add up, four pools.
func TestParseSGLangDPAttention(t *testing.T) {
	var b strings.Builder
	for _, m := range []struct {
		name   string
		values [4]string
	}{
		{"sglang:num_running_reqs", [4]string{"7.0", "5.0", "9.0", "3.0"}},
		{"sglang:num_queue_reqs", [4]string{"2.0", "0.0", "4.0", "1.0"}},
		{"sglang:token_usage", [4]string{"0.5", "0.25", "0.75", "0.1"}},
		{"sglang:max_total_num_tokens", [4]string{"401408.0", "401408.0", "401408.0", "401408.0"}},
	} {
		fmt.Fprintf(&b, "# HELP %s Multiprocess metric\n# TYPE %s gauge\n", m.name, m.name)
		for r, v := range m.values {
			fmt.Fprintf(&b, "%s{dp_rank=\"%d\",engine_type=\"unified\",model_name=\"deepseek-ai/DeepSeek-V3\",moe_ep_rank=\"%d\",pp_rank=\"0\",tp_rank=\"%d\"} %s\n",
				m.name, r, r, r, v)
		}
	}
	o, err := signals.Parse(strings.NewReader(b.String()), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, signals.EngineSGLang, o.Engine)
	assert.Equal(t, 24, o.Running, "every data-parallel rank's batch")
	assert.Equal(t, 7, o.Waiting)
	assert.InDelta(t, 0.4, o.KVUsage, 1e-12, "four pools of one size: the mean of their fractions")
	assert.Equal(t, 4*401408, o.KVBlocks)
	assert.Equal(t, 1, o.BlockSize)
}

// TestParseSGLangPages: SGLang reports its KV pool in pages of
// --page-size tokens. Since sgl-project/sglang#24197 (v0.5.12) every
// scheduler writes sglang:page_size and sglang:num_pages, the pool's
// max_total_num_tokens // page_size (SchedulerMetricsCollector.emit_constants
// in python/sglang/srt/observability/metrics_collector.py), with the labels
// of its other gauges; from #17273 to then it wrote both as the labels of
// one sglang:cache_config_info series, without the scheduler's labels, so
// that the data-parallel ranks' identical pools read as one. Here two
// data-parallel ranks of two schedulers each (every one exporting), each
// with a pool of 401408 tokens in pages of 64.
func TestParseSGLangPages(t *testing.T) {
	const labels = `model_name="deepseek-ai/DeepSeek-V3",engine_type="unified",tp_rank="%d",pp_rank="0",moe_ep_rank="%d",dp_rank="%d"`
	gauge := func(b *strings.Builder, name, help, value string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for dp := range 2 {
			for tp := range 2 {
				r := 2*dp + tp
				fmt.Fprintf(b, "%s{"+labels+"} %s\n", name, r, r, dp, value)
			}
		}
	}
	base := func() *strings.Builder {
		var b strings.Builder
		gauge(&b, "sglang:num_running_reqs", "The number of running requests.", "5.0")
		gauge(&b, "sglang:num_queue_reqs", "The number of requests in the waiting queue.", "1.0")
		gauge(&b, "sglang:token_usage", "The token usage.", "0.5")
		gauge(&b, "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", "401408.0")
		return &b
	}
	gauges := base()
	gauge(gauges, "sglang:page_size", "KV cache page size in tokens.", "64.0")
	gauge(gauges, "sglang:num_pages", "Number of KV cache pages.", "6272.0")
	info := base()
	info.WriteString("# HELP sglang:cache_config_info Cache configuration information.\n# TYPE sglang:cache_config_info gauge\n" +
		`sglang:cache_config_info{page_size="64",num_pages="6272"} 1.0` + "\n")
	cases := []struct {
		name              string
		in                string
		blocks, blockSize int
	}{
		{"page gauges", gauges.String(), 2 * 6272, 64},
		{"cache_config_info", info.String(), 2 * 401408 / 64, 64},
		{"tokens only", base().String(), 2 * 401408, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o, err := signals.Parse(strings.NewReader(c.in), textType, signals.EngineAuto)
			require.NoError(t, err)
			assert.Equal(t, signals.EngineSGLang, o.Engine)
			assert.Equal(t, 10, o.Running)
			assert.Equal(t, c.blocks, o.KVBlocks)
			assert.Equal(t, c.blockSize, o.BlockSize)
			assert.Equal(t, 2*401408, o.KVBlocks*o.BlockSize, "the pools' tokens")
		})
	}
}

// SGLang's disaggregation queues hold requests the server has admitted and
// not yet put in num_queue_reqs: they wait with it. The bootstrap queue was
// named num_prefill_prealloc_queue_reqs before its rename; where both
// names are present the new one is read.
func TestParseSGLangDisaggregationQueues(t *testing.T) {
	const base = `sglang:num_running_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 4
sglang:num_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 1
`
	cases := []struct {
		name    string
		extra   string
		waiting int
	}{
		{"unified", "", 1},
		{"decode prealloc", `sglang:num_decode_prealloc_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 6` + "\n", 7},
		{"decode transfer", `sglang:num_decode_transfer_queue_reqs{engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 2` + "\n", 3},
		{"prefill bootstrap", `sglang:num_prefill_bootstrap_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 5` + "\n", 6},
		{"prefill bootstrap, old name", `sglang:num_prefill_prealloc_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 5` + "\n", 6},
		{"prefill bootstrap, both names", `sglang:num_prefill_bootstrap_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 5
sglang:num_prefill_prealloc_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 5` + "\n", 6},
		{"prefill inflight is not waiting", `sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="m",pp_rank="0",tp_rank="0"} 9` + "\n", 1},
		// Two data-parallel ranks add up; two schedulers of one rank
		// (tp_rank) count once.
		{"data parallel", `sglang:num_decode_prealloc_queue_reqs{dp_rank="0",engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"} 6
sglang:num_decode_prealloc_queue_reqs{dp_rank="0",engine_type="decode",model_name="m",pp_rank="0",tp_rank="1"} 6
sglang:num_decode_prealloc_queue_reqs{dp_rank="1",engine_type="decode",model_name="m",pp_rank="0",tp_rank="2"} 2` + "\n", 9},
	}
	for _, c := range cases {
		for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineSGLang} {
			t.Run(c.name+"/engine="+engine.String(), func(t *testing.T) {
				o, err := signals.Parse(strings.NewReader(base+c.extra), textType, engine)
				require.NoError(t, err)
				assert.Equal(t, 4, o.Running)
				assert.Equal(t, c.waiting, o.Waiting)
			})
		}
	}
	for _, v := range []string{"NaN", "-1", "+Inf", "1e9"} {
		t.Run("invalid "+v, func(t *testing.T) {
			_, err := signals.Parse(strings.NewReader(base+`sglang:num_decode_transfer_queue_reqs{tp_rank="0"} `+v+"\n"), textType, signals.EngineSGLang)
			require.ErrorIs(t, err, signals.ErrInvalidValue)
			assert.Contains(t, err.Error(), "sglang:num_decode_transfer_queue_reqs")
		})
	}
}

// Two series of one metric with the same labels are not two replicas' or
// ranks' counts but a malformed exposition: it fails instead of counting
// the value twice, in every format and whatever the labels' order.
func TestParseDuplicateSeries(t *testing.T) {
	cases := []struct{ name, body string }{
		{"no labels", "vllm:num_requests_running 5\nvllm:num_requests_running 5\nvllm:num_requests_waiting 0\n"},
		{"apart", `vllm:num_requests_running{engine="0"} 5` + "\nvllm:num_requests_waiting 0\n" + `vllm:num_requests_running{engine="0"} 5` + "\n"},
		{"label order", `vllm:num_requests_running{engine="0",model_name="m"} 5` + "\n" + `vllm:num_requests_running{model_name="m",engine="0"} 5` + "\nvllm:num_requests_waiting 0\n"},
		{"sglang queue", `sglang:num_running_reqs{tp_rank="0"} 1` + "\nsglang:num_queue_reqs 0\n" +
			`sglang:num_decode_prealloc_queue_reqs{tp_rank="0"} 3` + "\n" + `sglang:num_decode_prealloc_queue_reqs{tp_rank="0"} 3` + "\n"},
		{"sleep state", vllmSleep([2]int{0}, [2]int{1}, [2]int{}, false) +
			`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0` + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := signals.Parse(strings.NewReader(c.body), textType, signals.EngineAuto)
			require.ErrorIs(t, err, signals.ErrParse)
			assert.Contains(t, err.Error(), "duplicate series")

			// The same families, delimited protobuf.
			var buf bytes.Buffer
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(c.body))
			require.NoError(t, err)
			for _, mf := range fams {
				_, err := protodelim.MarshalTo(&buf, mf)
				require.NoError(t, err)
			}
			_, err = signals.Parse(&buf, string(expfmt.NewFormat(expfmt.TypeProtoDelim)), signals.EngineAuto)
			require.ErrorIs(t, err, signals.ErrParse)
			assert.Contains(t, err.Error(), "duplicate series")
		})
	}
	// Series that differ in a label are not duplicates.
	o, err := signals.Parse(strings.NewReader(`vllm:num_requests_running{engine="0"} 5`+"\n"+`vllm:num_requests_running{engine="1"} 5`+"\nvllm:num_requests_waiting 0\n"), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 10, o.Running)
}

// A body of more short series of the metrics read than any engine exposes
// fails before the parser allocates for each (a 4 MiB text body of them cost
// it 50 MB), in text as in protobuf; a body of as many lines the profiles
// do not read parses.
func TestParseTooManySeries(t *testing.T) {
	var b strings.Builder
	for i := range 1<<16 + 1 {
		fmt.Fprintf(&b, "vllm:num_requests_running{e=\"%d\"} 0\n", i)
	}
	b.WriteString("vllm:num_requests_waiting 0\n")
	_, err := signals.Parse(strings.NewReader(b.String()), textType, signals.EngineAuto)
	require.ErrorIs(t, err, signals.ErrParse)
	assert.Contains(t, err.Error(), "series")

	b.Reset()
	for i := range 1<<16 + 1 {
		fmt.Fprintf(&b, "vllm:request_success_total{e=\"%d\"} 0\n", i)
	}
	b.WriteString("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")
	o, err := signals.Parse(strings.NewReader(b.String()), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 1, o.Running)
}

// Waiting adds up several gauges, each within the plausible limit: the
// total is held to it too.
func TestParseWaitingSumLimit(t *testing.T) {
	for _, body := range []string{
		// TensorRT-LLM: the queued requests and the active ones not
		// scheduled.
		"trtllm_num_requests_running 16777216\ntrtllm_num_requests_waiting 16777216\ntrtllm_num_scheduled_requests 0\n",
		// SGLang: the waiting queue and the disaggregation queues.
		"sglang:num_running_reqs 0\nsglang:num_queue_reqs 16777216\nsglang:num_decode_prealloc_queue_reqs 16777216\n",
	} {
		_, err := signals.Parse(strings.NewReader(body), textType, signals.EngineAuto)
		require.ErrorIs(t, err, signals.ErrInvalidValue, body)
		assert.Contains(t, err.Error(), "waiting")
	}
	o, err := signals.Parse(strings.NewReader("trtllm_num_requests_running 8388608\ntrtllm_num_requests_waiting 8388608\ntrtllm_num_scheduled_requests 0\n"), textType, signals.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 1<<24, o.Waiting)
}

// A protobuf body with two messages of one family fails, as a text body
// declaring a family twice does, instead of reading only the last message.
func TestParseProtoFamilyTwice(t *testing.T) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	first, err := p.TextToMetricFamilies(strings.NewReader("vllm:num_requests_running{engine=\"0\"} 5\nvllm:num_requests_waiting 0\n"))
	require.NoError(t, err)
	p = expfmt.NewTextParser(model.UTF8Validation)
	second, err := p.TextToMetricFamilies(strings.NewReader("vllm:num_requests_running{engine=\"1\"} 7\n"))
	require.NoError(t, err)
	var buf bytes.Buffer
	for _, mf := range []*dto.MetricFamily{first["vllm:num_requests_running"], first["vllm:num_requests_waiting"], second["vllm:num_requests_running"]} {
		_, err := protodelim.MarshalTo(&buf, mf)
		require.NoError(t, err)
	}
	_, err = signals.Parse(&buf, string(expfmt.NewFormat(expfmt.TypeProtoDelim)), signals.EngineAuto)
	require.ErrorIs(t, err, signals.ErrParse)
	assert.Contains(t, err.Error(), "twice")
}
