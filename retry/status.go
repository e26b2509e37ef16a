package retry

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
)

// gRPC status codes, as plain ints so that this package does not import
// grpc. They are the values of google.golang.org/grpc/codes.
const (
	// GRPCResourceExhausted is codes.ResourceExhausted (8).
	GRPCResourceExhausted = 8
	// GRPCUnavailable is codes.Unavailable (14).
	GRPCUnavailable = 14
)

// StatusError is an attempt's failure with a status code from the server:
// an HTTP status, or a gRPC code when GRPC is set. Header carries the
// response headers (for gRPC, the trailers) that [FromHeader] reads for
// pushback. An attempt function returns one to let [Loop] classify the
// failure and honour the server's Retry-After. [Loop] and the helpers of
// this package only read it; do not change one after returning it.
type StatusError struct {
	// Code is the HTTP status, or the gRPC code if GRPC is true.
	Code int
	// GRPC reports whether Code is a gRPC code.
	GRPC bool
	// Header holds the response headers or trailers; it may be nil. gRPC
	// trailers may be given as they are, http.Header(md), with metadata's
	// lowercase keys ([FromHeader] reads both forms).
	Header http.Header
}

// Error implements error.
func (e *StatusError) Error() string {
	if e.GRPC {
		return "retry: upstream gRPC status " + strconv.Itoa(e.Code)
	}
	return "retry: upstream HTTP status " + strconv.Itoa(e.Code)
}

// Default retryable codes.
var (
	defaultHTTPCodes = []int{408, 429, 500, 502, 503, 504}
	defaultGRPCCodes = []int{GRPCResourceExhausted, GRPCUnavailable}
	defaultClassify  = OnCodes(defaultHTTPCodes, defaultGRPCCodes)
)

// DefaultClassify reports whether an attempt's error may be retried: a
// [*StatusError] with HTTP status 408, 429, 500, 502, 503 or 504, or gRPC
// RESOURCE_EXHAUSTED or UNAVAILABLE; an [*OverloadError]; or any other error
// that is not a context error and not [ErrExhausted] (a transport failure
// before the first token, such as a refused connection). nil, context
// errors and errors wrapping ErrExhausted (a lower loop already gave up:
// retry at one layer only) are not retryable.
func DefaultClassify(err error) bool { return defaultClassify(err) }

// OnCodes returns a classifier like [DefaultClassify] that retries the given
// HTTP statuses and gRPC codes instead of the default ones. The slices are
// copied.
func OnCodes(httpCodes, grpcCodes []int) func(err error) bool {
	httpCodes, grpcCodes = slices.Clone(httpCodes), slices.Clone(grpcCodes)
	return func(err error) bool {
		switch {
		case err == nil, errors.Is(err, ErrExhausted),
			errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return false
		}
		var se *StatusError
		if errors.As(err, &se) {
			if se.GRPC {
				return slices.Contains(grpcCodes, se.Code)
			}
			return slices.Contains(httpCodes, se.Code)
		}
		return true
	}
}
