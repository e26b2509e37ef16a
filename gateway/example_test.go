package gateway_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/llmlb/llmlb/gateway"
)

// A gateway over two replicas in one call: it routes with the default
// policy, scrapes the replicas' /metrics while Run runs, and reports its
// view of them in State (served as JSON by Debug).
func Example() {
	replica := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
			return
		}
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	}
	a := httptest.NewServer(http.HandlerFunc(replica))
	defer a.Close()
	b := httptest.NewServer(http.HandlerFunc(replica))
	defer b.Close()

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := gateway.New([]string{a.URL, b.URL}, gateway.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	front := httptest.NewServer(g)
	defer front.Close()

	resp, err := http.Post(front.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"Say hi","max_tokens":4}`))
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))

	state := g.State()
	fmt.Println("replicas:", len(state.Endpoints), "ejected:", len(state.Ejected))
	for _, e := range state.Endpoints {
		fmt.Println("healthy:", e.Healthy)
	}
	cancel()
	<-done
	http.DefaultClient.CloseIdleConnections()
	// Output:
	// 200 {"choices":[{"text":"hi"}]}
	// replicas: 2 ejected: 0
	// healthy: true
	// healthy: true
}
