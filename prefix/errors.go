package prefix

import "errors"

// Sentinel errors. Every error returned by this package wraps one of them,
// so callers branch with [errors.Is].
var (
	// ErrInvalidConfig: a field of [HasherConfig] or [IndexConfig] is out of
	// range.
	ErrInvalidConfig = errors.New("prefix: invalid config")
	// ErrInvalidArgument: an argument is out of range, such as an empty
	// endpoint key or a non-positive capacity. Nothing was changed.
	ErrInvalidArgument = errors.New("prefix: invalid argument")
	// ErrBlockSizeMismatch: an engine KV event reports a block size other
	// than the index's. The event was not applied; the hasher, the index and
	// the engine must agree on the block size, or nothing would ever match.
	ErrBlockSizeMismatch = errors.New("prefix: block size mismatch")
	// ErrTooManyEndpoints: adding the endpoint would exceed
	// [IndexConfig.MaxEndpoints]. Nothing was changed; remove endpoints that
	// left the pool with [Index.RemoveEndpoint].
	ErrTooManyEndpoints = errors.New("prefix: too many endpoints")
)
