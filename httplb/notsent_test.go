package httplb

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// TestDialFailureForgetsPrefix: an attempt whose connection could not be
// opened never reached its endpoint, so the prefix-aware policy forgets the
// prompt blocks it recorded there for the pick; the retry's endpoint, which
// served the request, keeps them. The failure still counts against the
// endpoint that refused.
func TestDialFailureForgetsPrefix(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + l.Addr().String()
	require.NoError(t, l.Close()) // connections to it are refused
	up := newUpstream(t, streamTokens(2))
	ix, err := prefix.NewIndex(prefix.IndexConfig{TTL: time.Duration(math.MaxInt64)})
	require.NoError(t, err)
	pol, err := llmlb.PrefixAware(llmlb.PrefixAwareConfig{Index: ix})
	require.NoError(t, err)
	var refused int
	b, err := llmlb.New(pol, llmlb.WithRand(rand.NewPCG(1, 2)), llmlb.WithObserver(&llmlb.Observer{Done: func(d llmlb.DoneInfo) {
		if d.Endpoint.Key() == deadURL {
			require.Error(t, d.Err)
			require.ErrorIs(t, d.Err, llmlb.ErrNotSent)
			var op *net.OpError
			require.ErrorAs(t, d.Err, &op, "the dial error is still there for classification")
			refused++
		}
	}}))
	require.NoError(t, err)
	eps, err := NewEndpoints(deadURL, up.URL)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := NewTransport(Config{Balancer: b, Base: base,
		Adjust: func(_ *http.Request, lr *llmlb.Request) {
			require.NotEmpty(t, lr.Prefix, "the prompt is long enough to hash")
		}})
	require.NoError(t, err)
	parser, err := NewParser(ParserConfig{})
	require.NoError(t, err)
	for i := range 16 {
		prompt := fmt.Sprintf("request %d: %s", i, strings.Repeat("a long shared document. ", 20))
		body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, prompt)
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_, _ = readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// The blocks the index was given for this request.
		hreq, err := http.NewRequest(http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		lr, err := parser.Parse(hreq)
		require.NoError(t, err)
		now := time.Now()
		require.Zero(t, ix.MatchLen(deadURL, lr.Prefix, now), "request %d: the refused endpoint holds its prompt", i)
		require.Equal(t, len(lr.Prefix), ix.MatchLen(up.URL, lr.Prefix, now), "request %d: the serving endpoint lost its prompt", i)
	}
	require.Positive(t, refused, "no request went to the refused endpoint first")
}

// TestPickErrorWrapsNotSent: pickError marks a dial error as not sent,
// leaves other errors as they are, and errNotSent is both a cancel and not
// sent.
func TestPickErrorWrapsNotSent(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	got := pickError(fmt.Errorf("round trip: %w", dial))
	require.ErrorIs(t, got, llmlb.ErrNotSent)
	require.ErrorIs(t, got, dial)
	require.Equal(t, "round trip: dial tcp: connection refused", got.Error())
	read := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset")}
	require.NotErrorIs(t, pickError(read), llmlb.ErrNotSent)
	require.Nil(t, pickError(nil))
	require.ErrorIs(t, errNotSent, llmlb.ErrNotSent)
	require.ErrorIs(t, errNotSent, context.Canceled)
}
