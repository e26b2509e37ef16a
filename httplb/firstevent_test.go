package httplb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keepAliveOnly answers with an event stream of nothing but comments until
// its request is cancelled, which it counts. After its first comment it
// calls started once.
func keepAliveOnly(started func(), cancelled *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		var once sync.Once
		for {
			fmt.Fprint(w, ": keep-alive\n\n")
			w.(http.Flusher).Flush()
			once.Do(started)
			select {
			case <-r.Context().Done():
				cancelled.Add(1)
				return
			case <-tick.C:
			}
		}
	}
}

// outcomes records what the budget is told.
type outcomes struct {
	mu  sync.Mutex
	got []retry.Outcome
}

func (*outcomes) Start()         {}
func (*outcomes) Withdraw() bool { return true }
func (o *outcomes) Finish(_ bool, out retry.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, out)
}

// An upstream that sends only keep-alive comments is given up after the
// first-event timeout and the request is retried on the next endpoint.
func TestFirstEventTimeout(t *testing.T) {
	const timeout = time.Hour // marks the first-event timers
	cases := []struct {
		name  string
		hedge time.Duration
	}{
		{"serial", 0},
		{"hedged", 2 * time.Hour}, // a hedge timer that never fires
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The first attempt's timer fires once a's stream of comments
			// has begun; the others never fire.
			fire := make(chan time.Time)
			var timers atomic.Int64
			var cancelled atomic.Int64
			a := newUpstream(t, keepAliveOnly(func() { close(fire) }, &cancelled))
			b := newUpstream(t, streamTokens(1))
			rec := &recorder{}
			budget := &outcomes{}
			h := newHarness(t, fixed{}, Config{FirstEventTimeout: timeout, Retry: retry.LoopConfig{
				Hedge:    retry.HedgeConfig{Delay: c.hedge},
				Reporter: rec,
				Budget:   budget,
				After: func(d time.Duration) <-chan time.Time {
					switch d {
					case timeout:
						if timers.Add(1) == 1 {
							return fire
						}
						return nil
					case c.hedge:
						return nil
					}
					return closedTime
				},
			}}, a, b)
			// A safety net for a broken build only: a correct one never
			// gets near it.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
			require.NoError(t, err)
			resp, err := h.tr.RoundTrip(req)
			require.NoError(t, err)
			body, err := readAll(t, resp)
			require.NoError(t, err)
			assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body)
			assert.EqualValues(t, 1, a.hits.Load())
			assert.EqualValues(t, 1, b.hits.Load())
			assert.EqualValues(t, 2, timers.Load(), "one timer per attempt")
			rec.mu.Lock()
			assert.Equal(t, []string{a.URL, b.URL}, rec.keys)
			require.Len(t, rec.errs, 2)
			assert.ErrorIs(t, rec.errs[0], ErrFirstEventTimeout)
			assert.NoError(t, rec.errs[1])
			rec.mu.Unlock()
			budget.mu.Lock()
			assert.Equal(t, []retry.Outcome{retry.Failed, retry.Succeeded}, budget.got, "the timed-out attempt failed")
			budget.mu.Unlock()
			require.Eventually(t, func() bool { return cancelled.Load() == 1 }, 5*time.Second, time.Millisecond, "a's attempt is cancelled")
		})
	}
}

// Without a first-event timeout an attempt waits for its first event until
// the request's context ends; nothing is retried.
func TestNoFirstEventTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled atomic.Int64
	a := newUpstream(t, keepAliveOnly(cancel, &cancelled)) // the client gives up once the comments have begun
	b := newUpstream(t, streamTokens(1))
	h := newHarness(t, fixed{}, Config{}, a, b)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	_, err = h.tr.RoundTrip(req)
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, errors.Is(err, ErrFirstEventTimeout))
	assert.EqualValues(t, 1, a.hits.Load())
	assert.EqualValues(t, 0, b.hits.Load())
	require.Eventually(t, func() bool { return cancelled.Load() == 1 }, 5*time.Second, time.Millisecond)
}

// The timer with the system clock: it fires, or it is stopped in time.
func TestEventTimer(t *testing.T) {
	errLate := errors.New("late")
	for _, after := range []func(time.Duration) <-chan time.Time{nil, time.After} {
		tr := &Transport{firstWait: time.Nanosecond, after: after}
		ctx, cancel := context.WithCancelCause(context.Background())
		e := tr.startEventTimer(cancel, errLate)
		<-ctx.Done()
		assert.Equal(t, errLate, context.Cause(ctx))
		assert.False(t, e.stop(), "fired")

		tr.firstWait = time.Hour
		ctx, cancel = context.WithCancelCause(context.Background())
		e = tr.startEventTimer(cancel, errLate)
		assert.True(t, e.stop(), "stopped before firing")
		assert.NoError(t, ctx.Err())
		cancel(nil)
	}
}
