package telemetry

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/spill"
)

// ScopeName is the instrumentation scope of the meter this package creates.
const ScopeName = "github.com/llmlb/llmlb/telemetry"

// Instrument names. The two gen_ai names and their bucket boundaries follow
// the OpenTelemetry semantic conventions for generative AI model servers; a
// gateway is a model server to its clients. The others are llmlb's own.
const (
	MetricPicks             = "llmlb.picks"
	MetricCachedTokens      = "llmlb.pick.cached_tokens"
	MetricSignalAge         = "llmlb.signal.age"
	MetricTimeToFirstToken  = "gen_ai.server.time_to_first_token"
	MetricRequestDuration   = "gen_ai.server.request.duration"
	MetricOutstanding       = "llmlb.endpoint.outstanding"
	MetricQueued            = "llmlb.endpoint.queued"
	MetricPrefillTokens     = "llmlb.endpoint.prefill_tokens"
	MetricDecodeTokens      = "llmlb.endpoint.decode_tokens"
	MetricHealthy           = "llmlb.endpoint.healthy"
	MetricRetries           = "llmlb.retries"
	MetricProbes            = "llmlb.probes"
	MetricHedges            = "llmlb.hedges"
	MetricBudgetExhausted   = "llmlb.retry.budget_exhausted"
	MetricEjections         = "llmlb.ejections"
	MetricCooldowns         = "llmlb.cooldowns"
	MetricAdmissionRejected = "llmlb.admission.rejections"
	MetricQueueWait         = "llmlb.queue.wait"
	MetricQueueRefusals     = "llmlb.queue.refusals"
	MetricQueueWaiting      = "llmlb.queue.waiting"
	MetricQueueInFlight     = "llmlb.queue.in_flight"
	MetricQueueTokens       = "llmlb.queue.tokens_in_flight"
	MetricSpillovers        = "llmlb.spillovers"
)

// Attribute keys.
const (
	// AttrEndpoint is the endpoint's key ([llmlb.Endpoint.Key]). Invalid
	// UTF-8 in a key is replaced with U+FFFD, and a key longer than 256
	// bytes is cut to at most 256; either ends with "~" and 16 hex digits
	// of the key's hash, so that any key exports and two keys stay two
	// series (the same holds for error types, spill tiers and reasons).
	AttrEndpoint = attribute.Key("llmlb.endpoint")
	// AttrPolicy is [Config.Policy].
	AttrPolicy = attribute.Key("llmlb.policy")
	// AttrScope is the cap that refused a request: "global" or "session".
	AttrScope = attribute.Key("llmlb.admission.scope")
	// AttrErrorType is the OpenTelemetry error.type attribute.
	AttrErrorType = attribute.Key("error.type")
	// AttrClass is a fair queue's priority class: "interactive",
	// "standard" or "batch" ([fair.Class.String]).
	AttrClass = attribute.Key("llmlb.queue.class")
	// AttrReason is why a fair queue refused a request: "full",
	// "principal", "shed" or "deadline" ([fair.Reason]).
	AttrReason = attribute.Key("llmlb.queue.reason")
	// AttrSpillFrom, AttrSpillTo and AttrSpillReason are a spill's tiers
	// and reason ([spill.Event]).
	AttrSpillFrom   = attribute.Key("llmlb.spill.from")
	AttrSpillTo     = attribute.Key("llmlb.spill.to")
	AttrSpillReason = attribute.Key("llmlb.spill.reason")
)

// ErrInvalidConfig: [New] was given a nil MeterProvider (or a nil pointer
// to one), or one whose meter is nil or creates a nil instrument or
// callback registration with no error, or [Metrics.Watch] or
// [Metrics.WatchQueue] a nil source. Errors of the OpenTelemetry API
// creating an instrument are returned as they are, wrapped with the
// package's name.
var ErrInvalidConfig = errors.New("telemetry: invalid config")

// The classes and refusal reasons of a fair queue, in the order of their
// precomputed attribute sets.
var (
	queueClasses = [...]fair.Class{fair.Interactive, fair.Standard, fair.Batch}
	queueReasons = [...]fair.Reason{fair.ReasonFull, fair.ReasonPrincipal, fair.ReasonShed, fair.ReasonDeadline}
)

// Bucket boundaries of the histograms. The time-to-first-token and duration
// boundaries are the semantic conventions' advice.
var (
	ttftBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBuckets    = []float64{0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576}
	ageBuckets      = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}
	waitBuckets     = []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

// maxCachedEndpoints bounds the per-endpoint attribute sets kept; past it the
// cache starts afresh, so endpoint churn never grows memory.
const maxCachedEndpoints = 4096

// maxErrorTypes bounds the error types whose attribute sets are kept.
const maxErrorTypes = 64

// Config configures [New]. The zero value is valid.
type Config struct {
	// Policy names the balancer's policy in the llmlb.policy attribute of
	// the balancer's instruments; "" omits the attribute.
	Policy string
	// Attributes are added to every measurement, for example the model
	// (gen_ai.request.model) or the gateway replica.
	Attributes []attribute.KeyValue
	// ErrorType maps a failed request's or pick's error to the error.type
	// attribute, which must have few distinct values; nil means
	// [ErrorType].
	ErrorType func(error) string
}

// Metrics records a balancer's and the retry components' events as
// OpenTelemetry instruments. Create one with [New], pass [Metrics.Observer]
// to [llmlb.WithObserver] and [Metrics.RetryObserver] to the retry
// components, and call [Metrics.Watch] to report the balancer's load. A
// Metrics is safe for concurrent use.
type Metrics struct {
	errorType func(error) string
	base      []attribute.KeyValue // Config.Attributes and the policy
	baseOpt   metric.MeasurementOption

	picks     metric.Int64Counter
	cached    metric.Int64Histogram
	sigAge    metric.Float64Histogram
	ttft      metric.Float64Histogram
	duration  metric.Float64Histogram
	retries   metric.Int64Counter
	probes    metric.Int64Counter
	hedges    metric.Int64Counter
	exhausted metric.Int64Counter
	ejections metric.Int64Counter
	cooldowns metric.Int64Counter
	rejected  metric.Int64Counter
	qwait     metric.Float64Histogram
	qrefused  metric.Int64Counter
	spills    metric.Int64Counter

	outstanding metric.Int64ObservableUpDownCounter
	queued      metric.Int64ObservableUpDownCounter
	prefill     metric.Int64ObservableUpDownCounter
	decode      metric.Int64ObservableUpDownCounter
	healthy     metric.Int64ObservableGauge
	qwaiting    metric.Int64ObservableUpDownCounter
	qinflight   metric.Int64ObservableUpDownCounter
	qtokens     metric.Int64ObservableUpDownCounter
	meter       metric.Meter

	endpoints sync.Map     // endpoint key -> *endpointAttrs
	cachedN   atomic.Int64 // entries in endpoints
	errSets   sync.Map     // error type -> metric.MeasurementOption
	errSetsN  atomic.Int64 // entries in errSets
	spillSets sync.Map     // spill.Event -> []metric.AddOption
	spillN    atomic.Int64 // entries in spillSets
	scopes    [2]metric.MeasurementOption
	classes   [len(queueClasses)][]metric.RecordOption                 // by class
	refusals  [len(queueClasses)][len(queueReasons)][]metric.AddOption // by class and reason

	regMu  sync.Mutex          // protects qreg; serializes WatchQueue and its Unregister
	qreg   metric.Registration // the callback reading queues, while any is watched
	qmu    sync.Mutex          // protects queues
	queues map[*fair.Queue]int // the queues watched: their registrations

	observer      llmlb.Observer
	retryObserver retry.Observer
	queueObserver fair.Observer
}

// endpointAttrs holds the precomputed attribute options of one endpoint, so
// recording allocates nothing.
type endpointAttrs struct {
	opt metric.MeasurementOption
	add []metric.AddOption
	rec []metric.RecordOption

	failed  sync.Map     // error type -> []metric.RecordOption of failed requests
	failedN atomic.Int64 // entries stored in failed
}

// New returns Metrics that create their instruments with a meter from mp,
// or an error if an instrument cannot be created.
func New(mp metric.MeterProvider, cfg Config) (*Metrics, error) {
	if isNil(mp) {
		// A nil pointer in the interface, such as a *sdkmetric.MeterProvider
		// not yet made, would panic inside OpenTelemetry.
		return nil, fmt.Errorf("%w: nil MeterProvider", ErrInvalidConfig)
	}
	m := &Metrics{errorType: cfg.ErrorType}
	if m.errorType == nil {
		m.errorType = ErrorType
	}
	m.base = append(m.base, cfg.Attributes...)
	if cfg.Policy != "" {
		m.base = append(m.base, AttrPolicy.String(cfg.Policy))
	}
	m.baseOpt = metric.WithAttributeSet(attribute.NewSet(m.base...))
	for i, s := range [2]string{"global", "session"} {
		m.scopes[i] = m.with(AttrScope.String(s))
	}
	for i, c := range queueClasses {
		m.classes[i] = []metric.RecordOption{m.with(AttrClass.String(c.String()))}
		for j, r := range queueReasons {
			m.refusals[i][j] = []metric.AddOption{m.with(AttrClass.String(c.String()), AttrReason.String(string(r)))}
		}
	}
	m.meter = mp.Meter(ScopeName)
	if isNil(m.meter) {
		return nil, fmt.Errorf("%w: the MeterProvider returned a nil Meter", ErrInvalidConfig)
	}
	var err error
	// mk creates the instrument of name with f, which returns it, unless an
	// earlier one failed. A nil instrument with no error (from a meter that
	// breaks the API's contract) fails too: recording would panic.
	mk := func(name string, f func() (any, error)) {
		if err != nil {
			return
		}
		var inst any
		if inst, err = f(); err == nil && isNil(inst) {
			err = fmt.Errorf("%w: the Meter returned a nil %s instrument", ErrInvalidConfig, name)
		}
	}
	mt := m.meter
	mk(MetricPicks, func() (i any, e error) {
		m.picks, e = mt.Int64Counter(MetricPicks, metric.WithUnit("{pick}"),
			metric.WithDescription("Picks made by the balancer, by chosen endpoint, or by error type for failed picks."))
		return m.picks, e
	})
	mk(MetricCachedTokens, func() (i any, e error) {
		m.cached, e = mt.Int64Histogram(MetricCachedTokens, metric.WithUnit("{token}"),
			metric.WithDescription("Prompt tokens the policy expected the chosen endpoint to hold in its prefix cache, per pick."),
			metric.WithExplicitBucketBoundaries(tokenBuckets...))
		return m.cached, e
	})
	mk(MetricSignalAge, func() (i any, e error) {
		m.sigAge, e = mt.Float64Histogram(MetricSignalAge, metric.WithUnit("s"),
			metric.WithDescription("Age of the engine load observation used for a pick, for picks that used one."),
			metric.WithExplicitBucketBoundaries(ageBuckets...))
		return m.sigAge, e
	})
	mk(MetricTimeToFirstToken, func() (i any, e error) {
		m.ttft, e = mt.Float64Histogram(MetricTimeToFirstToken, metric.WithUnit("s"),
			metric.WithDescription("Time from the pick to the first streamed token."),
			metric.WithExplicitBucketBoundaries(ttftBuckets...))
		return m.ttft, e
	})
	mk(MetricRequestDuration, func() (i any, e error) {
		m.duration, e = mt.Float64Histogram(MetricRequestDuration, metric.WithUnit("s"),
			metric.WithDescription("Time from the pick to the end of the request."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		return m.duration, e
	})
	counter := func(dst *metric.Int64Counter, name, unit, desc string) {
		mk(name, func() (i any, e error) {
			*dst, e = mt.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
			return *dst, e
		})
	}
	counter(&m.retries, MetricRetries, "{attempt}", "Retries sent after a failed attempt, before the first token.")
	counter(&m.probes, MetricProbes, "{attempt}", "Attempts sent to look for a stored response on the next endpoint, after a 404.")
	counter(&m.hedges, MetricHedges, "{attempt}", "Hedges sent while an earlier attempt had no first token yet.")
	counter(&m.exhausted, MetricBudgetExhausted, "{attempt}", "Retries and hedges the retry budget refused.")
	counter(&m.ejections, MetricEjections, "{ejection}", "Endpoints ejected as outliers, by endpoint.")
	counter(&m.cooldowns, MetricCooldowns, "{cooldown}", "Endpoints taken out for the wait an overload answer asked, by endpoint.")
	counter(&m.rejected, MetricAdmissionRejected, "{request}", "Requests refused by admission control, by the cap that refused them.")
	counter(&m.qrefused, MetricQueueRefusals, "{request}", "Requests a fair queue refused, by priority class and reason.")
	counter(&m.spills, MetricSpillovers, "{request}", "Requests moved from one tier to the next, by tiers and reason.")
	mk(MetricQueueWait, func() (i any, e error) {
		m.qwait, e = mt.Float64Histogram(MetricQueueWait, metric.WithUnit("s"),
			metric.WithDescription("Time a request waited in a fair queue before admission, by priority class."),
			metric.WithExplicitBucketBoundaries(waitBuckets...))
		return m.qwait, e
	})
	// Counts that add up across endpoints and queues are asynchronous
	// UpDownCounters, as OpenTelemetry's semantic conventions make
	// http.server.active_requests; whether an endpoint is healthy is a
	// gauge. Prometheus exports both as gauges.
	count := func(dst *metric.Int64ObservableUpDownCounter, name, unit, desc string) {
		mk(name, func() (i any, e error) {
			*dst, e = mt.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
			return *dst, e
		})
	}
	count(&m.outstanding, MetricOutstanding, "{request}", "Requests picked for the endpoint and not done.")
	count(&m.queued, MetricQueued, "{request}", "Requests picked for the endpoint and before their first token.")
	count(&m.prefill, MetricPrefillTokens, "{token}", "Prompt tokens picked for the endpoint and not yet prefilled, net of expected cache hits.")
	count(&m.decode, MetricDecodeTokens, "{token}", "Expected output tokens of the endpoint's outstanding requests.")
	mk(MetricHealthy, func() (i any, e error) {
		m.healthy, e = mt.Int64ObservableGauge(MetricHealthy, metric.WithUnit("1"), metric.WithDescription("1 if the endpoint is marked healthy, 0 if not."))
		return m.healthy, e
	})
	count(&m.qwaiting, MetricQueueWaiting, "{request}", "Requests waiting in a fair queue.")
	count(&m.qinflight, MetricQueueInFlight, "{request}", "Requests a fair queue admitted and not done.")
	count(&m.qtokens, MetricQueueTokens, "{token}", "Prompt and output tokens of the requests a fair queue admitted and not done.")
	if err != nil {
		if errors.Is(err, ErrInvalidConfig) {
			return nil, err // already prefixed
		}
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	m.observer = llmlb.Observer{Pick: m.pick, FirstToken: m.firstToken, Done: m.done}
	m.retryObserver = retry.Observer{
		Retry:  func(int, error) { m.retries.Add(context.Background(), 1, m.baseOpt) },
		Probe:  func(int, error) { m.probes.Add(context.Background(), 1, m.baseOpt) },
		Hedge:  func(int) { m.hedges.Add(context.Background(), 1, m.baseOpt) },
		Denied: func() { m.exhausted.Add(context.Background(), 1, m.baseOpt) },
		Eject: func(key string, _ time.Duration) {
			m.ejections.Add(context.Background(), 1, m.endpoint(key).add...)
		},
		Cooldown: func(key string, _ time.Duration) {
			m.cooldowns.Add(context.Background(), 1, m.endpoint(key).add...)
		},
		Reject: func(err *retry.OverloadError) {
			i := 0
			if err.Scope == "session" {
				i = 1
			}
			m.rejected.Add(context.Background(), 1, m.scopes[i])
		},
	}
	m.queueObserver = fair.Observer{
		Admitted: func(c fair.Class, waited time.Duration) {
			m.qwait.Record(context.Background(), waited.Seconds(), m.classes[classIndex(c)]...)
		},
		Refused: func(c fair.Class, reason fair.Reason) {
			j := 0
			for k, r := range queueReasons {
				if r == reason {
					j = k
				}
			}
			m.qrefused.Add(context.Background(), 1, m.refusals[classIndex(c)][j]...)
		},
	}
	return m, nil
}

// classIndex returns c's index in queueClasses.
func classIndex(c fair.Class) int {
	switch {
	case c <= fair.Interactive:
		return 0
	case c >= fair.Batch:
		return 2
	}
	return 1
}

// SpillObserver returns the function to set as a spill.Config's Observer
// (or a gateway.Config's SpillObserver): every spill counts in
// llmlb.spillovers, by tiers and reason.
func (m *Metrics) SpillObserver() func(spill.Event) { return m.spill }

func (m *Metrics) spill(e spill.Event) {
	var opts []metric.AddOption
	if o, ok := m.spillSets.Load(e); ok {
		opts = o.([]metric.AddOption)
	} else {
		opts = []metric.AddOption{m.with(AttrSpillFrom.String(attrValue(e.From)), AttrSpillTo.String(attrValue(e.To)), AttrSpillReason.String(attrValue(string(e.Reason))))}
		if m.spillN.Add(1) <= maxErrorTypes*16 {
			m.spillSets.Store(e, opts)
		}
	}
	m.spills.Add(context.Background(), 1, opts...)
}

// QueueObserver returns the functions to set as a fair queue's
// [fair.Config.Observer]: each admission's wait (llmlb.queue.wait) and each
// refusal (llmlb.queue.refusals), by priority class.
func (m *Metrics) QueueObserver() *fair.Observer { return &m.queueObserver }

// WatchQueue reports q's requests waiting and in flight and its tokens in
// flight as gauges, read from [fair.Queue.Stats] at each collection.
// Unregister the returned registration to stop. The queues watched through
// one Metrics are reported together, their counts summed, as the refusals
// and waits their [Metrics.QueueObserver] reports are; a queue watched
// twice counts once. To tell queues apart, watch each through Metrics whose
// [Config.Attributes] differ.
func (m *Metrics) WatchQueue(q *fair.Queue) (metric.Registration, error) {
	if q == nil {
		return nil, fmt.Errorf("%w: WatchQueue(nil)", ErrInvalidConfig)
	}
	// The SDK calls observeQueues holding the lock that RegisterCallback
	// and Unregister take: they are called under regMu, never under qmu.
	m.regMu.Lock()
	defer m.regMu.Unlock()
	if m.qreg == nil {
		reg, err := registered(m.meter.RegisterCallback(m.observeQueues, m.qwaiting, m.qinflight, m.qtokens))
		if err != nil {
			return nil, err
		}
		m.qreg = reg
	}
	m.qmu.Lock()
	if m.queues == nil {
		m.queues = make(map[*fair.Queue]int)
	}
	m.queues[q]++
	m.qmu.Unlock()
	return &queueWatch{m: m, q: q}, nil
}

// observeQueues reports the sums of the watched queues' stats.
func (m *Metrics) observeQueues(_ context.Context, o metric.Observer) error {
	m.qmu.Lock()
	qs := make([]*fair.Queue, 0, len(m.queues))
	for q := range m.queues {
		qs = append(qs, q)
	}
	m.qmu.Unlock()
	if len(qs) == 0 {
		return nil
	}
	var waiting, inFlight, tokens int64
	for _, q := range qs {
		s := q.Stats()
		waiting += int64(s.Waiting)
		inFlight += int64(s.InFlight)
		tokens += s.TokensInFlight
	}
	o.ObserveInt64(m.qwaiting, waiting, m.baseOpt)
	o.ObserveInt64(m.qinflight, inFlight, m.baseOpt)
	o.ObserveInt64(m.qtokens, tokens, m.baseOpt)
	return nil
}

// queueWatch is the registration of one call of [Metrics.WatchQueue].
type queueWatch struct {
	embedded.Registration
	m    *Metrics
	q    *fair.Queue
	once sync.Once
}

// Unregister stops watching the queue, once; the callback reading the
// queues is unregistered with the last of them.
func (w *queueWatch) Unregister() error {
	var err error
	w.once.Do(func() {
		m := w.m
		m.regMu.Lock()
		defer m.regMu.Unlock()
		m.qmu.Lock()
		if m.queues[w.q]--; m.queues[w.q] <= 0 {
			delete(m.queues, w.q)
		}
		none := len(m.queues) == 0
		m.qmu.Unlock()
		if none && m.qreg != nil {
			err = m.qreg.Unregister()
			m.qreg = nil
		}
	})
	return err
}

// registered returns RegisterCallback's results, or an error in place of
// a nil registration returned with no error, which its caller could not
// unregister.
func registered(r metric.Registration, err error) (metric.Registration, error) {
	if err == nil && isNil(r) {
		return nil, fmt.Errorf("%w: the Meter returned a nil callback registration", ErrInvalidConfig)
	}
	return r, err
}

// isNil reports whether v is nil or holds a nil pointer.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Observer returns the functions to pass to [llmlb.WithObserver].
func (m *Metrics) Observer() *llmlb.Observer { return &m.observer }

// RetryObserver returns the functions to set as the Observer of a
// [retry.Loop], [retry.Admission] or [retry.Ejector], or of the Retry
// settings of an httplb Transport or a gateway.
func (m *Metrics) RetryObserver() *retry.Observer { return &m.retryObserver }

// Watch reports b's per-endpoint load (outstanding and queued requests,
// pending prefill and decode tokens, health) as gauges, read from
// [llmlb.Balancer.Stats] at each collection. Unregister the returned
// registration to stop. The gauges carry no attribute that tells balancers
// apart: watch two balancers that may share endpoint keys with two
// Metrics whose [Config.Attributes] differ, or their points collide.
func (m *Metrics) Watch(b *llmlb.Balancer) (metric.Registration, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: Watch(nil)", ErrInvalidConfig)
	}
	return registered(m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range b.Stats() {
			opt := m.endpoint(s.Key).opt
			o.ObserveInt64(m.outstanding, s.Outstanding, opt)
			o.ObserveInt64(m.queued, s.Queued, opt)
			o.ObserveInt64(m.prefill, s.PrefillTokens, opt)
			o.ObserveInt64(m.decode, s.DecodeTokens, opt)
			h := int64(0)
			if s.Healthy {
				h = 1
			}
			o.ObserveInt64(m.healthy, h, opt)
		}
		return nil
	}, m.outstanding, m.queued, m.prefill, m.decode, m.healthy))
}

func (m *Metrics) pick(p llmlb.PickInfo) {
	ctx := context.Background()
	if p.Err != nil {
		m.picks.Add(ctx, 1, m.errorSet(p.Err))
		return
	}
	a := m.endpoint(p.Endpoint.Key())
	m.picks.Add(ctx, 1, a.add...)
	m.cached.Record(ctx, int64(p.CachedTokens), a.rec...)
	if p.SignalAge >= 0 {
		m.sigAge.Record(ctx, p.SignalAge.Seconds(), a.rec...)
	}
}

func (m *Metrics) firstToken(f llmlb.FirstTokenInfo) {
	if f.Transferred {
		return // the prefill endpoint's first token is the request's
	}
	m.ttft.Record(context.Background(), f.Latency.Seconds(), m.endpoint(f.Endpoint.Key()).rec...)
}

func (m *Metrics) done(d llmlb.DoneInfo) {
	ctx := context.Background()
	if d.Err != nil {
		key := d.Endpoint.Key()
		m.duration.Record(ctx, d.Latency.Seconds(), m.failed(m.endpoint(key), key, m.errorType(d.Err))...)
		return
	}
	m.duration.Record(ctx, d.Latency.Seconds(), m.endpoint(d.Endpoint.Key()).rec...)
}

// with returns a measurement option of the base attributes and kvs.
func (m *Metrics) with(kvs ...attribute.KeyValue) metric.MeasurementOption {
	all := make([]attribute.KeyValue, 0, len(m.base)+len(kvs))
	all = append(append(all, m.base...), kvs...)
	return metric.WithAttributeSet(attribute.NewSet(all...))
}

// endpoint returns the attribute options of the endpoint key, computed once.
func (m *Metrics) endpoint(key string) *endpointAttrs {
	if a, ok := m.endpoints.Load(key); ok {
		return a.(*endpointAttrs)
	}
	opt := m.with(AttrEndpoint.String(attrValue(key)))
	a := &endpointAttrs{opt: opt, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
	if m.cachedN.Add(1) > maxCachedEndpoints {
		m.endpoints.Clear()
		m.cachedN.Store(1)
	}
	if prev, loaded := m.endpoints.LoadOrStore(key, a); loaded {
		m.cachedN.Add(-1)
		return prev.(*endpointAttrs)
	}
	return a
}

// maxAttrBytes bounds an attribute value taken from an endpoint key, a tier
// name or an error type.
const maxAttrBytes = 256

// attrValue returns s as an attribute value every exporter accepts: invalid
// UTF-8 is replaced (the Prometheus exporter fails a whole scrape on one
// invalid label value), and a value longer than maxAttrBytes is cut on a
// character boundary; either ends with "~" and a hash of all of s, so that
// keys differing only in their invalid bytes, or long keys sharing their
// first bytes, stay distinct series, and a scrape stays small whatever the
// keys.
func attrValue(s string) string {
	v := strings.ToValidUTF8(s, "\uFFFD")
	if len(v) <= maxAttrBytes && v == s {
		return v
	}
	h := fnv.New64a()
	h.Write([]byte(s))
	suffix := fmt.Sprintf("~%016x", h.Sum64())
	cut := min(len(v), maxAttrBytes-len(suffix))
	for cut > 0 && cut < len(v) && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + suffix
}

// failed returns the record options of a failed request's duration at the
// endpoint a with the error type typ, computed once per endpoint and type
// (at most maxErrorTypes types an endpoint).
func (m *Metrics) failed(a *endpointAttrs, key, typ string) []metric.RecordOption {
	if o, ok := a.failed.Load(typ); ok {
		return o.([]metric.RecordOption)
	}
	o := []metric.RecordOption{m.with(AttrEndpoint.String(attrValue(key)), AttrErrorType.String(attrValue(typ)))}
	if a.failedN.Add(1) <= maxErrorTypes {
		a.failed.Store(typ, o)
	}
	return o
}

// errorSet returns the attribute option of a failed pick's error type.
func (m *Metrics) errorSet(err error) metric.MeasurementOption {
	t := m.errorType(err)
	if o, ok := m.errSets.Load(t); ok {
		return o.(metric.MeasurementOption)
	}
	o := m.with(AttrErrorType.String(attrValue(t)))
	if m.errSetsN.Add(1) <= maxErrorTypes {
		m.errSets.Store(t, o)
	}
	return o
}

// ErrorType is the default error.type of an error: "no_endpoints",
// "no_candidates", "canceled", "deadline_exceeded", "overloaded", "policy"
// or "error".
func ErrorType(err error) string {
	switch {
	case errors.Is(err, llmlb.ErrNoEndpoints):
		return "no_endpoints"
	case errors.Is(err, llmlb.ErrNoCandidates):
		return "no_candidates"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, retry.ErrOverloaded):
		return "overloaded"
	case errors.Is(err, llmlb.ErrInvalidPolicy):
		return "policy"
	}
	return "error"
}
