package httplb

import (
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sseResponse(r *http.Request, events string) *http.Response {
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"text/event-stream"}},
		Body:       io.NopCloser(strings.NewReader(events)),
		Request:    r,
	}
}

// newMemHarness returns a harness over endpoints a.test, b.test, ... (in
// that order of preference with the fixed policy) served by base, whose
// balancer has the options opts.
func newMemHarness(t *testing.T, cfg Config, base roundTripFunc, n int, opts ...llmlb.Option) *harness {
	t.Helper()
	b, err := llmlb.New(fixed{}, append([]llmlb.Option{llmlb.WithRand(rand.NewPCG(1, 2))}, opts...)...)
	require.NoError(t, err)
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://" + string(rune('a'+i)) + ".test"
	}
	eps, err := NewEndpoints(urls...)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	cfg.Balancer = b
	cfg.Base = base
	tr, err := NewTransport(cfg)
	require.NoError(t, err)
	h := &harness{b: b, tr: tr, cfg: cfg}
	t.Cleanup(func() { h.requireIdle(t) })
	return h
}

// The hedge timer fires after the first attempt committed but before
// RoundTrip has received its result: the worst moment. No hedge may be sent.
func TestNoHedgeAfterCommit(t *testing.T) {
	const hedgeDelay = time.Hour // marks the hedge timer
	var hedgeC chan time.Time    // the current request's hedge timer
	var hedges atomic.Int64      // hedges sent
	budget := &countingBudget{}
	h := newMemHarness(t, Config{Retry: retry.LoopConfig{
		Hedge:  retry.HedgeConfig{Delay: hedgeDelay},
		Budget: budget,
		After: func(d time.Duration) <-chan time.Time {
			if d == hedgeDelay {
				return hedgeC
			}
			return closedTime
		},
	}}, func(r *http.Request) (*http.Response, error) {
		if r.URL.Host != "a.test" {
			hedges.Add(1)
		}
		return sseResponse(r, "data: x\n\ndata: [DONE]\n\n"), nil
	}, 2)
	for i := range 1000 {
		hedgeC = make(chan time.Time)
		var once sync.Once
		h.tr.afterCommit = func() {
			// Deliver the timer and wait until RoundTrip has taken it:
			// it is still waiting for the committed attempt's result.
			once.Do(func() { hedgeC <- time.Time{} })
		}
		resp, err := do(t, h, chatBody)
		require.NoError(t, err)
		body, err := readAll(t, resp)
		require.NoError(t, err)
		require.Equal(t, "data: x\n\ndata: [DONE]\n\n", body)
		require.Zero(t, budget.withdrawn.Load(), "hedge started after the commitment point, request %d", i)
		require.Zero(t, hedges.Load(), "hedge sent after the commitment point, request %d", i)
	}
}

// countingBudget grants every retry and counts the withdrawals.
type countingBudget struct{ withdrawn atomic.Int64 }

func (*countingBudget) Start() {}
func (c *countingBudget) Withdraw() bool {
	c.withdrawn.Add(1)
	return true
}
func (*countingBudget) Finish(bool, retry.Outcome) {}

// A hedge's status answer that is not retried (a 400) arrives while the
// first attempt commits: the committed attempt is the answer, not the 400.
func TestStatusAfterCommitLoses(t *testing.T) {
	for i := range 200 {
		classified := make(chan struct{}) // the 400 is being classified
		committed := make(chan struct{})  // the first attempt committed
		var once sync.Once
		h := newMemHarness(t, Config{Retry: retry.LoopConfig{
			Hedge:  retry.HedgeConfig{Delay: time.Hour},
			Budget: unlimited{},
			Classify: func(err error) bool {
				var se *retry.StatusError
				if errors.As(err, &se) && se.Code == http.StatusBadRequest {
					once.Do(func() {
						close(classified)
						<-committed
					})
				}
				return retry.DefaultClassify(err)
			},
			After: func(time.Duration) <-chan time.Time { return closedTime }, // hedge at once
		}}, func(r *http.Request) (*http.Response, error) {
			if r.URL.Host == "a.test" {
				<-classified
				return sseResponse(r, "data: x\n\n"), nil
			}
			return &http.Response{StatusCode: http.StatusBadRequest, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("bad")), Request: r}, nil
		}, 2)
		h.tr.afterCommit = func() { close(committed) }
		resp, err := do(t, h, chatBody)
		require.NoError(t, err)
		body, err := readAll(t, resp)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d", i)
		assert.Equal(t, "data: x\n\n", body)
	}
}
