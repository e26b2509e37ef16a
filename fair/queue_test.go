package fair

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/retry"
)

func TestNewRejectsInvalidConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"negative MaxInFlight", Config{MaxInFlight: -1}},
		{"negative MaxTokensInFlight", Config{MaxTokensInFlight: -1}},
		{"negative MaxWaiting", Config{MaxWaiting: -1}},
		{"negative MaxWaitingPerPrincipal", Config{MaxWaitingPerPrincipal: -1}},
		{"negative MaxPrincipals", Config{MaxPrincipals: -1}},
		{"negative InputWeight", Config{InputWeight: -1}},
		{"NaN OutputWeight", Config{OutputWeight: math.NaN()}},
		{"infinite OutputWeight", Config{OutputWeight: math.Inf(1)}},
		{"negative RetryAfter", Config{RetryAfter: -time.Second}},
		{"negative MaxRetryAfter", Config{MaxRetryAfter: -time.Second}},
		{"MaxRetryAfter below RetryAfter", Config{RetryAfter: 10 * time.Second, MaxRetryAfter: time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestZeroConfigAdmitsEverything(t *testing.T) {
	q, _ := newTestQueue(t, Config{})
	var ts []*Ticket
	for range 5000 {
		tk, err := q.Admit(context.Background(), Request{Principal: "a", PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tk)
	}
	if s := q.Stats(); s.InFlight != 5000 || s.TokensInFlight != 500000 || s.Waiting != 0 {
		t.Fatalf("stats %+v", s)
	}
	for _, tk := range ts {
		tk.Done()
	}
	if s := q.Stats(); s != (Stats{Principals: 1}) {
		t.Fatalf("stats after release %+v", s)
	}
	mustCheck(t, q)
}

func TestReleaseWakesNextWaiter(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	first, err := q.Admit(context.Background(), Request{Principal: "a"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Ticket)
	go func() {
		tk, err := q.Admit(context.Background(), Request{Principal: "b"})
		if err != nil {
			t.Error(err)
		}
		got <- tk
	}()
	waitFor(t, func() bool { return q.Stats().Waiting == 1 })
	select {
	case <-got:
		t.Fatal("admitted past the cap")
	default:
	}
	first.Done()
	second := <-got
	if s := q.Stats(); s.InFlight != 1 || s.Waiting != 0 {
		t.Fatalf("stats %+v", s)
	}
	second.Done()
	second.Done() // no-op
	first.Done()  // no-op
	if s := q.Stats(); s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	mustCheck(t, q)
}

// waitFor polls cond for a goroutine to reach a state; only tests poll.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestClassOrder(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	hold, _ := q.push(Request{Principal: "x"})
	batch, _ := q.push(Request{Principal: "a", Class: Batch})
	std, _ := q.push(Request{Principal: "b", Class: Standard})
	inter, _ := q.push(Request{Principal: "c", Class: Interactive})
	order := []*Ticket{inter, std, batch}
	prev := hold
	for i, want := range order {
		prev.Done()
		if !want.admitted() {
			t.Fatalf("step %d: the %v request was not admitted next", i, []Class{Interactive, Standard, Batch}[i])
		}
		prev = want
	}
	prev.Done()
	mustCheck(t, q)
}

// Within a class the principal with the least counter goes first, however
// many requests the other has waiting and however early they came.
func TestVTCOrderWithinClass(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	// Give "heavy" a lead: 1000 prompt tokens served.
	h0, _ := q.push(Request{Principal: "heavy", PromptTokens: 1000})
	var heavy []*Ticket
	for range 3 {
		tk, _ := q.push(Request{Principal: "heavy", PromptTokens: 10})
		heavy = append(heavy, tk)
	}
	light, _ := q.push(Request{Principal: "light", PromptTokens: 10})
	// light was lifted to heavy's counter when it started waiting.
	if ch, _ := q.counter("heavy"); ch != 1000 {
		t.Fatalf("heavy counter %v", ch)
	}
	if cl, _ := q.counter("light"); cl != 1000 {
		t.Fatalf("light counter %v, want lifted to 1000", cl)
	}
	h0.Done()
	// Counters tie at 1000: heavy's first waiter came first.
	if !heavy[0].admitted() {
		t.Fatal("tie not broken by arrival")
	}
	heavy[0].Done()
	// heavy is now at 1010 > light's 1000.
	if !light.admitted() {
		t.Fatal("light not admitted before heavy's later requests")
	}
	light.Done()
	heavy[1].Done()
	heavy[2].Done()
	mustCheck(t, q)
}

// An idle principal cannot bank credit: when it starts waiting its counter is
// lifted to the least counter of those waiting.
func TestLiftingPreventsBanking(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	// "busy" is served 10 times while "idle" does nothing.
	for range 10 {
		tk, _ := q.push(Request{Principal: "busy", PromptTokens: 100})
		tk.Done()
	}
	hold, _ := q.push(Request{Principal: "busy", PromptTokens: 100})
	b, _ := q.push(Request{Principal: "busy", PromptTokens: 100})
	i1, _ := q.push(Request{Principal: "idle", PromptTokens: 100})
	i2, _ := q.push(Request{Principal: "idle", PromptTokens: 100})
	cb, _ := q.counter("busy")
	ci, _ := q.counter("idle")
	if ci != cb {
		t.Fatalf("idle counter %v, want lifted to busy's %v", ci, cb)
	}
	// Service alternates instead of idle taking both slots first.
	hold.Done()
	if !b.admitted() {
		t.Fatal("busy's earlier waiter should win the tie")
	}
	b.Done()
	if !i1.admitted() {
		t.Fatal("idle not admitted")
	}
	i1.Done()
	i2.Done()
	mustCheck(t, q)
}

// With nothing waiting, a newcomer is lifted to the counter of the principal
// admitted last, as in the VTC paper.
func TestLiftingWhenNothingWaits(t *testing.T) {
	q, _ := newTestQueue(t, Config{})
	for range 5 {
		tk, _ := q.push(Request{Principal: "a", PromptTokens: 100})
		tk.Charge(50)
		tk.Done()
	}
	ca, _ := q.counter("a") // 5*(100 + 2*50) = 1000
	tk, _ := q.push(Request{Principal: "b", PromptTokens: 10})
	cb, _ := q.counter("b")
	if ca != 1000 || cb != ca+10 {
		t.Fatalf("a %v, b %v; want b = a + 10", ca, cb)
	}
	tk.Done()
}

func TestWeights(t *testing.T) {
	q, _ := newTestQueue(t, Config{Weight: func(p string) float64 {
		switch p {
		case "gold":
			return 4
		case "bad":
			return math.NaN()
		}
		return 0
	}})
	for _, p := range []string{"gold", "plain", "bad"} {
		tk, _ := q.push(Request{Principal: p, PromptTokens: 100})
		tk.Charge(10)
		tk.Done()
	}
	want := map[string]float64{"gold": 30, "plain": 120, "bad": 120}
	for p, w := range want {
		if c, _ := q.counter(p); c < w {
			t.Errorf("%s counter %v, want at least %v", p, c, w)
		}
	}
	// gold paid a quarter of plain's price for the same service: its counter
	// rose by 30, plain's by 120 (plus lifting, which only raises).
	cg, _ := q.counter("gold")
	if cg != 30 {
		t.Errorf("gold counter %v, want 30", cg)
	}
}

// Weights are taken within [1e-6, 1e6], so that a charge stays finite: a
// weight of 5e-324 made a request's charge +Inf, and the refund of a
// request admitted as its context ended, Inf - Inf, a NaN counter that
// turned fairness off for every principal.
func TestExtremeWeights(t *testing.T) {
	q, _ := newTestQueue(t, Config{Weight: func(p string) float64 {
		if p == "tiny" {
			return 5e-324
		}
		return math.MaxFloat64
	}})
	for _, p := range []string{"huge", "tiny"} { // tiny, lifted to huge's counter, gains little
		var ctx context.Context // nil, taken as Background
		tk, err := q.Admit(ctx, Request{Principal: p, PromptTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		tk.Charge(1 << 30)
		tk.Done()
	}
	for p, want := range map[string]float64{"tiny": (100 + 2<<30) / 1e-6, "huge": (100 + 2<<30) / 1e6} {
		if c, _ := q.counter(p); math.Abs(c-want) > 1e-6*want {
			t.Errorf("%s counter %v, want %v", p, c, want)
		}
	}
}

func TestTokenCap(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxTokensInFlight: 100})
	a, _ := q.push(Request{Principal: "a", PromptTokens: 60})
	b, _ := q.push(Request{Principal: "b", PromptTokens: 60})
	c, _ := q.push(Request{Principal: "c", PromptTokens: 10})
	if !a.admitted() || b.admitted() {
		t.Fatal("token cap not applied")
	}
	// c fits but b is ahead of it: no overtaking.
	if c.admitted() {
		t.Fatal("a later, smaller request overtook the head")
	}
	a.Charge(30) // output counts in flight: 90
	if s := q.Stats(); s.TokensInFlight != 90 {
		t.Fatalf("tokens in flight %d", s.TokensInFlight)
	}
	a.Done()
	if !b.admitted() || !c.admitted() {
		t.Fatal("release did not admit both")
	}
	b.Done()
	c.Done()
	// A prompt larger than the cap is admitted alone.
	big, _ := q.push(Request{Principal: "a", PromptTokens: 500})
	small, _ := q.push(Request{Principal: "b", PromptTokens: 1})
	if !big.admitted() || small.admitted() {
		t.Fatal("oversized prompt not admitted alone")
	}
	big.Done()
	if !small.admitted() {
		t.Fatal("small not admitted")
	}
	small.Done()
	if s := q.Stats(); s.TokensInFlight != 0 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	mustCheck(t, q)
}

func isOverload(t *testing.T, err error, scope string) {
	t.Helper()
	var oe *retry.OverloadError
	if !errors.As(err, &oe) || !errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("error %v, want a *retry.OverloadError", err)
	}
	if oe.Scope != scope || oe.RetryAfter != 3*time.Second {
		t.Fatalf("overload %+v, want scope %q and RetryAfter 3s", oe, scope)
	}
}

func TestBounds(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 3, MaxWaitingPerPrincipal: 2, RetryAfter: 3 * time.Second})
	hold, _ := q.push(Request{Principal: "a"})
	q.push(Request{Principal: "a"})
	q.push(Request{Principal: "a"})
	_, err := q.push(Request{Principal: "a"})
	isOverload(t, err, "principal")
	q.push(Request{Principal: "b"})
	_, err = q.push(Request{Principal: "c", Class: Batch})
	isOverload(t, err, "queue")
	if s := q.Stats(); s.Waiting != 3 || s.InFlight != 1 {
		t.Fatalf("stats %+v", s)
	}
	_ = hold
	mustCheck(t, q)
}

// A full queue sheds its newest waiter of the least urgent class below the
// arrival's, and refuses an arrival that outranks nobody.
func TestShedding(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 3, RetryAfter: 3 * time.Second})
	q.push(Request{Principal: "x"})
	oldBatch, _ := q.push(Request{Principal: "a", Class: Batch})
	newBatch, _ := q.push(Request{Principal: "b", Class: Batch})
	std, _ := q.push(Request{Principal: "c", Class: Standard})
	inter, err := q.push(Request{Principal: "d", Class: Interactive})
	if err != nil {
		t.Fatal(err)
	}
	if newBatch.stateNow() != stateRefused || oldBatch.stateNow() != stateQueued {
		t.Fatal("the newest batch waiter should be shed")
	}
	<-newBatch.ready
	isOverload(t, newBatch.err, "queue")
	if _, err := q.push(Request{Principal: "e", Class: Batch}); err == nil {
		t.Fatal("a batch arrival into a full queue should be refused")
	}
	if _, err := q.push(Request{Principal: "e", Class: Standard}); err != nil {
		t.Fatal(err) // sheds oldBatch
	}
	if oldBatch.stateNow() != stateRefused || std.stateNow() != stateQueued || inter.stateNow() != stateQueued {
		t.Fatal("wrong victim")
	}
	mustCheck(t, q)
}

// A principal whose arrival sheds its own less urgent waiter stays tracked
// and waiting: it is not settled idle, and so not forgotten while its
// request waits.
func TestSheddingOwnWaiter(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 1, MaxPrincipals: 2})
	hold, _ := q.push(Request{Principal: "b"})
	batch, _ := q.push(Request{Principal: "a", Class: Batch})
	inter, err := q.push(Request{Principal: "a", Class: Interactive})
	if err != nil {
		t.Fatal(err)
	}
	if batch.stateNow() != stateRefused {
		t.Fatal("the batch waiter was not shed")
	}
	mustCheck(t, q)
	// A newcomer past MaxPrincipals evicts idle principals only.
	if _, err := q.push(Request{Principal: "c"}); err == nil {
		t.Fatal("c was not refused by the full queue")
	}
	if _, ok := q.counter("a"); !ok {
		t.Fatal("a was forgotten while its request waits")
	}
	mustCheck(t, q)
	hold.Done()
	if !inter.admitted() {
		t.Fatal("a's interactive request was not admitted")
	}
	inter.Done()
	mustCheck(t, q)
}

func TestDeadline(t *testing.T) {
	q, clk := newTestQueue(t, Config{MaxInFlight: 1, RetryAfter: 3 * time.Second})
	hold, _ := q.push(Request{Principal: "a"})

	// A deadline already past (by the queue's clock) is refused at once.
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now())
	defer cancel()
	_, err := q.Admit(ctx, Request{Principal: "b"})
	isOverload(t, err, "queue")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v does not match context.DeadlineExceeded", err)
	}

	// A waiter whose deadline passes by the clock is refused at the next
	// dispatch instead of being admitted late.
	late, _, err := q.enter(Request{Principal: "c"}, 1, clk.Now().Add(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := q.push(Request{Principal: "d"})
	clk.Advance(2 * time.Second)
	hold.Done()
	if late.stateNow() != stateRefused || !ok.admitted() {
		t.Fatal("expired waiter admitted")
	}
	isOverload(t, late.err, "queue")
	ok.Done()

	// A real deadline ends the wait with a 429-mapped error.
	hold, _ = q.push(Request{Principal: "a"})
	realClockQ, _ := New(Config{MaxInFlight: 1, RetryAfter: 3 * time.Second})
	h2, _ := realClockQ.Admit(context.Background(), Request{})
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, err = realClockQ.Admit(ctx2, Request{Principal: "e"})
	isOverload(t, err, "queue")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v does not match context.DeadlineExceeded", err)
	}
	if s := realClockQ.Stats(); s.Waiting != 0 || s.InFlight != 1 {
		t.Fatalf("stats %+v", s)
	}
	h2.Done()
	hold.Done()
	mustCheck(t, q)
	mustCheck(t, realClockQ)
}

// A cancelled waiter leaves the queue, is charged nothing, and the waiters
// behind it move up.
func TestCancelLeavesQueue(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxTokensInFlight: 100})
	hold, _ := q.push(Request{Principal: "a", PromptTokens: 50})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := q.Admit(ctx, Request{Principal: "big", PromptTokens: 90})
		errc <- err
	}()
	waitFor(t, func() bool { return q.Stats().Waiting == 1 })
	small, _ := q.push(Request{Principal: "small", PromptTokens: 10})
	if small.admitted() {
		t.Fatal("small overtook big")
	}
	before, _ := q.counter("big")
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || errors.Is(err, retry.ErrOverloaded) {
		t.Fatalf("error %v, want context.Canceled only", err)
	}
	if !small.admitted() {
		t.Fatal("the waiter behind the cancelled one was not admitted")
	}
	after, ok := q.counter("big")
	if ok && after != before {
		t.Fatalf("cancelled principal charged: %v -> %v", before, after)
	}
	small.Done()
	hold.Done()
	if s := q.Stats(); s.InFlight != 0 || s.Waiting != 0 || s.TokensInFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	mustCheck(t, q)
}

// A waiter admitted in the same instant its context ends gives the admission
// back, with its charge.
func TestAbandonAfterAdmissionRefunds(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1})
	hold, _ := q.push(Request{Principal: "a"})
	w, _ := q.push(Request{Principal: "b", PromptTokens: 40})
	before, _ := q.counter("b")
	hold.Done()
	if !w.admitted() {
		t.Fatal("not admitted")
	}
	err := q.abandon(w, context.Canceled)
	if !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	after, _ := q.counter("b")
	if after != before {
		t.Fatalf("counter %v -> %v, want refunded", before, after)
	}
	if s := q.Stats(); s.InFlight != 0 || s.TokensInFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	w.Done() // no-op
	// Nor does it lose the refund when it comes back, lifted to the
	// virtual time the admission had moved: it is charged this request
	// alone.
	again, _ := q.push(Request{Principal: "b", PromptTokens: 40})
	if c, _ := q.counter("b"); c != before+40 {
		t.Fatalf("counter %v once admitted again, want %v", c, before+40)
	}
	again.Done()
	mustCheck(t, q)
}

// Huge charges and prompts (a backend's bogus usage report) count at most
// 1<<31-1 tokens each and never wrap the tokens in flight negative, which
// would let every later request past the token cap; releasing them empties
// the queue.
func TestHugeTokensDoNotWrap(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxTokensInFlight: 1000})
	a, _ := q.push(Request{Principal: "a", PromptTokens: 10})
	a.Charge(math.MaxInt)
	a.Charge(math.MaxInt)
	if s, want := q.Stats(), int64(10+1<<31-1); s.TokensInFlight != want {
		t.Fatalf("tokens in flight %d after huge charges, want %d", s.TokensInFlight, want)
	}
	b, _ := q.push(Request{Principal: "b", PromptTokens: 10})
	if b.admitted() {
		t.Fatal("a request was admitted past the token cap")
	}
	a.Done()
	if !b.admitted() {
		t.Fatal("the release did not admit the waiter")
	}
	big, _ := q.push(Request{Principal: "c", PromptTokens: math.MaxInt})
	if big.admitted() {
		t.Fatal("a huge prompt was admitted beside another request")
	}
	b.Done()
	if !big.admitted() {
		t.Fatal("a huge prompt was not admitted alone")
	}
	big.Done()
	if s := q.Stats(); s.TokensInFlight != 0 || s.InFlight != 0 {
		t.Fatalf("stats %+v after every release", s)
	}
	mustCheck(t, q)
}

// A token count beyond any model's context (a bogus prompt estimate or
// usage report) is taken as 1<<31-1 tokens. Charged in full it would lift
// the counters of the principals served after it so high that a request's
// charge no longer changes them, and the queue would order every principal
// by arrival alone.
func TestHugeTokenCountsKeepTheCountersExact(t *testing.T) {
	cases := []struct {
		name           string
		prompt, output int
		inFlight       int64
	}{
		{"prompt", math.MaxInt, 0, 1<<31 - 1},
		{"output", 1, math.MaxInt, 1 + 1<<31 - 1},
		{"output in chunks", 1, math.MaxInt / 4, 1 + 1<<31 - 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := newTestQueue(t, Config{MaxInFlight: 1})
			bogus, _ := q.push(Request{Principal: "bogus", PromptTokens: tc.prompt})
			for range 4 {
				bogus.Charge(tc.output)
			}
			if got := q.Stats().TokensInFlight; got != tc.inFlight {
				t.Errorf("tokens in flight %d, want %d", got, tc.inFlight)
			}
			// a and b wait, both lifted to the bogus principal's counter.
			a1, _ := q.push(Request{Principal: "a", PromptTokens: 100})
			a2, _ := q.push(Request{Principal: "a", PromptTokens: 100})
			b1, _ := q.push(Request{Principal: "b", PromptTokens: 100})
			bogus.Done()
			if !a1.admitted() {
				t.Fatal("the first waiter was not admitted")
			}
			a1.Done() // a was served 100 tokens more than b
			if !b1.admitted() || a2.admitted() {
				t.Fatalf("b admitted %v, a admitted %v; want b, served less", b1.admitted(), a2.admitted())
			}
			ca, _ := q.counter("a")
			cb, _ := q.counter("b")
			if ca != cb {
				t.Errorf("counters a %v, b %v after each was served 100 tokens", ca, cb)
			}
			b1.Done()
			a2.Done()
			mustCheck(t, q)
		})
	}
}

func TestChargeAfterDoneIsNoop(t *testing.T) {
	q, _ := newTestQueue(t, Config{})
	tk, _ := q.push(Request{Principal: "a", PromptTokens: 10})
	tk.Charge(-5)
	tk.Charge(0)
	tk.Done()
	before, _ := q.counter("a")
	tk.Charge(100)
	after, _ := q.counter("a")
	if before != after || q.Stats().TokensInFlight != 0 {
		t.Fatal("charge after Done counted")
	}
}

func TestPrincipalsBounded(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxPrincipals: 10})
	var held []*Ticket
	for i := range 1000 {
		tk, _ := q.push(Request{Principal: string(rune('A' + i%50)), PromptTokens: 1})
		if i < 20 {
			held = append(held, tk) // active principals are never forgotten
			continue
		}
		tk.Done()
		mustCheck(t, q)
	}
	if n := q.Stats().Principals; n != 20 {
		t.Fatalf("%d principals tracked, want the 20 active", n)
	}
	for _, tk := range held {
		tk.Done()
	}
	if n := q.Stats().Principals; n != 10 {
		t.Fatalf("%d principals tracked, want 10", n)
	}
	mustCheck(t, q)
}

// A request refused on arrival under a name the queue does not know leaves
// nothing behind: a flood of them, each under a new name, neither grows the
// principals tracked nor makes the queue forget the counter of a principal
// it served.
func TestRefusedNewcomersAreNotRemembered(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 1, MaxPrincipals: 3})
	h, _ := q.push(Request{Principal: "heavy", PromptTokens: 1000})
	h.Done()
	running, _ := q.push(Request{Principal: "x", PromptTokens: 1})
	waiting, _ := q.push(Request{Principal: "y", PromptTokens: 1})
	for i := range 100 {
		_, err := q.push(Request{Principal: fmt.Sprint("new", i), PromptTokens: 1})
		if !errors.Is(err, retry.ErrOverloaded) {
			t.Fatalf("request %d: %v, want a refusal of a full queue", i, err)
		}
	}
	if n := q.Stats().Principals; n != 3 {
		t.Errorf("%d principals tracked, want 3 (heavy, x, y)", n)
	}
	if c, ok := q.counter("heavy"); !ok || c != 1000 {
		t.Errorf("heavy's counter %v (tracked %v), want 1000", c, ok)
	}
	mustCheck(t, q)
	running.Done()
	waiting.Done()
	mustCheck(t, q)
}

// A principal's name may be as long as a request's body (a session key
// taken from it). Once its requests end, the queue keeps a bounded amount
// of memory for it, whatever the name's length; names that differ only at
// their end are still distinct principals, and the weight is asked of the
// whole name.
func TestLongPrincipalNamesTakeBoundedMemory(t *testing.T) {
	const n, size = 32, 1 << 20
	var weighed atomic.Int64 // bytes of the names Weight was asked about
	q, _ := newTestQueue(t, Config{MaxPrincipals: n, Weight: func(p string) float64 {
		weighed.Add(int64(len(p)))
		return 1
	}})
	name := func(i int) string { return strings.Repeat("x", size) + strconv.Itoa(i%10) + strconv.Itoa(i/10) }
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		tk, err := q.Admit(context.Background(), Request{Principal: name(i), PromptTokens: 10 * (i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		tk.Done()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > n*size/4 {
		t.Errorf("the heap grew by %d bytes for %d idle principals of %d-byte names", grown, n, size)
	}
	if got := q.Stats().Principals; got != n {
		t.Errorf("%d principals tracked after %d distinct names, want %d", got, n, n)
	}
	tk, err := q.Admit(context.Background(), Request{Principal: name(0)})
	if err != nil {
		t.Fatal(err)
	}
	tk.Done()
	if got := q.Stats().Principals; got != n {
		t.Errorf("%d principals tracked after a name came back, want %d", got, n)
	}
	if got, want := weighed.Load(), int64((n+1)*(size+2)); got != want {
		t.Errorf("Weight was asked about %d bytes of names, want %d", got, want)
	}
	mustCheck(t, q)
}

func TestAdmitCancelledContext(t *testing.T) {
	q, _ := newTestQueue(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.Admit(ctx, Request{}); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if s := q.Stats(); s != (Stats{}) {
		t.Fatalf("stats %+v", s)
	}
}

func TestParseClass(t *testing.T) {
	cases := []struct {
		in   string
		want Class
		ok   bool
	}{
		{"interactive", Interactive, true},
		{" Batch ", Batch, true},
		{"STANDARD", Standard, true},
		{"urgent", Standard, false},
		{"", Standard, false},
	}
	for _, tc := range cases {
		c, ok := ParseClass(tc.in)
		if c != tc.want || ok != tc.ok {
			t.Errorf("ParseClass(%q) = %v, %v", tc.in, c, ok)
		}
	}
	if Class(-9).String() != "interactive" || Class(9).String() != "batch" || Class(0).String() != "standard" {
		t.Error("out-of-range classes should count as the nearest named one")
	}
}

// A waiter admitted in the same instant its deadline passes is reported to
// the observer once, as admitted: not also as refused.
func TestAbandonAfterAdmissionObservedOnce(t *testing.T) {
	var admitted, refused int
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, Observer: &Observer{
		Admitted: func(Class, time.Duration) { admitted++ },
		Refused:  func(Class, Reason) { refused++ },
	}})
	hold, _ := q.push(Request{Principal: "a"})
	w, _ := q.push(Request{Principal: "b", PromptTokens: 40})
	hold.Done()
	if !w.admitted() {
		t.Fatal("not admitted")
	}
	err := q.abandon(w, context.DeadlineExceeded)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("abandon: %v, want the deadline", err)
	}
	if admitted != 2 || refused != 0 {
		t.Fatalf("observed %d admitted, %d refused; want 2 and 0", admitted, refused)
	}
	if s := q.Stats(); s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
	mustCheck(t, q)
}

// A principal that fills the queue does not keep the others out: a full
// queue sheds the newest waiter of the class of the principal with the
// most waiting for an arrival of a principal with at least two fewer, and
// refuses the arrival once the two are within one of each other.
func TestFullQueueShedsTheLongestPrincipal(t *testing.T) {
	var reasons []Reason
	obs := &Observer{Refused: func(_ Class, r Reason) { reasons = append(reasons, r) }}
	q, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 4, RetryAfter: 3 * time.Second, Observer: obs})
	hold, _ := q.push(Request{Principal: "a"})
	var flood []*Ticket
	for range 4 {
		tk, err := q.push(Request{Principal: "a"})
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, tk)
	}
	if _, err := q.push(Request{Principal: "a"}); err == nil {
		t.Fatal("a's own arrival into a full queue of its requests should be refused")
	}
	b1, err := q.push(Request{Principal: "b"})
	if err != nil {
		t.Fatalf("b's first request was refused: %v", err)
	}
	if flood[3].stateNow() != stateRefused || flood[2].stateNow() != stateQueued {
		t.Fatal("a's newest waiter should be shed")
	}
	<-flood[3].ready
	isOverload(t, flood[3].err, "queue")
	if _, err := q.push(Request{Principal: "b"}); err != nil {
		t.Fatalf("b's second request was refused: %v", err) // a has 3 waiting, b 1
	}
	if flood[2].stateNow() != stateRefused {
		t.Fatal("a's newest waiter should be shed")
	}
	// a and b have two waiting each: neither sheds the other's.
	_, err = q.push(Request{Principal: "b"})
	isOverload(t, err, "queue")
	// A more urgent class is not shed for a less urgent arrival.
	q2, _ := newTestQueue(t, Config{MaxInFlight: 1, MaxWaiting: 2})
	q2.push(Request{Principal: "a"})
	q2.push(Request{Principal: "a", Class: Interactive})
	q2.push(Request{Principal: "a", Class: Interactive})
	if _, err := q2.push(Request{Principal: "b"}); err == nil {
		t.Fatal("a standard arrival shed an interactive waiter")
	}
	want := []Reason{ReasonFull, ReasonShed, ReasonShed, ReasonFull}
	if !slices.Equal(reasons, want) {
		t.Errorf("refusals %v, want %v", reasons, want)
	}
	hold.Done() // admits a's oldest waiter
	if !flood[0].admitted() || b1.stateNow() != stateQueued {
		t.Fatal("admission order")
	}
	mustCheck(t, q)
	mustCheck(t, q2)
}
