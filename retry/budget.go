package retry

import (
	"math"
	"strconv"
	"sync/atomic"
	"time"
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

// Outcome is how an attempt ended, as far as a budget cares.
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
	Clock Clock
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

// paddedSlot keeps each slot on its own cache line, so that writes to the
// current slot do not evict the others from the caches of cores summing them.
type paddedSlot struct {
	v atomic.Uint64
	_ [56]byte
}

// budgetSlots is the number of time slots a TTL is divided into.
const budgetSlots = 10

// percentScale is the denominator of the percentage's fixed-point form.
const percentScale = 10000

// PercentBudget is a retry budget after Finagle's RetryBudget: each request
// deposits PercentCanRetry of a retry, each retry withdraws one, and both
// expire after the TTL; a reserve of MinRetriesPerSec*TTL retries is always
// available on top. Create one with [NewPercentBudget]; the zero value is not
// usable. It is safe for concurrent use, takes no locks, and does not allocate.
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
//
// # The system clock
//
// With the system clock (a nil Clock), the budget does not read the clock on
// each call: a timer moves it to the next slot at each boundary, so calls
// read one shared word, and a slot begins late by the timer's delay, usually
// well under a millisecond. The bound above holds for slots so delimited.
// The timer fires once per slot (every second with the default TTL) and
// stops once the budget is unreachable. With an injected Clock, each call
// reads it.
type PercentBudget struct {
	clock   Clock
	ticker  *slotClock // with the system clock: the slot, kept by a timer
	start   time.Time
	width   int64    // slot width in nanoseconds
	deposit int64    // units added per deposit
	cost    int64    // units taken per withdrawal
	reserve int64    // units always available
	_       [64]byte // keeps the fields above off the slots' cache lines
	// slots holds, per slot, the low 32 bits of the slot's epoch and its net
	// balance in units (see packSlot). The zero word is not a valid slot:
	// NewPercentBudget initializes each to balance 0 of a far epoch.
	slots [budgetSlots]paddedSlot
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
	if reserveRetries > 1e12 {
		return nil, invalidf("budget reserve of %v retries per TTL is too large", reserveRetries)
	}
	clock := clockOr(cfg.Clock)
	b := &PercentBudget{
		clock:   clock,
		start:   clock.Now(),
		width:   int64(cfg.TTL / budgetSlots),
		deposit: d,
		cost:    w,
		reserve: int64(reserveRetries * float64(w)),
	}
	for i := range b.slots {
		// An epoch half the cycle away reads as stale from epoch 0 on.
		b.slots[i].v.Store(packSlot(1<<31, 0))
	}
	if _, sys := clock.(systemClock); sys {
		b.ticker = newSlotClock(b.start, time.Duration(b.width))
	}
	return b, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// epoch returns the slot number of the current time.
func (b *PercentBudget) epoch() uint64 {
	if b.ticker != nil {
		return b.ticker.load()
	}
	d := int64(b.clock.Now().Sub(b.start))
	if d < 0 {
		return 0
	}
	return uint64(d / b.width)
}

// Deposit records one request.
func (b *PercentBudget) Deposit() { b.add(b.epoch(), b.deposit, false) }

// TryWithdraw reports whether one retry may be sent, and if so records it.
func (b *PercentBudget) TryWithdraw() bool {
	e := b.epoch()
	if b.balance(e) < b.cost {
		return false // fast path: no write when the budget is spent
	}
	rec, ok := b.add(e, -b.cost, false)
	if !ok {
		return false
	}
	if b.balance(e) >= 0 {
		return true
	}
	b.add(rec, b.cost, true)
	return false
}

// Available returns the number of retries that could be withdrawn now,
// rounded down. It is meant for tests and metrics.
func (b *PercentBudget) Available() int64 {
	bal := b.balance(b.epoch())
	if bal < 0 {
		return 0
	}
	return bal / b.cost
}

// Start implements [Budget] by depositing.
func (b *PercentBudget) Start() { b.Deposit() }

// Withdraw implements [Budget]; see [PercentBudget.TryWithdraw].
func (b *PercentBudget) Withdraw() bool { return b.TryWithdraw() }

// Finish implements [Budget]; it does nothing.
func (b *PercentBudget) Finish(bool, Outcome) {}

// newerSlots bounds how far ahead of a goroutine's clock reading a slot's
// epoch may be and still be taken as newer rather than stale. Only a slot
// left untouched for about 2^32 slots (more than a year with the minimum TTL)
// could be mistaken for a newer one.
const newerSlots = 1 << 20

// A slot packs the low 32 bits of its epoch and its balance biased by 2^31:
// epoch<<32 | uint32(balance + 2^31). While the balance stays well inside
// the int32 range, adding a delta to the packed word adds it to the balance
// without touching the epoch, so the common case is one atomic add.
const (
	slotBias = 1 << 31
	slotSafe = 1 << 30 // |balance| below this takes the atomic-add path
)

func packSlot(e uint32, v int64) uint64 { return uint64(e)<<32 | uint64(v+slotBias) }

func unpackSlot(x uint64) (uint32, int64) { return uint32(x >> 32), int64(uint32(x)) - slotBias }

// add adds delta units to the slot of epoch e and returns the epoch it was
// recorded under. A slot holding an older epoch is restarted; one holding a
// newer epoch (another goroutine read a later time) takes the delta, which
// errs on the safe side for a withdrawal and extends a deposit's life by at
// most a slot. With exact set, the delta is dropped unless the slot still
// holds epoch e: a refund of a withdrawal that expired is not paid. A balance
// is capped at the int32 range; a withdrawal that would pass the floor fails.
func (b *PercentBudget) add(e uint64, delta int64, exact bool) (uint64, bool) {
	s := &b.slots[e%budgetSlots].v
	if !exact {
		// Fast path: the slot is current and far from the bounds. If
		// another goroutine restarts it for a newer epoch meanwhile, the
		// delta lands in the newer epoch, as on the slow path.
		if se, sv := unpackSlot(s.Load()); se == uint32(e) && sv > -slotSafe && sv < slotSafe {
			ne, _ := unpackSlot(s.Add(uint64(delta)))
			return e + uint64(int32(ne-uint32(e))), true
		}
	}
	for {
		old := s.Load()
		se, sv := unpackSlot(old)
		diff := int32(uint32(e) - se)
		re := e
		switch {
		case diff == 0:
		case exact:
			return 0, false
		case diff < 0 && diff > -newerSlots:
			re = e + uint64(-diff)
		default:
			se, sv = uint32(e), 0
		}
		nv := sv + delta
		if nv < math.MinInt32 {
			return 0, false
		}
		nv = min(nv, math.MaxInt32)
		if s.CompareAndSwap(old, packSlot(se, nv)) {
			return re, true
		}
	}
}

// balance returns the reserve plus the net balance of the live slots at
// epoch e.
func (b *PercentBudget) balance(e uint64) int64 {
	sum := b.reserve
	for i := range b.slots {
		se, sv := unpackSlot(b.slots[i].v.Load())
		if diff := int32(uint32(e) - se); diff > -budgetSlots && diff < budgetSlots {
			sum += sv
		}
	}
	return sum
}

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
