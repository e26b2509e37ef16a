package fair

import (
	"testing"
	"time"
)

// TestTokenCapHeadIsNotStarvedByAging: a request whose prompt is larger than
// MaxTokensInFlight is admitted once the tokens in flight drain, even while
// a less urgent backlog ages: the admissions aging lends the backlog, one an
// interval, do not keep tokens in flight for ever.
func TestTokenCapHeadIsNotStarvedByAging(t *testing.T) {
	const (
		aging = time.Second
		hold  = 3 * time.Second // each backlog request's run time
		step  = 100 * time.Millisecond
	)
	cases := []struct {
		name       string
		big, small Class
	}{
		{"interactive over standard", Interactive, Standard},
		{"interactive over batch", Interactive, Batch},
		{"standard over batch", Standard, Batch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, clk := newTestQueue(t, Config{MaxTokensInFlight: 100, AgingInterval: aging})
			type running struct {
				tk    *Ticket
				until time.Time
			}
			var (
				inflight []running
				backlog  []*Ticket
				lent     int
			)
			refill := func() {
				var keep []*Ticket
				for _, tk := range backlog {
					switch tk.stateNow() {
					case stateQueued:
						keep = append(keep, tk)
					case stateAdmitted:
						inflight = append(inflight, running{tk, clk.Now().Add(hold)})
						lent++
					}
				}
				backlog = keep
				for len(backlog) < 5 {
					tk, err := q.push(Request{Principal: "backlog", Class: c.small, PromptTokens: 10})
					if err != nil {
						t.Fatal(err)
					}
					if tk.admitted() {
						inflight = append(inflight, running{tk, clk.Now().Add(hold)})
						continue
					}
					backlog = append(backlog, tk)
				}
			}
			refill()
			big, err := q.push(Request{Principal: "user", Class: c.big, PromptTokens: 500})
			if err != nil {
				t.Fatal(err)
			}
			start := clk.Now()
			for clk.Now().Sub(start) < time.Minute && !big.admitted() {
				clk.Advance(step)
				var keep []running
				for _, r := range inflight {
					if clk.Now().Before(r.until) {
						keep = append(keep, r)
						continue
					}
					r.tk.Done()
				}
				inflight = keep
				refill()
				mustCheck(t, q)
			}
			waited := clk.Now().Sub(start)
			if !big.admitted() {
				t.Fatalf("the request larger than the token cap still waits after %v; aging lent the backlog %d admissions meanwhile", waited, lent)
			}
			// It waits for the requests in flight to end, and for those
			// lent an admission before it was first in order.
			if limit := hold + 2*aging + step; waited > limit {
				t.Errorf("the request larger than the token cap waited %v, more than %v", waited, limit)
			}
		})
	}
}

// TestTokenCapHeadYieldsToMoreUrgent: a waiter that keeps its place for want
// of tokens still lets a request of a more urgent class in before it.
func TestTokenCapHeadYieldsToMoreUrgent(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxTokensInFlight: 100})
	first, _ := q.push(Request{Principal: "a", PromptTokens: 50})
	big, _ := q.push(Request{Principal: "b", Class: Standard, PromptTokens: 80})
	same, _ := q.push(Request{Principal: "c", Class: Standard, PromptTokens: 10})
	urgent, _ := q.push(Request{Principal: "d", Class: Interactive, PromptTokens: 10})
	if !first.admitted() || big.admitted() || same.admitted() || !urgent.admitted() {
		t.Fatalf("admitted: first %v, big %v, same class %v, more urgent %v; want true, false, false, true",
			first.admitted(), big.admitted(), same.admitted(), urgent.admitted())
	}
	first.Done()
	urgent.Done()
	if !big.admitted() || !same.admitted() {
		t.Fatal("the tokens drained and the waiters were not admitted")
	}
	big.Done()
	same.Done()
	mustCheck(t, q)
}
