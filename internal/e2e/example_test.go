package e2e_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
)

// Open-loop load straight at one emulated engine.
func ExampleGenerate() {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 50})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	res := e2e.Generate(context.Background(), client, c.URLs[0], e2e.Workload{Requests: 20, Rate: 200, Groups: 2, Seed: 1})
	hit, err := c.ScrapeHitRate(context.Background(), client)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("complete:", res.Count((*e2e.Outcome).Complete))
	fmt.Println("prefix cache hits:", hit.Hits > 0)
	// Output:
	// complete: 20
	// prefix cache hits: true
}
