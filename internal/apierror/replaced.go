package apierror

import (
	"bytes"
	"io"
)

// Replaced is the body of an answer whose own error body was replaced with
// a generic one for the client and logged by the one that replaced it, as
// package spill does for a tier's answer: a handler that later sees it
// (httplb's NewUpstreamErrorHandler) logs the answer no second time, with
// the generic body in place of the upstream's.
type Replaced struct {
	r *bytes.Reader
}

// NewReplaced returns a Replaced body reading b.
func NewReplaced(b []byte) *Replaced { return &Replaced{r: bytes.NewReader(b)} }

// Read implements io.Reader.
func (b *Replaced) Read(p []byte) (int, error) { return b.r.Read(p) }

// Close implements io.Closer; it does nothing.
func (b *Replaced) Close() error { return nil }

var _ io.ReadCloser = (*Replaced)(nil)
