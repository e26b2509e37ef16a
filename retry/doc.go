// Package retry provides retry budgets, back-off, server pushback parsing,
// a retry and hedging loop, outlier ejection and admission caps that callers
// wire into their own HTTP or gRPC clients around an [llmlb.Balancer].
//
// Retries multiply across layers (3 retries at each of four layers turn one
// user action into 144 upstream calls) and, during an incident, re-enter the
// same least-loaded selection that picks the replica about to fail next. The
// pieces here bound both:
//
//   - Budgets ([Budget]) cap retries as a share of traffic:
//     [PercentBudget] after Finagle (20% of the requests of the last 10 s
//     plus 10 a second), [Throttle] after gRPC (a token bucket that stops
//     retries below half full), and [ConcurrentBudget] after Envoy (retries
//     in flight at most 20% of the active requests, at least 3).
//   - Back-off ([FullJitter], [DecorrelatedJitter]) spreads retries in time;
//     server pushback ([ParseRetryAfter], [ParseGRPCPushback],
//     [ParseRateLimitReset], [FromHeader]) can lengthen a back-off, never
//     shorten it; gRPC's pushback can also forbid the retry. An HTTP
//     Retry-After or rate-limit reset that cannot be parsed is ignored.
//   - [Loop] runs a request: attempt, classify ([DefaultClassify],
//     [StatusError]), ask the budget, back off, pick again with the failed
//     endpoints excluded, optionally hedge when no first token arrives in
//     time, and stop at the commitment point: after [Attempt.FirstToken]
//     nothing is retried or hedged, because the user has seen output.
//   - [Ejector] ejects endpoints that fail repeatedly by marking them
//     unhealthy in the balancer, and brings them back half-open; overload
//     answers (429, 503 with a readable Retry-After that asks for a wait)
//     do not count, since busy is not unhealthy.
//   - [Admission] fails fast with [ErrOverloaded] and a suggested Retry-After
//     when a global or per-session concurrency cap is reached.
//
// Retry at one layer: a Loop that gives up returns an error wrapping
// [ErrExhausted], which [DefaultClassify] does not retry, so loops stacked in
// one process do not multiply. With a PercentBudget at the inner loop, the
// upstream attempts of U user requests under total failure are then at most
// (1+PercentCanRetry)*U plus the budget's reserve, MinRetriesPerSec*TTL, once
// per started TTL (see [PercentBudget] for the exact bound); stacked loops
// that retried each other's give-ups would instead compound to
// (1+p)^2*U and more.
//
// Every type takes an injectable clock (and back-off an injectable random
// source), starts no goroutines in its constructor, and is safe for
// concurrent use. Budgets are explicit (zero means zero, and a
// [PercentConfig] or [ThrottleConfig] without its required fields is
// rejected; start from [DefaultPercentConfig], [DefaultThrottleConfig] or
// [DefaultConcurrentConfig]), while back-off, the loop, ejection and
// admission document a default for each zero field. Constructors reject
// values out of range with errors wrapping [ErrInvalidConfig].
//
// This package's plain data types (AdmissionConfig, BackoffConfig,
// ConcurrentConfig, EjectorConfig, HedgeConfig, LoopConfig, PercentConfig,
// Pushback, ThrottleConfig) hold no lock: any number of goroutines may read
// a value of one at once, but none may write it meanwhile.
package retry
