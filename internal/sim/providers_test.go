package sim

import (
	"bytes"
	"context"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// runPoolSeeds runs sc under seeds 1..n and pools each routing's results.
func runPoolSeeds(t *testing.T, sc *PoolScenario, n int) map[string]*PoolResult {
	t.Helper()
	runs := make([][]*PoolResult, len(sc.Routings))
	for seed := uint64(1); seed <= uint64(n); seed++ {
		rs, err := RunPool(context.Background(), sc, seed)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rs {
			runs[i] = append(runs[i], r)
		}
	}
	out := make(map[string]*PoolResult)
	for _, rs := range runs {
		m, err := MergePoolResults(rs...)
		if err != nil {
			t.Fatal(err)
		}
		key := m.Routing
		if m.Cooldown {
			key += "+cooldown"
		}
		out[key] = m
	}
	return out
}

func TestPoolDeterministic(t *testing.T) {
	for _, name := range []string{"providers", "spill"} {
		t.Run(name, func(t *testing.T) {
			sc, ok := LookupPoolScenario(name)
			if !ok {
				t.Fatalf("no pool scenario %q", name)
			}
			sc.Workload.Duration = 3 * time.Minute
			a, err := RunPool(context.Background(), &sc, 7)
			if err != nil {
				t.Fatal(err)
			}
			b, err := RunPool(context.Background(), &sc, 7)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Error("two runs of one seed differ")
			}
			c, err := RunPool(context.Background(), &sc, 8)
			if err != nil {
				t.Fatal(err)
			}
			if reflect.DeepEqual(a, c) {
				t.Error("two seeds gave the same results")
			}
			for _, r := range a {
				if r.Completed+r.Refused != r.Requests {
					t.Errorf("%s: %d completed + %d refused != %d requests", r.Routing, r.Completed, r.Refused, r.Requests)
				}
			}
		})
	}
}

func TestDeploymentRateLimit(t *testing.T) {
	d := &depState{cfg: &Deployment{Name: "d", Concurrency: 8, RPM: 60, Burst: 2}}
	d.tokens = d.burst()
	cases := []struct {
		at                        time.Duration
		ok                        bool
		remaining, reset, backoff string
	}{
		{0, true, "1", "1s", ""},
		{0, true, "0", "2s", ""},
		{0, false, "0", "2s", "1"},                        // empty: one request a second
		{500 * time.Millisecond, false, "0", "1.5s", "1"}, // half a request: 0.5 s, rounded up
		{time.Second, true, "0", "2s", ""},
		{3 * time.Second, true, "1", "1s", ""}, // refilled to the burst, not beyond
	}
	for _, c := range cases {
		ok, h := d.admit(c.at)
		got := []string{h.Get("X-Ratelimit-Remaining-Requests"), h.Get("X-Ratelimit-Reset-Requests"), h.Get("Retry-After")}
		if want := []string{c.remaining, c.reset, c.backoff}; ok != c.ok || !reflect.DeepEqual(got, want) {
			t.Errorf("at %v: admit = %v %q, want %v %q", c.at, ok, got, c.ok, want)
		}
	}

	// A slow refill asks for the wait rounded up to whole seconds.
	slow := &depState{cfg: &Deployment{Name: "s", Concurrency: 8, RPM: 24, Burst: 1}}
	slow.tokens = 1
	slow.admit(0)
	if ok, h := slow.admit(0); ok || h.Get("Retry-After") != "3" {
		t.Errorf("empty bucket at 0.4 req/s: admit = %v, Retry-After %q, want refused and 3", ok, h.Get("Retry-After"))
	}
}

func TestDeploymentRefusals(t *testing.T) {
	d := &depState{cfg: &Deployment{Name: "q", Concurrency: 1, QueueLimit: 1}}
	d.running, d.queue = 1, []int{0}
	if ok, h := d.admit(0); ok || h.Get("Retry-After") != "1" {
		t.Errorf("full queue: admit = %v, Retry-After %q, want refused and 1", ok, h.Get("Retry-After"))
	}
	d.queue = nil
	if ok, _ := d.admit(0); !ok {
		t.Error("queue with room: refused")
	}

	x := &Deployment{Name: "x", Concurrency: 1, ExhaustedRetryAfter: time.Hour}
	x.Exhausted.From, x.Exhausted.To = time.Minute, 2*time.Minute
	e := &depState{cfg: x}
	for _, c := range []struct {
		at time.Duration
		ok bool
	}{{59 * time.Second, true}, {time.Minute, false}, {119 * time.Second, false}, {2 * time.Minute, true}} {
		ok, h := e.admit(c.at)
		if ok != c.ok || !ok && h.Get("Retry-After") != "3600" {
			t.Errorf("exhausted window, at %v: admit = %v, Retry-After %q", c.at, ok, h.Get("Retry-After"))
		}
	}
}

func TestSpikes(t *testing.T) {
	sc, _ := LookupPoolScenario("providers")
	d := sc.Tiers[0][0]
	rng := rand.New(rand.NewPCG(1, 2))
	spikes := drawSpikes(&d, rng, time.Hour)
	// About one spike a minute, merged when they overlap.
	if n := len(spikes); n < 35 || n > 70 {
		t.Fatalf("%d spikes in an hour, want about 55 (60, some merged)", n)
	}
	ds := &depState{cfg: &d, spikes: spikes}
	var in time.Duration
	for i, s := range spikes {
		if s[1]-s[0] < d.SpikeLength || i > 0 && s[0] <= spikes[i-1][1] {
			t.Fatalf("spike %d %v: shorter than %v or overlapping the previous", i, s, d.SpikeLength)
		}
		if !ds.spiking(s[0]) || !ds.spiking(s[1]-1) || ds.spiking(s[1]) || ds.spiking(s[0]-1) {
			t.Fatalf("spiking() wrong at the edges of spike %d %v", i, s)
		}
		in += s[1] - s[0]
	}
	if f := in.Seconds() / 3600; f < 0.08 || f > 0.25 {
		t.Errorf("spiking %.0f%% of the time, want about 15%%", 100*f)
	}
}

func TestSpillReducesRefusals(t *testing.T) {
	sc, _ := LookupPoolScenario("spill")
	rs := runPoolSeeds(t, &sc, 1)
	alone, spill, rr := rs["self-hosted only+cooldown"], rs["spill to provider+cooldown"], rs["round-robin over both+cooldown"]
	if alone.Refused < alone.Requests/20 {
		t.Fatalf("the self-hosted pool alone refused %d of %d: the bursts do not overload it", alone.Refused, alone.Requests)
	}
	if spill.Refused > alone.Refused/20 {
		t.Errorf("spilling refused %d, the self-hosted pool alone %d: want a twentieth at most", spill.Refused, alone.Refused)
	}
	if spill.Offloaded == 0 || spill.Offloaded*2 > rr.Offloaded {
		t.Errorf("spilling sent %d requests to the provider, round robin over both %d: want some, and half at most", spill.Offloaded, rr.Offloaded)
	}
	if spill.MetSLO <= alone.MetSLO {
		t.Errorf("spilling met the SLO for %d requests, the pool alone for %d", spill.MetSLO, alone.MetSLO)
	}
}

func TestSpillComesBack(t *testing.T) {
	sc, _ := LookupPoolScenario("spill")
	reqs := sc.Workload.generate(1)
	run, err := newPoolRun(&sc, sc.Routings[3], 1, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Requests spill during the bursts and shortly after, while the
	// self-hosted queues drain, and not in between.
	in, out := 0, 0
	for _, c := range run.calls {
		if c.dep.tier == 0 {
			continue
		}
		at, burst := reqs[c.req].at, false
		for _, b := range sc.Workload.Bursts {
			burst = burst || at >= b.From && at < b.To+30*time.Second
		}
		if burst {
			in++
		} else {
			out++
		}
	}
	if in == 0 || out*10 > in {
		t.Errorf("%d requests spilled in or just after a burst, %d in between: want most in bursts", in, out)
	}
}

func TestPeakEWMAAvoidsSpikes(t *testing.T) {
	sc, _ := LookupPoolScenario("providers")
	rs := runPoolSeeds(t, &sc, 2)
	for _, cool := range []string{"", "+cooldown"} {
		pe, rr := rs["peak-ewma"+cool], rs["round-robin"+cool]
		fpe := float64(pe.Spiked) / float64(pe.Completed)
		frr := float64(rr.Spiked) / float64(rr.Completed)
		if frr < 0.08 {
			t.Fatalf("round robin%s served %.1f%% during spikes: the spikes do not happen", cool, 100*frr)
		}
		if fpe > 0.85*frr {
			t.Errorf("peak-ewma%s served %.1f%% during spikes, round robin %.1f%%: want at most 85%% of it", cool, 100*fpe, 100*frr)
		}
		if rr.TTFT[len(rr.TTFT)*99/100] <= pe.TTFT[len(pe.TTFT)*99/100] {
			t.Errorf("peak-ewma%s TTFT p99 is not below round robin's", cool)
		}
	}
	// Cooldowns keep requests off the deployments that asked for a wait.
	for _, p := range []string{"round-robin", "least-outstanding", "peak-ewma"} {
		if no, yes := rs[p].Throttled, rs[p+"+cooldown"].Throttled; yes*2 > no {
			t.Errorf("%s: %d 429s with cooldowns, %d without: want half at most", p, yes, no)
		}
	}
}

func TestCooldownCapped(t *testing.T) {
	// The slow deployment runs out of quota from 5 to 7 minutes and asks
	// for an hour's wait; the cooldown, capped at a minute, brings it back.
	sc, _ := LookupPoolScenario("providers")
	reqs := sc.Workload.generate(1)
	rt := PoolRouting{Name: "peak-ewma", Policies: []string{"peak-ewma"}, Cooldown: true}
	run, err := newPoolRun(&sc, rt, 1, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	x := sc.Tiers[0][3].Exhausted
	back := 0
	for _, c := range run.calls {
		if at := reqs[c.req].at; c.dep.cfg.Name == "slow" && at >= x.To && at < x.To+sc.MaxCooldown+10*time.Second {
			back++
		}
	}
	if back == 0 {
		t.Error("the slow deployment served nothing within the cooldown cap after its quota returned")
	}
}

func TestWritePoolTable(t *testing.T) {
	sc, _ := LookupPoolScenario("spill")
	sc.Workload.Duration = time.Minute
	rs, err := RunPool(context.Background(), &sc, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WritePoolTable(&b, &sc, 1, 1, rs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"scenario spill:", "routing", "offload", "TTFT p50", "spill to provider", "\nCompare first"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if _, err := MergePoolResults(rs[0], rs[1]); err == nil {
		t.Error("merging two routings' results: no error")
	}
}
