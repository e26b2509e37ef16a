package signals

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// OnResult sees each scrape's status before and after it: a failure, a
// second one, then the recovery.
func TestScraperOnResult(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n"))
	}))
	defer srv.Close()
	type call struct{ prev, cur Status }
	var calls []call
	s, err := NewScraper(Config{OnResult: func(prev, cur Status) { calls = append(calls, call{prev, cur}) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetTargets(map[string]string{"a": srv.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if _, err := s.Scrape(ctx, "a"); err == nil {
			t.Fatal("scrape of a failing endpoint succeeded")
		}
	}
	fail.Store(false)
	if _, err := s.Scrape(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 {
		t.Fatalf("OnResult called %d times, want 3", len(calls))
	}
	for i, want := range []struct{ prev, cur int }{{0, 1}, {1, 2}, {2, 0}} {
		c := calls[i]
		if c.prev.ConsecutiveFailures != want.prev || c.cur.ConsecutiveFailures != want.cur || c.cur.Key != "a" {
			t.Errorf("call %d: consecutive failures %d -> %d (key %q), want %d -> %d", i,
				c.prev.ConsecutiveFailures, c.cur.ConsecutiveFailures, c.cur.Key, want.prev, want.cur)
		}
	}
	if calls[0].cur.LastError == nil || calls[2].cur.LastSuccess.IsZero() {
		t.Error("the failure's error or the recovery's success time is missing")
	}
}

// A target removed while it is being scraped is not reported: the caller
// would log a failure of a replica that has left.
func TestScraperOnResultNotForRemovedTarget(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var calls atomic.Int32
	s, err := NewScraper(Config{OnResult: func(prev, cur Status) { calls.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetTargets(map[string]string{"a": srv.URL + "/metrics"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Scrape(context.Background(), "a")
		done <- err
	}()
	<-entered
	if err := s.SetTargets(map[string]string{}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err == nil {
		t.Fatal("scrape of a failing endpoint succeeded")
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("OnResult called %d times for a removed target, want 0", n)
	}
}
