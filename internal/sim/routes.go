package sim

import (
	"fmt"
	"math"
	"time"
)

// Route is one kind of request of a [Synthetic] workload split by
// [Synthetic].Routes, such as an API route or a prompt template: a
// classification answers in a few tokens, a chat in a paragraph, a report
// or a reasoning model in thousands. Its requests carry its Name as
// [Request].Route.
type Route struct {
	// Name is the route's name, set as [Request].Route on its requests;
	// not empty, and unique among the routes.
	Name string
	// Share is the route's part of the fresh requests, relative to the
	// other routes' shares; positive and finite.
	Share float64
	// Output is the length distribution of the route's outputs; Max is at
	// most [MaxOutputTokens].
	Output LogNormal
}

// validateRoutes checks the routes of a workload.
func validateRoutes(rs []Route) error {
	seen := make(map[string]bool, len(rs))
	for _, r := range rs {
		switch {
		case r.Name == "":
			return fmt.Errorf("%w: a route has no name", ErrInvalidWorkload)
		case seen[r.Name]:
			return fmt.Errorf("%w: route %q listed twice", ErrInvalidWorkload, r.Name)
		case !(r.Share > 0) || math.IsInf(r.Share, 0):
			return fmt.Errorf("%w: route %q has share %v, want positive and finite", ErrInvalidWorkload, r.Name, r.Share)
		}
		seen[r.Name] = true
		if err := r.Output.validate(fmt.Sprintf("route %q output", r.Name), MaxOutputTokens); err != nil {
			return err
		}
	}
	return nil
}

// drawRoute draws the route of a fresh request by share, or returns "" for
// a workload without routes, drawing no random number.
func (g *generator) drawRoute() string {
	rs := g.s.Routes
	if len(rs) == 0 {
		return ""
	}
	total := 0.0
	for _, r := range rs {
		total += r.Share
	}
	u := g.rng.Float64() * total
	for _, r := range rs {
		if u -= r.Share; u < 0 {
			return r.Name
		}
	}
	return rs[len(rs)-1].Name
}

// output draws the output length of a request of the named route: from
// the route's Output, or from the workload's for "".
func (g *generator) output(route string) int {
	if route != "" {
		for _, r := range g.s.Routes {
			if r.Name == route {
				return r.Output.sample(g.rng)
			}
		}
	}
	return g.s.Output.sample(g.rng)
}

// RoutesRate is the arrival rate of the routes scenario, in requests per
// second for 8 replicas.
const RoutesRate = 48.0

// RoutesSynthetic returns the workload of the routes scenario: the default
// scenario's ([DefaultSynthetic]) at rate requests per second, its
// requests split among four routes whose outputs differ by two orders of
// magnitude: classify (30% of fresh requests, a label: median 8 tokens),
// extract (20%, a few fields: median 40), chat (35%, the default
// scenario's outputs: median 150, heavy-tailed) and generate (15%, reports
// and reasoning: median 1000, one in a hundred over 6k).
func RoutesSynthetic(n int, rate float64) Synthetic {
	w := DefaultSynthetic(n, rate)
	w.Routes = []Route{
		{Name: "classify", Share: 0.30, Output: LogNormal{Median: 8, Sigma: 0.5, Min: 2, Max: 64}},
		{Name: "extract", Share: 0.20, Output: LogNormal{Median: 40, Sigma: 0.6, Min: 4, Max: 512}},
		{Name: "chat", Share: 0.35, Output: LogNormal{Median: 150, Sigma: 0.9, Min: 2, Max: 2048}},
		{Name: "generate", Share: 0.15, Output: LogNormal{Median: 1000, Sigma: 0.8, Min: 64, Max: 8192}},
	}
	return w
}

// routesScenario returns the routes scenario (see [Scenarios]).
func routesScenario() Scenario {
	return Scenario{
		Name:     "routes",
		Doc:      "default, split among 4 routes whose outputs differ 100-fold: decode allowance, learned and true output lengths compared",
		Config:   Config{Replicas: 8, Routers: 1, Scrape: time.Second, Engine: Engine{KVBlocks: DefaultScenarioKVBlocks}},
		Workload: RoutesSynthetic(DefaultRequests, RoutesRate),
		Policies: []string{"least-outstanding", "least-tokens", "default"},
		Outputs:  []OutputKnowledge{OutputsAllowance, OutputsPredicted, OutputsTrue},
	}
}
