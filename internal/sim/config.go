package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/model"
)

// Sentinel errors; errors returned by this package wrap one of them.
var (
	// ErrInvalidConfig: a Config or Engine field is out of range.
	ErrInvalidConfig = model.ErrInvalidConfig
	// ErrInvalidWorkload: a request or a workload description is invalid.
	ErrInvalidWorkload = model.ErrInvalidWorkload
	// ErrUnknownPolicy: no policy of that name is in [Policies].
	ErrUnknownPolicy = errors.New("sim: unknown policy")
	// ErrMalformedTrace: a trace line could not be parsed; the message names
	// the line.
	ErrMalformedTrace = errors.New("sim: malformed trace")
)

// SLO is the per-request service-level objective; a request meets it when
// both its TTFT and its TPOT are within bounds.
type SLO struct {
	// TTFT is the time-to-first-token bound. 0 means 2 s.
	TTFT time.Duration
	// TPOT is the time-per-output-token bound: (E2E - TTFT) / (output - 1).
	// 0 means 50 ms.
	TPOT time.Duration
}

// Config describes the simulated cluster. The zero value is 8 default
// replicas behind one router that scrapes every second.
type Config struct {
	// Replicas is the number of replicas. 0 means 8.
	Replicas int
	// Routers is the number of routers, each with its own Balancer; arrivals
	// are split among them in turn. 0 means 1.
	Routers int
	// RandomSplit splits arrivals among routers at random instead of in turn.
	RandomSplit bool
	// Engine configures every replica.
	Engine Engine
	// Speed, if not nil, is each replica's speed relative to Engine, by
	// replica index: replica i's iterations take IterTime / Speed[i], so
	// at 0.5 it runs at half speed; each from [MinSpeed] to [MaxSpeed].
	// Replicas beyond its length run at 1.
	// Unless DeclareWeights, the replicas declare no weight to the routers:
	// a policy must find the difference itself.
	Speed []float64
	// SpeedChanges change replicas' speeds during the run.
	SpeedChanges []SpeedChange
	// DeclareWeights, if true, has every replica declare its speed at the
	// start of the run (Speed, 1 beyond its length) to the routers as its
	// weight ([llmlb.Endpoint]), as an operator who knows the replicas'
	// hardware would configure; policies that read weights (llmlb.Default
	// divides its cost by them) then know the speeds from the first pick,
	// and those that do not ignore them. The weights stay as declared:
	// SpeedChanges do not change them. Equal speeds declare weights of 1,
	// which changes nothing.
	DeclareWeights bool
	// onPick, if not nil, is told of every dispatch: the simulated time
	// and the replica. Tests use it.
	onPick func(at time.Duration, replica int)
	// Scrape is the interval at which each router refreshes its view of the
	// replicas' engine metrics, for policies whose preset does not set its
	// own ([PolicySpec.Scrape]). 0 means 1 s.
	Scrape time.Duration
	// SignalInterval, if not 0, is the scrape interval of every policy,
	// overriding the presets' own intervals, so that a comparison can run
	// every policy on equally fresh signals; MaxSignalAge then defaults to
	// 3*SignalInterval.
	SignalInterval time.Duration
	// Stagger offsets router r's scrapes by r*Scrape/Routers; otherwise all
	// routers scrape at the same instants and share one stale view.
	Stagger bool
	// MaxSignalAge is passed to llmlb.WithSignal. 0 means 3*Scrape.
	MaxSignalAge time.Duration
	// Delay is the network delay from a router to a replica.
	Delay time.Duration
	// Share, if not 0, has the routers share their requests in flight and
	// the prefixes they routed, through a [share.Group] each (the Group is
	// the router's signal, over its scrapes, and observes its Balancer;
	// peers' prefixes go to the policy's index of its own decisions, if it
	// has one): every Share, each router builds a batch, which reaches the
	// other routers twice Delay later (to the NATS server and on; NATS
	// itself adds well under a millisecond). Router r's batches are built
	// at offsets of r*Share/Routers. It needs at least two routers. Each
	// Group tracks every other router as a peer, however many there are
	// ([share.Config].MaxPeers is Routers-1): the default bound of 64
	// guards a deployment against peers it does not know of, and here the
	// peers are known. Likewise each tracks every replica
	// ([share.Config].MaxEndpoints is Replicas, or share's default 1024
	// if that is more).
	Share time.Duration
	// SLO is the per-request objective for SLO attainment and goodput.
	SLO SLO
	// Seed seeds every random choice of the routers and policies.
	Seed uint64
	// Admission is the admission control in front of the routers. The zero
	// value admits every request at once.
	Admission Admission
	// Outputs is what the routers know of output lengths. The zero value,
	// [OutputsUntold], charges every request the decode allowance.
	Outputs OutputKnowledge
	// Prediction configures the routers' output-length prediction under
	// [OutputsPredicted]; the zero value selects llmlb's defaults.
	Prediction llmlb.OutputConfig
	// Prefill is the number of prefill workers of a disaggregated run: under
	// a policy that routes prefill and decode apart ([PolicySpec].Decode),
	// replicas 0 to Prefill-1 only prefill prompts and the others decode
	// them (see [KVTransfer]); other policies ignore it and use every
	// replica for both. 0 means a quarter of the replicas, at least one;
	// it must leave at least one decode worker.
	Prefill int
	// Transfer models the KV cache transfer from a prefill worker to a
	// decode worker in a disaggregated run; the zero value is the default.
	Transfer KVTransfer
	// onTransfer, if not nil, is told of every KV transfer of a
	// disaggregated run as it starts: the request, the prompt tokens
	// pulled and the transfer time. Tests use it.
	onTransfer func(req, tokens int, d time.Duration)
	// onEnd, if not nil, is given the runner at the end of a successful
	// run. Tests use it.
	onEnd func(r *runner)
	// Series is the sampling interval of the per-replica outstanding-work
	// series ([Result].Series). 0 means the last arrival time / 200 (at
	// least 10 ms). The series holds at most 1024 samples: when a run
	// outlasts that many intervals, every other sample is dropped and the
	// interval doubles.
	Series time.Duration
}

// SpeedChange sets a replica's speed from a time on: iterations that start
// at or after At take IterTime / Speed; one under way at At ends at the old
// speed.
type SpeedChange struct {
	// Replica is the index of the replica.
	Replica int
	// At is the simulated time of the change, from the start of the run.
	At time.Duration
	// Speed is the new speed relative to Engine, from [MinSpeed] to
	// [MaxSpeed].
	Speed float64
}

// Bounds on a replica's speed ([Config].Speed, [SpeedChange].Speed): a
// thousandfold slower replica already turns a second of work into a quarter
// of an hour, and far slower ones would make a run's iteration times
// overflow time.Duration or its scrapes countless.
const (
	MinSpeed = 1e-3
	MaxSpeed = 1e3
)

// validSpeed reports whether v is within [MinSpeed, MaxSpeed].
func validSpeed(v float64) bool { return v >= MinSpeed && v <= MaxSpeed }

// speedAt returns replica i's speed at now.
func (c *Config) speedAt(i int, now time.Duration) float64 {
	speed := 1.0
	if i < len(c.Speed) {
		speed = c.Speed[i]
	}
	last := time.Duration(-1)
	for _, ch := range c.SpeedChanges {
		if ch.Replica == i && ch.At <= now && ch.At >= last {
			speed, last = ch.Speed, ch.At
		}
	}
	return speed
}

func (c *Config) normalize() error {
	if c.Replicas == 0 {
		c.Replicas = 8
	}
	if c.Routers == 0 {
		c.Routers = 1
	}
	if c.Scrape == 0 {
		c.Scrape = time.Second
	}
	if c.MaxSignalAge == 0 {
		c.MaxSignalAge = 3 * c.Scrape
	}
	if c.SLO.TTFT == 0 {
		c.SLO.TTFT = 2 * time.Second
	}
	if c.SLO.TPOT == 0 {
		c.SLO.TPOT = 50 * time.Millisecond
	}
	switch {
	case c.Replicas < 1 || c.Replicas > 1<<12:
		return fmt.Errorf("%w: %d replicas, want 1 to 4096", ErrInvalidConfig, c.Replicas)
	case c.Routers < 1 || c.Routers > 1<<10:
		return fmt.Errorf("%w: %d routers, want 1 to 1024", ErrInvalidConfig, c.Routers)
	case c.Scrape < time.Millisecond:
		return fmt.Errorf("%w: scrape interval %v, want at least 1ms", ErrInvalidConfig, c.Scrape)
	case c.MaxSignalAge < 0 || c.Delay < 0 || c.Series < 0 || c.SignalInterval < 0 || c.Share < 0:
		return fmt.Errorf("%w: negative duration", ErrInvalidConfig)
	case c.Share > 0 && c.Routers < 2:
		return fmt.Errorf("%w: sharing every %v needs at least 2 routers, not %d", ErrInvalidConfig, c.Share, c.Routers)
	case c.Share > 0 && (c.Share < time.Millisecond || c.Share > time.Minute):
		return fmt.Errorf("%w: sharing interval %v, want 1ms to 1m", ErrInvalidConfig, c.Share)
	case c.SLO.TTFT < 0 || c.SLO.TPOT < 0:
		return fmt.Errorf("%w: negative SLO", ErrInvalidConfig)
	case c.Prefill < 0 || c.Prefill > 0 && c.Prefill >= c.Replicas:
		return fmt.Errorf("%w: %d prefill workers of %d replicas, want at least one decode worker", ErrInvalidConfig, c.Prefill, c.Replicas)
	}
	if err := c.Transfer.validate(); err != nil {
		return err
	}
	if err := c.Admission.validate(); err != nil {
		return err
	}
	if err := c.validateOutputs(); err != nil {
		return err
	}
	for i, v := range c.Speed {
		if !validSpeed(v) {
			return fmt.Errorf("%w: replica %d speed %v, want %g to %g", ErrInvalidConfig, i, v, MinSpeed, MaxSpeed)
		}
	}
	for _, ch := range c.SpeedChanges {
		if ch.Replica < 0 || ch.Replica >= c.Replicas || ch.At < 0 || !validSpeed(ch.Speed) {
			return fmt.Errorf("%w: speed change %+v of %d replicas", ErrInvalidConfig, ch, c.Replicas)
		}
	}
	return c.Engine.Normalize()
}
