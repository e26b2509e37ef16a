package signals_test

import (
	"bytes"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

var contentTypes = []string{"", textType, omType, "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited", "text/html"}

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.prom"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(0), uint8(0))
	}
	f.Add([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.5\n"), uint8(1), uint8(1))
	f.Add([]byte("nv_trt_llm_request_metrics{request_type=\"waiting\"} 1\nnv_trt_llm_request_metrics{request_type=\"scheduled\"} NaN\n"), uint8(1), uint8(4))
	f.Add([]byte("vllm:cache_config_info{num_gpu_blocks=\"-1\",block_size=\"16\"} 1\n"), uint8(2), uint8(0))
	f.Add([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a, b,a\",waiting_lora_adapters=\"\"} 1.7e9\n"), uint8(0), uint8(1))
	f.Add([]byte("sglang:num_running_reqs{tp_rank=\"0\"} 1\nsglang:num_queue_reqs{priority=\"\"} 2\nsglang:num_decode_prealloc_queue_reqs{priority=\"\"} 16777215\nsglang:num_prefill_prealloc_queue_reqs 3\n"), uint8(1), uint8(2))
	f.Add([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:num_requests_running 1\nvllm:engine_fully_awake{engine=\"0\"} 0\n"), uint8(0), uint8(0))
	f.Add([]byte("sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:max_total_num_tokens 1000\nsglang:cache_config_info{page_size=\"64\",num_pages=\"15\"} 1\n"), uint8(1), uint8(2))
	f.Add([]byte("<html>oops</html>"), uint8(4), uint8(0))
	f.Add([]byte{0x0a, 0xff, 0x01}, uint8(3), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, ct, engine uint8) {
		e := signals.Engine(int(engine) % 6)
		o, err := signals.Parse(bytes.NewReader(data), contentTypes[int(ct)%len(contentTypes)], e)
		if err != nil {
			if !errors.Is(err, signals.ErrParse) && !errors.Is(err, signals.ErrMissingMetric) &&
				!errors.Is(err, signals.ErrInvalidValue) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "signals: ") {
				t.Fatalf("unprefixed error %q", err)
			}
			return
		}
		if e != signals.EngineAuto && o.Engine != e {
			t.Fatalf("engine %v, want %v", o.Engine, e)
		}
		if o.Running < 0 || o.Running > 1<<24 || o.Waiting < 0 || o.Waiting > 1<<24 ||
			o.KVBlocks < 0 || o.BlockSize < 0 {
			t.Fatalf("out-of-range counts: %+v", o)
		}
		if !math.IsNaN(o.KVUsage) && !(o.KVUsage >= 0 && o.KVUsage <= 1) {
			t.Fatalf("KV usage %v", o.KVUsage)
		}
		for _, c := range []float64{o.Preemptions, o.PrefixQueries, o.PrefixHits} {
			if !math.IsNaN(c) && !(c >= 0 && c <= 1e18) {
				t.Fatalf("counter %v", c)
			}
		}
		if o.MaxAdapters < 0 || o.MaxAdapters > 1<<16 || len(o.Adapters) > 1024 {
			t.Fatalf("adapters %d of max %d", len(o.Adapters), o.MaxAdapters)
		}
		for i, a := range o.Adapters {
			if a == "" || strings.TrimSpace(a) != a || strings.Contains(a, ",") || slices.Contains(o.Adapters[:i], a) {
				t.Fatalf("adapter names %q", o.Adapters)
			}
		}
		// A parsed observation is always accepted by a Store and valid for
		// the balancer.
		var s signals.Store
		o.At = time.Unix(1, 0)
		if err := s.RecordObservation("k", o); err != nil {
			t.Fatalf("parsed observation rejected: %v", err)
		}
	})
}

// orcaText formats r in the TEXT form.
func orcaText(r signals.OrcaReport) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	parts := []string{
		"cpu_utilization=" + f(r.CPUUtilization),
		"mem_utilization=" + f(r.MemUtilization),
		"application_utilization=" + f(r.ApplicationUtilization),
		"rps_fractional=" + f(r.RPSFractional),
		"eps=" + f(r.EPS),
	}
	for _, m := range []struct {
		prefix string
		m      map[string]float64
	}{{"named_metrics.", r.NamedMetrics}, {"utilization.", r.Utilization}, {"request_cost.", r.RequestCost}} {
		keys := make([]string, 0, len(m.m))
		for k := range m.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, m.prefix+k+"="+f(m.m[k]))
		}
	}
	return "TEXT " + strings.Join(parts, ", ")
}

func FuzzORCA(f *testing.F) {
	for _, s := range []string{
		"TEXT cpu_utilization=0.3, mem_utilization=0.8, rps_fractional=10, named_metrics.kv_cache_utilization=0.4",
		"TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2.0",
		"TEXT utilization.gpu=0.5,request_cost.tokens=812",
		`JSON {"cpu_utilization": 0.3, "named_metrics": {"kv_cache_utilization": 0.4}}`,
		`JSON {"cpuUtilization": 0.3, "namedMetrics": {"num_requests_running": 7}}`,
		orcaBin(0.3, "kv_cache_usage_perc", 0.4),
		"BIN CZqZmZmZmbk/MQAAAAAAAABAQg4KA2ZvbxGamZmZmZm5P0IOCgNiYXIRmpmZmZmZyT8=",
		"TEXT cpu_utilization=NaN",
		"TEXT utilization.gpu=-0.5",
		`JSON {"utilization": {"gpu": -1}, "request_cost": {"": 1}}`,
		"JSON {",
		`JSON {"cpu_utilization": 0.3, "cpuUtilization": 0.4}`,
		`JSON {"named_metrics": {"a": 1, "a": 2}, "eps": null}`,
		"XML <a/>",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		r, err := signals.ParseOrca(h)
		if err != nil {
			if !errors.Is(err, signals.ErrORCA) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		for _, v := range []float64{r.CPUUtilization, r.MemUtilization, r.ApplicationUtilization, r.RPSFractional, r.EPS} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("bad value %v in %+v", v, r)
			}
		}
		for _, m := range []map[string]float64{r.Utilization, r.RequestCost, r.NamedMetrics} {
			if len(m) > 256 {
				t.Fatalf("%d map entries", len(m))
			}
			for k, v := range m {
				if k == "" || math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("bad entry %q=%v in %+v", k, v, r)
				}
			}
		}
		for k, v := range r.Utilization {
			if v < 0 {
				t.Fatalf("negative utilization %q=%v", k, v)
			}
		}
		// The TEXT form of a parsed report parses back to the same report.
		if strings.HasPrefix(h, "TEXT ") {
			back, err := signals.ParseOrca(orcaText(r))
			if err != nil {
				t.Fatalf("reparse of %q: %v", orcaText(r), err)
			}
			if orcaText(back) != orcaText(r) {
				t.Fatalf("round trip changed %q to %q", orcaText(r), orcaText(back))
			}
		}
		l, err := signals.OrcaMapping{}.Load(r, time.Unix(1, 0))
		if err != nil {
			if !errors.Is(err, signals.ErrORCA) {
				t.Fatalf("mapping error wraps no sentinel: %v", err)
			}
			return
		}
		var s signals.Store
		if err := s.Record("k", l); err != nil {
			t.Fatalf("mapped load %+v rejected: %v", l, err)
		}
		_ = llmlb.Load(l)
	})
}

// FuzzRecordResponse records one or two endpoint-load-metrics header values,
// in any of the three forms, over a scraped observation: a hostile header is
// an error wrapping ErrORCA or a valid observation, and never changes the
// fields the default mapping does not read.
func FuzzRecordResponse(f *testing.F) {
	for _, s := range []string{
		"TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2.0",
		"TEXT named_metrics.num_requests_running=1e9",
		"TEXT utilization.kv_cache_utilization=1.0000001",
		"TEXT named_metrics.num_requests_waiting=-0",
		"TEXT ",
		`JSON {"named_metrics": {"num_requests_running": 7, "kv_cache_usage_perc": 0.5}}`,
		`JSON {"utilization": {"kv_cache_utilization": 0.4}, "namedMetrics": {"num_requests_waiting": 1e300}}`,
		orcaBin(0.3, "kv_cache_usage_perc", 0.4),
		orcaBin(0.3, "num_requests_waiting", math.Inf(1)),
		orcaBin(-1, "num_requests_running", 3),
	} {
		f.Add(s, "", false)
		f.Add(s, "TEXT named_metrics.num_requests_running=3", true)
	}
	at := time.Unix(1000, 0)
	f.Fuzz(func(t *testing.T, h1, h2 string, two bool) {
		var s signals.Store
		base := signals.Observation{
			Load:   llmlb.Load{At: at, Running: 5, Waiting: 2, KVUsage: 0.3, KVBlocks: 1000, BlockSize: 16, Adapters: []string{"x"}, MaxAdapters: 2},
			Engine: signals.EngineVLLM, Preemptions: 1, PrefixQueries: 2, PrefixHits: 1,
		}
		if err := s.RecordObservation("k", base); err != nil {
			t.Fatal(err)
		}
		resp := &http.Response{Header: http.Header{}}
		resp.Header.Set(signals.OrcaHeader, h1)
		if two {
			resp.Header.Add(signals.OrcaHeader, h2)
		}
		_, err := s.RecordResponse("k", resp, at.Add(time.Second), signals.OrcaMapping{})
		if err != nil && !errors.Is(err, signals.ErrORCA) {
			t.Fatalf("error wraps no sentinel: %v", err)
		}
		o, ok := s.Observation("k")
		if !ok {
			t.Fatal("the scraped observation is gone")
		}
		if err != nil && !reflect.DeepEqual(o, base) {
			t.Fatalf("a refused report changed the observation to %+v", o)
		}
		if o.Running < 0 || o.Waiting < 0 || !(math.IsNaN(o.KVUsage) || o.KVUsage >= 0 && o.KVUsage <= 1) {
			t.Fatalf("invalid observation %+v", o)
		}
		if o.KVBlocks != base.KVBlocks || o.BlockSize != base.BlockSize || !slices.Equal(o.Adapters, base.Adapters) ||
			o.MaxAdapters != base.MaxAdapters || o.Engine != base.Engine || o.Preemptions != base.Preemptions ||
			o.PrefixQueries != base.PrefixQueries || o.PrefixHits != base.PrefixHits {
			t.Fatalf("a report changed fields it does not carry: %+v", o)
		}
		var fresh signals.Store
		if _, err := fresh.RecordResponse("k", resp, at, signals.OrcaMapping{}); err == nil {
			if l, ok := fresh.Load("k"); ok && (l.At != at || l.Running < 0 || l.Waiting < 0) {
				t.Fatalf("invalid load %+v", l)
			}
		}
	})
}
