package httplb

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Read after Close fails, as an http.Response body's does, even while
// bytes held back for the first event are left.
func TestReadAfterClose(t *testing.T) {
	h := newMemHarness(t, Config{}, func(r *http.Request) (*http.Response, error) {
		return sseResponse(r, ": ping\n\ndata: a\n\ndata: b\n\n"), nil
	}, 1)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	n, err := resp.Body.Read(make([]byte, 64))
	assert.Zero(t, n)
	assert.ErrorIs(t, err, http.ErrBodyReadAfterClose)
	require.NoError(t, resp.Body.Close(), "a second Close")
}

// A base transport that breaks its contract, answering neither a response
// nor an error, fails the attempt: no panic, and the pick is done.
func TestBaseNilResponse(t *testing.T) {
	h := newMemHarness(t, Config{}, func(*http.Request) (*http.Response, error) { return nil, nil }, 2)
	resp, err := do(t, h, chatBody)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	assert.ErrorContains(t, err, "nil response")
}
