package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
)

// The routes workload: every request has a route, the turns of a
// conversation share theirs, conversations start on each route about its
// share of the time, and each route's outputs follow its distribution.
func TestRoutesWorkload(t *testing.T) {
	w := RoutesSynthetic(4000, RoutesRate)
	reqs, err := w.Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	routes := make(map[string]Route)
	for _, r := range w.Routes {
		routes[r.Name] = r
	}
	first := make(map[string]string) // session: its route
	started := make(map[string]int)  // route: conversations and single requests started
	outputs := make(map[string][]int)
	for _, q := range reqs {
		r, ok := routes[q.Route]
		if !ok {
			t.Fatalf("request of route %q", q.Route)
		}
		if q.OutputTokens < r.Output.Min || q.OutputTokens > r.Output.Max {
			t.Errorf("route %s: output %d out of [%d, %d]", q.Route, q.OutputTokens, r.Output.Min, r.Output.Max)
		}
		outputs[q.Route] = append(outputs[q.Route], q.OutputTokens)
		if q.Session == "" {
			started[q.Route]++
			continue
		}
		if f, ok := first[q.Session]; !ok {
			first[q.Session] = q.Route
			started[q.Route]++
		} else if f != q.Route {
			t.Fatalf("session %s changes route from %s to %s", q.Session, f, q.Route)
		}
	}
	total := 0
	for _, n := range started {
		total += n
	}
	var medians []int
	for _, r := range w.Routes {
		if got := float64(started[r.Name]) / float64(total); math.Abs(got-r.Share) > 0.04 {
			t.Errorf("route %s starts %.3f of the conversations, want about %v", r.Name, got, r.Share)
		}
		xs := outputs[r.Name]
		slices.Sort(xs)
		m := xs[len(xs)/2]
		if m < int(r.Output.Median*0.8) || m > int(r.Output.Median*1.25) {
			t.Errorf("route %s: median output %d, want about %v", r.Name, m, r.Output.Median)
		}
		medians = append(medians, m)
	}
	if !slices.IsSorted(medians) || medians[len(medians)-1] < 50*medians[0] {
		t.Errorf("median outputs by route %v: want increasing, 50-fold from first to last", medians)
	}
}

// A workload without routes draws no random number for them: the default
// workload's requests, on which every published table depends, are pinned
// by a fingerprint, and carry no route.
func TestNoRoutesDrawsNothing(t *testing.T) {
	reqs, err := DefaultSynthetic(500, DefaultRate).Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	for _, q := range reqs {
		if q.Route != "" {
			t.Fatalf("request of route %q in a workload without routes", q.Route)
		}
		fmt.Fprintln(h, q.Arrival, q.PromptTokens, q.OutputTokens, q.BlockTokens, q.Prefix, q.Reply, q.Session, q.Tenant)
	}
	if got, want := h.Sum64(), uint64(defaultWorkloadFingerprint); got != want {
		t.Errorf("default workload fingerprint %#x, want %#x: the generator draws differently", got, want)
	}
}

// defaultWorkloadFingerprint is the FNV-1a hash of the fields of the
// requests of DefaultSynthetic(500, DefaultRate) under seed 1, printed a
// request a line.
const defaultWorkloadFingerprint = 0xe5c5f1ce986cc698

// routesRun is the routes scenario's workload, shortened for tests.
func routesRun(t *testing.T, n int, seed uint64) (Config, []Request) {
	t.Helper()
	sc, err := LookupScenario("routes")
	if err != nil {
		t.Fatal(err)
	}
	w := sc.Workload
	w.Requests = n
	reqs, err := w.Generate(seed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sc.Config
	cfg.Seed = seed
	return cfg, reqs
}

// Telling the routers output lengths changes nothing for a policy that does
// not read the decode work charged (least-outstanding), nor, without
// prediction, for one that does not learn speeds (default): the results
// equal those of the zero Config, but for their outputs label, which the
// zero Config's JSON does not show.
func TestOutputsChangeOnlyTheCharge(t *testing.T) {
	cfg, reqs := routesRun(t, 2000, 2)
	for _, c := range []struct {
		policy string
		kinds  []OutputKnowledge
	}{
		{"least-outstanding", []OutputKnowledge{OutputsAllowance, OutputsPredicted, OutputsTrue}},
		{"default", []OutputKnowledge{OutputsAllowance}},
	} {
		cfg.Outputs = OutputsUntold
		base, err := Simulate(context.Background(), cfg, reqs, c.policy)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(base)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(want), `"outputs"`) {
			t.Fatalf("the zero Config's outputs show in the JSON: %s", want)
		}
		for _, k := range c.kinds {
			cfg.Outputs = k
			res, err := Simulate(context.Background(), cfg, reqs, c.policy)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outputs != k.String() {
				t.Errorf("%s: Outputs %q, want %q", c.policy, res.Outputs, k)
			}
			res.Outputs = ""
			got, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) || !slices.Equal(res.TTFTs, base.TTFTs) {
				t.Errorf("%s under %v: results changed:\n got %s\nwant %s", c.policy, k, got, want)
			}
		}
	}
}

// chargeRecorder is a policy that notes the decode work its balancer
// charges each request, by route, and otherwise picks as least-outstanding.
type chargeRecorder struct {
	llmlb.Policy
	charged map[string][]int64 // by Feature, in pick order
}

func (p *chargeRecorder) Choose(c *llmlb.Candidates) int {
	r := c.Request()
	p.charged[r.Feature] = append(p.charged[r.Feature], c.RequestTokens()-int64(r.PromptTokens))
	return p.Policy.Choose(c)
}

// charges runs reqs under cfg with a chargeRecorder and returns what it
// noted.
func charges(t *testing.T, cfg Config, reqs []Request) map[string][]int64 {
	t.Helper()
	rec := &chargeRecorder{Policy: llmlb.LeastOutstanding(), charged: make(map[string][]int64)}
	spec := PolicySpec{Name: "recorder", New: func(*PolicyEnv) (llmlb.Policy, error) { return rec, nil }}
	if _, err := simulate(context.Background(), cfg, reqs, spec); err != nil {
		t.Fatal(err)
	}
	return rec.charged
}

func mean[T int | int64](xs []T) float64 {
	s := 0.0
	for _, x := range xs {
		s += float64(x)
	}
	return s / float64(len(xs))
}

// Each knowledge of output lengths charges what it says: the allowance, the
// true length, or, once learned, about the mean of the route's outputs (a
// higher quantile charging more).
func TestOutputsCharge(t *testing.T) {
	cfg, reqs := routesRun(t, 4000, 1)
	truth := make(map[string][]int)
	for _, q := range reqs {
		truth[q.Route] = append(truth[q.Route], q.OutputTokens)
	}

	cfg.Outputs = OutputsAllowance
	for route, xs := range charges(t, cfg, reqs) {
		for _, x := range xs {
			if x != llmlb.DefaultDecodeAllowance {
				t.Fatalf("allowance: route %s charged %d", route, x)
			}
		}
	}

	cfg.Outputs = OutputsTrue
	for route, xs := range charges(t, cfg, reqs) {
		if !slices.Equal(xs, toInt64(truth[route])) {
			t.Fatalf("true: route %s charged other than the true lengths", route)
		}
	}

	cfg.Outputs = OutputsPredicted
	learned := make(map[string]float64)
	for route, xs := range charges(t, cfg, reqs) {
		// Past the first fifth, the route's own completions are known.
		learned[route] = mean(xs[len(xs)/5:])
		want := mean(truth[route])
		if got := learned[route]; got < 0.7*want || got > 1.3*want {
			t.Errorf("predict: route %s charged %.0f on average, its outputs average %.0f", route, got, want)
		}
	}
	cfg.Prediction.Quantile = 0.9
	for route, xs := range charges(t, cfg, reqs) {
		if got := mean(xs[len(xs)/5:]); got < 1.3*learned[route] {
			t.Errorf("predict q0.9: route %s charged %.0f on average, the mean predicted %.0f", route, got, learned[route])
		}
	}
}

func toInt64(xs []int) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// Prediction moves a policy that balances decode work towards what the
// true lengths give: least-tokens' missed requests under prediction are
// closer to those under the true lengths than the allowance's are. (On this workload the true lengths make least-tokens worse,
// not better: see docs/outputs.md.)
func TestPredictionTowardsTrue(t *testing.T) {
	for seed := uint64(1); seed <= 2; seed++ {
		cfg, reqs := routesRun(t, 4000, seed)
		missed := make(map[OutputKnowledge]int)
		for _, k := range []OutputKnowledge{OutputsAllowance, OutputsPredicted, OutputsTrue} {
			cfg.Outputs = k
			res, err := Simulate(context.Background(), cfg, reqs, "least-tokens")
			if err != nil {
				t.Fatal(err)
			}
			missed[k] = res.Missed
		}
		a, p, tr := missed[OutputsAllowance], missed[OutputsPredicted], missed[OutputsTrue]
		if math.Abs(float64(p-tr)) >= math.Abs(float64(a-tr)) {
			t.Errorf("seed %d: least-tokens missed %d with the allowance, %d predicted, %d with true lengths: want the prediction nearer the true lengths",
				seed, a, p, tr)
		}
	}
}

// Invalid output knowledge or prediction settings are configuration
// errors.
func TestInvalidOutputs(t *testing.T) {
	_, reqs := routesRun(t, 100, 1)
	for _, cfg := range []Config{
		{Outputs: OutputsTrue + 1},
		{Outputs: OutputsPredicted, Prediction: llmlb.OutputConfig{Quantile: 1}},
		{Outputs: OutputsPredicted, Prediction: llmlb.OutputConfig{Quantile: math.NaN()}},
		{Outputs: OutputsPredicted, Prediction: llmlb.OutputConfig{Window: -1}},
	} {
		if _, err := Simulate(context.Background(), cfg, reqs, "least-tokens"); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: error %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// Invalid routes are workload errors.
func TestInvalidRoutes(t *testing.T) {
	ok := LogNormal{Median: 10, Min: 1, Max: 100}
	for _, rs := range [][]Route{
		{{Name: "", Share: 1, Output: ok}},
		{{Name: "a", Share: 1, Output: ok}, {Name: "a", Share: 1, Output: ok}},
		{{Name: "a", Share: 0, Output: ok}},
		{{Name: "a", Share: math.Inf(1), Output: ok}},
		{{Name: "a", Share: 1, Output: LogNormal{Median: 10, Min: 1, Max: MaxOutputTokens + 1}}},
	} {
		w := DefaultSynthetic(10, 1)
		w.Routes = rs
		if _, err := w.Generate(1); !errors.Is(err, ErrInvalidWorkload) {
			t.Errorf("routes %+v: error %v, want ErrInvalidWorkload", rs, err)
		}
	}
}
