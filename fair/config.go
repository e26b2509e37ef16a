package fair

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/llmlb/llmlb"
)

// Defaults of [Config].
const (
	// DefaultMaxWaiting bounds the requests waiting in a queue.
	DefaultMaxWaiting = 1000
	// DefaultMaxPrincipals bounds the idle principals whose counters a
	// queue remembers.
	DefaultMaxPrincipals = 10000
	// DefaultAgingInterval is the wait after which a class moves up one
	// rank: a Batch class none of whose requests was admitted for 10 s
	// competes as Interactive.
	DefaultAgingInterval = 5 * time.Second
	// DefaultRetryAfter is the least wait suggested to refused callers.
	DefaultRetryAfter = time.Second
	// DefaultMaxRetryAfter is the most wait suggested to refused callers.
	DefaultMaxRetryAfter = time.Minute
	// DefaultInputWeight and DefaultOutputWeight price a prompt token and
	// an output token in the counters: an output token costs two prompt
	// tokens, the weights of the VTC paper's experiments, since output is
	// produced one token per step while the prompt is prefilled in
	// parallel.
	DefaultInputWeight  = 1
	DefaultOutputWeight = 2
)

// ErrInvalidConfig: [New] was given a configuration value out of range.
var ErrInvalidConfig = errors.New("fair: invalid config")

// Config configures a [Queue]. Every zero field is a documented default.
// With neither MaxInFlight nor MaxTokensInFlight set, every request is
// admitted at once and nothing waits; the counters are still kept.
type Config struct {
	// MaxInFlight caps the requests admitted and not done. 0 means no cap.
	MaxInFlight int
	// MaxTokensInFlight caps the tokens of the requests admitted and not
	// done: their prompt tokens and the output tokens charged so far, a
	// proxy for the KV cache they hold. A request is admitted if its prompt
	// fits under the cap, or if no tokens are in flight (only requests of
	// no tokens, or none), so that a prompt larger than the cap is admitted
	// alone rather than never. 0 means no cap.
	MaxTokensInFlight int64
	// MaxWaiting bounds the requests waiting. A request arriving when it is
	// reached sheds the newest waiter of the least urgent class less urgent
	// than its own; or else, in its own class, the newest waiter of the
	// principal with the most requests waiting, if that principal has at
	// least two more waiting than the request's own, so that one principal
	// filling the queue does not have every other's requests refused; or
	// else is refused. 0 means [DefaultMaxWaiting].
	MaxWaiting int
	// MaxWaitingPerPrincipal bounds the requests of one principal waiting;
	// past it the principal's requests are refused. 0 means no bound but
	// MaxWaiting.
	MaxWaitingPerPrincipal int
	// MaxPrincipals bounds the principals remembered while they have
	// nothing waiting or in flight. Past it the one idle the longest is
	// forgotten, and if it comes back it starts afresh, lifted as any
	// principal that starts waiting (see the package documentation),
	// losing any lead it had. Principals with requests waiting or in flight are always
	// tracked; a request refused on arrival does not make the queue track
	// its principal. 0 means [DefaultMaxPrincipals].
	MaxPrincipals int
	// Weight returns a principal's weight: its share of the capacity
	// relative to others, so that a principal of weight 2 is served twice
	// the tokens of one of weight 1 when both wait. It is called on every
	// Admit and Enter, outside the queue's lock, and must be safe for
	// concurrent use. nil, or a result that is not a positive finite
	// number, means 1; a weight is taken within [1e-6, 1e6].
	Weight func(principal string) float64
	// InputWeight is the charge for one prompt token; 0 means
	// [DefaultInputWeight].
	InputWeight float64
	// OutputWeight is the charge for one output token; 0 means
	// [DefaultOutputWeight].
	OutputWeight float64
	// AgingInterval is the wait after which a class counts as one rank
	// more urgent; a class waits from its oldest waiter's arrival or its
	// last admission, whichever is later (see the package documentation).
	// 0 means [DefaultAgingInterval]; a negative value disables aging, so
	// that a lower class waits as long as a higher one has waiters.
	AgingInterval time.Duration
	// RetryAfter is the least wait suggested to refused callers; 0 means
	// [DefaultRetryAfter], or MaxRetryAfter if that is set and less. The
	// wait suggested is the time the queue is expected to take to admit
	// the requests waiting, at the rate it has admitted requests lately
	// (an exponentially weighted rate over about 10 s): all of them for a
	// refusal of scope "queue", and for scope "principal" the principal's
	// own, at its share of that rate (the rate divided by the principals
	// waiting). It is never below RetryAfter, nor above MaxRetryAfter, and
	// is RetryAfter until the queue has admitted requests for a second.
	RetryAfter time.Duration
	// MaxRetryAfter is the most wait suggested to refused callers; 0 means
	// [DefaultMaxRetryAfter], or RetryAfter if that is more. A value set
	// below RetryAfter is an error.
	MaxRetryAfter time.Duration
	// Observer, if not nil, is told of every admission and refusal, for
	// metrics (package telemetry provides one).
	Observer *Observer
	// Clock tells the time; nil means the system clock. A context's
	// deadline (see [Queue.Admit]) is read on this clock: one that is not
	// the system clock's time (a simulation's) must be given deadlines on
	// its own time line.
	Clock llmlb.Clock
}

// Observer is told of a queue's decisions. Its functions are called with
// the queue's lock held: they must return quickly and must not call the
// queue's or its tickets' methods. The calls of one queue therefore never
// overlap; an Observer shared by several queues must be safe for
// concurrent use. A nil function is skipped.
type Observer struct {
	// Admitted is called once for every request admitted, with its class
	// and the time it waited on the queue's clock (0 if it was admitted on
	// arrival; never negative).
	Admitted func(c Class, waited time.Duration)
	// Refused is called once for every request refused, with its class and
	// the reason: [ReasonFull], [ReasonPrincipal], [ReasonShed] or
	// [ReasonDeadline]. A request whose caller gives up (a cancelled
	// context, a queued ticket's Done) is not refused.
	Refused func(c Class, reason Reason)
}

// Reason is why a queue refused a request, as [Observer.Refused] reports
// it. Its values are the Reason constants; as a string it is the label a
// metric or a log line carries. It is a plain value, safe to share.
type Reason string

// The reasons of a refusal.
const (
	// ReasonFull: MaxWaiting requests were waiting, none of them less
	// urgent to shed.
	ReasonFull Reason = "full"
	// ReasonPrincipal: MaxWaitingPerPrincipal requests of the principal
	// were waiting.
	ReasonPrincipal Reason = "principal"
	// ReasonShed: the request was waiting and made room for a more urgent
	// one, or for one of a principal with fewer requests waiting.
	ReasonShed Reason = "shed"
	// ReasonDeadline: the caller's deadline passed before admission.
	ReasonDeadline Reason = "deadline"
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

func validWeight(w float64) bool { return w > 0 && !math.IsInf(w, 1) }

// The bounds of a principal's weight ([Config.Weight]): a million to one
// either way, so that a request's charge stays a finite number.
const (
	minWeight = 1e-6
	maxWeight = 1e6
)

// principalWeight returns the weight of principal: Config.Weight's, within
// [minWeight, maxWeight], or 1.
func (q *Queue) principalWeight(principal string) float64 {
	if q.weight == nil {
		return 1
	}
	if v := q.weight(principal); validWeight(v) {
		return min(max(v, minWeight), maxWeight)
	}
	return 1
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
