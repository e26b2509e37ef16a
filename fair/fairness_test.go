package fair

import (
	"fmt"
	"testing"
	"time"
)

// contention runs a closed-loop workload in steps: K requests in flight, a
// heavy principal keeping heavyDepth requests waiting and each light one
// keeping one; every request has a 100-token prompt and streams 50 output
// tokens, 10 a step. principalOf maps a workload principal to the queue's
// principal. It returns the weighted service (prompt + 2 x output tokens)
// each workload principal received.
func contention(t *testing.T, principalOf func(string) string, steps int) map[string]float64 {
	t.Helper()
	const (
		k          = 4
		heavyDepth = 20
		prompt     = 100
		output     = 50
		perStep    = 10
	)
	q, _ := newTestQueue(t, Config{MaxInFlight: k, MaxWaiting: 100})
	names := []string{"heavy", "light1", "light2", "light3"}
	depth := map[string]int{"heavy": heavyDepth, "light1": 1, "light2": 1, "light3": 1}
	type req struct {
		who string
		tk  *Ticket
		out int
	}
	var all []*req
	service := map[string]float64{}
	waiting := map[string]int{}
	refill := func() {
		for _, who := range names {
			for waiting[who] < depth[who] {
				tk, err := q.push(Request{Principal: principalOf(who), PromptTokens: prompt})
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, &req{who: who, tk: tk})
				waiting[who]++
			}
		}
	}
	seen := map[*req]bool{}
	account := func() {
		for _, r := range all {
			if !seen[r] && r.tk.stateNow() != stateQueued {
				seen[r] = true
				waiting[r.who]--
				service[r.who] += prompt
			}
		}
	}
	refill()
	account()
	refill()
	for range steps {
		var live []*req
		for _, r := range all {
			switch r.tk.stateNow() {
			case stateAdmitted:
				r.tk.Charge(perStep)
				r.out += perStep
				service[r.who] += 2 * perStep
				if r.out >= output {
					r.tk.Done()
					continue
				}
			case stateDone:
				continue
			}
			live = append(live, r)
		}
		all = live
		account()
		refill()
		mustCheck(t, q)
	}
	return service
}

// Under contention VTC gives each backlogged principal the same service
// within a bound, however many requests the heavy one queues; FIFO (every
// request under one principal) gives the heavy one a share proportional to
// its queue.
func TestFairnessHeavyVersusLight(t *testing.T) {
	const steps = 4000
	const perRequest = 100 + 2*50 // U: the most one request is charged
	vtc := contention(t, func(p string) string { return p }, steps)
	fifo := contention(t, func(string) string { return "" }, steps)
	total := func(m map[string]float64) float64 {
		s := 0.0
		for _, v := range m {
			s += v
		}
		return s
	}
	t.Logf("VTC  service: %v", fmtShares(vtc))
	t.Logf("FIFO service: %v", fmtShares(fifo))

	// VTC: every principal is within (K+1)*U of the fair share. A principal
	// is admitted only while its counter is the least of those waiting, is
	// charged at most U per admission, and has at most K requests in flight
	// whose output is still to be charged.
	fair := total(vtc) / 4
	bound := float64(4+1) * perRequest
	for who, s := range vtc {
		if d := s - fair; d > bound || d < -bound {
			t.Errorf("VTC: %s served %.0f, fair share %.0f, off by more than %.0f", who, s, fair, bound)
		}
	}
	// FIFO: the light principals get about 1/23 of the service each, less
	// than half their fair share.
	fairFIFO := total(fifo) / 4
	for _, who := range []string{"light1", "light2", "light3"} {
		if fifo[who] > fairFIFO/2 {
			t.Errorf("FIFO: %s served %.0f, expected under half the fair share %.0f", who, fifo[who], fairFIFO)
		}
	}
	if fifo["heavy"] < 2*fairFIFO {
		t.Errorf("FIFO: heavy served %.0f, expected over twice the fair share %.0f", fifo["heavy"], fairFIFO)
	}
}

func fmtShares(m map[string]float64) string {
	s := 0.0
	for _, v := range m {
		s += v
	}
	out := ""
	for _, who := range []string{"heavy", "light1", "light2", "light3"} {
		out += fmt.Sprintf("%s=%.1f%% ", who, 100*m[who]/s)
	}
	return out
}

// A lower class never starves: with Interactive requests saturating the
// queue, a Batch waiter is admitted within 2 aging intervals (plus one
// release), a Standard one within 1; without aging neither gets in.
func TestAgingPreventsStarvation(t *testing.T) {
	const (
		aging = time.Second
		step  = 100 * time.Millisecond
	)
	run := func(agingInterval time.Duration, class Class, horizon time.Duration) (time.Duration, bool) {
		q, clk := newTestQueue(t, Config{MaxInFlight: 2, AgingInterval: agingInterval})
		var live []*Ticket
		refill := func() {
			queued := map[string]int{}
			for _, tk := range live {
				if tk.stateNow() == stateQueued {
					queued[tk.p.key]++
				}
			}
			for _, p := range []string{"i1", "i2"} {
				for range 3 - queued[p] {
					tk, err := q.push(Request{Principal: p, Class: Interactive, PromptTokens: 10})
					if err != nil {
						t.Fatal(err)
					}
					live = append(live, tk)
				}
			}
		}
		refill()
		start := clk.Now()
		low, err := q.push(Request{Principal: "b", Class: class, PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		for clk.Now().Sub(start) < horizon {
			clk.Advance(step)
			var running, next []*Ticket
			for _, tk := range live {
				switch tk.stateNow() {
				case stateAdmitted:
					running = append(running, tk)
				case stateQueued:
					next = append(next, tk)
				}
			}
			for _, tk := range running {
				tk.Done() // every request lasts one step
			}
			live = next
			switch low.stateNow() {
			case stateAdmitted:
				return clk.Now().Sub(start), true
			case stateRefused:
				t.Fatalf("%v waiter refused: %v", class, low.err)
			}
			refill() // Interactive demand never lets up
		}
		return horizon, false
	}
	for _, tc := range []struct {
		class Class
		bound time.Duration
	}{{Batch, 2*aging + step}, {Standard, aging + step}} {
		waited, ok := run(aging, tc.class, time.Minute)
		if !ok || waited > tc.bound {
			t.Errorf("%v waited %v (admitted %v), bound %v", tc.class, waited, ok, tc.bound)
		}
		t.Logf("%v admitted after %v with aging", tc.class, waited)
		if _, ok := run(-1, tc.class, time.Minute); ok {
			t.Errorf("%v admitted without aging: the workload does not saturate", tc.class)
		}
	}
}

// Aging lends a less urgent class one admission per interval, not the more
// urgent class's place: with a Standard backlog that never lets up and a
// Batch backlog older than the interval, Batch is admitted about once per
// interval, and Standard keeps the rest.
func TestAgingLendsOneAdmissionPerInterval(t *testing.T) {
	const (
		aging   = time.Second
		step    = 100 * time.Millisecond
		horizon = 10 * time.Second
	)
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, AgingInterval: aging})
	push := func(p string, c Class) *Ticket {
		tk, err := q.push(Request{Principal: p, Class: c, PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	live := []*Ticket{push("s", Standard)} // admitted at once
	for range 30 {
		live = append(live, push("b", Batch))
	}
	admitted := map[Class]int{}
	for start := clk.Now(); clk.Now().Sub(start) < horizon; {
		queued := 0
		for _, tk := range live {
			if tk.stateNow() == stateQueued && tk.rank == Standard.rank() {
				queued++
			}
		}
		for range 3 - queued {
			live = append(live, push("s", Standard))
		}
		clk.Advance(step)
		var running, next []*Ticket
		for _, tk := range live {
			switch tk.stateNow() {
			case stateAdmitted:
				running = append(running, tk)
			case stateQueued:
				next = append(next, tk)
			}
		}
		for _, tk := range running {
			tk.Done() // every request lasts one step
		}
		for _, tk := range next {
			if tk.stateNow() == stateAdmitted {
				admitted[Class(tk.rank-1)]++
			}
		}
		live = next
	}
	per := int(horizon / aging)
	if b := admitted[Batch]; b < per-1 || b > per+1 {
		t.Errorf("Batch admitted %d times in %v, want about one per %v (%d); Standard %d", b, horizon, aging, per, admitted[Standard])
	}
}

// Aging never lifts a waiter above another of its own class: a tenant whose
// backlog has waited for many aging intervals does not go before a light
// tenant's fresh request of the same class once it has received more.
func TestAgingKeepsTheCounterOrderWithinAClass(t *testing.T) {
	const aging = time.Second
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, AgingInterval: aging})
	running, err := q.push(Request{Principal: "heavy", Class: Standard, PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	var backlog []*Ticket
	for range 10 {
		tk, err := q.push(Request{Principal: "heavy", Class: Standard, PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		backlog = append(backlog, tk)
	}
	clk.Advance(5 * aging)
	light, err := q.push(Request{Principal: "light", Class: Standard, PromptTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	// light is lifted to heavy's counter; heavy's oldest waiter goes first
	// on the tie, after which heavy has received more than light.
	for i := 0; i < 2 && light.stateNow() != stateAdmitted; i++ {
		running.Done()
		for _, tk := range backlog {
			if tk.stateNow() == stateAdmitted {
				running = tk
			}
		}
	}
	if light.stateNow() != stateAdmitted {
		t.Fatal("the light tenant's request waited behind the heavy tenant's older backlog of its class")
	}
}

// Aging lends the less urgent class its admission whatever its principals'
// counters: a Batch tenant that was served one long generation (a counter
// far above the Interactive tenant's) still advances one request each time
// its rank has aged to Interactive's, two intervals, instead of waiting
// until the Interactive tenant has received as much.
func TestAgingLendsAdmissionsToAServedTenant(t *testing.T) {
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, AgingInterval: time.Second, MaxWaiting: 1000})
	var running []*Ticket // admitted, in order
	waiting := map[string]int{}
	enter := func(p string, c Class) {
		var tk *Ticket
		tk, ok, err := q.Enter(Request{Principal: p, Class: c, PromptTokens: 100}, func(err error) {
			waiting[p]--
			if err == nil {
				running = append(running, tk)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			running = append(running, tk)
		} else {
			waiting[p]++
		}
	}
	enter("b", Batch)       // admitted at once
	enter("i", Interactive) // waits, its counter lifted to b's
	running[0].Charge(100000)
	admitted := map[string]int{}
	const steps, step = 600, 200 * time.Millisecond
	for range steps {
		for waiting["i"] < 5 {
			enter("i", Interactive)
		}
		for waiting["b"] < 5 {
			enter("b", Batch)
		}
		clk.Advance(step)
		tk := running[0]
		running = running[1:]
		tk.Charge(50)
		tk.Done() // admits the next
		if len(running) > 0 {
			admitted[running[0].p.key]++
		}
	}
	want := int(steps * step / (2 * time.Second))
	if b := admitted["b"]; b < want-2 || b > want+2 {
		t.Errorf("Batch admitted %d times of %d, want about %d (one per two aging intervals)", b, steps, want)
	}
}

// TestAgingWhenTheClockGoesBack steps the clock back after a Standard
// request queued: the class must keep its own rank, not fall behind a Batch
// request that arrived after the step.
func TestAgingWhenTheClockGoesBack(t *testing.T) {
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, AgingInterval: time.Second})
	push := func(p string, c Class) *Ticket {
		tk, err := q.push(Request{Principal: p, Class: c, PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	running := push("x", Standard)
	standard := push("s", Standard)
	clk.Advance(-10 * time.Second)
	batch := push("b", Batch)
	running.Done()
	if !standard.admitted() || batch.admitted() {
		t.Fatalf("after the clock went back: Standard admitted %v, Batch admitted %v; want the Standard request first", standard.admitted(), batch.admitted())
	}
	standard.Done()
	if !batch.admitted() {
		t.Fatal("Batch request not admitted once the queue was free")
	}
	batch.Done()
}

// After the clock steps back, a class waits from the step: under sustained
// Interactive load a Batch waiter is admitted within two aging intervals of
// it, as ever, not only once the clock is back where it was.
func TestAgingResumesAfterTheClockGoesBack(t *testing.T) {
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, AgingInterval: time.Second})
	push := func(p string, c Class) *Ticket {
		tk, err := q.push(Request{Principal: p, Class: c, PromptTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	running := push("b", Batch) // Batch admitted just before the step
	clk.Advance(-time.Hour)
	queued := push("i", Interactive)
	batch := push("b", Batch)
	for step := range 4 {
		clk.Advance(time.Second)
		running.Done()
		running = queued
		if batch.admitted() {
			t.Logf("Batch admitted %d s after the clock went back", step+1)
			running.Done()
			batch.Done()
			mustCheck(t, q)
			return
		}
		if !running.admitted() {
			t.Fatal("the Interactive waiter was not admitted")
		}
		queued = push("i", Interactive)
	}
	t.Fatal("Batch not admitted within 4 aging intervals after the clock went back")
}
