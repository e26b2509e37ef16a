package fair

import (
	"context"
	"testing"
	"time"
)

// A refusal with nothing waiting after hours without an admission suggests
// the least wait, as it does after a shorter lull: the admission rate had
// decayed to exactly 0, and 0 waiting at a rate of 0 was taken for an
// endless wait, MaxRetryAfter.
func TestRetryAfterIdleQueue(t *testing.T) {
	for _, idle := range []time.Duration{time.Minute, 3 * time.Hour} {
		q, clk := newTestQueue(t, Config{MaxInFlight: 1})
		for range 10 {
			tk, err := q.push(Request{Principal: "a"})
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			tk.Done()
		}
		clk.Advance(idle)
		ctx, cancel := context.WithDeadline(context.Background(), clk.Now())
		_, err := q.Admit(ctx, Request{Principal: "b"})
		cancel()
		if got := retryAfter(t, err, "queue"); got != DefaultRetryAfter {
			t.Errorf("after %v idle, nothing waiting: RetryAfter %v, want %v", idle, got, DefaultRetryAfter)
		}
		mustCheck(t, q)
	}
}
