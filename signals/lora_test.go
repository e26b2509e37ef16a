package signals_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/signals"
)

// vllmLoRA is a vLLM exposition with LoRA enabled: prometheus_client keeps
// a series for every combination of labels it was set with, and the newest
// (the largest timestamp) is current.
const vllmLoRA = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 3.0
vllm:num_requests_waiting{engine="0",model_name="base"} 1.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7898284e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters="chat,legal"} 1.7898285e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7898283e+09
`

func TestParseLoRAInfo(t *testing.T) {
	o, err := signals.Parse(strings.NewReader(vllmLoRA), textType, signals.EngineAuto)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"sql", "chat", "legal"}; !slices.Equal(o.Adapters, want) || o.MaxAdapters != 4 {
		t.Fatalf("adapters %q, max %d; want %q, 4", o.Adapters, o.MaxAdapters, want)
	}
	if o.Running != 3 || o.Waiting != 1 {
		t.Fatalf("running %d, waiting %d", o.Running, o.Waiting)
	}
}

func TestParseLoRAInfoAbsentOrIdle(t *testing.T) {
	o, err := signals.Parse(strings.NewReader("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"), textType, signals.EngineVLLM)
	if err != nil {
		t.Fatal(err)
	}
	if o.Adapters != nil || o.MaxAdapters != 0 {
		t.Fatalf("no LoRA metric: adapters %q, max %d; want nil, 0", o.Adapters, o.MaxAdapters)
	}
	idle := "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n" +
		`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9` + "\n"
	o, err = signals.Parse(strings.NewReader(idle), textType, signals.EngineVLLM)
	if err != nil {
		t.Fatal(err)
	}
	if o.Adapters == nil || len(o.Adapters) != 0 || o.MaxAdapters != 2 {
		t.Fatalf("idle: adapters %q, max %d; want empty and reported, 2", o.Adapters, o.MaxAdapters)
	}
}

func TestParseLoRAInfoInvalid(t *testing.T) {
	head := "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
	cases := map[string]string{
		"max_lora not a number": `vllm:lora_requests_info{max_lora="four",running_lora_adapters="a"} 1`,
		"max_lora negative":     `vllm:lora_requests_info{max_lora="-1",running_lora_adapters="a"} 1`,
		"max_lora huge":         `vllm:lora_requests_info{max_lora="99999999",running_lora_adapters="a"} 1`,
		"too many adapters":     `vllm:lora_requests_info{max_lora="4",running_lora_adapters="` + manyNames(2000) + `"} 1`,
		"name too long":         `vllm:lora_requests_info{max_lora="4",running_lora_adapters="` + strings.Repeat("n", 5000) + `"} 1`,
	}
	for name, line := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := signals.Parse(strings.NewReader(head+line+"\n"), textType, signals.EngineVLLM)
			if !errors.Is(err, signals.ErrInvalidValue) {
				t.Fatalf("err = %v, want ErrInvalidValue", err)
			}
		})
	}
}

func manyNames(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "a" + strings.Repeat("b", i%7) + string(rune('A'+i%26)) + strings.Repeat("c", i/26)
	}
	return strings.Join(names, ",")
}

// loraLabel returns a lora_requests_info body whose running adapters label
// is about size bytes: distinct names first, then the last one repeated.
func loraLabel(distinct, size int) string {
	var lab strings.Builder
	for i := range distinct {
		fmt.Fprintf(&lab, "a%03x,", i)
	}
	last := fmt.Sprintf("a%03x,", distinct-1)
	for lab.Len() < size {
		lab.WriteString(last)
	}
	return "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n" +
		`vllm:lora_requests_info{max_lora="4",running_lora_adapters="` + lab.String() + `",waiting_lora_adapters=""} 1.7e9` + "\n"
}

// TestParseLoRARepeatedNames: names repeated any number of times count once,
// and the plausible limit counts distinct names.
func TestParseLoRARepeatedNames(t *testing.T) {
	o, err := signals.Parse(strings.NewReader(loraLabel(1024, 1<<20)), textType, signals.EngineVLLM)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Adapters) != 1024 || o.Adapters[0] != "a000" || o.Adapters[1023] != "a3ff" {
		t.Fatalf("%d adapters (%q ... ), want 1024 distinct", len(o.Adapters), o.Adapters[:min(3, len(o.Adapters))])
	}
}

// TestParseLoRAInfoMultiprocess reads vllm:lora_requests_info as vLLM
// exposes it with several API server processes: the gauge's
// multiprocess_mode is "sum" (vllm/v1/metrics/loggers.py), so each label
// set's value is the sum of the last update times of every process that
// set it, without a pid label. The newest label set is the one with the
// newest mean time, not the largest sum. The values are written as
// prometheus_client writes them.
func TestParseLoRAInfoMultiprocess(t *testing.T) {
	const head = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} 0.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
`
	series := func(running, value string) string {
		return `vllm:lora_requests_info{max_lora="4",running_lora_adapters="` + running + `",waiting_lora_adapters=""} ` + value + "\n"
	}
	// t0 = 1789828000; "A at t0+10.125" means process A set the label set
	// last at that time.
	cases := []struct {
		name string
		body string
		want []string
	}{{
		// Idle: A at t0+10.125, B at t0+20.5. sql: A at t0+100.75. chat:
		// A, B and C at t0+50.5, t0+60.25 and t0+70.
		name: "one label set by one process",
		body: series("", "3.579656030625e+09") + series("sql", "1.78982810075e+09") + series("chat", "5.36948418075e+09"),
		want: []string{"sql"},
	}, {
		// old: A, B and C at t0+0.5, t0+1.25 and t0+2. sql: A and B at
		// t0+100.5 and t0+101. Idle: A and B at t0+10 and t0+20.25.
		name: "every label set by several processes",
		body: series("old", "5.36948400375e+09") + series("sql", "3.5796562015e+09") + series("", "3.57965603025e+09"),
		want: []string{"sql"},
	}, {
		name: "one process",
		body: series("", "1.7898284e+09") + series("sql", "1.7898285e+09") + series("old", "1.7898283e+09"),
		want: []string{"sql"},
	}, {
		// 400 days apart: not a whole multiple of one time, compared as
		// they are.
		name: "one process, times far apart",
		body: series("sql", "1.7345e+09") + series("old", "1.7e+09"),
		want: []string{"sql"},
	}, {
		// Not Unix times, as a test server sends: compared as they are.
		name: "not times",
		body: series("old", "1") + series("sql", "2") + series("", "1"),
		want: []string{"sql"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o, err := signals.Parse(strings.NewReader(head+c.body), textType, signals.EngineVLLM)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.Adapters, c.want) || o.MaxAdapters != 4 {
				t.Fatalf("adapters %q, max %d; want %q, 4", o.Adapters, o.MaxAdapters, c.want)
			}
		})
	}
}
