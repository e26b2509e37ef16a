package sim

import (
	"github.com/llmlb/llmlb/internal/model"
	"time"
	"unsafe"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
)

// reqState is the progress of one simulated request. The runner keeps them
// in one slice, whose backing array, a large allocation, starts on a page;
// the padding makes each a whole number of 64-byte cache lines, so that
// every Sequence starts a line and the progress its engine reads at every
// iteration (see model.Sequence) takes one line instead of straddling two.
type reqState struct {
	reqFields
	_ [(64 - unsafe.Sizeof(reqFields{})%64) % 64]byte
}

// reqFields are the fields of a reqState.
type reqFields struct {
	Sequence
	req     *Request
	pick    llmlb.Pick
	replica int
	router  int          // the router that picked the replica
	ticket  *fair.Ticket // with a FairQueue admission

	firstToken time.Duration // simulated time of the first output token
	finished   time.Duration

	pd *pdState // with a disaggregated policy

}

// replica is one simulated engine: a Replica driven by simulated time.
type replica struct {
	*Replica
	idx    int
	run    *runner
	busy   bool
	iterAt time.Duration

	outstanding int // requests dispatched here and not finished
	assigned    int
}

// enqueue submits a newly arrived request.
func (r *replica) enqueue(s *reqState, now time.Duration) error {
	return r.enqueueSeq(&s.Sequence, now)
}

// enqueueSeq submits a sequence.
func (r *replica) enqueueSeq(s *Sequence, now time.Duration) error {
	if err := r.Submit(s); err != nil {
		return err
	}
	r.kick(now)
	return nil
}

// kick starts an iteration if the engine is idle and has work.
func (r *replica) kick(now time.Duration) {
	if r.busy {
		return
	}
	b, ok := r.Plan()
	if len(r.Started()) > 0 {
		r.run.transfer(r)
	}
	if !ok {
		return
	}
	d := r.Engine().IterTime(b)
	if speed := r.run.cfg.speedAt(r.idx, now); speed != 1 {
		d = time.Duration(float64(d) / speed)
	}
	d += time.Duration(b.AdapterLoads) * r.Engine().AdapterLoad
	if d <= 0 {
		d = time.Nanosecond
	}
	r.busy = true
	r.iterAt = now + d
	r.run.schedule(r.iterAt, evIteration, r.idx)
}

// finish completes the iteration that ends at now and starts the next.
// Unless admission control charges every token, the replica decodes
// quietly: Finish returns only the tokens finish acts on, a request's first
// and last (and the one that ends a prefill).
func (r *replica) finish(now time.Duration) {
	r.busy = false
	for _, q := range r.Finish() {
		if q.ID < 0 {
			// The prefill of a disaggregated request, its only token.
			r.outstanding--
			r.run.prefilled(-1 - q.ID)
			continue
		}
		s := &r.run.st[q.ID]
		// Only a run with admission control gives tickets, and only a
		// disaggregated one pdState: the others need not read them.
		if r.run.adm != nil && s.ticket != nil {
			s.ticket.Charge(1)
		}
		if r.run.disagg && s.pd != nil {
			r.finishDisagg(s, now)
			continue
		}
		if s.Generated() == 1 {
			s.firstToken = now
			s.pick.FirstToken()
		}
		if s.State() == model.StateDone {
			s.finished = now
			r.outstanding--
			if r.run.cfg.Outputs != OutputsUntold {
				s.pick.Generated(s.Generated())
			}
			s.pick.Done(nil)
			r.run.finished(s)
		}
	}
	r.kick(now)
}
