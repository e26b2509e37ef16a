package fair

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// model is a reference implementation of the admission order, written for
// clarity: every waiter in one slice, every choice by a full scan.
type model struct {
	maxInFlight int
	maxTokens   int64
	aging       time.Duration
	weights     map[string]float64 // every principal's weight
	counters    map[string]float64
	vtime       float64 // the virtual time
	last        string
	hasLast     bool
	served      map[int]time.Time // the last admission of each rank
	waiters     []*mreq           // in arrival order
	blocked     *mreq             // the waiter first in order that did not fit the token cap
	inflight    []*mreq
	tokens      int64
}

type mreq struct {
	id        int
	principal string
	rank      int
	prompt    int64
	enq       time.Time
	cost      float64 // the counter charge at admission
	price     float64 // the prompt and output charged, before weight
	tokens    int64
}

func (m *model) fits(prompt int64) bool {
	if m.maxInFlight > 0 && len(m.inflight) >= m.maxInFlight {
		return false
	}
	return m.maxTokens == 0 || m.tokens == 0 || m.tokens+prompt <= m.maxTokens
}

func (m *model) waitingPrincipal(p string) bool {
	for _, w := range m.waiters {
		if w.principal == p {
			return true
		}
	}
	return false
}

func (m *model) floor() float64 {
	if len(m.waiters) == 0 {
		if m.hasLast {
			return m.counters[m.last]
		}
		return 0
	}
	f := math.Inf(1)
	for _, w := range m.waiters {
		f = min(f, m.counters[w.principal])
	}
	return f
}

// lift lifts the counter of a principal that starts waiting, or is
// admitted at once: to the least counter of those waiting (or the counter
// of the principal admitted last), and, if it has nothing in flight, to the
// virtual time.
func (m *model) lift(p string) {
	l := m.floor()
	if !slices.ContainsFunc(m.inflight, func(r *mreq) bool { return r.principal == p }) {
		l = max(l, m.vtime)
	}
	m.counters[p] = max(m.counters[p], l)
}

// advance raises the virtual time once r, admitted, was charged: to the
// counter of r's principal, but not past the counter of any principal
// waiting plus r's price at that principal's weight.
func (m *model) advance(r *mreq) {
	v := m.counters[r.principal]
	for _, w := range m.waiters {
		v = min(v, m.counters[w.principal]+r.price/m.weights[w.principal])
	}
	m.vtime = max(m.vtime, v)
}

func (m *model) admit(r *mreq, now time.Time) {
	if m.served == nil {
		m.served = map[int]time.Time{}
	}
	m.served[r.rank] = now
	r.price = float64(max(r.prompt, 1)) * DefaultInputWeight
	r.cost = r.price / m.weights[r.principal]
	m.counters[r.principal] += r.cost
	m.advance(r)
	r.tokens = r.prompt
	m.tokens += r.prompt
	m.inflight = append(m.inflight, r)
	m.last, m.hasLast = r.principal, true
}

func (m *model) push(r *mreq) {
	if len(m.waiters) == 0 && m.fits(r.prompt) {
		m.lift(r.principal)
		m.admit(r, r.enq)
		return
	}
	if !m.waitingPrincipal(r.principal) {
		m.lift(r.principal)
	}
	m.waiters = append(m.waiters, r)
	m.dispatch(r.enq)
}

// effRank is the rank of r's class less one for every full aging interval
// the class has waited, since its oldest waiter's arrival or its last
// admission, whichever is later; never below 0.
func (m *model) effRank(r *mreq, now time.Time) int {
	if m.aging <= 0 {
		return r.rank
	}
	oldest := r.enq
	for _, w := range m.waiters {
		if w.rank == r.rank && w.enq.Before(oldest) {
			oldest = w.enq
		}
	}
	if s := m.served[r.rank]; s.After(oldest) {
		oldest = s
	}
	return max(r.rank-int(now.Sub(oldest)/m.aging), 0)
}

func (m *model) dispatch(now time.Time) {
	for len(m.waiters) > 0 {
		bi := 0
		for i, w := range m.waiters[1:] {
			b := m.waiters[bi]
			rw, rb := m.effRank(w, now), m.effRank(b, now)
			aw, ab := w.rank-rw, b.rank-rb // how far each class has aged
			cw, cb := m.counters[w.principal], m.counters[b.principal]
			// The least effective rank, then the class aged the most, then
			// the least counter. The slice is in arrival order: ties keep
			// the earlier one.
			if rw < rb || rw == rb && (aw > ab || aw == ab && cw < cb) {
				bi = i + 1
			}
		}
		// A waiter that did not fit the token cap when it was first keeps
		// its place against its own class and the less urgent ones.
		if m.blocked != nil && m.waiters[bi].rank >= m.blocked.rank {
			for i, w := range m.waiters {
				if w == m.blocked {
					bi = i
				}
			}
		}
		b := m.waiters[bi]
		if !m.fits(b.prompt) {
			if m.maxInFlight == 0 || len(m.inflight) < m.maxInFlight {
				m.blocked = b
			}
			return
		}
		m.waiters = append(m.waiters[:bi], m.waiters[bi+1:]...)
		if m.blocked == b {
			m.blocked = nil
		}
		m.admit(b, now)
	}
}

func (m *model) done(i int, now time.Time) {
	r := m.inflight[i]
	m.advance(r) // with its output
	m.inflight = append(m.inflight[:i], m.inflight[i+1:]...)
	m.tokens -= r.tokens
	m.dispatch(now)
}

func (m *model) charge(i, n int) {
	r := m.inflight[i]
	price := float64(n) * DefaultOutputWeight
	r.price += price
	m.counters[r.principal] += price / m.weights[r.principal]
	r.tokens += int64(n)
	m.tokens += int64(n)
}

func (m *model) cancel(i int, now time.Time) {
	if m.blocked == m.waiters[i] {
		m.blocked = nil
	}
	m.waiters = append(m.waiters[:i], m.waiters[i+1:]...)
	m.dispatch(now)
}

// FuzzQueueMatchesModel drives a Queue and the reference model with the
// same operations and checks that they admit the same requests and keep the
// same counters.
func FuzzQueueMatchesModel(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 2, 0, 2, 0, 4, 1, 3, 5, 2, 0})
	f.Add([]byte{0, 7, 0, 33, 0, 65, 0, 98, 1, 40, 2, 1, 0, 3, 3, 2, 2, 2, 4, 0, 2, 0, 2, 0})
	f.Add([]byte("a long sequence of operations: admissions, releases, charges and cancellations"))
	f.Fuzz(checkQueueMatchesModel)
}

// TestQueueMatchesModelRandomOps runs the comparison with the model on
// seeded random operations, so that it covers aging, charges and
// cancellations in every test run, not only under the fuzzer.
func TestQueueMatchesModelRandomOps(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for range 200 {
		ops := make([]byte, 2*(10+r.IntN(200)))
		for j := range ops {
			ops[j] = byte(r.Uint32())
		}
		checkQueueMatchesModel(t, ops)
	}
}

// checkQueueMatchesModel applies ops, pairs of an operation and its
// argument, to a Queue and to the model, and compares them after each.
func checkQueueMatchesModel(t *testing.T, ops []byte) {
	if len(ops) > 600 {
		ops = ops[:600]
	}
	const aging = time.Second
	// Weights far apart, so that a principal's charge moves its counter far
	// past the others' and the bound on the virtual time matters.
	weights := map[string]float64{"a": 1, "b": 1, "c": 4, "d": 0.01}
	weight := func(p string) float64 { return weights[p] }
	q, clk := newTestQueue(t, Config{MaxInFlight: 3, MaxTokensInFlight: 120, MaxWaiting: 1000, AgingInterval: aging, Weight: weight})
	m := &model{maxInFlight: 3, maxTokens: 120, aging: aging, weights: weights, counters: map[string]float64{}}
	tickets := map[int]*Ticket{}
	next := 0
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%5, int(ops[i+1])
		now := clk.Now()
		switch op {
		case 0: // arrival
			r := Request{Principal: string(rune('a' + arg%4)), Class: Class(arg/4%3 - 1), PromptTokens: arg % 70}
			tk, err := q.push(r)
			if err != nil {
				t.Fatal(err)
			}
			tickets[next] = tk
			m.push(&mreq{id: next, principal: r.Principal, rank: r.Class.rank(), prompt: int64(r.PromptTokens), enq: now})
			next++
		case 1: // time passes
			clk.Advance(time.Duration(arg) * 50 * time.Millisecond)
		case 2: // a request ends
			if len(m.inflight) == 0 {
				continue
			}
			j := arg % len(m.inflight)
			tickets[m.inflight[j].id].Done()
			m.done(j, now)
		case 3: // output streams
			if len(m.inflight) == 0 {
				continue
			}
			j := arg % len(m.inflight)
			tickets[m.inflight[j].id].Charge(arg % 7)
			m.charge(j, arg%7)
		case 4: // a waiter gives up
			if len(m.waiters) == 0 {
				continue
			}
			j := arg % len(m.waiters)
			q.abandon(tickets[m.waiters[j].id], context.Canceled)
			m.cancel(j, now)
		}
		mustCheck(t, q)
		for _, r := range m.inflight {
			if !tickets[r.id].admitted() {
				t.Fatalf("op %d: request %d admitted by the model, not by the queue", i/2, r.id)
			}
		}
		for _, r := range m.waiters {
			if s := tickets[r.id].stateNow(); s != stateQueued {
				t.Fatalf("op %d: request %d waiting in the model, state %d in the queue", i/2, r.id, s)
			}
		}
		for p, c := range m.counters {
			if got, _ := q.counter(p); math.Abs(got-c) > 1e-9 {
				t.Fatalf("op %d: counter of %q %v, model %v", i/2, p, got, c)
			}
		}
		if got := q.virtualTime(); got != m.vtime {
			t.Fatalf("op %d: virtual time %v, model %v", i/2, got, m.vtime)
		}
		if s := q.Stats(); s.TokensInFlight != m.tokens || s.InFlight != len(m.inflight) || s.Waiting != len(m.waiters) {
			t.Fatalf("op %d: stats %+v, model %d in flight, %d tokens, %d waiting", i/2, s, len(m.inflight), m.tokens, len(m.waiters))
		}
	}
}
