package httplb

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with [errors.Is].
var (
	// ErrInvalidConfig: a [Config] or [ParserConfig] field is out of range,
	// or an endpoint URL is not an absolute http or https URL.
	ErrInvalidConfig = errors.New("httplb: invalid config")
	// ErrBodyTooLarge: the request body exceeds the parser's cap. The
	// handler returned by [NewProxy] answers 413 Request Entity Too Large.
	ErrBodyTooLarge = errors.New("httplb: request body too large")
	// ErrNoURL: the picked endpoint has no URL: it is not an [*Endpoint]
	// and [Config.URL] is nil or returned nil.
	ErrNoURL = errors.New("httplb: endpoint has no URL")
)

func configErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}
