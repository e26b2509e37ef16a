package retry

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with [errors.Is].
var (
	// ErrInvalidConfig: a constructor was given a configuration value out of
	// range (a negative percentage, a zero TTL, a cap below the base, ...).
	ErrInvalidConfig = errors.New("retry: invalid config")
	// ErrExhausted: a request failed with a retryable error and [Loop.Do]
	// gave up on it (attempts, budget, pushback or endpoints ran out). The
	// error returned also wraps the last attempt's error. [DefaultClassify]
	// treats it as not retryable, so a loop stacked above another one does
	// not multiply its retries.
	ErrExhausted = errors.New("retry: gave up")
	// ErrOverloaded: [Admission] refused a request because a concurrency cap
	// is reached. The error is an [*OverloadError] carrying a suggested
	// Retry-After; a gateway answers 429 with it.
	ErrOverloaded = errors.New("retry: overloaded")
)

// errNotSent ends the pick of a hedge that was not sent: the budget
// refused it, or the caller left or another attempt committed before it
// started. It wraps [context.Canceled], which observers and
// outlier detection count as neither a success nor a failure of the
// endpoint.
var errNotSent = fmt.Errorf("retry: attempt not sent: %w", context.Canceled)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// GiveUpError is returned by [Loop.Do] when the last attempt failed with a
// retryable error and no further attempt is allowed. It wraps both
// [ErrExhausted] and the last attempt's error, so errors.As still finds a
// [*StatusError] inside. It is not changed after it is returned, so its
// methods may be called from any goroutine.
type GiveUpError struct {
	// Attempts is the number of attempts sent, hedges included.
	Attempts int
	// Reason says why no further attempt was sent: "attempts", "budget",
	// "pushback", "deadline" or "endpoints".
	Reason string
	// Err is the last attempt's error.
	Err error
}

// Error implements error.
func (e *GiveUpError) Error() string {
	return fmt.Sprintf("retry: gave up after %d attempts (%s): %v", e.Attempts, e.Reason, e.Err)
}

// Unwrap returns [ErrExhausted] and the last attempt's error.
func (e *GiveUpError) Unwrap() []error { return []error{ErrExhausted, e.Err} }

// OverloadError is returned by [Admission.Acquire] when a cap is reached. It
// matches [ErrOverloaded] with errors.Is. It is not changed after it is
// returned, so its methods may be called from any goroutine.
type OverloadError struct {
	// Scope says what refused the request. [Admission] sets "global" when
	// the in-flight cap is reached and "session" when the session's cap
	// is reached; other packages set their own (package fair "queue" or
	// "principal", package spill "spill").
	Scope string
	// RetryAfter is the suggested wait before trying again, for a
	// Retry-After header (rounded up to whole seconds there).
	RetryAfter time.Duration
}

// Error implements error. It names the cap reached for [Admission]'s
// scopes and only the scope for others, whose refusals need not be a cap
// (a fair queue also refuses a request whose deadline passed, or sheds it).
func (e *OverloadError) Error() string {
	switch e.Scope {
	case "global", "session":
		return fmt.Sprintf("retry: overloaded (%s cap reached), retry after %v", e.Scope, e.RetryAfter)
	case "":
		return fmt.Sprintf("retry: overloaded, retry after %v", e.RetryAfter)
	}
	return fmt.Sprintf("retry: overloaded (%s), retry after %v", e.Scope, e.RetryAfter)
}

// Is reports whether target is [ErrOverloaded].
func (e *OverloadError) Is(target error) bool { return target == ErrOverloaded }
