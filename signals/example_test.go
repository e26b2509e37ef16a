package signals_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/signals"
)

// replica is an llmlb.Endpoint.
type replica string

func (r replica) Key() string { return string(r) }

// vllmMetrics is a trimmed vLLM /metrics exposition.
func vllmMetrics(running, waiting int, kv float64) http.Handler {
	body := fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} %d
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} %g
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="8192"} 1.0
`, running, waiting, kv)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, body)
	})
}

// A balancer picking by KV pressure (P2C over KVScore), fed by a scraper of
// two vLLM replicas: one nearly full with a queue, one mostly idle.
func Example() {
	busy := httptest.NewServer(vllmMetrics(48, 12, 0.97))
	defer busy.Close()
	idle := httptest.NewServer(vllmMetrics(3, 0, 0.15))
	defer idle.Close()

	scraper, err := signals.NewScraper(signals.Config{Interval: time.Second})
	if err != nil {
		panic(err)
	}
	defer scraper.Close()
	_ = scraper.SetTargets(map[string]string{
		"busy:8000": busy.URL + "/metrics",
		"idle:8000": idle.URL + "/metrics",
	})

	b, err := llmlb.New(llmlb.P2C(llmlb.KVScore), llmlb.WithSignal(scraper, 5*time.Second))
	if err != nil {
		panic(err)
	}
	_ = b.Update([]llmlb.Endpoint{replica("busy:8000"), replica("idle:8000")})

	// A server runs `go scraper.Run(ctx)`; here one synchronous round.
	ctx := context.Background()
	for _, st := range scraper.Statuses() {
		o, err := scraper.Scrape(ctx, st.Key)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s running=%d waiting=%d kv=%.2f capacity=%d tokens\n",
			st.Key, o.Engine, o.Running, o.Waiting, o.KVUsage, o.KVBlocks*o.BlockSize)
	}

	p, err := b.Pick(ctx, &llmlb.Request{PromptTokens: 3000, MaxTokens: 256})
	if err != nil {
		panic(err)
	}
	fmt.Println("picked", p.Endpoint().Key())
	p.Done(nil)
	// Output:
	// busy:8000: vllm running=48 waiting=12 kv=0.97 capacity=131072 tokens
	// idle:8000: vllm running=3 waiting=0 kv=0.15 capacity=131072 tokens
	// picked idle:8000
}
