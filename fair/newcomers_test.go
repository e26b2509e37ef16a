package fair

import (
	"fmt"
	"math"
	"testing"
)

// churnRun is a closed-loop workload in steps: k requests in flight at
// most, each steady principal keeping one request waiting, and oneShots
// principals that each wait once (a new name for every request) kept
// waiting; every request has a 100-token prompt and streams 50 output
// tokens, 10 a step. The steady principal named idle sends nothing from
// step idleFrom until step idleTo, when it comes back with idleDepth
// requests at once.
type churnRun struct {
	steady    []string
	weight    map[string]float64 // weights of steady principals; 1 if absent
	oneShots  int
	k         int
	idle      string
	idleFrom  int
	idleTo    int
	idleDepth int
	steps     int
	from      int // the step from which admissions are counted
}

type churnResult struct {
	admitted   map[string]int // admissions from step from on: by steady principal, and "one-shot" for the others
	total      int            // all the admissions from step from on
	maxOneShot int            // most admissions that passed while a one-shot principal waited
	back       []bool         // the first admissions after idle came back: whether each was idle's
}

func (c churnRun) run(t *testing.T) churnResult {
	t.Helper()
	const (
		prompt  = 100
		output  = 50
		perStep = 10
	)
	q, _ := newTestQueue(t, Config{MaxInFlight: c.k, Weight: func(p string) float64 {
		if w, ok := c.weight[p]; ok {
			return w
		}
		return 1
	}})
	type req struct {
		who     string // steady principal, or "" for a one-shot one
		tk      *Ticket
		out     int
		arrived int // admissions so far when it arrived
	}
	var (
		live     []*req
		admitted = map[string]int{}
		waiting  = map[string]int{}
		total    int
		maxWait  int
		names    int
	)
	res := churnResult{admitted: admitted}
	push := func(who string) {
		name := who
		if who == "" {
			name = fmt.Sprintf("one-shot-%d", names)
			names++
		}
		tk, err := q.push(Request{Principal: name, PromptTokens: prompt})
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, &req{who: who, tk: tk, arrived: total})
		waiting[who]++
	}
	refill := func(step int) {
		for _, who := range c.steady {
			depth := 1
			if who == c.idle && step >= c.idleFrom && step < c.idleTo {
				continue
			}
			if who == c.idle && step == c.idleTo {
				depth = c.idleDepth
			}
			for waiting[who] < depth {
				push(who)
			}
		}
		for waiting[""] < c.oneShots {
			push("")
		}
	}
	seen := map[*req]bool{}
	account := func(step int) {
		for _, r := range live {
			if seen[r] || r.tk.stateNow() == stateQueued {
				continue
			}
			seen[r] = true
			waiting[r.who]--
			if r.who == "" {
				maxWait = max(maxWait, total-r.arrived)
			}
			total++
			if step >= c.from {
				key := r.who
				if key == "" {
					key = "one-shot"
				}
				admitted[key]++
				res.total++
			}
			if c.idle != "" && step >= c.idleTo && len(res.back) < 3*(len(c.steady)+c.oneShots) {
				res.back = append(res.back, r.who == c.idle)
			}
		}
	}
	for step := range c.steps {
		refill(step)
		account(step)
		var next []*req
		for _, r := range live {
			switch r.tk.stateNow() {
			case stateAdmitted:
				r.tk.Charge(perStep)
				r.out += perStep
				if r.out >= output {
					r.tk.Done()
					continue
				}
			case stateDone:
				continue
			}
			next = append(next, r)
		}
		live = next
		account(step)
		mustCheck(t, q)
	}
	res.maxOneShot = maxWait
	return res
}

// Principals that each wait once cannot starve a principal that keeps
// waiting. With 20 one-shot principals always waiting against 3 steady
// ones, lifting a newcomer to the least counter of those waiting kept it
// at the level of the other newcomers, never charged before they leave:
// the level never rose, and the steady principals, served once, were above
// it for good and got no admission at all. With the virtual time each of
// the 23 principals waiting gets its share, 1/23 of the admissions, and a
// one-shot principal waits about one round.
func TestNewcomersDoNotStarveSteadyPrincipals(t *testing.T) {
	cases := []struct {
		name   string
		weight map[string]float64
	}{
		{"equal weights", nil},
		// A principal of weight 0.01 is charged 100 times a request:
		// it must not make the newcomers wait behind the others.
		{"a low-weight steady principal", map[string]float64{"s3": 0.01}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := churnRun{steady: []string{"s1", "s2", "s3"}, weight: tc.weight, oneShots: 20, k: 4, steps: 6000, from: 1000}.run(t)
			weights := 0.0
			for _, s := range []string{"s1", "s2", "s3"} {
				weights += weightOr1(tc.weight, s)
			}
			weights += 20
			for _, s := range []string{"s1", "s2", "s3"} {
				got := res.admitted[s]
				fair := float64(res.total) * weightOr1(tc.weight, s) / weights
				t.Logf("%s: %d of %d admissions, fair share %.1f", s, got, res.total, fair)
				// Within 10%; a fair share of a few admissions within 2.
				if d := math.Abs(float64(got) - fair); d > max(0.1*fair, 2) {
					t.Errorf("%s got %d of %d admissions, fair share %.1f", s, got, res.total, fair)
				}
			}
			// A one-shot principal waits about one round: one admission of
			// each of the 22 other principals waiting.
			t.Logf("a one-shot principal waited at most %d admissions", res.maxOneShot)
			if res.maxOneShot > 23 {
				t.Errorf("a one-shot principal waited %d admissions, want at most 23", res.maxOneShot)
			}
		})
	}
}

func weightOr1(w map[string]float64, p string) float64 {
	if v, ok := w[p]; ok {
		return v
	}
	return 1
}

// A principal idle for a long time does not monopolise the queue when it
// comes back with a backlog, however far the others' counters rose
// meanwhile: it is lifted to the virtual time, among the principals
// waiting, and gets its share, one admission a round, from the first
// round on. (Lifting it to the least counter of those waiting, the newest
// newcomers', it was served once and then starved with the other steady
// principals.)
func TestIdlePrincipalDoesNotMonopoliseWhenItComesBack(t *testing.T) {
	res := churnRun{
		steady: []string{"s1", "s2", "back"}, oneShots: 20, k: 4,
		idle: "back", idleFrom: 200, idleTo: 3000, idleDepth: 20,
		steps: 3200, from: 3000,
	}.run(t)
	// 23 principals wait: 3 rounds are 69 admissions, 3 of them fair.
	n := 0
	for _, ok := range res.back {
		if ok {
			n++
		}
	}
	t.Logf("back: %d of the first %d admissions after it came back: %v", n, len(res.back), res.back)
	if n < 2 || n > 4 {
		t.Errorf("back got %d of the first %d admissions after it came back with 20 requests, want 2 to 4 (one a round)", n, len(res.back))
	}
	for i := 2; i < len(res.back); i++ {
		if res.back[i] && res.back[i-1] && res.back[i-2] {
			t.Fatalf("back got 3 admissions in a row (admissions %d-%d after it came back)", i-1, i+1)
		}
	}
}

// A principal that sends its next request as soon as one is admitted is
// lifted to the virtual time only once nothing of it is in flight: its
// counter is yet to be charged the output of the request in flight, which
// the virtual time may count already, and lifting it would charge that
// output twice. Two such clients against one that keeps 20 requests
// waiting each get a third of the admissions.
func TestPrincipalWithRequestsInFlightIsNotChargedTwice(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	type client struct {
		name           string
		depth, waiting int
		admitted       int
	}
	clients := []*client{{name: "a", depth: 1}, {name: "b", depth: 1}, {name: "backlog", depth: 20}}
	var (
		inflight *Ticket
		total    int
	)
	for total < 300 {
		for _, c := range clients {
			for c.waiting < c.depth {
				var tk *Ticket
				tk, ok, err := q.Enter(Request{Principal: c.name, PromptTokens: 10}, func(err error) {
					if err != nil {
						t.Fatal(err)
					}
					c.waiting--
					c.admitted++
					total++
					inflight = tk
				})
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					c.admitted++
					total++
					inflight = tk
				} else {
					c.waiting++
				}
			}
		}
		tk := inflight
		tk.Charge(50)
		tk.Done()
	}
	for _, c := range clients {
		if c.admitted < 97 || c.admitted > 103 {
			t.Errorf("%s: %d of %d admissions, want about 100", c.name, c.admitted, total)
		}
	}
}
