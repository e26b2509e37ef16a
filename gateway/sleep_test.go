package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/spill"
)

// sleepyBase is a Base in front of emulated engines: it counts the
// completions sent to each, and appends to the /metrics of each
// vllm:engine_sleep_state as vLLM's PrometheusStatLogger writes it
// (vllm/v1/metrics/loggers.py, record_sleep_state): awake 0 and
// weights_offloaded 1 after POST /sleep?level=1, awake 1 after wake_up.
type sleepyBase struct {
	next        *http.Transport
	asleep      map[string]*atomic.Bool  // by base URL
	completions map[string]*atomic.Int64 // by base URL
}

func newSleepyBase(t *testing.T, urls ...string) *sleepyBase {
	b := &sleepyBase{next: defaultBase(), asleep: map[string]*atomic.Bool{}, completions: map[string]*atomic.Int64{}}
	t.Cleanup(b.next.CloseIdleConnections)
	for _, u := range urls {
		b.asleep[u], b.completions[u] = new(atomic.Bool), new(atomic.Int64)
	}
	return b
}

func (b *sleepyBase) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.URL.Scheme + "://" + r.URL.Host
	if r.URL.Path != "/metrics" {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			b.completions[key].Add(1)
		}
		return b.next.RoundTrip(r)
	}
	resp, err := b.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	awake, offloaded := 1, 0
	if b.asleep[key].Load() {
		awake, offloaded = 0, 1
	}
	body = fmt.Appendf(body, "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n"+
		"# TYPE vllm:engine_sleep_state gauge\n"+
		"vllm:engine_sleep_state{engine=\"0\",model_name=\"%[1]s\",sleep_state=\"awake\"} %[2]d.0\n"+
		"vllm:engine_sleep_state{engine=\"0\",model_name=\"%[1]s\",sleep_state=\"weights_offloaded\"} %[3]d.0\n"+
		"vllm:engine_sleep_state{engine=\"0\",model_name=\"%[1]s\",sleep_state=\"discard_all\"} 0.0\n",
		engine.DefaultModel, awake, offloaded)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Del("Content-Length")
	return resp, nil
}

// A replica whose engine is asleep reports no requests, the idlest of
// all; the gateway sends it none while the other is awake, and sends it
// requests again once it wakes.
func TestGatewayAvoidsSleepingEngine(t *testing.T) {
	c, err := e2e.StartCluster(2, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := c.URLs[0], c.URLs[1]
	base := newSleepyBase(t, a, b)
	log, logs := newLogger()
	g, err := New([]string{a, b}, Config{Logger: log, ScrapeInterval: time.Hour, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() {
		t.Helper()
		for _, k := range []string{a, b} {
			if _, err := g.scraper.Scrape(context.Background(), k); err != nil {
				t.Fatal(err)
			}
		}
	}
	send := func(round string, n int) {
		t.Helper()
		for i := range n {
			if code, body, _ := post(t, g, fmt.Sprintf("%s request %d", round, i)); code != http.StatusOK || !strings.Contains(body, "data: [DONE]") {
				t.Fatalf("%s request %d: %d %q", round, i, code, body)
			}
		}
	}
	got := func(key string) int64 { return base.completions[key].Load() }
	endpoint := func(key string) DebugEndpoint {
		t.Helper()
		for _, e := range g.State().Endpoints {
			if e.Key == key {
				return e
			}
		}
		t.Fatalf("no endpoint %s in the debug view", key)
		return DebugEndpoint{}
	}

	// a sleeps: every request goes to b.
	base.asleep[a].Store(true)
	scrape()
	if e := endpoint(a); !e.Asleep || e.Healthy {
		t.Errorf("sleeping replica in the debug view: asleep %v, healthy %v; want asleep and not healthy", e.Asleep, e.Healthy)
	}
	if e := endpoint(b); e.Asleep || !e.Healthy {
		t.Errorf("awake replica in the debug view: asleep %v, healthy %v", e.Asleep, e.Healthy)
	}
	send("a asleep", 10)
	if n := got(a); n != 0 {
		t.Errorf("the sleeping replica got %d of 10 requests, want none", n)
	}
	if n := got(b); n != 10 {
		t.Errorf("the awake replica got %d of 10 requests, want all", n)
	}
	if n := len(logs.records(t, "gateway: engine asleep, not picked while another replica is awake")); n != 1 {
		t.Errorf("the sleep was logged %d times, want once", n)
	}

	// a wakes and b sleeps: every request goes to a.
	base.asleep[a].Store(false)
	base.asleep[b].Store(true)
	scrape()
	if e := endpoint(a); e.Asleep || !e.Healthy {
		t.Errorf("woken replica in the debug view: asleep %v, healthy %v", e.Asleep, e.Healthy)
	}
	send("b asleep", 10)
	if n := got(a); n != 10 {
		t.Errorf("the woken replica got %d of 10 requests, want all", n)
	}
	if n := got(b); n != 10 {
		t.Errorf("the replica that went to sleep got %d more requests, want none", n-10)
	}

	// Both asleep: the requests are still served, by one of them, rather
	// than refused (vLLM holds them until it wakes).
	base.asleep[a].Store(true)
	scrape()
	send("both asleep", 2)
	if n := got(a) + got(b); n != 22 {
		t.Errorf("%d requests reached the replicas, want 22", n)
	}

	// Both awake: both healthy again.
	base.asleep[a].Store(false)
	base.asleep[b].Store(false)
	scrape()
	for _, k := range []string{a, b} {
		if e := endpoint(k); e.Asleep || !e.Healthy {
			t.Errorf("%s awake: asleep %v, healthy %v", k, e.Asleep, e.Healthy)
		}
	}
}

// The ejector and the sleep state mark the balancer without undoing each
// other: a replica is healthy again only when neither keeps it out.
func TestHealthEjectionAndSleep(t *testing.T) {
	b, err := llmlb.New(llmlb.RoundRobin())
	if err != nil {
		t.Fatal(err)
	}
	eps, err := httplb.NewEndpoints("http://a", "http://b")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	h := newHealth(b)
	healthy := func(key string) bool {
		for _, s := range b.Stats() {
			if s.Key == key {
				return s.Healthy
			}
		}
		t.Fatalf("no endpoint %s", key)
		return false
	}
	const a = "http://a"

	// Ejected, then asleep; the ejection ends first.
	if err := h.SetHealthy(a, false); err != nil {
		t.Fatal(err)
	}
	h.setAsleep(a, true)
	if err := h.SetHealthy(a, true); err != nil {
		t.Fatal(err)
	}
	if healthy(a) {
		t.Error("the end of an ejection marked a sleeping replica healthy")
	}
	h.setAsleep(a, false)
	if !healthy(a) {
		t.Error("a replica neither ejected nor asleep is not healthy")
	}

	// Asleep, then ejected; it wakes first.
	h.setAsleep(a, true)
	if err := h.SetHealthy(a, false); err != nil {
		t.Fatal(err)
	}
	h.setAsleep(a, false)
	if healthy(a) {
		t.Error("waking marked an ejected replica healthy")
	}
	if err := h.SetHealthy(a, true); err != nil {
		t.Fatal(err)
	}
	if !healthy(a) {
		t.Error("a replica neither ejected nor asleep is not healthy")
	}

	// Only changes mark: a mark of the caller's own stands until then.
	if err := b.SetHealthy(a, false); err != nil {
		t.Fatal(err)
	}
	h.setAsleep(a, false)
	if healthy(a) {
		t.Error("an unchanged sleep state overwrote the caller's mark")
	}
	if err := b.SetHealthy(a, true); err != nil {
		t.Fatal(err)
	}

	// A key that is not a member is refused and forgotten; members that
	// leave are forgotten.
	if h.setAsleep("http://c", true) || h.isAsleep("http://c") {
		t.Error("a non-member is held as asleep")
	}
	if err := h.SetHealthy("http://c", false); err == nil {
		t.Error("SetHealthy of a non-member succeeded")
	}
	h.setAsleep(a, true)
	h.retain(map[string]string{"http://b": ""})
	if h.isAsleep(a) || len(h.asleep) != 0 || len(h.ejected) != 0 || len(h.marked) != 0 {
		t.Errorf("state of departed replicas kept: asleep %v, ejected %v, marked %v", h.asleep, h.ejected, h.marked)
	}
}

// A replica the program marked unhealthy on the balancer stays so when an
// ejection or a sleep of it ends: the gateway marks healthy again only the
// replicas it marked unhealthy itself.
func TestHealthKeepsProgramMark(t *testing.T) {
	b, err := llmlb.New(llmlb.RoundRobin())
	if err != nil {
		t.Fatal(err)
	}
	eps, err := httplb.NewEndpoints("http://a", "http://b")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	h := newHealth(b)
	const a = "http://a"
	healthy := func() bool {
		s, ok := b.StatsOf(a)
		if !ok {
			t.Fatalf("no endpoint %s", a)
		}
		return s.Healthy
	}
	cases := []struct {
		name      string
		out, back func() error
	}{
		{"ejection", func() error { return h.SetHealthy(a, false) }, func() error { return h.SetHealthy(a, true) }},
		{"sleep", func() error { h.setAsleep(a, true); return nil }, func() error { h.setAsleep(a, false); return nil }},
	}
	for _, test := range cases {
		t.Run(test.name, func(t *testing.T) {
			if err := b.SetHealthy(a, false); err != nil {
				t.Fatal(err)
			}
			if err := test.out(); err != nil {
				t.Fatal(err)
			}
			if err := test.back(); err != nil {
				t.Fatal(err)
			}
			if healthy() {
				t.Error("the end of the gateway's hold marked healthy a replica the program marked unhealthy")
			}
			// Once the program lets it back in, the gateway's own holds
			// mark it as before.
			if err := b.SetHealthy(a, true); err != nil {
				t.Fatal(err)
			}
			if err := test.out(); err != nil {
				t.Fatal(err)
			}
			if healthy() {
				t.Error("the gateway's hold did not mark the replica unhealthy")
			}
			if err := test.back(); err != nil {
				t.Fatal(err)
			}
			if !healthy() {
				t.Error("the end of the gateway's hold did not mark the replica healthy")
			}
		})
	}
}

// With SpillTo, a tier whose replicas all sleep is not ready: requests
// spill to the next tier rather than wait on a sleeping replica, until a
// replica wakes. A tier whose replicas are each held out, one asleep and
// one cooling down, is not ready either.
func TestGatewaySpillsPastSleepingReplicas(t *testing.T) {
	c, err := e2e.StartCluster(3, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := c.URLs[0], c.URLs[1]
	base := newSleepyBase(t, a, b)
	next, err := New(c.URLs[2:], Config{ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer next.transport.CloseIdleConnections()
	log, _ := newLogger()
	g, err := New([]string{a, b}, Config{Logger: log, ScrapeInterval: time.Hour, Base: base, Name: "local",
		SpillTo: []spill.Tier{next.Tier("next")}})
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() {
		t.Helper()
		for _, k := range []string{a, b} {
			if _, err := g.scraper.Scrape(context.Background(), k); err != nil {
				t.Fatal(err)
			}
		}
	}
	send := func(wantFrom string) {
		t.Helper()
		code, body, h := post(t, g, "spill past sleep")
		if code != http.StatusOK || !strings.Contains(body, "data: [DONE]") || h.Get(spill.DefaultHeader) != wantFrom {
			t.Fatalf("%d, spilled from %q, want %q: %q", code, h.Get(spill.DefaultHeader), wantFrom, body)
		}
	}
	local := func() int64 { return base.completions[a].Load() + base.completions[b].Load() }

	// One asleep: the other serves.
	base.asleep[a].Store(true)
	scrape()
	send("")
	if n := local(); n != 1 {
		t.Fatalf("%d requests reached the tier's replicas, want 1", n)
	}

	// Both asleep: the tier is not ready until the next scrape, and the
	// request spills without reaching them.
	base.asleep[b].Store(true)
	scrape()
	if ok, wait := g.ready(); ok || wait != time.Hour {
		t.Errorf("every replica asleep: ready() = %v, %v; want false, the scrape interval", ok, wait)
	}
	send("local")
	if n := local(); n != 1 {
		t.Errorf("%d requests reached the sleeping replicas, want none", n-1)
	}

	// a asleep, b cooling down: held out both, the tier is not ready
	// until b's cooldown ends, before the next scrape.
	base.asleep[b].Store(false)
	scrape()
	g.ejector.Report(b, &retry.StatusError{Code: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"60"}}})
	if st := g.State(); !slices.Equal(st.Cooling, []string{b}) {
		t.Fatalf("cooling %v, want %s", st.Cooling, b)
	}
	if ok, wait := g.ready(); ok || wait <= 0 || wait > time.Minute {
		t.Errorf("one replica asleep, one cooling: ready() = %v, %v; want false, b's cooldown", ok, wait)
	}
	send("local")

	// a wakes: the tier is ready again and serves.
	base.asleep[a].Store(false)
	scrape()
	if ok, _ := g.ready(); !ok {
		t.Error("not ready with a replica awake")
	}
	send("")
	if n := local(); n != 2 {
		t.Errorf("%d requests reached the tier's replicas, want 2", n)
	}
	g.transport.CloseIdleConnections()
}

// With SpillTo, a tier whose replicas the program all marked unhealthy on
// Gateway.Balancer is not ready: requests spill past it rather than go to
// replicas taken out of service, until the program marks one healthy. A
// program's mark on one replica and an ejection of the other hold the tier
// out until the ejection ends.
func TestGatewaySpillsPastProgramMarks(t *testing.T) {
	c, err := e2e.StartCluster(3, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := c.URLs[0], c.URLs[1]
	base := newSleepyBase(t, a, b)
	next, err := New(c.URLs[2:], Config{ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer next.transport.CloseIdleConnections()
	log, _ := newLogger()
	g, err := New([]string{a, b}, Config{Logger: log, ScrapeInterval: -1, Base: base, Name: "local",
		SpillTo: []spill.Tier{next.Tier("next")}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	send := func(wantFrom string) {
		t.Helper()
		code, body, h := post(t, g, "spill past marks")
		if code != http.StatusOK || !strings.Contains(body, "data: [DONE]") || h.Get(spill.DefaultHeader) != wantFrom {
			t.Fatalf("%d, spilled from %q, want %q: %q", code, h.Get(spill.DefaultHeader), wantFrom, body)
		}
	}
	local := func() int64 { return base.completions[a].Load() + base.completions[b].Load() }
	mark := func(key string, healthy bool) {
		t.Helper()
		if err := g.Balancer().SetHealthy(key, healthy); err != nil {
			t.Fatal(err)
		}
	}

	// One marked: the tier is ready and the other serves.
	mark(a, false)
	if ok, _ := g.ready(); !ok {
		t.Error("one replica marked unhealthy: not ready")
	}
	send("")
	if n := local(); n != 1 {
		t.Fatalf("%d requests reached the tier's replicas, want 1", n)
	}

	// Both marked: not ready, with no time of the gateway's own to wait,
	// and the request spills without reaching them.
	mark(b, false)
	if ok, wait := g.ready(); ok || wait != 0 {
		t.Errorf("every replica marked unhealthy: ready() = %v, %v; want false, 0", ok, wait)
	}
	send("local")
	if n := local(); n != 1 {
		t.Errorf("%d requests reached the replicas marked unhealthy, want none", n-1)
	}

	// b cooling down, a marked: not ready until b's cooldown ends.
	mark(b, true)
	g.ejector.Report(b, &retry.StatusError{Code: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"60"}}})
	if st := g.State(); !slices.Equal(st.Cooling, []string{b}) {
		t.Fatalf("cooling %v, want %s", st.Cooling, b)
	}
	if ok, wait := g.ready(); ok || wait <= 0 || wait > time.Minute {
		t.Errorf("one replica marked, one cooling: ready() = %v, %v; want false, b's cooldown", ok, wait)
	}
	send("local")

	// The program lets a back in: the tier is ready and serves.
	mark(a, true)
	if ok, _ := g.ready(); !ok {
		t.Error("not ready with a replica marked healthy")
	}
	send("")
	if n := local(); n != 2 {
		t.Errorf("%d requests reached the tier's replicas, want 2", n)
	}
}
