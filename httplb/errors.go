package httplb

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/llmlb/llmlb"
)

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with [errors.Is].
var (
	// ErrInvalidConfig: a [Config] or [ParserConfig] field is out of range,
	// or an endpoint URL is not an absolute http or https URL or ends in
	// /v1 (see [Endpoint]).
	ErrInvalidConfig = errors.New("httplb: invalid config")
	// ErrBodyTooLarge: the request body exceeds the parser's cap. The
	// handler returned by [NewProxy] answers 413 Request Entity Too Large.
	ErrBodyTooLarge = errors.New("httplb: request body too large")
	// ErrNoURL: the picked endpoint has no URL: it is not an [*Endpoint]
	// and [Config.URL] is nil or returned nil. A [Transport] does not retry
	// it, and the proxy's error handler answers 500.
	ErrNoURL = errors.New("httplb: endpoint has no URL")
	// ErrFirstEventTimeout: an attempt's first event did not arrive within
	// [Config.FirstEventTimeout]. The attempt was cancelled and is retried
	// on another endpoint while attempts and the budget last; when they run
	// out, RoundTrip returns a *retry.GiveUpError wrapping it.
	ErrFirstEventTimeout = errors.New("httplb: first event timed out")
	// ErrUnauthenticated wraps the error of [ParserConfig.Tenant]: the
	// request's tenant could not be established. The proxy's error
	// handler answers 401 without the cause, which it logs.
	ErrUnauthenticated = errors.New("httplb: tenant not established")
	// ErrBodyRead wraps the error of reading a request's body: the client
	// broke off, sent a malformed chunked body or, behind a read deadline
	// (gateway.Config.BodyTimeout), sent too slowly. The proxy's error
	// handler answers 408 Request Timeout for a timeout and 400 otherwise,
	// without the cause, which it logs.
	ErrBodyRead = errors.New("httplb: request body not read")
	// ErrErrorEvent is passed to a pick's Done, and to the Reporter, for
	// a response stream that carried an error event (see
	// [OutputCounter.Failed]): the engine failed the request after its
	// 200 (vLLM and SGLang then send {"error": {...}} and end the stream,
	// text-generation-inference {"error": "...", "error_type": "..."}
	// or, on its OpenAI-compatible routes, {"error": {"message": "...",
	// "http_status_code": 422}}; the OpenAI Responses API sends an
	// "error" or a "response.failed" event, Anthropic's Messages API an
	// event named "error"), which is no success whatever the status said.
	// An attempt
	// whose first event is one fails with it too, wrapping a
	// [*retry.StatusError] of the event's code if that is an HTTP status
	// or stands for one (OpenAI's "rate_limit_exceeded" for 429, an
	// error type such as Anthropic's "overloaded_error" for 503 or
	// "invalid_request_error" for 400, text-generation-inference's
	// error_type "validation" for 422, or the error its OpenAI-compatible
	// routes name in the message of an event whose http_status_code is
	// 422 whatever the error, "Model is overloaded" for 429, or the
	// top-level "code" of an event named "error"), else of 500.
	ErrErrorEvent = errors.New("httplb: the response stream carried an error event")
)

// errOutrun is the error of an attempt that received its first event after
// another attempt of the same request had committed, or that was about to be
// sent then: it is dropped, not retried.
var errOutrun = fmt.Errorf("httplb: another attempt committed first: %w", context.Canceled)

// errNotSent ends a pick that was not sent: a hedge that the budget
// refused or that the client left before it started. It wraps
// [context.Canceled], which observers and outlier detection count as
// neither a success nor a failure of the endpoint, and [llmlb.ErrNotSent],
// so that a prefix-aware policy forgets the prompt blocks it recorded at
// the endpoint for the pick.
var errNotSent error = newNotSent(fmt.Errorf("httplb: attempt not sent: %w", context.Canceled))

// notSent is an error that also wraps [llmlb.ErrNotSent], whose message it
// leaves out.
type notSent struct {
	error
	errs []error // llmlb.ErrNotSent, first for a short errors.Is, and error; built once
}

// newNotSent returns err wrapping [llmlb.ErrNotSent] as well.
func newNotSent(err error) error { return &notSent{err, []error{llmlb.ErrNotSent, err}} }

func (e *notSent) Unwrap() []error { return e.errs }

// pickError returns the error that ends the pick of an attempt that failed
// with err: err, wrapping [llmlb.ErrNotSent] as well if the connection to
// the endpoint could not be opened (a dial error), since the endpoint then
// never saw the request. Outlier detection still counts it as a failure.
func pickError(err error) error {
	var op *net.OpError
	if err != nil && errors.As(err, &op) && op.Op == "dial" && !errors.Is(err, llmlb.ErrNotSent) {
		return newNotSent(err)
	}
	return err
}

func configErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}
