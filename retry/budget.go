package retry

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/llmlb/llmlb"
)

// Budget decides whether a request may send one more attempt (a retry or a
// hedge). [Loop] calls Start when a request's first attempt begins, Withdraw
// before each further attempt, and Finish once for the first attempt and once
// for every attempt Withdraw granted. Implementations are safe for concurrent
// use; [*PercentBudget], [*Throttle] and [*ConcurrentBudget] are the three in
// this package.
type Budget interface {
	// Start records that a request begins.
	Start()
	// Withdraw reports whether one more attempt may be sent.
	Withdraw() bool
	// Finish records that an attempt ended; retry tells whether Withdraw
	// granted it.
	Finish(retry bool, o Outcome)
}

// Outcome is how an attempt ended, as far as a budget cares. It is a plain
// value, safe to use from any goroutine.
type Outcome uint8

const (
	// Succeeded: the attempt produced a response (including one streamed
	// after its first token).
	Succeeded Outcome = iota
	// Failed: the attempt failed with a retryable error, such as a 503.
	Failed
	// Abandoned: the attempt was cancelled (a losing hedge, the caller's
	// context) or failed with an error that says nothing about the
	// upstream's health, such as a 400.
	Abandoned
)

// Finagle's RetryBudget defaults, the values of [DefaultPercentConfig].
const (
	DefaultBudgetTTL        = 10 * time.Second
	DefaultMinRetriesPerSec = 10
	DefaultPercentCanRetry  = 0.2
)

// PercentConfig configures a [PercentBudget]. A budget is a policy
// decision, so there are no hidden defaults: TTL must be set, and zero
// MinRetriesPerSec or PercentCanRetry mean zero. Start from
// [DefaultPercentConfig] for Finagle's budget.
type PercentConfig struct {
	// TTL is how long a deposit (and a withdrawal) counts. It is required
	// and must be at least 100 ms.
	TTL time.Duration
	// MinRetriesPerSec is the retry rate always allowed, even with no
	// traffic: the budget holds a reserve of MinRetriesPerSec*TTL retries per
	// TTL, rounded down to a whole retry when PercentCanRetry is 0. 0 means
	// no reserve. It must be finite and non-negative.
	MinRetriesPerSec float64
	// PercentCanRetry is the fraction of requests that may be retried, in
	// [0, 1], with a precision of 1e-4. 0 means only the reserve may be
	// spent.
	PercentCanRetry float64
	// Clock tells the time; nil means the system clock.
	Clock llmlb.Clock
}

// DefaultPercentConfig returns Finagle's default budget: 20% of the requests
// of the last 10 s plus 10 retries a second, on the system clock.
func DefaultPercentConfig() PercentConfig {
	return PercentConfig{
		TTL:              DefaultBudgetTTL,
		MinRetriesPerSec: DefaultMinRetriesPerSec,
		PercentCanRetry:  DefaultPercentCanRetry,
	}
}

// budgetSlots is the number of time slots a TTL is divided into.
const budgetSlots = 10

// percentScale is the denominator of the percentage's fixed-point form.
const percentScale = 10000

// maxReserve bounds the reserve, in retries per TTL, well below the 2^32
// retries a TTL's count can hold.
const maxReserve = 1 << 30

// PercentBudget is a retry budget after Finagle's RetryBudget: each request
// deposits PercentCanRetry of a retry, each retry withdraws one, and both
// expire after the TTL; a reserve of MinRetriesPerSec*TTL retries is always
// available on top. Create one with [NewPercentBudget]; the zero value is not
// usable. It is safe for concurrent use and does not allocate; its calls take
// no locks, except, with an injected Clock, the first call of each slot.
//
// # The bound
//
// Time is cut into slots of TTL/10, starting when the budget was created. A
// deposit or withdrawal counts while its slot is one of the 10 latest (so it
// expires between 0.9 TTL and 1 TTL after it was made). A withdrawal succeeds
// only if, counting it, withdrawals <= PercentCanRetry*deposits + reserve over
// the live slots. It follows that for any run of m consecutive slots,
//
//	retries(run) <= PercentCanRetry * requests(run and the 9 slots before it)
//	               + MinRetriesPerSec*TTL * ceil(m/10)
//
// because the last retry of the run bounds every retry in its 10-slot window,
// the last retry before that window bounds the previous window, and so on:
// at most ceil(m/10) disjoint windows, each with its own reserve and its own
// deposits. In particular, for traffic that starts on an idle budget,
// retries are at most PercentCanRetry*requests plus MinRetriesPerSec*TTL per
// started TTL. The percentage is rounded to 1e-4, written d/w in lowest
// terms, and the reserve is rounded down to a multiple of 1/w of a retry.
// The counts are kept modulo 2^32: a TTL may hold up to 2^32-1 requests,
// and the reserve is at most 2^30 retries.
//
// # The system clock
//
// With the system clock (a nil Clock), the budget does not read the clock on
// each call: a timer moves it to the next slot at each boundary, so a call
// is one atomic operation on one shared word (plus a read of a word that
// changes once a slot), and a slot begins late by the timer's delay, usually
// well under a millisecond. The bound above holds for slots so delimited.
// The timer fires once per slot (every second with the default TTL) and
// stops once the budget is unreachable. With an injected Clock, each call
// reads it, and the first call of a new slot moves the budget to it.
type PercentBudget struct {
	clock   llmlb.Clock
	manual  bool // an injected clock: calls read it and move the slot
	start   time.Time
	width   int64 // slot width in nanoseconds
	deposit int64 // units added per deposit
	cost    int64 // units taken per withdrawal
	reserve int64 // units always available
	// base is counts as it was when the oldest live slot began: the live
	// requests and retries are counts minus base. It changes once a slot.
	base atomic.Uint64
	// mu serializes moving to a new slot; cur and marks change under it.
	mu  sync.Mutex
	cur atomic.Uint64 // the slot number base belongs to
	// marks holds counts as it was when each of the last 10 slots began,
	// slot k at marks[k%budgetSlots].
	marks [budgetSlots]uint64
	_     [64]byte // keeps the fields above off counts' cache line
	// counts packs the requests (low 32 bits) and the retries (high 32
	// bits) ever counted, each modulo 2^32. A request is one atomic add;
	// when the low half wraps, its carry reads as one more retry, which
	// only errs on the safe side, once per 2^32 requests.
	counts atomic.Uint64
	_      [56]byte
}

// NewPercentBudget returns a budget configured by cfg. It rejects a missing,
// negative or tiny TTL, a negative or non-finite MinRetriesPerSec, and a
// PercentCanRetry outside [0, 1] with an error wrapping [ErrInvalidConfig].
func NewPercentBudget(cfg PercentConfig) (*PercentBudget, error) {
	if cfg.TTL == 0 {
		return nil, invalidf("budget TTL is required (DefaultPercentConfig sets %v)", DefaultBudgetTTL)
	}
	if cfg.TTL < 100*time.Millisecond {
		return nil, invalidf("budget TTL %v must be at least 100ms", cfg.TTL)
	}
	if !(cfg.MinRetriesPerSec >= 0) || math.IsInf(cfg.MinRetriesPerSec, 0) {
		return nil, invalidf("budget MinRetriesPerSec %v must be finite and non-negative", cfg.MinRetriesPerSec)
	}
	if !(cfg.PercentCanRetry >= 0 && cfg.PercentCanRetry <= 1) {
		return nil, invalidf("budget PercentCanRetry %v must be in [0, 1]", cfg.PercentCanRetry)
	}
	d := int64(math.Round(cfg.PercentCanRetry * percentScale))
	if d == 0 && cfg.PercentCanRetry != 0 {
		return nil, invalidf("budget PercentCanRetry %v is below the precision of 1e-4", cfg.PercentCanRetry)
	}
	w := int64(percentScale)
	g := gcd(d, w)
	d, w = d/g, w/g
	reserveRetries := cfg.MinRetriesPerSec * cfg.TTL.Seconds()
	if reserveRetries > maxReserve {
		return nil, invalidf("budget reserve of %v retries per TTL is too large (at most %v)", reserveRetries, float64(maxReserve))
	}
	clock := clockOr(cfg.Clock)
	_, sys := clock.(systemClock)
	b := &PercentBudget{
		clock:   clock,
		manual:  !sys,
		start:   clock.Now(),
		width:   int64(cfg.TTL / budgetSlots),
		deposit: d,
		cost:    w,
		reserve: int64(reserveRetries * float64(w)),
	}
	if sys {
		armSlotTimer(weak.Make(b), time.Duration(b.width))
	}
	return b, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// armSlotTimer moves the budget to the slot of the time after the given
// delay, and then again at each following slot boundary, for as long as the
// budget is reachable: the timer holds it only weakly.
func armSlotTimer(wp weak.Pointer[PercentBudget], after time.Duration) {
	time.AfterFunc(after, func() {
		b := wp.Value()
		if b == nil {
			return
		}
		e := b.epoch()
		b.moveTo(e)
		armSlotTimer(wp, time.Until(b.start.Add(time.Duration(e+1)*time.Duration(b.width))))
	})
}

// epoch returns the slot number of the clock's time.
func (b *PercentBudget) epoch() uint64 {
	d := int64(b.clock.Now().Sub(b.start))
	if d < 0 {
		return 0
	}
	return uint64(d / b.width)
}

// sync moves an injected-clock budget to the slot of the clock's time.
func (b *PercentBudget) sync() {
	if !b.manual {
		return
	}
	if e := b.epoch(); e > b.cur.Load() {
		b.moveTo(e)
	}
}

// moveTo makes slot e the current one, if it is later than the current one:
// the slots since the current one begin now, and base becomes the mark of
// slot e-9.
func (b *PercentBudget) moveTo(e uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.cur.Load()
	if e <= cur {
		return
	}
	now := b.counts.Load()
	first := cur + 1
	if e >= budgetSlots && e-budgetSlots+1 > first {
		first = e - budgetSlots + 1
	}
	for k := first; k <= e; k++ {
		b.marks[k%budgetSlots] = now
	}
	// Slot e-9, the oldest live one, sits where slot e+1 will. Before slot
	// 9 it is slot 0's mark, still zero.
	if e >= budgetSlots-1 {
		b.base.Store(b.marks[(e+1)%budgetSlots])
	}
	b.cur.Store(e)
}

// balance returns the units left by counts c over base: the reserve plus
// the live deposits minus the live withdrawals.
func (b *PercentBudget) balance(c, base uint64) int64 {
	deposits := int64(uint32(c) - uint32(base))
	withdrawals := int64(uint32(c>>32) - uint32(base>>32))
	return b.reserve + deposits*b.deposit - withdrawals*b.cost
}

// Available returns the number of retries that could be withdrawn now,
// rounded down. It is meant for tests and metrics.
func (b *PercentBudget) Available() int64 {
	b.sync()
	bal := b.balance(b.counts.Load(), b.base.Load())
	if bal < 0 {
		return 0
	}
	return bal / b.cost
}

// Start records one request: it deposits PercentCanRetry of a retry, which
// counts until the deposit's slot expires. It implements [Budget].
func (b *PercentBudget) Start() {
	b.sync()
	b.counts.Add(1)
}

// Withdraw reports whether one retry may be sent and, if so, records it as a
// withdrawal that counts against the budget until its slot expires. A
// refused retry leaves the budget unchanged. It implements [Budget].
func (b *PercentBudget) Withdraw() bool {
	b.sync()
	base := b.base.Load()
	for {
		c := b.counts.Load()
		if b.balance(c, base) < b.cost {
			return false
		}
		if b.counts.CompareAndSwap(c, c+1<<32) {
			return true
		}
	}
}

// Finish does nothing: a PercentBudget counts requests and retries, not
// their outcomes. It implements [Budget].
func (b *PercentBudget) Finish(bool, Outcome) {}

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case Abandoned:
		return "abandoned"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}
