package sim

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// Sharing runs on simulated time: two runs with the same seed agree, and
// the sharing changes the routing.
func TestShareDeterministic(t *testing.T) {
	reqs, err := DefaultSynthetic(1500, 37).Generate(7)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Seed: 3, Routers: 3, Stagger: true, Delay: time.Millisecond, Share: 100 * time.Millisecond}
	unshared := cfg
	unshared.Share = 0
	for _, p := range []string{"default", "default-approx", "gie-default"} {
		a, err := Simulate(context.Background(), cfg, reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Simulate(context.Background(), cfg, reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs with the same seed differ", p)
		}
		c, err := Simulate(context.Background(), unshared, reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(a, c) {
			t.Errorf("%s: sharing changed nothing", p)
		}
	}
}

// With two routers sharing every 100 ms, the second router's estimate of a
// replica includes the first router's requests in flight once a batch that
// holds them has arrived, twice the network delay after it was built: the
// first router's batches are built at 0, 100 ms..., so its picks at 0 and
// 60 ms reach the second router at 100 ms without delay, and at 160 ms with
// a delay of 30 ms, after its pick at 150 ms. Without sharing it counts
// only its own.
func TestShareShowsPeersWork(t *testing.T) {
	// Arrivals alternate between the routers: even ones to router 0.
	arrivals := []time.Duration{0, 50, 60, 150, 160, 250}
	reqs := make([]Request, len(arrivals))
	for i, ms := range arrivals {
		reqs[i] = Request{Arrival: ms * time.Millisecond, PromptTokens: 16, OutputTokens: 2000}
	}
	// seen records, at each pick of router 1, the requests it estimates at
	// replica 0, where every request goes; the scrape at 0 saw it empty.
	seen := func(share, delay time.Duration) map[time.Duration]int64 {
		got := map[time.Duration]int64{}
		spec := PolicySpec{Name: "probe", New: func(env *PolicyEnv) (llmlb.Policy, error) {
			return llmlb.LeastScore(func(c *llmlb.Candidates, i int, l *llmlb.EndpointLoad) float64 {
				if env.Router == 1 && c.Member(i) == 0 {
					got[env.run.now] = l.Requests
				}
				return float64(c.Member(i))
			}), nil
		}}
		cfg := Config{Replicas: 2, Routers: 2, Scrape: 10 * time.Second, Share: share, Delay: delay}
		if _, err := simulate(context.Background(), cfg, reqs, spec); err != nil {
			t.Fatal(err)
		}
		return got
	}
	ms := time.Millisecond
	if got, want := seen(100*ms, 0), map[time.Duration]int64{50 * ms: 0, 150 * ms: 3, 250 * ms: 5}; !reflect.DeepEqual(got, want) {
		t.Errorf("sharing: router 1 saw %v, want %v (its own, plus router 0's two from 100 ms and three from 200 ms)", got, want)
	}
	if got, want := seen(100*ms, 30*ms), map[time.Duration]int64{50 * ms: 0, 150 * ms: 1, 250 * ms: 4}; !reflect.DeepEqual(got, want) {
		t.Errorf("sharing with a 30 ms delay: router 1 saw %v, want %v (its own, plus router 0's two from 160 ms)", got, want)
	}
	if got, want := seen(0, 0), map[time.Duration]int64{50 * ms: 0, 150 * ms: 1, 250 * ms: 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("no sharing: router 1 saw %v, want %v (its own)", got, want)
	}
}

// Routers share between more peers than share's default MaxPeers (64):
// every router's Group tracks all the others, none refused (a refused
// batch fails the run).
func TestShareManyRouters(t *testing.T) {
	reqs, err := DefaultSynthetic(200, 37).Generate(7)
	if err != nil {
		t.Fatal(err)
	}
	const routers = 70
	peers := make([]int, 0, routers)
	cfg := Config{Seed: 3, Routers: routers, Share: 100 * time.Millisecond, onEnd: func(r *runner) {
		for _, rt := range r.routers {
			peers = append(peers, rt.group.Stats().Peers)
		}
	}}
	if _, err := Simulate(context.Background(), cfg, reqs, "default"); err != nil {
		t.Fatal(err)
	}
	for k, n := range peers {
		if n != routers-1 {
			t.Errorf("router %d tracks %d peers at the end, want %d", k, n, routers-1)
		}
	}
	if len(peers) != routers {
		t.Errorf("%d routers, want %d", len(peers), routers)
	}
}

// Routers share the picks of more replicas than share's default
// MaxEndpoints (1024): none is left out of the batches (a pick left out
// counts in the group's Dropped).
func TestShareManyReplicas(t *testing.T) {
	const replicas = 1100
	reqs, err := DefaultSynthetic(2*replicas, 2000).Generate(5)
	if err != nil {
		t.Fatal(err)
	}
	var dropped []uint64
	cfg := Config{Seed: 3, Replicas: replicas, Routers: 2, Share: 100 * time.Millisecond, onEnd: func(r *runner) {
		for _, rt := range r.routers {
			dropped = append(dropped, rt.group.Stats().Dropped)
		}
	}}
	if _, err := Simulate(context.Background(), cfg, reqs, "round-robin"); err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 2 {
		t.Fatalf("%d routers, want 2", len(dropped))
	}
	for k, n := range dropped {
		if n != 0 {
			t.Errorf("router %d left %d picks out of its batches, want 0", k, n)
		}
	}
}
