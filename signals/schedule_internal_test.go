package signals

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunLooksForNewTargetsOnlyWhenAdded: Run goes over the targets to
// schedule new ones when it starts and after a SetTargets that added some,
// not once per scrape, which would make each interval cost time in the
// square of the number of targets.
func TestRunLooksForNewTargetsOnlyWhenAdded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")
	}))
	defer srv.Close()
	s, err := NewScraper(Config{Interval: 2 * time.Millisecond, Jitter: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	targets := map[string]string{}
	for i := range 8 {
		targets[fmt.Sprint("ep", i)] = srv.URL
	}
	if err := s.SetTargets(targets); err != nil {
		t.Fatal(err)
	}
	var looks atomic.Int64
	testHookSchedule = func() { looks.Add(1) }
	defer func() { testHookSchedule = nil }()

	scrapes := func() uint64 {
		var n uint64
		for _, st := range s.Statuses() {
			n += st.Scrapes
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitFor := func(n uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for scrapes() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d scrapes after 10s, want %d", scrapes(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor(80)
	if n := looks.Load(); n != 1 {
		t.Errorf("Run looked for new targets %d times over 80 scrapes of unchanged targets; want once", n)
	}

	// Setting the same targets again adds none; one more does.
	if err := s.SetTargets(targets); err != nil {
		t.Fatal(err)
	}
	targets["new"] = srv.URL
	if err := s.SetTargets(targets); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st, _ := s.Status("new"); st.Scrapes == 0; st, _ = s.Status("new") {
		if time.Now().After(deadline) {
			t.Fatal("the added target was not scraped")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run returned %v", err)
	}
	if n := looks.Load(); n != 2 {
		t.Errorf("Run looked for new targets %d times; want twice", n)
	}
}
