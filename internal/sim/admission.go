package sim

import (
	"cmp"
	"fmt"
	"math"
	"time"

	"github.com/llmlb/llmlb/fair"
)

// AdmissionKind selects the admission control in front of the routers.
type AdmissionKind uint8

// The kinds of admission control.
const (
	// AdmitAll admits every request at once, as if there were no admission
	// control: the simulator's behaviour without one.
	AdmitAll AdmissionKind = iota
	// RateLimit limits each tenant ([Request].Tenant) to Admission.RPM
	// requests and Admission.TPM tokens per minute, as API gateways do
	// (LiteLLM's per-key rpm_limit and tpm_limit, Azure API Management's
	// rate-limit-by-key and llm-token-limit): a request arriving when its
	// tenant is over either limit is refused, as a gateway answers 429.
	RateLimit
	// FairQueue admits requests through a [fair.Queue] configured by
	// Admission.Queue, one for the whole cluster, its principals the
	// tenants: a request waits while the queue's caps on requests or tokens
	// in flight are reached, and the next one admitted is of the tenant
	// served the fewest weighted tokens (the Virtual Token Counter). Each
	// output token is charged to the request's ticket as a replica emits
	// it, and the ticket is done when the request completes. A request the
	// queue refuses (past its bounds on waiting requests) is refused.
	FairQueue
)

// DefaultRateBurst is the burst of a [RateLimit] admission when
// Admission.Burst is 0: a tenant's whole per-minute limit, as a gateway's
// one-minute window allows.
const DefaultRateBurst = time.Minute

// Admission is the admission control in front of the routers: whether an
// arriving request is routed at once, waits, or is refused. A refused
// request never reaches a replica and misses the SLO ([Result].Refused
// counts them). Waiting for admission counts in a request's TTFT. The zero
// value admits every request at once, exactly as a simulation without
// admission control.
type Admission struct {
	// Name labels the results of runs under this admission
	// ([Result].Admission), such as "vtc"; it may be empty.
	Name string
	// Kind is the admission control; the other fields configure it.
	Kind AdmissionKind
	// RPM and TPM are a RateLimit's limits per tenant: requests and tokens
	// per minute; 0 means no limit. Each is a token bucket that refills at
	// the limit's rate and holds at most Burst's worth of it. A request is
	// refused if its tenant's request bucket holds less than one request
	// or its token bucket is empty or in debt; an admitted request takes
	// one request and its prompt tokens at once, and its output tokens when
	// it completes, as a gateway learns them from the response's usage, so
	// that the token bucket may go into debt.
	RPM, TPM float64
	// Burst is how much of a minute's limits a RateLimit bucket holds. 0
	// means [DefaultRateBurst].
	Burst time.Duration
	// Queue configures a FairQueue's [fair.Queue]; its Clock is replaced
	// by the simulated clock. With neither Queue.MaxInFlight nor
	// Queue.MaxTokensInFlight set nothing waits, but the counters are kept.
	Queue fair.Config
	// Principal, if not empty, is a FairQueue's principal for every
	// request, instead of the request's tenant: the traffic of one
	// customer, which only the requests' classes order.
	Principal string
	// IgnoreClass makes a FairQueue admit every request as [fair.Standard],
	// whatever its [Request].Class.
	IgnoreClass bool
}

func (a *Admission) validate() error {
	switch {
	case a.Kind > FairQueue:
		return fmt.Errorf("%w: admission kind %d", ErrInvalidConfig, a.Kind)
	case a.Kind == RateLimit && (!(a.RPM >= 0) || !(a.TPM >= 0) || math.IsInf(a.RPM, 0) || math.IsInf(a.TPM, 0)):
		return fmt.Errorf("%w: rate limits of %v RPM and %v TPM, want finite and not negative", ErrInvalidConfig, a.RPM, a.TPM)
	case a.Burst < 0:
		return fmt.Errorf("%w: rate-limit burst %v is negative", ErrInvalidConfig, a.Burst)
	}
	return nil
}

// admission is the state of a run's admission control.
type admission struct {
	cfg     Admission
	queue   *fair.Queue         // FairQueue
	buckets map[string]*buckets // RateLimit: by tenant
}

// buckets are a tenant's RateLimit token buckets, as of at.
type buckets struct {
	reqs, tokens float64
	at           time.Duration
}

// newAdmission returns the admission control of a run, or nil for AdmitAll.
func newAdmission(r *runner) (*admission, error) {
	a := &admission{cfg: r.cfg.Admission}
	switch a.cfg.Kind {
	case AdmitAll:
		return nil, nil
	case RateLimit:
		if a.cfg.Burst == 0 {
			a.cfg.Burst = DefaultRateBurst
		}
		a.buckets = make(map[string]*buckets)
	case FairQueue:
		qc := a.cfg.Queue
		qc.Clock = simClock{r}
		q, err := fair.New(qc)
		if err != nil {
			return nil, fmt.Errorf("%w: admission queue: %w", ErrInvalidConfig, err)
		}
		a.queue = q
	}
	return a, nil
}

// refill returns tenant's buckets refilled up to now.
func (a *admission) refill(tenant string, now time.Duration) *buckets {
	b := a.buckets[tenant]
	burst := a.cfg.Burst.Minutes()
	if b == nil {
		b = &buckets{reqs: a.cfg.RPM * burst, tokens: a.cfg.TPM * burst, at: now}
		a.buckets[tenant] = b
		return b
	}
	elapsed := (now - b.at).Minutes()
	b.reqs = min(b.reqs+a.cfg.RPM*elapsed, a.cfg.RPM*burst)
	b.tokens = min(b.tokens+a.cfg.TPM*elapsed, a.cfg.TPM*burst)
	b.at = now
	return b
}

// admit decides on request i, which has just arrived: it routes it, makes
// it wait, or refuses it.
func (r *runner) admit(i int) error {
	a := r.adm
	s := &r.st[i]
	req := &r.reqs[i]
	switch a.cfg.Kind {
	case RateLimit:
		b := a.refill(req.Tenant, r.now)
		if a.cfg.RPM > 0 && b.reqs < 1 || a.cfg.TPM > 0 && b.tokens <= 0 {
			r.refuse(s)
			return nil
		}
		b.reqs--
		b.tokens -= float64(req.PromptTokens)
	case FairQueue:
		fr := fair.Request{Principal: cmp.Or(a.cfg.Principal, req.Tenant), Class: req.Class, PromptTokens: req.PromptTokens}
		if a.cfg.IgnoreClass {
			fr.Class = fair.Standard
		}
		t, admitted, err := a.queue.Enter(fr, func(err error) {
			// Called from within another request's Ticket.Done: route
			// the request by an event at this instant, not from inside
			// that request's completion.
			if err != nil {
				r.refuse(s)
				return
			}
			r.schedule(r.now, evAdmit, i)
		})
		if err != nil {
			r.refuse(s)
			return nil
		}
		s.ticket = t
		if !admitted {
			return nil
		}
	}
	return r.route(i)
}

// refuse ends s, refused by the admission control.
func (r *runner) refuse(s *reqState) {
	s.Refuse()
	r.ended++
}

// admissionEnd tells the admission control that s, admitted, ended: a
// rate-limited tenant is charged its output, a fair queue's ticket is done.
func (r *runner) admissionEnd(s *reqState) {
	a := r.adm
	if a == nil {
		return
	}
	switch a.cfg.Kind {
	case RateLimit:
		a.refill(s.req.Tenant, r.now).tokens -= float64(s.Generated())
	case FairQueue:
		s.ticket.Done()
	}
}

// checkAdmission verifies, at the end of a run, that the admission control
// holds nothing.
func (r *runner) checkAdmission() error {
	if r.adm == nil || r.adm.queue == nil {
		return nil
	}
	if st := r.adm.queue.Stats(); st.InFlight != 0 || st.Waiting != 0 || st.TokensInFlight != 0 {
		return fmt.Errorf("sim: internal error: admission queue ended with %d in flight, %d tokens, %d waiting", st.InFlight, st.TokensInFlight, st.Waiting)
	}
	return nil
}
