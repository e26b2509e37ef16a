package llmlb

import (
	"fmt"
	"time"
)

// Observer holds functions a [Balancer] calls as requests pass through it,
// for metrics, logs and traces (package telemetry turns them into
// OpenTelemetry instruments). A nil field is skipped; a Balancer without an
// Observer ([WithObserver]) does no work for it at all.
//
// The functions are called synchronously, on the goroutine that called Pick,
// FirstToken or Done, outside every lock of the balancer. They must be safe
// for concurrent use, must not block, and must not call back into the
// Balancer or the [Pick] they describe. The info values they receive are
// valid only during the call; copy what you keep. If Pick panics, the
// request it describes, which the caller of [Balancer.Pick] then never
// receives, is released (without a call of Done) before the panic goes on.
type Observer struct {
	// Pick is called at the end of every [Balancer.Pick] call that got past
	// its argument checks (a cancelled context, an invalid request), with
	// the endpoint chosen or the error.
	Pick func(PickInfo)
	// FirstToken is called on the first effective [Pick.FirstToken] of a
	// request.
	FirstToken func(FirstTokenInfo)
	// Done is called on the first effective [Pick.Done] of a request.
	Done func(DoneInfo)
}

// PickInfo describes one pick for [Observer.Pick].
type PickInfo struct {
	// Endpoint is the endpoint chosen; nil if Err is set.
	Endpoint Endpoint
	// Request is the request passed to Pick; nil if Pick was given nil.
	Request *Request
	// Candidates is the number of endpoints the policy chose among.
	Candidates int
	// CachedTokens is the part of the prompt the policy expects the chosen
	// endpoint to hold in its prefix cache (0 for policies that do not
	// track caches).
	CachedTokens int
	// DecodeTokens is the output the chosen endpoint is charged for the
	// request, in tokens, as [Balancer.Stats] counts it: OutputTokens
	// times Choices, or without OutputTokens the learned prediction
	// ([WithOutputPrediction]) or else the decode allowance
	// ([WithDecodeAllowance]), at most MaxTokens, times Choices; at most
	// 2^31-1. 0 if Err is set.
	DecodeTokens int
	// SignalAge is the age of the engine observation of the chosen endpoint
	// that the estimate used, or -1 if none was used (no signal configured,
	// or the observation was missing or older than the maximum age).
	SignalAge time.Duration
	// Err is the error Pick returns: [ErrNoEndpoints], [ErrNoCandidates] or
	// a policy error ([ErrInvalidPolicy]).
	Err error
}

// FirstTokenInfo describes a request's first token for
// [Observer.FirstToken].
type FirstTokenInfo struct {
	// Endpoint is the endpoint the request was sent to.
	Endpoint Endpoint
	// Latency is the time from the pick to the first token, on the
	// balancer's clock.
	Latency time.Duration
	// Transferred reports a request whose prompt another endpoint
	// prefills ([Disaggregated]): this endpoint receives its KV cache
	// rather than computing it, and counts it as streaming from the pick
	// on, so FirstToken is called at the pick and Latency is no time to
	// first token.
	Transferred bool
}

// DoneInfo describes a finished request for [Observer.Done].
type DoneInfo struct {
	// Endpoint is the endpoint the request was sent to.
	Endpoint Endpoint
	// Latency is the time from the pick to Done, on the balancer's clock.
	Latency time.Duration
	// Streamed reports whether FirstToken was called before Done.
	Streamed bool
	// Err is the error passed to Done.
	Err error
}

// WithObserver sets functions the balancer calls on every pick, first token
// and completion. Leaving it unset costs nothing; with it, the balancer reads
// its clock at each of the three events to measure latencies.
func WithObserver(o *Observer) Option {
	return optionFunc(func(cfg *config) error {
		if o == nil {
			return fmt.Errorf("%w: WithObserver(nil)", ErrInvalidOption)
		}
		if o.Pick == nil && o.FirstToken == nil && o.Done == nil {
			return nil
		}
		cp := *o
		cfg.observer = &cp
		return nil
	})
}
