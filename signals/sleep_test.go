package signals_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/signals"
)

// vllmSleep returns a vLLM exposition of one engine index (or two, with
// dp) with vllm:engine_sleep_state as PrometheusStatLogger.record_sleep_state
// writes it: awake 1 while awake, and awake 0 with weights_offloaded 1 at
// sleep level 1, discard_all 1 at level 2, neither at level 0
// (vllm/v1/metrics/loggers.py).
func vllmSleep(awake, offloaded, discard [2]int, dp bool) string {
	engines := 1
	if dp {
		engines = 2
	}
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for e := range engines {
		b.WriteString(`vllm:num_requests_running{engine="` + string(rune('0'+e)) + `",model_name="m"} 0.0` + "\n")
	}
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\n")
	for e := range engines {
		b.WriteString(`vllm:num_requests_waiting{engine="` + string(rune('0'+e)) + `",model_name="m"} 0.0` + "\n")
	}
	b.WriteString("# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n")
	b.WriteString("# TYPE vllm:engine_sleep_state gauge\n")
	for _, st := range []struct {
		name string
		v    [2]int
	}{{"awake", awake}, {"weights_offloaded", offloaded}, {"discard_all", discard}} {
		for e := range engines {
			b.WriteString(`vllm:engine_sleep_state{engine="` + string(rune('0'+e)) + `",model_name="m",sleep_state="` + st.name + `"} ` +
				string(rune('0'+st.v[e])) + ".0\n")
		}
	}
	return b.String()
}

func TestParseVLLMSleepState(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		asleep bool
	}{
		{"awake", vllmSleep([2]int{1}, [2]int{}, [2]int{}, false), false},
		{"level 1", vllmSleep([2]int{0}, [2]int{1}, [2]int{}, false), true},
		{"level 2", vllmSleep([2]int{0}, [2]int{}, [2]int{1}, false), true},
		// Level 0 pauses the scheduler and keeps the memory: awake is 0
		// all the same.
		{"level 0", vllmSleep([2]int{0}, [2]int{}, [2]int{}, false), true},
		{"data parallel asleep", vllmSleep([2]int{0, 0}, [2]int{1, 1}, [2]int{}, true), true},
		{"data parallel awake", vllmSleep([2]int{1, 1}, [2]int{}, [2]int{}, true), false},
		// record_sleep_state sets every engine index at once; an
		// engine index still awake serves.
		{"data parallel one awake", vllmSleep([2]int{0, 1}, [2]int{1, 0}, [2]int{}, true), false},
		// Releases before the gauge, and the fixture of an awake server.
		{"no gauge", "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", false},
		{"fixture vllm.prom", string(fixture(t, "vllm.prom")), false},
		{"fixture vllm_asleep.prom", string(fixture(t, "vllm_asleep.prom")), true},
	}
	for _, c := range cases {
		for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineVLLM} {
			t.Run(c.name+"/engine="+engine.String(), func(t *testing.T) {
				o, err := signals.Parse(strings.NewReader(c.body), textType, engine)
				require.NoError(t, err)
				assert.Equal(t, c.asleep, o.Asleep)
			})
		}
	}
}

// The sleep state reads the same in OpenMetrics and delimited protobuf.
func TestParseVLLMSleepStateFormats(t *testing.T) {
	body := fixture(t, "vllm_asleep.prom")
	o, err := signals.Parse(strings.NewReader(string(body)+"# EOF\n"), omType, signals.EngineAuto)
	require.NoError(t, err)
	assert.True(t, o.Asleep, "OpenMetrics")
	assert.Equal(t, 0, o.Running)
	assert.InDelta(t, 4, o.Preemptions, 0)

	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	var buf strings.Builder
	format := expfmt.NewFormat(expfmt.TypeProtoDelim)
	enc := expfmt.NewEncoder(&buf, format)
	for _, mf := range fams {
		require.NoError(t, enc.Encode(mf))
	}
	o, err = signals.Parse(strings.NewReader(buf.String()), string(format), signals.EngineAuto)
	require.NoError(t, err)
	assert.True(t, o.Asleep, "protobuf")
}

// A sleep state that is not a count fails the scrape as other gauges do; one
// of another engine's dialect is not read.
func TestParseVLLMSleepStateInvalid(t *testing.T) {
	head := "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
	for _, v := range []string{"NaN", "-1", "+Inf"} {
		_, err := signals.Parse(strings.NewReader(head+`vllm:engine_sleep_state{sleep_state="awake"} `+v+"\n"), textType, signals.EngineVLLM)
		require.Error(t, err, v)
		assert.True(t, errors.Is(err, signals.ErrInvalidValue), "%s: %v", v, err)
		assert.Contains(t, err.Error(), "vllm:engine_sleep_state", v)
	}
	o, err := signals.Parse(strings.NewReader("sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"+
		`vllm:engine_sleep_state{sleep_state="awake"} 0`+"\n"), textType, signals.EngineSGLang)
	require.NoError(t, err)
	assert.False(t, o.Asleep)
}

// A scrape records the sleep state, and the next one after wake_up clears it.
func TestScrapeSleepState(t *testing.T) {
	srv := newSwitchServer(t, serve(textType, fixture(t, "vllm_asleep.prom")))
	s := newScraper(t, signals.Config{})
	require.NoError(t, s.SetTargets(map[string]string{"a": srv.URL}))
	o, err := s.Scrape(context.Background(), "a")
	require.NoError(t, err)
	assert.True(t, o.Asleep)
	held, ok := s.Observation("a")
	require.True(t, ok)
	assert.True(t, held.Asleep)

	srv.Set(serve(textType, []byte(vllmSleep([2]int{1, 1}, [2]int{}, [2]int{}, true))))
	_, err = s.Scrape(context.Background(), "a")
	require.NoError(t, err)
	held, _ = s.Observation("a")
	assert.False(t, held.Asleep)
}

// Asleep comes with the full observations: an ORCA report leaves it as the
// last scrape set it, while it carries that scrape's values, and drops it
// with them; the next scrape sets it again either way.
func TestStoreSleepStateMerge(t *testing.T) {
	clk := newFakeClock()
	const maxAge = 3 * time.Second
	s, err := signals.NewStore(signals.StoreConfig{Clock: clk, MaxAge: maxAge})
	require.NoError(t, err)
	asleep := func(at time.Time) signals.Observation {
		o := scraped(at)
		o.Running, o.Waiting, o.KVUsage, o.Asleep = 0, 0, 0, true
		return o
	}
	t0 := clk.Now()
	require.NoError(t, s.RecordObservation("a", asleep(t0)))

	// A report (of a response the engine sent before it slept, arriving
	// late, or of one it answered) keeps the scrape's state.
	clk.Advance(time.Second)
	_, err = s.RecordResponse("a", vllmReport(0.2, 1), clk.Now(), signals.OrcaMapping{})
	require.NoError(t, err)
	got, ok := s.Observation("a")
	require.True(t, ok)
	assert.True(t, got.Asleep, "a report keeps the scraped sleep state")
	assert.Equal(t, 1, got.Waiting)

	// The scrape after wake_up clears it, though a report is newer for
	// the fields it set.
	clk.Advance(100 * time.Millisecond)
	woke := scraped(clk.Now().Add(-200 * time.Millisecond)) // sent before the report
	require.NoError(t, s.RecordObservation("a", woke))
	got, _ = s.Observation("a")
	assert.False(t, got.Asleep, "the newer scrape says awake")
	assert.Equal(t, 1, got.Waiting, "the report's newer field is kept")

	// Asleep again; then only reports arrive, past the carry: the sleep
	// state is dropped with the other scraped values.
	clk.Advance(time.Second)
	t1 := clk.Now()
	require.NoError(t, s.RecordObservation("a", asleep(t1)))
	got, _ = s.Observation("a")
	assert.True(t, got.Asleep)
	clk.Advance(maxAge + time.Second)
	_, err = s.RecordResponse("a", vllmReport(0.2, 1), clk.Now(), signals.OrcaMapping{})
	require.NoError(t, err)
	got, ok = s.Observation("a")
	require.True(t, ok)
	assert.False(t, got.Asleep, "reports alone do not keep a stale sleep state")
	assert.Equal(t, signals.EngineAuto, got.Engine)

	// Without reports, the observation, sleep state included, ages out.
	require.NoError(t, s.RecordObservation("b", asleep(clk.Now())))
	clk.Advance(maxAge + time.Millisecond)
	_, ok = s.Observation("b")
	assert.False(t, ok, "an observation older than MaxAge is not served")

	// A pushed load carries no sleep state, and replaces a scraped one.
	require.NoError(t, s.RecordObservation("c", asleep(clk.Now())))
	clk.Advance(time.Millisecond)
	l := scraped(clk.Now()).Load
	require.NoError(t, s.Record("c", l))
	got, _ = s.Observation("c")
	assert.False(t, got.Asleep)
}

// vllmFullyAwake returns a vLLM exposition with vllm:engine_fully_awake, one
// series per engine index, as vLLM's sleep-state telemetry writes it (1 only
// while the scheduler runs and weights and KV cache are both resident;
// docs/design/engine_sleep_state.md), with the older gauge's awake series
// (which there follows the same predicate) if legacy is set.
func vllmFullyAwake(awake []int, legacy bool) string {
	var b strings.Builder
	b.WriteString("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n")
	b.WriteString("# TYPE vllm:engine_fully_awake gauge\n")
	for e, v := range awake {
		fmt.Fprintf(&b, "vllm:engine_fully_awake{engine=\"%d\",model_name=\"m\"} %d.0\n", e, v)
	}
	if legacy {
		b.WriteString("# TYPE vllm:engine_sleep_state gauge\n")
		for e, v := range awake {
			fmt.Fprintf(&b, "vllm:engine_sleep_state{engine=\"%d\",model_name=\"m\",sleep_state=\"awake\"} %d.0\n", e, v)
		}
	}
	return b.String()
}

// A partial wake-up (wake_up(tags=["weights"])) leaves the KV cache
// released. vllm:engine_sleep_state cannot show it: AsyncLLM.wake_up
// records awake whatever its tags, so the exposition is that of an engine
// fully awake, and reads as one. vllm:engine_fully_awake stays 0 until
// every resource is back, and is read first where vLLM exports it.
func TestParseVLLMPartialWake(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		asleep bool
	}{
		{"engine_sleep_state after a partial wake", vllmSleep([2]int{1}, [2]int{}, [2]int{}, false), false},
		{"fully_awake 0 alone", vllmFullyAwake([]int{0}, false), true},
		{"fully_awake 0 with the older gauge", vllmFullyAwake([]int{0}, true), true},
		{"fully_awake 1", vllmFullyAwake([]int{1}, false), false},
		{"fully_awake data parallel, one awake", vllmFullyAwake([]int{0, 1}, false), false},
		{"fully_awake data parallel, none awake", vllmFullyAwake([]int{0, 0}, false), true},
		// fully_awake wins over an older gauge that disagrees with it.
		{"fully_awake 0 over awake 1", vllmFullyAwake([]int{0}, false) +
			`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0` + "\n", true},
	}
	for _, c := range cases {
		for _, engine := range []signals.Engine{signals.EngineAuto, signals.EngineVLLM} {
			t.Run(c.name+"/engine="+engine.String(), func(t *testing.T) {
				o, err := signals.Parse(strings.NewReader(c.body), textType, engine)
				require.NoError(t, err)
				assert.Equal(t, c.asleep, o.Asleep)
			})
		}
	}
	_, err := signals.Parse(strings.NewReader(vllmFullyAwake(nil, false)+"vllm:engine_fully_awake NaN\n"), textType, signals.EngineVLLM)
	require.ErrorIs(t, err, signals.ErrInvalidValue)
}
