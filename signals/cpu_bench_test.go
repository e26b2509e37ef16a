//go:build unix

package signals_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb/signals"
)

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScrapeCPU measures the CPU cost of scraping 100 vLLM endpoints,
// each serving a realistic exposition over keep-alive loopback HTTP, and
// projects it to 100 endpoints scraped every second. The process CPU time
// includes the 100 test servers, so the figure is an upper bound for the
// scraper alone.
func BenchmarkScrapeCPU(b *testing.B) {
	const endpoints = 100
	body := fixture(b, "vllm.prom")
	s, err := signals.NewScraper(signals.Config{Engine: signals.EngineAuto})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	keys := make([]string, endpoints)
	targets := make(map[string]string, endpoints)
	for i := range keys {
		srv := newSwitchServer(b, serve(textType, body))
		keys[i] = fmt.Sprint(i)
		targets[keys[i]] = srv.URL + "/metrics"
	}
	if err := s.SetTargets(targets); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range keys { // warm up connections
		if _, err := s.Scrape(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	i := 0
	for b.Loop() {
		if _, err := s.Scrape(ctx, keys[i%endpoints]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	perScrape := float64(cpuTime(b)-cpu0) / float64(i)
	b.ReportMetric(perScrape, "cpu-ns/scrape")
	// 100 scrapes a second, as a fraction of one core's second.
	b.ReportMetric(perScrape*endpoints/float64(time.Second)*100, "%core@100ep/1s")
}
