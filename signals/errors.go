package signals

import "errors"

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with [errors.Is].
var (
	// ErrInvalidConfig: a Config or StoreConfig field is out of range.
	ErrInvalidConfig = errors.New("signals: invalid config")
	// ErrParse: a metrics body is not a well-formed exposition in a format
	// this package reads (for example an HTML error page).
	ErrParse = errors.New("signals: malformed exposition")
	// ErrMissingMetric: the exposition lacks a metric the engine profile
	// requires, or no engine profile matches it.
	ErrMissingMetric = errors.New("signals: missing metric")
	// ErrInvalidValue: a reported value is NaN, infinite, negative or
	// implausibly large.
	ErrInvalidValue = errors.New("signals: invalid value")
	// ErrBodyTooLarge: a metrics body (after decompression) exceeds the
	// configured cap.
	ErrBodyTooLarge = errors.New("signals: body too large")
	// ErrHTTPStatus: the metrics endpoint answered with a non-2xx status.
	ErrHTTPStatus = errors.New("signals: unexpected HTTP status")
	// ErrUnknownEndpoint: no target with that key is configured.
	ErrUnknownEndpoint = errors.New("signals: unknown endpoint")
	// ErrTooManyKeys: a Scraper was given more targets than its maximum. (A
	// full Store evicts an endpoint instead.)
	ErrTooManyKeys = errors.New("signals: too many endpoints")
	// ErrInvalidLoad: an observation has an empty key, a zero time, negative
	// counts, a KV usage outside [0, 1], engine counters negative or above
	// 1e18, or more prefix-cache hits than queries.
	ErrInvalidLoad = errors.New("signals: invalid observation")
	// ErrORCA: an ORCA load report is malformed, in an unsupported format, or
	// carries none of the mapped metrics.
	ErrORCA = errors.New("signals: invalid ORCA load report")
	// ErrRunning: Run was called while another call of Run is running.
	ErrRunning = errors.New("signals: Scraper.Run is already running")
)
