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

// A \u escape of a lowercase letter, a '.' or a '_' (of which every key
// and type OutputCounter reads is made) may make an error event; other
// escapes may not, but one cut short may.
func TestHasNameEscape(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{`{"\u0065rror":{}}`, true},
		{`{"type":"response\u002Efailed"}`, true},
		{`{"type":"response.in\u005fprogress"}`, true},
		{`{"\\u0065rror":{}}`, true}, // an escaped backslash, then text: read as one, to be sure
		{`{"\u0045rror":{}}`, false},
		{`{"text":"\u00e9\u4e00\n\t\"\\\/\u003c"}`, false},
		{`{"text":"x\u00`, true},
		{`{"text":"x\u0`, true},
		{`{"text":"x\`, true},
		{`{"text":"x\n`, false},
		{``, false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, hasNameEscape([]byte(c.in)), c.in)
	}
}
