package fair

import (
	"errors"
	"fmt"
	"math"
	"time"
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
	// DefaultRetryAfter is the wait suggested to refused callers.
	DefaultRetryAfter = time.Second
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

// Clock tells the time. The queue reads it to age waiters and to compare
// their deadlines; tests pass a fake one.
type Clock interface {
	Now() time.Time
}

// Config configures a [Queue]. Every zero field is a documented default.
// With neither MaxInFlight nor MaxTokensInFlight set, every request is
// admitted at once and nothing waits; the counters are still kept.
type Config struct {
	// MaxInFlight caps the requests admitted and not done. 0 means no cap.
	MaxInFlight int
	// MaxTokensInFlight caps the tokens of the requests admitted and not
	// done: their prompt tokens and the output tokens charged so far, a
	// proxy for the KV cache they hold. A request is admitted if its prompt
	// fits under the cap, or if nothing else is in flight, so that a prompt
	// larger than the cap is admitted alone rather than never. 0 means no
	// cap.
	MaxTokensInFlight int64
	// MaxWaiting bounds the requests waiting. A request arriving when it is
	// reached sheds the newest waiter of the least urgent class less urgent
	// than its own, or else is refused. 0 means [DefaultMaxWaiting].
	MaxWaiting int
	// MaxWaitingPerPrincipal bounds the requests of one principal waiting;
	// past it the principal's requests are refused. 0 means no bound but
	// MaxWaiting.
	MaxWaitingPerPrincipal int
	// MaxPrincipals bounds the principals remembered while they have
	// nothing waiting or in flight. Past it the one idle the longest is
	// forgotten, and if it comes back it starts afresh at the least
	// counter of those waiting (as any newcomer does), losing any lead it
	// had. Principals with requests waiting or in flight are always
	// tracked. 0 means [DefaultMaxPrincipals].
	MaxPrincipals int
	// Weight returns a principal's weight: its share of the capacity
	// relative to others, so that a principal of weight 2 is served twice
	// the tokens of one of weight 1 when both wait. It is called on every
	// Admit, outside the queue's lock, and must be safe for concurrent
	// use. nil, or a result that is not a positive finite number, means 1.
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
	// RetryAfter is the wait suggested to refused callers; 0 means
	// [DefaultRetryAfter].
	RetryAfter time.Duration
	// Clock tells the time; nil means the system clock.
	Clock Clock
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

func validWeight(w float64) bool { return w > 0 && !math.IsInf(w, 1) }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
