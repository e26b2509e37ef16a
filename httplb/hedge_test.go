package httplb

import (
	"context"
	"io"
	"math"
	"net/http"
	"slices"
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

// slow never sends a first event; it counts the requests it saw cancelled.
func slow(cancelled *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			cancelled.Add(1)
		case <-time.After(10 * time.Second):
		}
	}
}

func TestHedgeWins(t *testing.T) {
	var cancelled atomic.Int64
	a := newUpstream(t, slow(&cancelled))
	b := newUpstream(t, streamTokens(2))
	budget := &denyAll{}
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Hedge: retry.HedgeConfig{Delay: time.Millisecond}, Budget: unlimitedFinish{budget}}}, a, b)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
	// The first attempt may be cancelled before its request reaches a (the
	// hedge fires after 1 ms and can win first on a loaded machine); if it
	// did reach a, a must see it cancelled.
	assert.LessOrEqual(t, a.hits.Load(), int64(1))
	assert.EqualValues(t, 1, b.hits.Load())
	require.Eventually(t, func() bool { return cancelled.Load() == a.hits.Load() }, 5*time.Second, time.Millisecond, "the losing attempt is cancelled")
	assert.EqualValues(t, 2, budget.finished.Load())
}

// Two attempts that both receive a first event: only the first commits, the
// other is closed, and both are finished.
func TestHedgeBothCommit(t *testing.T) {
	a := newUpstream(t, streamTokens(1))
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{Hedge: retry.HedgeConfig{Delay: time.Millisecond}}}, a, b)
	for range 20 {
		resp, err := do(t, h, chatBody)
		require.NoError(t, err)
		body, err := readAll(t, resp)
		require.NoError(t, err)
		assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body)
	}
	assert.Greater(t, a.hits.Load()+b.hits.Load(), int64(20), "some requests were hedged")
}

func TestHedgeFailuresThenRetry(t *testing.T) {
	a := newUpstream(t, status(http.StatusServiceUnavailable))
	b := newUpstream(t, status(http.StatusServiceUnavailable))
	c := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Hedge: retry.HedgeConfig{Delay: time.Millisecond}, MaxAttempts: 3, Budget: unlimited{}}}, a, b, c)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 1, c.hits.Load())
}

// With one endpoint there is nowhere to hedge to: the attempt just goes on.
func TestHedgeNowhere(t *testing.T) {
	a := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Hedge: retry.HedgeConfig{Delay: time.Millisecond}}}, a)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.EqualValues(t, 1, a.hits.Load())
}

func TestHedgeCancelled(t *testing.T) {
	var cancelled atomic.Int64
	a := newUpstream(t, slow(&cancelled))
	b := newUpstream(t, slow(&cancelled))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{Hedge: retry.HedgeConfig{Delay: time.Millisecond}, Budget: unlimited{}}}, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	_, err = h.tr.RoundTrip(req)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 1, b.hits.Load())
}

// stepClock is a clock that only moves when told to.
type stepClock struct {
	mu  sync.Mutex // protects now
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// With a hedge Percentile the hedge delay is learned, as in a retry.Loop:
// once 20 winners took 40 ms from pick to first event, a slow attempt is
// hedged after their p90, 40 ms, not after Delay, which is only the floor
// (and until then the delay; with no Delay nothing is hedged until then).
func TestHedgePercentile(t *testing.T) {
	const ttft = 40 * time.Millisecond
	cases := []struct {
		name  string
		delay time.Duration
		early []time.Duration // hedge delays of the first 19 requests
	}{
		{"floor", time.Millisecond, slices.Repeat([]time.Duration{time.Millisecond}, 19)},
		{"no floor", 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := &stepClock{now: time.Unix(1, 0)}
			var slow atomic.Bool // a.test never answers, and hedge timers fire at once
			var mu sync.Mutex
			var delays []time.Duration // the hedge delays asked for
			var hits [2]atomic.Int64   // a.test, b.test
			h := newMemHarness(t, Config{Retry: retry.LoopConfig{
				Hedge:  retry.HedgeConfig{Delay: c.delay, Percentile: 0.9},
				Budget: unlimited{},
				Clock:  clock,
				After: func(d time.Duration) <-chan time.Time {
					mu.Lock()
					delays = append(delays, d)
					mu.Unlock()
					if slow.Load() {
						return closedTime
					}
					return nil
				},
			}}, func(r *http.Request) (*http.Response, error) {
				hits[r.URL.Host[0]-'a'].Add(1)
				if slow.Load() && r.URL.Host == "a.test" {
					<-r.Context().Done()
					return nil, r.Context().Err()
				}
				clock.Advance(ttft)
				return sseResponse(r, "data: x\n\n"), nil
			}, 2)
			get := func() {
				t.Helper()
				resp, err := do(t, h, chatBody)
				require.NoError(t, err)
				_, err = readAll(t, resp)
				require.NoError(t, err)
			}
			for range 19 {
				get()
			}
			mu.Lock()
			assert.Equal(t, c.early, delays, "before 20 winners: Delay")
			mu.Unlock()
			// The 20th request's winner may commit before its hedge timer
			// is set, which may then see 20 winners or not.
			get()
			mu.Lock()
			delays = nil
			mu.Unlock()
			for range 5 {
				get()
			}
			mu.Lock()
			assert.Equal(t, slices.Repeat([]time.Duration{ttft}, 5), delays, "after 20 winners: their p90")
			delays = nil
			mu.Unlock()
			assert.EqualValues(t, 25, hits[0].Load())
			assert.Zero(t, hits[1].Load(), "a fast attempt was hedged")

			slow.Store(true)
			// A safety net for a broken build only: the hedge wins at once.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			resp, err := h.tr.RoundTrip(req)
			require.NoError(t, err, "the slow attempt was not hedged")
			_, err = readAll(t, resp)
			require.NoError(t, err)
			mu.Lock()
			require.NotEmpty(t, delays)
			assert.Equal(t, ttft, delays[0], "the slow attempt's hedge delay")
			mu.Unlock()
			assert.EqualValues(t, 1, hits[1].Load(), "the slow attempt was hedged")
		})
	}
}

// TestHedgeManyAttempts: MaxAttempts has no upper bound in a Transport; a
// large one, bounded in practice by the budget, costs a hedged request
// nothing.
func TestHedgeManyAttempts(t *testing.T) {
	a := newUpstream(t, streamTokens(1))
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{
		MaxAttempts: math.MaxInt,
		Hedge:       retry.HedgeConfig{Delay: time.Hour},
	}}, a, b)
	var resp *http.Response
	var err error
	require.NotPanics(t, func() { resp, err = do(t, h, chatBody) })
	require.NoError(t, err)
	_, err = readAll(t, resp)
	require.NoError(t, err)
}

// A hedge with no endpoint to go to sends nothing and takes nothing from
// the budget: with a single endpoint, with the others excluded by the
// request, and once every endpoint has an attempt.
func TestHedgeNowhereTakesNoBudget(t *testing.T) {
	cases := []struct {
		name      string
		endpoints int
		exclude   []string // keys the request excludes
		maxHedges int
		picks     int64 // picks made, the hedge's that finds nothing included
		hedges    int   // hedges sent
	}{
		{"one endpoint", 1, nil, 1, 2, 0},
		{"others excluded", 3, []string{"http://b.test", "http://c.test"}, 1, 2, 0},
		{"every endpoint tried", 2, nil, 2, 3, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var picks atomic.Int64
			picked := make(chan struct{}) // the last pick was made
			budget := &countingBudget{}
			var ev events
			h := newMemHarness(t, Config{
				Adjust: func(_ *http.Request, lr *llmlb.Request) { lr.Exclude = c.exclude },
				Retry: retry.LoopConfig{
					MaxAttempts: 3,
					Hedge:       retry.HedgeConfig{Delay: time.Hour, MaxHedges: c.maxHedges},
					Budget:      budget,
					Observer:    ev.observer(),
					After:       func(time.Duration) <-chan time.Time { return closedTime }, // hedge at once
				},
			}, func(r *http.Request) (*http.Response, error) {
				if r.URL.Host != "a.test" {
					<-r.Context().Done() // a hedge waits until a wins
					return nil, r.Context().Err()
				}
				<-picked
				return sseResponse(r, "data: x\n\n"), nil
			}, c.endpoints, llmlb.WithObserver(&llmlb.Observer{Pick: func(llmlb.PickInfo) {
				if picks.Add(1) == c.picks {
					close(picked)
				}
			}}))
			resp, err := do(t, h, chatBody)
			require.NoError(t, err)
			_, err = readAll(t, resp)
			require.NoError(t, err)
			assert.EqualValues(t, c.hedges, budget.withdrawn.Load(), "budget withdrawals")
			ev.mu.Lock()
			defer ev.mu.Unlock()
			assert.Len(t, ev.hedges, c.hedges, "hedges sent")
			assert.Zero(t, ev.denied, "hedges the budget refused")
		})
	}
}

// The client leaves while a hedge is being picked: the hedge is not sent,
// observed or paid for.
func TestNoHedgeAfterClientLeft(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var picks, hedgesSent atomic.Int64
	budget := &countingBudget{}
	var ev events
	h := newMemHarness(t, Config{Retry: retry.LoopConfig{
		Hedge:    retry.HedgeConfig{Delay: time.Hour},
		Budget:   budget,
		Observer: ev.observer(),
		After:    func(time.Duration) <-chan time.Time { return closedTime }, // hedge at once
	}}, func(r *http.Request) (*http.Response, error) {
		if r.URL.Host != "a.test" {
			hedgesSent.Add(1)
		}
		<-r.Context().Done()
		return nil, r.Context().Err()
	}, 2, llmlb.WithObserver(&llmlb.Observer{Pick: func(llmlb.PickInfo) {
		if picks.Add(1) == 2 {
			cancel() // after the hedge's pick checked the context
		}
	}}))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	_, err = h.tr.RoundTrip(req)
	require.ErrorIs(t, err, context.Canceled)
	assert.EqualValues(t, 2, picks.Load(), "picks")
	assert.Zero(t, hedgesSent.Load(), "hedges sent to the upstream")
	assert.Zero(t, budget.withdrawn.Load(), "budget withdrawals")
	ev.mu.Lock()
	defer ev.mu.Unlock()
	assert.Empty(t, ev.hedges, "hedges observed")
}

// A hedge's overload answer arrives as the first attempt wins: it is
// reported as it is (a 429 and the wait it asks for), not as a
// cancellation, so that outlier detection cools its endpoint down.
func TestHedgeLoserAnswerReported(t *testing.T) {
	cases := []struct {
		name    string
		code    int
		header  http.Header
		outcome retry.Outcome // the budget's outcome of the loser
	}{
		{"429", http.StatusTooManyRequests, http.Header{"Retry-After": {"30"}}, retry.Failed},
		{"503", http.StatusServiceUnavailable, http.Header{}, retry.Failed},
		{"400", http.StatusBadRequest, http.Header{}, retry.Abandoned},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hedged := make(chan struct{}) // the hedge reached b
			rep := &recorder{}
			budget := &outcomes{}
			var mu sync.Mutex
			done := map[string]error{} // the error each pick ended with
			h := newMemHarness(t, Config{Retry: retry.LoopConfig{
				Hedge:    retry.HedgeConfig{Delay: time.Hour},
				Budget:   budget,
				Reporter: rep,
				After:    func(time.Duration) <-chan time.Time { return closedTime }, // hedge at once
			}}, func(r *http.Request) (*http.Response, error) {
				if r.URL.Host == "a.test" {
					<-hedged
					return sseResponse(r, "data: x\n\n"), nil
				}
				close(hedged)
				// The answer is handed back only once a has won and this
				// attempt was cancelled: its result then waits behind the
				// winner's.
				<-r.Context().Done()
				return &http.Response{StatusCode: c.code, Header: c.header, Body: io.NopCloser(strings.NewReader("busy")), Request: r}, nil
			}, 2, llmlb.WithObserver(&llmlb.Observer{Done: func(d llmlb.DoneInfo) {
				mu.Lock()
				done[d.Endpoint.Key()] = d.Err
				mu.Unlock()
			}}))
			resp, err := do(t, h, chatBody)
			require.NoError(t, err)
			body, err := readAll(t, resp)
			require.NoError(t, err)
			require.Equal(t, "data: x\n\n", body)

			rep.mu.Lock()
			var lost error
			for i, k := range rep.keys {
				if k == "http://b.test" {
					lost = rep.errs[i]
				}
			}
			rep.mu.Unlock()
			var se *retry.StatusError
			require.ErrorAs(t, lost, &se, "the losing hedge was reported as %v", lost)
			assert.Equal(t, c.code, se.Code)
			assert.Equal(t, c.header.Get("Retry-After"), se.Header.Get("Retry-After"))
			mu.Lock()
			assert.ErrorAs(t, done["http://b.test"], &se, "the losing hedge's pick ended with %v", done["http://b.test"])
			mu.Unlock()
			budget.mu.Lock()
			assert.ElementsMatch(t, []retry.Outcome{retry.Succeeded, c.outcome}, budget.got, "the budget's outcomes")
			budget.mu.Unlock()
		})
	}
}
