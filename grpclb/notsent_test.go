package grpclb

import (
	"context"
	"errors"
	"testing"

	"github.com/llmlb/llmlb"
)

// TestErrNotSent: a pick discarded before its RPC was sent is ended as
// cancelled (neither a success nor a failure of the endpoint) and as not
// sent, so that a prefix-aware policy forgets the blocks it recorded.
func TestErrNotSent(t *testing.T) {
	for _, target := range []error{context.Canceled, llmlb.ErrNotSent} {
		if !errors.Is(errNotSent, target) {
			t.Errorf("errNotSent does not wrap %v", target)
		}
	}
	if got, want := errNotSent.Error(), "grpclb: pick discarded before the RPC was sent: context canceled"; got != want {
		t.Errorf("errNotSent says %q, want %q", got, want)
	}
}
