package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// PoolWorkload is the traffic of a pool scenario: Poisson arrivals at Rate
// per second for Duration, at the rate of a burst within each burst's
// window; prompts and outputs log-normal.
type PoolWorkload struct {
	// Duration is the arrival window.
	Duration time.Duration
	// Rate is the arrival rate outside bursts, in requests per second.
	Rate float64
	// Bursts are windows of a higher Rate.
	Bursts []PoolBurst
	// PromptMedian and PromptSigma give the log-normal prompt lengths in
	// tokens, clipped to [64, 16384].
	PromptMedian float64
	PromptSigma  float64
	// OutputMedian and OutputSigma give the log-normal output lengths in
	// tokens, clipped to [1, 4096].
	OutputMedian float64
	OutputSigma  float64
}

// PoolBurst is a window of a [PoolWorkload] with its own arrival rate.
type PoolBurst struct {
	From, To time.Duration
	Rate     float64 // requests per second
}

// PoolRouting is one way of routing the requests of a [PoolScenario]. Each
// tier it uses has its own [llmlb.Balancer] over the tier's deployments,
// and a request tries a tier up to three times, never twice on one
// deployment while another is left, as httplb's retry loop does: at once
// after a 429 if a later tier follows (a gateway with SpillTo ignores the
// pushback), else after the longer of the back-off (full jitter from 25ms)
// and the Retry-After (one above five minutes is ignored). With several
// tiers a request moves to the next tier that is ready when its tier's
// attempts all ended in 429, and is refused to the client when none is
// left, as package spill does.
type PoolRouting struct {
	// Name labels the routing in the table.
	Name string
	// Policies names the policy of each tier used, in order:
	// "round-robin", "random", "least-outstanding" or "peak-ewma". The
	// routing uses the scenario's first len(Policies) tiers.
	Policies []string
	// Flat puts the deployments of every tier in one pool, under
	// Policies[0], which must be its only policy.
	Flat bool
	// Cooldown gives each tier a retry.Ejector fed every answer (Report
	// and ReportQuota), which takes a deployment out while it cools down
	// after a 429's Retry-After or a spent rate limit; with several tiers,
	// a tier whose deployments are all out is skipped.
	Cooldown bool
	// Weights declares each deployment's rate limit (RPM) as its endpoint
	// weight, so that a policy gives a deployment a share of the traffic in
	// proportion to its quota. Deployments without a rate limit weigh 1.
	Weights bool
}

// rpmEndpoint is a deployment's endpoint that declares its rate limit as
// its weight (PoolRouting.Weights).
type rpmEndpoint struct {
	endpoint
	rpm float64
}

// Weight returns the deployment's requests per minute.
func (e *rpmEndpoint) Weight() float64 { return e.rpm }

// PoolScenario is a preset of tiers of deployments, a workload and the
// routings compared on it.
type PoolScenario struct {
	// Name is the -scenario name.
	Name string
	// Tiers are the groups of deployments, in order of preference.
	Tiers [][]Deployment
	// Workload is the traffic.
	Workload PoolWorkload
	// Routings are compared on the same requests and deployments.
	Routings []PoolRouting
	// MaxCooldown caps the cooldowns of the routings with Cooldown
	// (retry.EjectorConfig.MaxCooldown).
	MaxCooldown time.Duration
	// SLO is the objective of goodput.
	SLO SLO
}

// PoolResult is what one routing of a [PoolScenario] achieved, over one
// seed or pooled over several ([MergePoolResults]). GoodputRPS only reads
// it and may be called concurrently.
type PoolResult struct {
	// Routing is the routing's name; Cooldown its Cooldown.
	Routing  string
	Cooldown bool
	// Requests is the number of requests; Completed were served,
	// Refused got a 429 after every tier and attempt (or found every
	// tier cooling).
	Requests, Completed, Refused int
	// Offloaded counts the completed requests served by a deployment of a
	// tier after the first: spilled there, or sent there by a flat
	// routing.
	Offloaded int
	// Throttled counts the 429s the deployments answered.
	Throttled int
	// Spiked counts the completed requests whose service started during
	// a latency spike of their deployment.
	Spiked int
	// MetSLO counts the completed requests that met both objectives.
	MetSLO int
	// Seconds is the arrival window, summed over the seeds pooled.
	Seconds float64
	// TTFT, TPOT and E2E hold the completed requests' latencies in
	// milliseconds, sorted.
	TTFT, TPOT, E2E []float64
}

// GoodputRPS returns the requests per second that met the SLO.
func (r *PoolResult) GoodputRPS() float64 {
	if r.Seconds <= 0 {
		return 0
	}
	return float64(r.MetSLO) / r.Seconds
}

// MergePoolResults pools results of one routing under several seeds into
// one, as if they were one longer run.
func MergePoolResults(rs ...*PoolResult) (*PoolResult, error) {
	if len(rs) == 0 {
		return nil, errors.New("sim: no pool results to merge")
	}
	m := &PoolResult{Routing: rs[0].Routing, Cooldown: rs[0].Cooldown}
	var ttft, tpot, e2e [][]float64
	for _, r := range rs {
		if r.Routing != m.Routing || r.Cooldown != m.Cooldown {
			return nil, fmt.Errorf("sim: merging pool results of %q and %q", m.Routing, r.Routing)
		}
		m.Requests += r.Requests
		m.Completed += r.Completed
		m.Refused += r.Refused
		m.Offloaded += r.Offloaded
		m.Throttled += r.Throttled
		m.Spiked += r.Spiked
		m.MetSLO += r.MetSLO
		m.Seconds += r.Seconds
		ttft, tpot, e2e = append(ttft, r.TTFT), append(tpot, r.TPOT), append(e2e, r.E2E)
	}
	m.TTFT, m.TPOT, m.E2E = sortedConcat(ttft), sortedConcat(tpot), sortedConcat(e2e)
	return m, nil
}

// poolReq is one request of a pool workload.
type poolReq struct {
	at             time.Duration
	prompt, output int
}

// generate draws the requests of w for seed.
func (w *PoolWorkload) generate(seed uint64) []poolReq {
	rng := rand.New(rand.NewPCG(seed, 0x9001))
	rate := func(t time.Duration) (float64, time.Duration) {
		// The rate at t and the end of the window it holds in.
		end := w.Duration
		for _, b := range w.Bursts {
			if t >= b.From && t < b.To {
				return b.Rate, b.To
			}
			if b.From > t && b.From < end {
				end = b.From
			}
		}
		return w.Rate, end
	}
	logn := func(median, sigma, lo, hi float64) int {
		return int(math.Round(min(max(median*math.Exp(sigma*rng.NormFloat64()), lo), hi)))
	}
	var reqs []poolReq
	for t := time.Duration(0); t < w.Duration; {
		r, end := rate(t)
		next := t + time.Duration(rng.ExpFloat64()/r*float64(time.Second))
		if next >= end {
			t = end // memoryless: draw afresh at the rate of the next window
			continue
		}
		t = next
		reqs = append(reqs, poolReq{
			at:     t,
			prompt: logn(w.PromptMedian, w.PromptSigma, 64, 16384),
			output: logn(w.OutputMedian, w.OutputSigma, 1, 4096),
		})
	}
	return reqs
}

// Event kinds of a pool run.
const (
	pvArrive uint8 = iota // request idx arrives
	pvRetry               // request idx makes its next attempt
	pvFirst               // call idx streams its first token
	pvDone                // call idx ends
)

// poolCall is one accepted attempt.
type poolCall struct {
	req    int
	dep    *depState
	pick   llmlb.Pick
	hdr    http.Header
	spiked bool
}

// poolReqState is a request during a run.
type poolReqState struct {
	tier     int      // index in the run's tiers
	attempts int      // in this tier
	tried    []string // deployments tried in this tier's round
	retries  int      // waits so far, for the back-off
	first    time.Duration
}

// poolTier is one tier of a routing during a run.
type poolTier struct {
	bal  *llmlb.Balancer
	ej   *retry.Ejector // nil without Cooldown
	size int
	last bool // no tier follows: retries honour the pushback
}

// poolRun is one routing of a scenario under one seed.
type poolRun struct {
	sc    *PoolScenario
	reqs  []poolReq
	st    []poolReqState
	deps  map[string]*depState
	tiers []*poolTier
	calls []poolCall
	q     eventQueue
	seq   uint64
	now   time.Duration
	rng   *rand.Rand // back-off jitter
	res   *PoolResult
}

type poolClock struct{ now *time.Duration }

func (c poolClock) Now() time.Time { return epoch.Add(*c.now) }

func (r *poolRun) push(at time.Duration, kind uint8, idx int) {
	r.seq++
	r.q.push(event{at: at, seq: r.seq, kind: kind, idx: idx})
}

// poolPolicy returns the policy of a name; headroom is the quota the
// tier's answers reported, for peak-ewma-quota.
func poolPolicy(name string, headroom func(string) (float64, bool)) (llmlb.Policy, error) {
	switch name {
	case "round-robin":
		return llmlb.RoundRobin(), nil
	case "random":
		return llmlb.Random(), nil
	case "least-outstanding":
		return llmlb.LeastOutstanding(), nil
	case "peak-ewma":
		return llmlb.PeakEWMA(llmlb.PeakEWMAConfig{})
	case "peak-ewma-quota":
		return llmlb.PeakEWMA(llmlb.PeakEWMAConfig{Headroom: headroom})
	}
	return nil, fmt.Errorf("%w: pool policy %q", ErrUnknownPolicy, name)
}

// newPoolRun sets up routing rt of sc for seed over reqs.
func newPoolRun(sc *PoolScenario, rt PoolRouting, seed uint64, reqs []poolReq) (*poolRun, error) {
	r := &poolRun{
		sc: sc, reqs: reqs,
		st:   make([]poolReqState, len(reqs)),
		deps: make(map[string]*depState),
		rng:  rand.New(rand.NewPCG(seed, 0x9004)),
		res:  &PoolResult{Routing: rt.Name, Cooldown: rt.Cooldown, Requests: len(reqs), Seconds: sc.Workload.Duration.Seconds()},
	}
	if len(rt.Policies) == 0 || len(rt.Policies) > len(sc.Tiers) || rt.Flat && len(rt.Policies) != 1 {
		return nil, fmt.Errorf("%w: routing %q has %d policies for %d tiers", ErrInvalidConfig, rt.Name, len(rt.Policies), len(sc.Tiers))
	}
	spikeRng := rand.New(rand.NewPCG(seed, 0x9002))
	horizon := sc.Workload.Duration + time.Hour
	for t := range sc.Tiers {
		for i := range sc.Tiers[t] {
			d := &sc.Tiers[t][i]
			if d.Name == "" || r.deps[d.Name] != nil || d.Concurrency < 1 {
				return nil, fmt.Errorf("%w: deployment %q: a unique name and a concurrency are required", ErrInvalidConfig, d.Name)
			}
			ds := &depState{cfg: d, tier: t, spikes: drawSpikes(d, spikeRng, horizon)}
			ds.tokens = ds.burst()
			r.deps[d.Name] = ds
		}
	}
	groups := sc.Tiers[:len(rt.Policies)]
	if rt.Flat {
		groups = [][]Deployment{slices.Concat(sc.Tiers...)}
	}
	clock := poolClock{&r.now}
	for t, g := range groups {
		pt := &poolTier{size: len(g), last: t == len(groups)-1}
		pol, err := poolPolicy(rt.Policies[t], func(key string) (float64, bool) {
			if pt.ej == nil {
				return 0, false
			}
			return pt.ej.Headroom(key)
		})
		if err != nil {
			return nil, err
		}
		bal, err := llmlb.New(pol, llmlb.WithClock(clock), llmlb.WithRand(rand.NewPCG(seed, 0x9003+uint64(t))))
		if err != nil {
			return nil, err
		}
		eps := make([]llmlb.Endpoint, len(g))
		for i := range g {
			eps[i] = &endpoint{key: g[i].Name, idx: i}
			if rt.Weights && g[i].RPM > 0 {
				eps[i] = &rpmEndpoint{endpoint{key: g[i].Name, idx: i}, g[i].RPM}
			}
		}
		if err := bal.Update(eps); err != nil {
			return nil, err
		}
		pt.bal = bal
		if rt.Cooldown {
			if pt.ej, err = retry.NewEjector(bal, retry.EjectorConfig{MaxCooldown: sc.MaxCooldown, Clock: clock}); err != nil {
				return nil, err
			}
		}
		r.tiers = append(r.tiers, pt)
	}
	return r, nil
}

// ready reports whether tier t may take a request: with several tiers, not
// while every one of its deployments is out (package spill's rule for a
// gateway's tier).
func (r *poolRun) ready(t int) bool {
	tr := r.tiers[t]
	if len(r.tiers) == 1 || tr.ej == nil {
		return true
	}
	n, _ := tr.ej.Out()
	return n < tr.size
}

// nextReady returns the first tier from t on that is ready, or -1.
func (r *poolRun) nextReady(t int) int {
	for ; t < len(r.tiers); t++ {
		if r.ready(t) {
			return t
		}
	}
	return -1
}

func (r *poolRun) run(ctx context.Context) (*PoolResult, error) {
	for i := range r.reqs {
		r.push(r.reqs[i].at, pvArrive, i)
	}
	done := doneOf(ctx)
	for n := 0; len(r.q) > 0; n++ {
		if n%cancelEvery == 0 && isDone(done) {
			return nil, ctx.Err()
		}
		ev := r.q.pop()
		r.now = ev.at
		switch ev.kind {
		case pvArrive:
			t := r.nextReady(0)
			if t < 0 {
				r.res.Refused++
				continue
			}
			r.st[ev.idx].tier = t
			if err := r.attempt(ev.idx); err != nil {
				return nil, err
			}
		case pvRetry:
			if err := r.attempt(ev.idx); err != nil {
				return nil, err
			}
		case pvFirst:
			c := &r.calls[ev.idx]
			c.pick.FirstToken()
			r.st[c.req].first = r.now
			if ej := r.tiers[r.st[c.req].tier].ej; ej != nil {
				ej.ReportQuota(c.dep.cfg.Name, c.hdr)
			}
		case pvDone:
			r.finish(ev.idx)
		}
	}
	res := r.res
	slices.Sort(res.TTFT)
	slices.Sort(res.TPOT)
	slices.Sort(res.E2E)
	return res, nil
}

// attempt sends request i to its tier once more.
func (r *poolRun) attempt(i int) error {
	s := &r.st[i]
	q := &r.reqs[i]
	tr := r.tiers[s.tier]
	p, err := tr.bal.Pick(context.Background(), &llmlb.Request{PromptTokens: q.prompt, Exclude: s.tried})
	if errors.Is(err, llmlb.ErrNoCandidates) {
		// Every deployment was tried: a new round, as retry.Loop does.
		s.tried = s.tried[:0]
		p, err = tr.bal.Pick(context.Background(), &llmlb.Request{PromptTokens: q.prompt})
	}
	if err != nil {
		return err
	}
	key := p.Endpoint().Key()
	d := r.deps[key]
	s.attempts++
	ok, h := d.admit(r.now)
	if ok {
		id := len(r.calls)
		r.calls = append(r.calls, poolCall{req: i, dep: d, pick: p, hdr: h})
		if d.running < d.cfg.Concurrency {
			r.start(id)
		} else {
			d.queue = append(d.queue, id)
		}
		return nil
	}
	r.res.Throttled++
	se := &retry.StatusError{Code: http.StatusTooManyRequests, Header: h}
	p.Done(se)
	if tr.ej != nil {
		tr.ej.Report(key, se)
		tr.ej.ReportQuota(key, h)
	}
	s.tried = append(s.tried, key)
	if s.attempts < 3 {
		s.retries++
		wait := time.Duration(r.rng.Float64() * float64(25*time.Millisecond<<(s.retries-1)))
		if tr.last {
			if pb := retry.FromHeader(h, epoch.Add(r.now), 0); pb.Kind == retry.RetryLater {
				wait = max(wait, pb.Delay)
			}
		}
		r.push(r.now+wait, pvRetry, i)
		return nil
	}
	// The tier's attempts are spent: spill to the next tier ready, if any.
	next := r.nextReady(s.tier + 1)
	if next < 0 {
		r.res.Refused++
		return nil
	}
	s.tier, s.attempts, s.tried = next, 0, s.tried[:0]
	return r.attempt(i)
}

// start begins serving call id.
func (r *poolRun) start(id int) {
	c := &r.calls[id]
	d, q := c.dep, &r.reqs[c.req]
	d.running++
	f := 1.0
	if d.spiking(r.now) {
		f, c.spiked = d.cfg.SpikeFactor, true
	}
	ttft := time.Duration(f * float64(d.cfg.TTFT+time.Duration(q.prompt)*d.cfg.PerPromptToken))
	decode := time.Duration(f * float64(time.Duration(q.output-1)*d.cfg.PerOutputToken))
	r.push(r.now+ttft, pvFirst, id)
	r.push(r.now+ttft+decode, pvDone, id)
}

// finish ends call id and starts the next one waiting at its deployment.
func (r *poolRun) finish(id int) {
	c := &r.calls[id]
	s, q := &r.st[c.req], &r.reqs[c.req]
	c.pick.Generated(q.output)
	c.pick.Done(nil)
	if ej := r.tiers[s.tier].ej; ej != nil {
		ej.Report(c.dep.cfg.Name, nil)
	}
	res := r.res
	res.Completed++
	if c.dep.tier > 0 {
		res.Offloaded++
	}
	if c.spiked {
		res.Spiked++
	}
	ttft, e2e := s.first-q.at, r.now-q.at
	tpot := time.Duration(0)
	if q.output > 1 {
		tpot = (r.now - s.first) / time.Duration(q.output-1)
	}
	res.TTFT = append(res.TTFT, ms(ttft))
	res.TPOT = append(res.TPOT, ms(tpot))
	res.E2E = append(res.E2E, ms(e2e))
	if ttft <= r.sc.SLO.TTFT && tpot <= r.sc.SLO.TPOT {
		res.MetSLO++
	}
	d := c.dep
	d.running--
	c.pick = llmlb.Pick{}
	if len(d.queue) > 0 {
		next := d.queue[0]
		d.queue = d.queue[1:]
		r.start(next)
	}
}

// RunPool runs every routing of sc on the requests and deployments of
// seed, and returns a result per routing, in order.
func RunPool(ctx context.Context, sc *PoolScenario, seed uint64) ([]*PoolResult, error) {
	reqs := sc.Workload.generate(seed)
	out := make([]*PoolResult, 0, len(sc.Routings))
	for _, rt := range sc.Routings {
		run, err := newPoolRun(sc, rt, seed, reqs)
		if err != nil {
			return nil, err
		}
		res, err := run.run(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}
