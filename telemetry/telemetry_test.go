package telemetry_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/spill"
	"github.com/llmlb/llmlb/telemetry"
)

type ep string

func (e ep) Key() string { return string(e) }

// fakeClock advances only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// staticSignal reports one observation per endpoint.
type staticSignal map[string]llmlb.Load

func (s staticSignal) Load(key string) (llmlb.Load, bool) {
	l, ok := s[key]
	return l, ok
}

func setup(t *testing.T) (*telemetry.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := telemetry.New(mp, telemetry.Config{
		Policy:     "round-robin",
		Attributes: []attribute.KeyValue{attribute.String("gen_ai.request.model", "m")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, reader
}

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != telemetry.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, telemetry.ScopeName)
		}
		for _, mm := range sm.Metrics {
			out[mm.Name] = mm.Data
		}
	}
	return out
}

// attrs renders a data point's attributes as a map.
func attrs(s attribute.Set) map[string]string {
	m := map[string]string{}
	for _, kv := range s.ToSlice() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// sums returns a counter's or gauge's values by the given attribute.
func sums(t *testing.T, data map[string]metricdata.Aggregation, name string, by attribute.Key) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	var points []metricdata.DataPoint[int64]
	switch d := data[name].(type) {
	case metricdata.Sum[int64]:
		points = d.DataPoints
	case metricdata.Gauge[int64]:
		points = d.DataPoints
	default:
		t.Fatalf("%s: no int64 sum or gauge (got %T)", name, data[name])
	}
	for _, p := range points {
		a := attrs(p.Attributes)
		if a["gen_ai.request.model"] != "m" {
			t.Errorf("%s: point %v lacks the configured attribute", name, a)
		}
		out[a[string(by)]] += p.Value
	}
	return out
}

// histogram returns a histogram's points by the given attribute.
func histogram[N int64 | float64](t *testing.T, data map[string]metricdata.Aggregation, name string, by attribute.Key) map[string]metricdata.HistogramDataPoint[N] {
	t.Helper()
	d, ok := data[name].(metricdata.Histogram[N])
	if !ok {
		t.Fatalf("%s: no histogram (got %T)", name, data[name])
	}
	out := map[string]metricdata.HistogramDataPoint[N]{}
	for _, p := range d.DataPoints {
		out[attrs(p.Attributes)[string(by)]] = p
	}
	return out
}

func TestBalancerInstruments(t *testing.T) {
	m, reader := setup(t)
	clk := &fakeClock{now: time.Unix(1000, 0)}
	sig := staticSignal{"a": {Running: 1, At: clk.now.Add(-2 * time.Second)}}
	b, err := llmlb.New(llmlb.RoundRobin(),
		llmlb.WithObserver(m.Observer()), llmlb.WithClock(clk),
		llmlb.WithRand(rand.NewPCG(1, 2)), llmlb.WithSignal(sig, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Watch(b); err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{ep("a"), ep("b")}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	byKey := map[string]llmlb.Pick{}
	for range 2 {
		p, err := b.Pick(ctx, &llmlb.Request{PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		byKey[p.Endpoint().Key()] = p
	}
	if len(byKey) != 2 {
		t.Fatalf("round robin picked %d distinct endpoints of 2", len(byKey))
	}
	if _, err := b.Pick(ctx, &llmlb.Request{Exclude: []string{"a", "b"}}); !errors.Is(err, llmlb.ErrNoCandidates) {
		t.Fatalf("pick excluding everything: %v", err)
	}

	// Mid-flight: both outstanding and queued, the gauges say so.
	data := collect(t, reader)
	if got := sums(t, data, telemetry.MetricOutstanding, telemetry.AttrEndpoint); got["a"] != 1 || got["b"] != 1 {
		t.Errorf("outstanding = %v, want a:1 b:1", got)
	}
	if got := sums(t, data, telemetry.MetricQueued, telemetry.AttrEndpoint); got["a"] != 1 || got["b"] != 1 {
		t.Errorf("queued = %v, want a:1 b:1", got)
	}
	if got := sums(t, data, telemetry.MetricPrefillTokens, telemetry.AttrEndpoint); got["a"] != 100 || got["b"] != 100 {
		t.Errorf("prefill tokens = %v, want 100 each", got)
	}
	if got := sums(t, data, telemetry.MetricDecodeTokens, telemetry.AttrEndpoint); got["a"] != llmlb.DefaultDecodeAllowance {
		t.Errorf("decode tokens = %v, want %d on a", got, llmlb.DefaultDecodeAllowance)
	}
	if got := sums(t, data, telemetry.MetricHealthy, telemetry.AttrEndpoint); got["a"] != 1 || got["b"] != 1 {
		t.Errorf("healthy = %v", got)
	}

	clk.Add(300 * time.Millisecond)
	byKey["a"].FirstToken()
	clk.Add(700 * time.Millisecond)
	byKey["a"].Done(nil)
	byKey["b"].Done(context.Canceled)
	byKey["a"].Done(nil) // a second Done records nothing
	// The decode endpoint of a request prefilled on another has no time to
	// first token of its own.
	m.Observer().FirstToken(llmlb.FirstTokenInfo{Endpoint: ep("b"), Latency: time.Millisecond, Transferred: true})

	data = collect(t, reader)
	picks := sums(t, data, telemetry.MetricPicks, telemetry.AttrEndpoint)
	if picks["a"] != 1 || picks["b"] != 1 {
		t.Errorf("picks by endpoint = %v", picks)
	}
	if got := sums(t, data, telemetry.MetricPicks, telemetry.AttrErrorType); got["no_candidates"] != 1 {
		t.Errorf("failed picks by error type = %v", got)
	}
	if got := sums(t, data, telemetry.MetricPicks, telemetry.AttrPolicy); got["round-robin"] != 3 {
		t.Errorf("picks by policy = %v", got)
	}
	ttft := histogram[float64](t, data, telemetry.MetricTimeToFirstToken, telemetry.AttrEndpoint)
	if p := ttft["a"]; p.Count != 1 || p.Sum != 0.3 {
		t.Errorf("time to first token on a: count %d sum %v, want 1 and 0.3", p.Count, p.Sum)
	}
	if _, ok := ttft["b"]; ok {
		t.Error("b never streamed but has a time to first token")
	}
	dur := histogram[float64](t, data, telemetry.MetricRequestDuration, telemetry.AttrErrorType)
	if p := dur[""]; p.Count != 1 || p.Sum != 1 {
		t.Errorf("successful durations: count %d sum %v, want 1 and 1", p.Count, p.Sum)
	}
	if p := dur["canceled"]; p.Count != 1 {
		t.Errorf("canceled durations: count %d, want 1", p.Count)
	}
	cached := histogram[int64](t, data, telemetry.MetricCachedTokens, telemetry.AttrEndpoint)
	if cached["a"].Count != 1 || cached["b"].Count != 1 {
		t.Errorf("cached-token histogram counts: a %d, b %d", cached["a"].Count, cached["b"].Count)
	}
	age := histogram[float64](t, data, telemetry.MetricSignalAge, telemetry.AttrEndpoint)
	if p := age["a"]; p.Count != 1 || p.Sum != 2 {
		t.Errorf("signal age on a: count %d sum %v, want 1 and 2", p.Count, p.Sum)
	}
	if _, ok := age["b"]; ok {
		t.Error("b has no observation but has a signal age")
	}
	if got := sums(t, data, telemetry.MetricOutstanding, telemetry.AttrEndpoint); got["a"] != 0 || got["b"] != 0 {
		t.Errorf("outstanding after Done = %v, want 0", got)
	}
}

// oneRetry is a budget that grants one retry.
type oneRetry struct{ granted bool }

func (b *oneRetry) Start() {}

func (b *oneRetry) Withdraw() bool {
	ok := !b.granted
	b.granted = true
	return ok
}

func (b *oneRetry) Finish(bool, retry.Outcome) {}

func TestRetryInstruments(t *testing.T) {
	m, reader := setup(t)
	obs := m.RetryObserver()
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithRand(rand.NewPCG(3, 4)))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{ep("a"), ep("b"), ep("c")}); err != nil {
		t.Fatal(err)
	}
	immediate := func(time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
	loop, err := retry.NewLoop(b, retry.LoopConfig{Observer: obs, After: immediate, MaxAttempts: 3, Budget: &oneRetry{}})
	if err != nil {
		t.Fatal(err)
	}
	// Two failures: the first is retried, the budget refuses the second.
	fail := &retry.StatusError{Code: 503}
	err = loop.Do(context.Background(), &llmlb.Request{}, func(context.Context, *retry.Attempt) error { return fail })
	if !errors.Is(err, retry.ErrExhausted) {
		t.Fatalf("Do: %v", err)
	}

	adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 2, MaxPerSession: 1, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := adm.Acquire("s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adm.Acquire("s"); !errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("second request of a session: %v", err)
	}
	rel2, err := adm.Acquire("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adm.Acquire("u"); !errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("third request in flight: %v", err)
	}
	rel()
	rel2()

	// A hedge: the first attempt never starts streaming, the hedge does.
	hedging, err := retry.NewLoop(b, retry.LoopConfig{Observer: obs, After: immediate, MaxAttempts: 2,
		Budget: &oneRetry{}, Hedge: retry.HedgeConfig{Delay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	err = hedging.Do(context.Background(), &llmlb.Request{}, func(ctx context.Context, a *retry.Attempt) error {
		if !a.Hedge() {
			<-ctx.Done() // cancelled when the hedge wins
			return ctx.Err()
		}
		a.FirstToken()
		return nil
	})
	if err != nil {
		t.Fatalf("hedged Do: %v", err)
	}

	// An ejection: five failures in a row.
	ej, err := retry.NewEjector(b, retry.EjectorConfig{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	for range retry.DefaultConsecutiveFailures {
		ej.Report("a", fail)
	}
	if got := ej.Ejected(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("ejected %v, want [a]", got)
	}
	// A cooldown: a 429 asking for a wait.
	ej.Report("b", &retry.StatusError{Code: 429, Header: http.Header{"Retry-After": {"3"}}})

	// A probe, as package httplb reports one.
	obs.Probe(2, &retry.StatusError{Code: http.StatusNotFound})

	data := collect(t, reader)
	one := func(name string) {
		t.Helper()
		if got := sums(t, data, name, telemetry.AttrPolicy); got["round-robin"] != 1 {
			t.Errorf("%s = %v, want 1", name, got)
		}
	}
	one(telemetry.MetricRetries)
	one(telemetry.MetricProbes)
	one(telemetry.MetricBudgetExhausted)
	one(telemetry.MetricHedges)
	if got := sums(t, data, telemetry.MetricCooldowns, telemetry.AttrEndpoint); got["b"] != 1 {
		t.Errorf("cooldowns = %v, want b:1", got)
	}
	if got := sums(t, data, telemetry.MetricEjections, telemetry.AttrEndpoint); got["a"] != 1 {
		t.Errorf("ejections = %v, want a:1", got)
	}
	if got := sums(t, data, telemetry.MetricAdmissionRejected, telemetry.AttrScope); got["global"] != 1 || got["session"] != 1 {
		t.Errorf("admission rejections = %v, want global:1 session:1", got)
	}
}

// A fair queue's admissions, refusals and state reach their instruments,
// by class and reason.
func TestQueueInstruments(t *testing.T) {
	m, reader := setup(t)
	clk := &fakeClock{}
	q, err := fair.New(fair.Config{MaxInFlight: 1, MaxWaiting: 1, Observer: m.QueueObserver(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := m.WatchQueue(q)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	ctx := context.Background()
	running, err := q.Admit(ctx, fair.Request{Principal: "a", PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan *fair.Ticket)
	go func() {
		tk, err := q.Admit(ctx, fair.Request{Principal: "b", Class: fair.Batch, PromptTokens: 10})
		if err != nil {
			t.Error(err)
		}
		waiting <- tk
	}()
	for q.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	// The queue is full of a batch waiter: a batch arrival is refused.
	if _, err := q.Admit(ctx, fair.Request{Principal: "c", Class: fair.Batch}); !errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("a batch arrival into a full queue: %v", err)
	}
	data := collect(t, reader)
	gauge := func(name string, want int64) {
		t.Helper()
		if got := sums(t, data, name, telemetry.AttrPolicy); got["round-robin"] != want {
			t.Errorf("%s = %v, want %d", name, got, want)
		}
	}
	gauge(telemetry.MetricQueueWaiting, 1)
	gauge(telemetry.MetricQueueInFlight, 1)
	gauge(telemetry.MetricQueueTokens, 100)

	clk.Add(2 * time.Second)
	running.Done()
	(<-waiting).Done()
	data = collect(t, reader)
	gauge(telemetry.MetricQueueWaiting, 0)
	gauge(telemetry.MetricQueueInFlight, 0)
	if got := sums(t, data, telemetry.MetricQueueRefusals, telemetry.AttrReason); len(got) != 1 || got[string(fair.ReasonFull)] != 1 {
		t.Errorf("refusals by reason = %v, want full:1", got)
	}
	if got := sums(t, data, telemetry.MetricQueueRefusals, telemetry.AttrClass); len(got) != 1 || got["batch"] != 1 {
		t.Errorf("refusals by class = %v, want batch:1", got)
	}
	waits := histogram[float64](t, data, telemetry.MetricQueueWait, telemetry.AttrClass)
	if p := waits["standard"]; p.Count != 1 || p.Sum != 0 {
		t.Errorf("standard waits: %d, sum %v s; want one of 0 s", p.Count, p.Sum)
	}
	if p := waits["batch"]; p.Count != 1 || p.Sum != 2 {
		t.Errorf("batch waits: %d, sum %v s; want one of 2 s", p.Count, p.Sum)
	}
	if _, err := m.WatchQueue(nil); !errors.Is(err, telemetry.ErrInvalidConfig) {
		t.Errorf("WatchQueue(nil): %v, want ErrInvalidConfig", err)
	}
}

func TestSpillInstrument(t *testing.T) {
	m, reader := setup(t)
	obs := m.SpillObserver()
	obs(spill.Event{From: "ptu", To: "paygo", Reason: spill.Throttled})
	obs(spill.Event{From: "ptu", To: "paygo", Reason: spill.Throttled})
	obs(spill.Event{From: "ptu", To: "paygo", Reason: spill.Cooling})
	data := collect(t, reader)
	if got := sums(t, data, telemetry.MetricSpillovers, telemetry.AttrSpillReason); got["throttled"] != 2 || got["cooling"] != 1 {
		t.Errorf("spillovers by reason = %v, want throttled:2 cooling:1", got)
	}
	if got := sums(t, data, telemetry.MetricSpillovers, telemetry.AttrSpillFrom); got["ptu"] != 3 {
		t.Errorf("spillovers by tier = %v, want ptu:3", got)
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := telemetry.New(nil, telemetry.Config{}); !errors.Is(err, telemetry.ErrInvalidConfig) {
		t.Errorf("New(nil): %v, want ErrInvalidConfig", err)
	}
	var typedNil *sdkmetric.MeterProvider
	if _, err := telemetry.New(typedNil, telemetry.Config{}); !errors.Is(err, telemetry.ErrInvalidConfig) {
		t.Errorf("New of a nil *MeterProvider: %v, want ErrInvalidConfig", err)
	}
	m, _ := setup(t)
	if _, err := m.Watch(nil); !errors.Is(err, telemetry.ErrInvalidConfig) {
		t.Errorf("Watch(nil): %v, want ErrInvalidConfig", err)
	}
}

func TestErrorType(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{llmlb.ErrNoEndpoints, "no_endpoints"},
		{llmlb.ErrNoCandidates, "no_candidates"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{&retry.OverloadError{Scope: "global"}, "overloaded"},
		{errors.New("dial tcp 10.0.0.7:8000: connection refused"), "error"},
	}
	for _, c := range cases {
		if got := telemetry.ErrorType(c.err); got != c.want {
			t.Errorf("ErrorType(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// Recording a request, failed or not, allocates nothing once its endpoint
// and error type have been seen.
func TestRecordDoesNotAllocate(t *testing.T) {
	m, _ := setup(t)
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithObserver(m.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{ep("a")}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := &llmlb.Request{PromptTokens: 10}
	for _, doneErr := range []error{nil, context.Canceled} {
		run := func() {
			p, err := b.Pick(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			p.FirstToken()
			p.Done(doneErr)
		}
		run() // the first sees the endpoint and the error type
		if n := testing.AllocsPerRun(200, run); n != 0 {
			t.Errorf("Pick, FirstToken and Done(%v) with metrics: %v allocs, want 0", doneErr, n)
		}
	}
}
