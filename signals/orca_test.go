package signals_test

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

// orcaBin encodes an OrcaLoadReport by hand: cpu_utilization (field 1) and
// one named_metrics entry (field 8), plus the deprecated rps (field 3).
func orcaBin(cpu float64, name string, v float64) string {
	var b []byte
	b = append(b, 1<<3|1) // field 1, fixed64
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(cpu))
	b = append(b, 3<<3, 7) // field 3, varint (wire type 0) 7
	var entry []byte
	entry = append(entry, 1<<3|2, byte(len(name)))
	entry = append(entry, name...)
	entry = append(entry, 2<<3|1)
	entry = binary.LittleEndian.AppendUint64(entry, math.Float64bits(v))
	b = append(b, 8<<3|2, byte(len(entry)))
	b = append(b, entry...)
	return "BIN " + base64.StdEncoding.EncodeToString(b)
}

func TestParseOrca(t *testing.T) {
	cases := []struct {
		name   string
		header string
		want   signals.OrcaReport
	}{
		{"text", "TEXT cpu_utilization=0.3, mem_utilization=0.8, rps_fractional=10, eps=0.5, application_utilization=0.7, named_metrics.kv_cache_utilization=0.4",
			signals.OrcaReport{CPUUtilization: 0.3, MemUtilization: 0.8, RPSFractional: 10, EPS: 0.5, ApplicationUtilization: 0.7,
				NamedMetrics: map[string]float64{"kv_cache_utilization": 0.4}}},
		{"text maps", "TEXT utilization.gpu=0.5,request_cost.tokens=812,named_metrics.num_requests_waiting=3",
			signals.OrcaReport{Utilization: map[string]float64{"gpu": 0.5}, RequestCost: map[string]float64{"tokens": 812},
				NamedMetrics: map[string]float64{"num_requests_waiting": 3}}},
		{"vllm text", "TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2.0",
			signals.OrcaReport{NamedMetrics: map[string]float64{"kv_cache_usage_perc": 0.25, "num_requests_waiting": 2}}},
		{"text envoy colons", "TEXT cpu_utilization:0.3, named_metrics.kv_cache_usage_perc:0.25",
			signals.OrcaReport{CPUUtilization: 0.3, NamedMetrics: map[string]float64{"kv_cache_usage_perc": 0.25}}},
		{"json", `JSON {"cpu_utilization": 0.3, "named_metrics": {"kv_cache_utilization": 0.4}}`,
			signals.OrcaReport{CPUUtilization: 0.3, NamedMetrics: map[string]float64{"kv_cache_utilization": 0.4}}},
		{"json camel", `JSON {"cpuUtilization": 0.3, "rpsFractional": 2, "namedMetrics": {"a": 1}, "requestCost": {"b": 2}, "utilization": {"c": 0.1}}`,
			signals.OrcaReport{CPUUtilization: 0.3, RPSFractional: 2, NamedMetrics: map[string]float64{"a": 1},
				RequestCost: map[string]float64{"b": 2}, Utilization: map[string]float64{"c": 0.1}}},
		{"json empty", `JSON {}`, signals.OrcaReport{}},
		{"bin", orcaBin(0.3, "kv_cache_usage_perc", 0.4),
			signals.OrcaReport{CPUUtilization: 0.3, NamedMetrics: map[string]float64{"kv_cache_usage_perc": 0.4}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := signals.ParseOrca(c.header)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestParseOrcaErrors(t *testing.T) {
	cases := []struct {
		name, header, mention string
	}{
		{"empty", "", "unsupported format"},
		{"no format", "cpu_utilization=0.3", "unsupported format"},
		{"lowercase format", "text cpu_utilization=0.3", "unsupported format"},
		{"empty text", "TEXT ", "empty TEXT"},
		{"missing value", "TEXT cpu_utilization=", "not name=value"},
		{"missing equals", "TEXT cpu_utilization", "not name=value"},
		{"colon without value", "TEXT cpu_utilization:", "not name=value"},
		{"unknown field", "TEXT gpu_utilization=0.3", "unknown field"},
		{"unknown prefix", "TEXT metrics.x=0.3", "unknown field"},
		{"empty named key", "TEXT named_metrics.=0.3", "unknown field"},
		{"duplicate", "TEXT cpu_utilization=0.3, cpu_utilization=0.4", "duplicate"},
		{"not a number", "TEXT cpu_utilization=high", "not a number"},
		{"NaN", "TEXT cpu_utilization=NaN", "NaN"},
		{"Inf", "TEXT named_metrics.x=+Inf", "Inf"},
		{"negative cpu", "TEXT cpu_utilization=-0.1", "cpu_utilization is -0.1"},
		{"negative rps", `JSON {"rps_fractional": -1}`, "rps_fractional"},
		{"json garbage", "JSON {", "JSON"},
		{"json unknown field", `JSON {"cpu": 1}`, "unknown field"},
		{"json wrong type", `JSON {"named_metrics": {"a": "b"}}`, "JSON"},
		{"json trailing", `JSON {} {}`, "trailing"},
		{"json string", `JSON "x"`, "JSON"},
		{"bin garbage base64", "BIN !!!", "BIN"},
		{"bin truncated", "BIN " + base64.StdEncoding.EncodeToString([]byte{1<<3 | 1, 0, 0}), "BIN"},
		{"bin wrong wire type", "BIN " + base64.StdEncoding.EncodeToString([]byte{1 << 3, 1}), "wire type"},
		{"bin NaN", orcaBin(math.NaN(), "a", 1), "NaN"},
		{"negative named utilization", "TEXT utilization.gpu=-0.5", "utilization.gpu is -0.5"},
		{"json negative named utilization", `JSON {"utilization": {"gpu": -1}}`, "utilization.gpu is -1"},
		{"json out of range", `JSON {"cpu_utilization": 1e400}`, "JSON"},
		{"too long", "TEXT " + strings.Repeat("named_metrics.a=1,", 2000), "bytes"},
		{"json too long", `JSON {"named_metrics": {"` + strings.Repeat("a", 20<<10) + `": 1}}`, "bytes"},
		{"bin too long", "BIN " + strings.Repeat("AAAA", 5<<10), "bytes"},
		{"too many metrics", "TEXT " + manyMetrics(300), "map entries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := signals.ParseOrca(c.header)
			require.ErrorIs(t, err, signals.ErrORCA)
			assert.Contains(t, err.Error(), c.mention)
			assert.True(t, strings.HasPrefix(err.Error(), "signals: "))
		})
	}
}

func manyMetrics(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("named_metrics.m")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(string(rune('a' + i%26)))
		b.WriteString(strings.Repeat("y", i/26))
		b.WriteString("=1")
	}
	return b.String()
}

func TestOrcaMapping(t *testing.T) {
	at := time.Unix(1000, 0)
	r, err := signals.ParseOrca("TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2, named_metrics.num_requests_running=5")
	require.NoError(t, err)
	l, err := signals.OrcaMapping{}.Load(r, at)
	require.NoError(t, err)
	assert.Equal(t, llmlb.Load{At: at, Running: 5, Waiting: 2, KVUsage: 0.25}, l)

	// The alternative default KV name, in the utilization map.
	r, err = signals.ParseOrca("TEXT utilization.kv_cache_utilization=0.5")
	require.NoError(t, err)
	l, err = signals.OrcaMapping{}.Load(r, at)
	require.NoError(t, err)
	assert.Equal(t, 0.5, l.KVUsage)
	assert.Zero(t, l.Running)

	// Custom names, including capacity.
	m := signals.OrcaMapping{KVUsage: "kv", Running: "run", Waiting: "wait", KVBlocks: "blocks", BlockSize: "bs"}
	r, err = signals.ParseOrca(`JSON {"named_metrics": {"kv": 0.1, "run": 1, "wait": 2, "blocks": 1000, "bs": 16}}`)
	require.NoError(t, err)
	l, err = m.Load(r, at)
	require.NoError(t, err)
	assert.Equal(t, llmlb.Load{At: at, Running: 1, Waiting: 2, KVUsage: 0.1, KVBlocks: 1000, BlockSize: 16}, l)

	for _, bad := range []string{
		"TEXT cpu_utilization=0.5",                   // none of the mapped metrics
		"TEXT named_metrics.kv_cache_usage_perc=1.5", // KV above 1
		"TEXT named_metrics.num_requests_running=-1", // negative count
		"TEXT named_metrics.num_requests_waiting=1e300",
	} {
		r, err := signals.ParseOrca(bad)
		require.NoError(t, err, bad)
		_, err = signals.OrcaMapping{}.Load(r, at)
		assert.ErrorIs(t, err, signals.ErrORCA, bad)
	}
}

func TestRecordResponse(t *testing.T) {
	var s signals.Store // the zero Store is ready to use
	at := time.Unix(1000, 0)
	resp := &http.Response{Header: http.Header{}}
	ok, err := s.RecordResponse("a", resp, at, signals.OrcaMapping{})
	assert.False(t, ok)
	assert.NoError(t, err)
	ok, err = s.RecordResponse("a", nil, at, signals.OrcaMapping{})
	assert.False(t, ok)
	assert.NoError(t, err)

	resp.Header.Set(signals.OrcaHeader, "TEXT named_metrics.kv_cache_usage_perc=0.3")
	resp.Header.Add(signals.OrcaHeader, "TEXT named_metrics.num_requests_waiting=4")
	ok, err = s.RecordResponse("a", resp, at, signals.OrcaMapping{})
	assert.True(t, ok)
	require.NoError(t, err)
	l, found := s.Load("a")
	require.True(t, found)
	assert.Equal(t, llmlb.Load{At: at, Waiting: 4, KVUsage: 0.3}, l)

	resp.Header.Set(signals.OrcaHeader, "TEXT garbage")
	ok, err = s.RecordResponse("b", resp, at, signals.OrcaMapping{})
	assert.True(t, ok)
	assert.ErrorIs(t, err, signals.ErrORCA)
	assert.Contains(t, err.Error(), `endpoint "b"`)
	_, found = s.Load("b")
	assert.False(t, found)

	// vLLM sends "TEXT " with nothing after it when it has no gauge to
	// report (its Prometheus metrics off): a report of nothing, not an
	// error on every response.
	for _, empty := range []string{"TEXT ", "TEXT"} {
		resp.Header.Set(signals.OrcaHeader, empty)
		ok, err = s.RecordResponse("d", resp, at, signals.OrcaMapping{})
		assert.False(t, ok, "%q", empty)
		assert.NoError(t, err, "%q", empty)
		_, found = s.Load("d")
		assert.False(t, found, "%q", empty)
	}

	// RecordOrca takes an already decoded report (the grpc adapter's path).
	require.NoError(t, s.RecordOrca("c", signals.OrcaReport{NamedMetrics: map[string]float64{"num_requests_running": 2}}, at, signals.OrcaMapping{}))
	l, _ = s.Load("c")
	assert.Equal(t, 2, l.Running)
	assert.True(t, math.IsNaN(l.KVUsage))
}

// A repeated header is read as Envoy reads it, the first value giving the
// format, except that a TEXT report takes the fields of every TEXT value:
// vLLM's bare "TEXT", sent when it has no gauge to report, on one line and
// the fields on another are a report.
func TestRecordResponseRepeated(t *testing.T) {
	const (
		kv      = "TEXT named_metrics.kv_cache_usage_perc=0.3"
		waiting = "TEXT named_metrics.num_requests_waiting=4"
		both    = kv + ", named_metrics.num_requests_waiting=4"
		running = `JSON {"named_metrics": {"num_requests_running": 7}}`
	)
	at := time.Unix(1000, 0)
	nan := math.NaN()
	cases := []struct {
		name string
		vals []string
		ok   bool       // a report
		want llmlb.Load // when recorded
		err  string     // when refused
	}{
		{"bare TEXT first", []string{"TEXT", both}, true, llmlb.Load{At: at, Waiting: 4, KVUsage: 0.3}, ""},
		{"bare TEXT with a space first", []string{"TEXT ", kv}, true, llmlb.Load{At: at, KVUsage: 0.3}, ""},
		{"bare TEXT last", []string{kv, "TEXT"}, true, llmlb.Load{At: at, KVUsage: 0.3}, ""},
		{"bare TEXT between", []string{kv, "TEXT", waiting}, true, llmlb.Load{At: at, Waiting: 4, KVUsage: 0.3}, ""},
		{"fields on two lines", []string{kv, waiting}, true, llmlb.Load{At: at, Waiting: 4, KVUsage: 0.3}, ""},
		{"only bare TEXT", []string{"TEXT", "TEXT "}, false, llmlb.Load{}, ""},
		{"TEXT then JSON", []string{waiting, running}, true, llmlb.Load{At: at, Waiting: 4, KVUsage: nan}, ""},
		{"bare TEXT then JSON", []string{"TEXT", running}, false, llmlb.Load{}, ""},
		{"JSON twice", []string{running, `JSON {"named_metrics": {"num_requests_running": 9}}`}, true, llmlb.Load{At: at, Running: 7, KVUsage: nan}, ""},
		{"JSON then TEXT", []string{running, waiting}, true, llmlb.Load{At: at, Running: 7, KVUsage: nan}, ""},
		{"BIN then TEXT", []string{orcaBin(0.5, "num_requests_waiting", 2), waiting}, true, llmlb.Load{At: at, Waiting: 2, KVUsage: nan}, ""},
		{"field on two lines", []string{waiting, "TEXT named_metrics.num_requests_waiting=5"}, true, llmlb.Load{}, "duplicate"},
		{"bad later TEXT", []string{"TEXT", "TEXT garbage"}, true, llmlb.Load{}, "not name=value"},
		{"unknown format first", []string{"XML <a/>", waiting}, true, llmlb.Load{}, "unsupported format"},
		{"too long", []string{kv, "TEXT " + strings.Repeat("named_metrics.a=1,", 1000), "TEXT " + strings.Repeat("named_metrics.b=1,", 1000)}, true, llmlb.Load{}, "bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s signals.Store
			resp := &http.Response{Header: http.Header{http.CanonicalHeaderKey(signals.OrcaHeader): c.vals}}
			ok, err := s.RecordResponse("a", resp, at, signals.OrcaMapping{})
			assert.Equal(t, c.ok, ok)
			l, found := s.Load("a")
			if c.err != "" {
				require.ErrorIs(t, err, signals.ErrORCA)
				assert.Contains(t, err.Error(), c.err)
				assert.False(t, found)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.ok, found)
			if !c.ok {
				return
			}
			if math.IsNaN(c.want.KVUsage) {
				assert.True(t, math.IsNaN(l.KVUsage), "KV usage %v", l.KVUsage)
				l.KVUsage, c.want.KVUsage = 0, 0
			}
			assert.Equal(t, c.want, l)
		})
	}
}

// scraped is a full observation of a vLLM replica at at, as a scrape
// records it.
func scraped(at time.Time) signals.Observation {
	return signals.Observation{
		Load: llmlb.Load{At: at, Running: 5, Waiting: 2, KVUsage: 0.3, KVBlocks: 1000, BlockSize: 16,
			Adapters: []string{"a"}, MaxAdapters: 4},
		Engine: signals.EngineVLLM, Preemptions: 7, PrefixQueries: 100, PrefixHits: 40,
	}
}

// vllmReport is the ORCA header of a vLLM response: KV usage and waiting
// requests, not running ones.
func vllmReport(kv float64, waiting int) *http.Response {
	resp := &http.Response{Header: http.Header{}}
	resp.Header.Set(signals.OrcaHeader, fmt.Sprintf("TEXT named_metrics.kv_cache_usage_perc=%v, named_metrics.num_requests_waiting=%d", kv, waiting))
	return resp
}

// An ORCA report sets the fields it carries and leaves the scraped ones it
// does not: a vLLM header, without running requests, KV capacity, adapters
// or prefix-cache counters, does not wipe them until the next scrape.
func TestOrcaReportKeepsScrapedFields(t *testing.T) {
	clk := newFakeClock()
	s, err := signals.NewStore(signals.StoreConfig{Clock: clk})
	require.NoError(t, err)
	t0 := clk.Now()
	require.NoError(t, s.RecordObservation("a", scraped(t0)))
	clk.Advance(100 * time.Millisecond)
	ok, err := s.RecordResponse("a", vllmReport(0.6, 9), clk.Now(), signals.OrcaMapping{})
	require.True(t, ok)
	require.NoError(t, err)

	want := scraped(t0)
	want.At, want.Waiting, want.KVUsage = clk.Now(), 9, 0.6
	got, found := s.Observation("a")
	require.True(t, found)
	assert.Equal(t, want, got)
	l, _ := s.Load("a")
	assert.Equal(t, want.Load, l)

	// A report older than the held fields changes nothing.
	ok, err = s.RecordResponse("a", vllmReport(0.1, 1), t0.Add(50*time.Millisecond), signals.OrcaMapping{})
	require.True(t, ok)
	require.NoError(t, err)
	got, _ = s.Observation("a")
	assert.Equal(t, want, got)

	// The next scrape sets every field again.
	clk.Advance(time.Second)
	next := scraped(clk.Now())
	next.Running, next.Waiting = 6, 1
	require.NoError(t, s.RecordObservation("a", next))
	got, _ = s.Observation("a")
	assert.Equal(t, next, got)
}

// A scrape sent before a report and answered after it still records the
// fields the report does not carry, and keeps the report's newer ones.
func TestScrapeAnsweredAfterReport(t *testing.T) {
	clk := newFakeClock()
	s, err := signals.NewStore(signals.StoreConfig{Clock: clk})
	require.NoError(t, err)
	sent := clk.Now()
	clk.Advance(20 * time.Millisecond)
	_, err = s.RecordResponse("a", vllmReport(0.6, 9), clk.Now(), signals.OrcaMapping{})
	require.NoError(t, err)
	clk.Advance(20 * time.Millisecond)
	require.NoError(t, s.RecordObservation("a", scraped(sent)))

	want := scraped(sent)
	want.At, want.Waiting, want.KVUsage = sent.Add(20*time.Millisecond), 9, 0.6
	got, found := s.Observation("a")
	require.True(t, found)
	assert.Equal(t, want, got)

	// A full observation older than the held full one is still refused.
	require.NoError(t, s.RecordObservation("a", signals.Observation{Load: llmlb.Load{At: sent.Add(-time.Second), Running: 1}}))
	got, _ = s.Observation("a")
	assert.Equal(t, want, got)
}

// Reports alone do not keep a scraped value alive: once the last scrape is
// older than the store's MaxAge (or llmlb.DefaultMaxSignalAge), a report
// drops what it does not carry.
func TestOrcaReportDropsStaleScrape(t *testing.T) {
	for _, c := range []struct {
		name   string
		maxAge time.Duration
		carry  time.Duration
	}{
		{"default", 0, llmlb.DefaultMaxSignalAge},
		{"MaxAge", 3 * time.Second, 3 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			s, err := signals.NewStore(signals.StoreConfig{Clock: clk, MaxAge: c.maxAge})
			require.NoError(t, err)
			t0 := clk.Now()
			require.NoError(t, s.RecordObservation("a", scraped(t0)))
			clk.Advance(c.carry)
			_, err = s.RecordResponse("a", vllmReport(0.6, 9), clk.Now(), signals.OrcaMapping{})
			require.NoError(t, err)
			got, _ := s.Observation("a")
			assert.Equal(t, 5, got.Running, "a scrape as old as the bound is kept")
			assert.Equal(t, []string{"a"}, got.Adapters)

			clk.Advance(time.Millisecond)
			_, err = s.RecordResponse("a", vllmReport(0.5, 8), clk.Now(), signals.OrcaMapping{})
			require.NoError(t, err)
			got, found := s.Observation("a")
			require.True(t, found)
			want := signals.Observation{
				Load:        llmlb.Load{At: clk.Now(), Waiting: 8, KVUsage: 0.5},
				Preemptions: math.NaN(), PrefixQueries: math.NaN(), PrefixHits: math.NaN(),
			}
			assert.Equal(t, fmt.Sprintf("%+v", want), fmt.Sprintf("%+v", got))
		})
	}
}

// Scrapes and reports recorded concurrently, in any order, leave each field
// at its newest value.
func TestOrcaReportsAndScrapesConcurrently(t *testing.T) {
	var s signals.Store
	t0 := time.Unix(1000, 0)
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		if i%2 == 0 {
			wg.Go(func() {
				o := scraped(at)
				o.Running, o.Waiting, o.KVBlocks = i, i, 1000+i
				assert.NoError(t, s.RecordObservation("a", o))
			})
		} else {
			wg.Go(func() {
				_, err := s.RecordResponse("a", vllmReport(float64(i)/n, i), at, signals.OrcaMapping{})
				assert.NoError(t, err)
			})
		}
	}
	wg.Wait()
	o, ok := s.Observation("a")
	require.True(t, ok)
	last := n - 1 // a report
	assert.Equal(t, t0.Add(time.Duration(last)*time.Millisecond), o.At)
	assert.Equal(t, last, o.Waiting)
	assert.Equal(t, float64(last)/n, o.KVUsage)
	assert.Equal(t, n-2, o.Running, "running requests from the newest scrape")
	assert.Equal(t, 1000+n-2, o.KVBlocks)
}

// TestParseOrcaJSONStrict checks that a JSON report is read as strictly
// as a TEXT one, and as protobuf's JSON parser (Envoy's) reads it: names
// match exactly, and a field or a map key given twice is an error rather
// than the last one winning.
func TestParseOrcaJSONStrict(t *testing.T) {
	errs := []struct{ name, header, mention string }{
		{"duplicate field", `JSON {"cpu_utilization": 0.3, "cpu_utilization": 0.9}`, "duplicate field"},
		{"both names of a field", `JSON {"cpu_utilization": 0.3, "cpuUtilization": 0.9}`, "duplicate field"},
		{"both names of a map", `JSON {"named_metrics": {"a": 1}, "namedMetrics": {"b": 2}}`, "duplicate field"},
		{"duplicate map", `JSON {"utilization": {"a": 0.1}, "utilization": {"b": 0.2}}`, "duplicate field"},
		{"duplicate map key", `JSON {"named_metrics": {"num_requests_waiting": 1, "num_requests_waiting": 9}}`, "duplicate key"},
		{"upper case", `JSON {"CPU_UTILIZATION": 0.3}`, "unknown field"},
		{"other case", `JSON {"CpuUtilization": 0.3}`, "unknown field"},
		{"other case of a map", `JSON {"Named_Metrics": {"a": 1}}`, "unknown field"},
		{"null map value", `JSON {"named_metrics": {"a": null}}`, "null"},
		{"map not an object", `JSON {"named_metrics": [1]}`, "not an object"},
		{"nested object", `JSON {"cpu_utilization": {"a": 1}}`, "not a number"},
	}
	for _, c := range errs {
		t.Run(c.name, func(t *testing.T) {
			_, err := signals.ParseOrca(c.header)
			require.ErrorIs(t, err, signals.ErrORCA)
			assert.Contains(t, err.Error(), c.mention)
		})
	}
	oks := []struct {
		name, header string
		want         signals.OrcaReport
	}{
		{"null fields", `JSON {"cpu_utilization": null, "named_metrics": null, "eps": 1}`, signals.OrcaReport{EPS: 1}},
		{"escaped name", `JSON {"cpu\u005futilization": 0.5}`, signals.OrcaReport{CPUUtilization: 0.5}},
		{"same key in two maps", `JSON {"named_metrics": {"a": 1}, "request_cost": {"a": 2}}`,
			signals.OrcaReport{NamedMetrics: map[string]float64{"a": 1}, RequestCost: map[string]float64{"a": 2}}},
		{"keys differing in case", `JSON {"named_metrics": {"a": 1, "A": 2}}`,
			signals.OrcaReport{NamedMetrics: map[string]float64{"a": 1, "A": 2}}},
	}
	for _, c := range oks {
		t.Run(c.name, func(t *testing.T) {
			got, err := signals.ParseOrca(c.header)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}
