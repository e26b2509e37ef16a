// Package telemetry exports llmlb's routing decisions and their outcomes as
// OpenTelemetry metrics.
//
// It uses only the OpenTelemetry metric API (go.opentelemetry.io/otel/metric):
// bring your own MeterProvider, from the OpenTelemetry SDK with whichever
// exporter you run (Prometheus, OTLP, ...); the package's Example wires one
// to the Prometheus exporter. The root package llmlb imports no telemetry
// library: it calls the plain functions of an [llmlb.Observer], and package
// retry those of a [retry.Observer]; a [Metrics] provides both.
//
//	m, err := telemetry.New(provider, telemetry.Config{Policy: "default"})
//	b, err := llmlb.New(policy, llmlb.WithObserver(m.Observer()))
//	reg, err := m.Watch(b) // per-endpoint load gauges
//	loop, err := retry.NewLoop(b, retry.LoopConfig{Observer: m.RetryObserver()})
//
// # Instruments
//
// Per pick, from the balancer:
//
//   - llmlb.picks (counter, {pick}): picks, with llmlb.endpoint, or with
//     error.type when the pick failed.
//   - llmlb.pick.cached_tokens (histogram, {token}): the prompt tokens the
//     policy expected the chosen endpoint to hold in its prefix cache, with
//     llmlb.endpoint.
//   - llmlb.signal.age (histogram, s): the age of the engine load
//     observation the pick used, when it used one, with llmlb.endpoint.
//   - gen_ai.server.time_to_first_token (histogram, s): from the pick to
//     [llmlb.Pick.FirstToken], with llmlb.endpoint; not for the decode
//     endpoint of a request prefilled on another
//     ([llmlb.FirstTokenInfo].Transferred).
//   - gen_ai.server.request.duration (histogram, s): from the pick to
//     [llmlb.Pick.Done], with llmlb.endpoint and, for failures, error.type.
//
// Per endpoint, read from [llmlb.Balancer.Stats] at each collection once
// [Metrics.Watch] is called: llmlb.endpoint.outstanding and
// llmlb.endpoint.queued ({request}), llmlb.endpoint.prefill_tokens and
// llmlb.endpoint.decode_tokens ({token}), asynchronous UpDownCounters since
// they add up across endpoints (as OpenTelemetry's semantic conventions
// make http.server.active_requests), and the gauge llmlb.endpoint.healthy
// (0 or 1). The Prometheus exporter writes all of them as gauges.
//
// From package retry, through [Metrics.RetryObserver]: llmlb.retries,
// llmlb.probes (attempts of package httplb that look for a stored response
// on the next endpoint), llmlb.hedges and llmlb.retry.budget_exhausted
// ({attempt}),
// llmlb.ejections ({ejection}, with llmlb.endpoint), llmlb.cooldowns
// ({cooldown}, with llmlb.endpoint) and
// llmlb.admission.rejections ({request}, with llmlb.admission.scope "global"
// or "session").
//
// From a fair queue (package fair), through [Metrics.QueueObserver] and
// [Metrics.WatchQueue]: llmlb.queue.wait (histogram, s, with
// llmlb.queue.class), llmlb.queue.refusals ({request}, with
// llmlb.queue.class and llmlb.queue.reason), and the asynchronous
// UpDownCounters llmlb.queue.waiting and llmlb.queue.in_flight ({request}) and
// llmlb.queue.tokens_in_flight ({token}), summed over the queues watched
// through one Metrics. Tenants are not an attribute: their number is
// unbounded.
//
// From a spill.Transport or a gateway with tiers to spill to, through
// [Metrics.SpillObserver]: llmlb.spillovers ({request}, with
// llmlb.spill.from, llmlb.spill.to and llmlb.spill.reason).
//
// Every measurement also carries [Config.Attributes] and, if set,
// llmlb.policy. The two gen_ai instruments follow the OpenTelemetry semantic
// conventions for generative AI model servers, names and bucket boundaries;
// a gateway is the model server its clients see. They measure attempts, not
// client requests: a request retried, hedged or spilled records once per
// pick. The conventions require gen_ai.operation.name (such as "chat") and
// gen_ai.provider.name on them, which the balancer does not know: a program
// serving one kind of operation sets them in Config.Attributes.
//
// # Endpoint churn
//
// The load counts report the balancer's current members only, but the
// counters and histograms with llmlb.endpoint keep a series for every key
// they ever recorded, for as long as the MeterProvider lives (cumulative
// temporality, which the Prometheus exporter uses), and the SDK caps the
// series of an instrument (its cardinality limit), folding the rest into
// one overflow series. Where keys churn, as pod addresses do in
// Kubernetes, drop llmlb.endpoint from every counter and histogram with
// views on the provider (ExampleMetrics_endpointChurn) and read
// per-endpoint load from the load counts, which views by instrument kind
// leave alone (they are asynchronous).
//
// # Cost
//
// Attribute sets are computed once per endpoint, and for failed requests
// once per endpoint and error type, and kept (at most 4096 endpoints; past
// that the cache starts afresh), so recording a request allocates nothing in
// this package; what the SDK does per measurement is its own cost. With the
// SDK, the metrics add about 1 us to a request (BenchmarkPick). A Balancer
// without an Observer does no work for telemetry at all.
//
// This package's plain data type, Config, holds no lock: any number of
// goroutines may read a value of it at once, but none may write it
// meanwhile.
package telemetry
