package sim

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/stamped"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/share"
)

// Event kinds, in no particular order: ties in time are broken by the order
// in which events were scheduled.
const (
	evArrival uint8 = iota
	evDeliver
	evIteration
	evScrape
	evSample
	evShareBatch  // router idx builds a batch for its peers
	evShareArrive // batch idx reaches the peers of its router
	evAdmit       // request idx, which waited for admission, is admitted
	evReceive     // the KV of request idx reached its decode replica
)

type event struct {
	at   time.Duration
	seq  uint64
	kind uint8
	idx  int
}

func (e *event) before(f *event) bool {
	return e.at < f.at || e.at == f.at && e.seq < f.seq
}

// eventQueue is a binary min-heap of events ordered by (time, sequence). It
// is written out rather than built on container/heap so that pushing an
// event does not box it in an interface and allocate.
type eventQueue []event

func (q *eventQueue) push(e event) {
	*q = append(*q, e)
	h := *q
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(&h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *eventQueue) pop() event {
	h := *q
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// epoch is the wall-clock instant of simulated time 0; any non-zero instant
// works, since llmlb ignores observations with a zero At.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type simClock struct{ r *runner }

func (c simClock) Now() time.Time { return epoch.Add(c.r.now) }

type endpoint struct {
	key string
	idx int
}

func (e *endpoint) Key() string { return e.key }

// router is one Balancer with its own view of the replicas.
type router struct {
	bal   *llmlb.Balancer
	snap  []llmlb.Load // last scrape, by replica
	group *share.Group // with Config.Share: the router's signal, over its scrapes

	// With a disaggregated policy, bal is the decode pool's Balancer and
	// pre the prefill pool's, which dis composes.
	pre *llmlb.Balancer
	dis *llmlb.Disaggregated
}

// shareBatch is a batch of a router's Group on its way to the peers.
type shareBatch struct {
	from int
	data []byte
}

// Load implements llmlb.Signal with the router's last scrape.
func (rt *router) Load(key string) (llmlb.Load, bool) {
	i, ok := replicaIndex(key, len(rt.snap))
	if !ok {
		return llmlb.Load{}, false
	}
	return rt.snap[i], true
}

// Loader returns a function that returns the router's last scrape of the
// replica key, for the balancer to call instead of Load. A scrape writes
// into the same storage, but only between picks: a run is one goroutine.
func (rt *router) Loader(_ stamped.Token, key string) func() *llmlb.Load {
	i, ok := replicaIndex(key, len(rt.snap))
	if !ok {
		return nil
	}
	return func() *llmlb.Load { return &rt.snap[i] }
}

// runner is one simulation of one policy.
type runner struct {
	cfg     Config
	reqs    []Request
	st      []reqState
	reps    []*replica
	routers []*router
	q       eventQueue
	seq     uint64
	now     time.Duration
	rng     *rand.Rand
	current *reqState                // the request being picked, for full-info
	kvSubs  []kvSub                  // indexes fed the replicas' KV events
	events  map[[2]int]*prefix.Index // read-only events indexes shared by the routers, by pool
	endSubs [][]endSub               // per router: told when a request it routed ends
	batches map[int]shareBatch       // with Config.Share: batches in transit, by id
	batchID int                      // id of the last batch built
	adm     *admission               // nil without admission control
	disagg  bool                     // the policy is disaggregated: requests have a pdState

	nextArrival int
	ended       int // requests done or rejected
	lastArrival time.Duration
	series      time.Duration

	// herding metrics
	skewSum   float64
	skewN     int
	skewPeak  int
	window    int64
	winCount  int
	winFirst  int
	winSame   bool
	windows   int
	pileups   int
	samples   []Sample
	lastEvent time.Duration
}

func (r *runner) schedule(at time.Duration, kind uint8, idx int) {
	r.seq++
	r.q.push(event{at: at, seq: r.seq, kind: kind, idx: idx})
}

// Simulate replays reqs against a cluster described by cfg whose routers use
// the named policy (see [Policies]), and returns its measurements. It is
// deterministic for cfg.Seed. ctx cancels a long run.
func Simulate(ctx context.Context, cfg Config, reqs []Request, policy string) (*Result, error) {
	spec, ok := LookupPolicy(policy)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, policy)
	}
	return simulate(ctx, cfg, reqs, spec)
}

func simulate(ctx context.Context, cfg Config, reqs []Request, spec PolicySpec) (*Result, error) {
	cfg.applySignal(spec)
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrInvalidWorkload)
	}
	if err := validateRequests(reqs, cfg.Engine.BlockSize); err != nil {
		return nil, err
	}
	r := &runner{
		cfg:  cfg,
		reqs: reqs,
		st:   make([]reqState, len(reqs)),
		rng:  rand.New(rand.NewPCG(cfg.Seed, 0x5711)),
	}
	var err error
	if r.adm, err = newAdmission(r); err != nil {
		return nil, err
	}
	r.lastArrival = reqs[len(reqs)-1].Arrival
	r.series = cfg.Series
	if r.series == 0 {
		r.series = max(r.lastArrival/200, 10*time.Millisecond)
	}
	eps := make([]llmlb.Endpoint, cfg.Replicas)
	r.reps = make([]*replica, cfg.Replicas)
	for i := range r.reps {
		rep, err := NewReplica(r.cfg.Engine)
		if err != nil {
			return nil, err
		}
		// Without admission control, which charges every token to its
		// tenant, the runner acts only on a request's first and last
		// tokens (see replica.finish and finishDisagg).
		rep.SetQuietDecode(r.adm == nil)
		r.reps[i] = &replica{Replica: rep, idx: i, run: r}
		key := replicaKey(i)
		eps[i] = cfg.newEndpoint(key, i)
	}
	blockTokens := 0
	for i := range reqs {
		if len(reqs[i].Prefix) > 0 {
			blockTokens = reqs[i].BlockTokens
			break
		}
	}
	if blockTokens == 0 {
		blockTokens = cfg.Engine.BlockSize
	}
	var promptTokens, longTokens float64
	for i := range reqs {
		promptTokens += float64(reqs[i].PromptTokens)
		if reqs[i].PromptTokens >= SegregatedLongPrompt {
			longTokens += float64(reqs[i].PromptTokens)
		}
	}
	if spec.Decode != nil {
		if err := r.checkDisagg(); err != nil {
			return nil, err
		}
		r.disagg = true
	}
	for k := 0; k < cfg.Routers; k++ {
		rt := &router{snap: make([]llmlb.Load, cfg.Replicas)}
		if spec.Decode != nil {
			if err := r.disaggRouter(rt, k, spec, eps, blockTokens, longTokens/max(promptTokens, 1)); err != nil {
				return nil, err
			}
			r.routers = append(r.routers, rt)
			r.schedule(r.scrapeOffset(k), evScrape, k)
			continue
		}
		env := &PolicyEnv{
			Replicas:    cfg.Replicas,
			BlockTokens: blockTokens,
			LongShare:   longTokens / max(promptTokens, 1),
			Router:      k,
			Slots:       r.reps[0].Engine().MaxRunning,
			SLO:         r.cfg.SLO,
			Stale:       func(m int) llmlb.Load { return rt.snap[m] },
			run:         r,
		}
		pol, err := spec.New(env)
		if err != nil {
			return nil, fmt.Errorf("sim: policy %s: %w", spec.Name, err)
		}
		opts := []llmlb.Option{
			llmlb.WithClock(simClock{r}),
			llmlb.WithRand(rand.NewPCG(cfg.Seed, uint64(k)+1)),
		}
		if cfg.Outputs == OutputsPredicted {
			opts = append(opts, llmlb.WithOutputPrediction(cfg.Prediction))
		}
		if cfg.Share == 0 {
			opts = append(opts, llmlb.WithSignal(rt, cfg.MaxSignalAge))
		} else {
			rt.group, err = share.New(share.Config{
				ID:           "router-" + strconv.Itoa(k),
				Signal:       rt,
				MaxSignalAge: cfg.MaxSignalAge,
				Index:        env.decisions,
				Interval:     cfg.Share,
				MaxPeers:     cfg.Routers - 1, // every other router, however many
				MaxEndpoints: max(cfg.Replicas, share.DefaultMaxEndpoints),
				Clock:        simClock{r},
				Logger:       slog.New(slog.DiscardHandler),
			})
			if err != nil {
				return nil, fmt.Errorf("sim: %w", err)
			}
			opts = append(opts, llmlb.WithSignal(rt.group, cfg.MaxSignalAge), llmlb.WithObserver(rt.group.Observer(nil)))
			r.schedule(time.Duration(k)*cfg.Share/time.Duration(cfg.Routers), evShareBatch, k)
		}
		bal, err := llmlb.New(pol, opts...)
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		if err := bal.Update(eps); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		rt.bal = bal
		r.routers = append(r.routers, rt)
		var offset time.Duration
		if cfg.Stagger {
			offset = time.Duration(k) * cfg.Scrape / time.Duration(cfg.Routers)
		}
		r.schedule(offset, evScrape, k)
	}
	r.schedule(0, evSample, 0)
	r.window = -1
	r.schedule(reqs[0].Arrival, evArrival, 0)
	r.nextArrival = 1

	done := doneOf(ctx)
	for n := 0; len(r.q) > 0; n++ {
		if n%cancelEvery == 0 && isDone(done) {
			return nil, ctx.Err()
		}
		e := r.q.pop()
		r.now = e.at
		switch e.kind {
		case evArrival:
			if r.nextArrival < len(reqs) {
				r.schedule(reqs[r.nextArrival].Arrival, evArrival, r.nextArrival)
				r.nextArrival++
			}
			if err := r.arrive(e.idx); err != nil {
				return nil, err
			}
		case evDeliver:
			s := &r.st[e.idx]
			if s.pd != nil && s.pd.prefill >= 0 {
				if err := r.reps[s.pd.prefill].enqueueSeq(&s.pd.pre, r.now); err != nil {
					return nil, err
				}
				break
			}
			if err := r.reps[s.replica].enqueue(s, r.now); err != nil {
				return nil, err
			}
		case evIteration:
			r.reps[e.idx].finish(r.now)
		case evScrape:
			r.scrape(e.idx)
			if r.ended < len(reqs) {
				r.schedule(r.now+cfg.Scrape, evScrape, e.idx)
			}
		case evSample:
			r.sample()
			if r.ended < len(reqs) {
				r.schedule(r.now+r.series, evSample, 0)
			}
		case evShareBatch:
			r.shareBatch(e.idx)
			if r.ended < len(reqs) {
				r.schedule(r.now+cfg.Share, evShareBatch, e.idx)
			}
		case evShareArrive:
			if err := r.shareArrive(e.idx); err != nil {
				return nil, err
			}
		case evAdmit:
			if err := r.route(e.idx); err != nil {
				return nil, err
			}
		case evReceive:
			r.receive(e.idx)
		}
	}
	r.closeWindow()
	for _, rep := range r.reps {
		// Every request ended, so every block must be back.
		if err := rep.CheckIdle(); err != nil {
			return nil, fmt.Errorf("replica %d: %w", rep.idx, err)
		}
		if rep.outstanding != 0 {
			return nil, fmt.Errorf("sim: internal error: replica %d ended with %d requests outstanding", rep.idx, rep.outstanding)
		}
	}
	if err := r.checkAdmission(); err != nil {
		return nil, err
	}
	if err := r.checkDisaggDone(); err != nil {
		return nil, err
	}
	if cfg.onEnd != nil {
		cfg.onEnd(r)
	}
	return r.result(spec.Name), nil
}

// sharedEventIndex returns an index for the workload's block size that holds
// exactly what the KV events of the replicas of the policy's pool report,
// the same index for every router of the run. It is for a policy that only
// reads its events index, as llmlb.Default reads DefaultConfig.Events: such
// an index changes only with the events, which every router would apply
// alike to an index of its own, so one index fed once gives each router
// what its own would hold.
func (e *PolicyEnv) sharedEventIndex() (*prefix.Index, error) {
	r := e.run
	if r == nil {
		return newEventIndex(e)
	}
	pool := [2]int{e.lo, e.lo + e.Replicas}
	if ix := r.events[pool]; ix != nil {
		return ix, nil
	}
	ix, err := newEventIndex(e)
	if err != nil {
		return nil, err
	}
	if r.events == nil {
		r.events = make(map[[2]int]*prefix.Index)
	}
	r.events[pool] = ix
	return ix, nil
}

// arrive admits request i, or routes it at once without admission control.
func (r *runner) arrive(i int) error {
	req := &r.reqs[i]
	s := &r.st[i]
	s.req = req
	s.Sequence = Sequence{
		ID:           i,
		PromptTokens: req.PromptTokens,
		OutputTokens: req.OutputTokens,
		Prefix:       req.Prefix,
		BlockTokens:  req.BlockTokens,
		Reply:        req.Reply,
		Adapter:      req.Adapter,
	}
	if r.adm != nil {
		return r.admit(i)
	}
	return r.route(i)
}

// route has a router pick a replica for request i and sends it there.
func (r *runner) route(i int) error {
	req := &r.reqs[i]
	s := &r.st[i]
	k := i % len(r.routers)
	if r.cfg.RandomSplit {
		k = r.rng.IntN(len(r.routers))
	}
	lr := llmlb.Request{PromptTokens: req.PromptTokens, Prefix: req.Prefix, AffinityKey: req.Session, Tenant: req.Tenant, Feature: req.Route, Adapter: req.Adapter}
	if r.cfg.Outputs == OutputsTrue {
		lr.OutputTokens = req.OutputTokens
	}
	if r.routers[k].dis != nil {
		return r.routeDisagg(i, k, &lr)
	}
	r.current = s
	pick, err := r.routers[k].bal.Pick(context.Background(), &lr)
	r.current = nil
	if err != nil {
		return fmt.Errorf("sim: pick for request %d: %w", i, err)
	}
	rep := r.reps[replicaOf(pick.Endpoint())]
	s.pick = pick
	s.replica = rep.idx
	s.router = k
	rep.assigned++
	rep.outstanding++
	if r.cfg.onPick != nil {
		r.cfg.onPick(r.now, rep.idx)
	}
	r.observeDispatch(rep.idx)
	if !rep.Fits(&s.Sequence) {
		s.Reject()
		pick.Done(fmt.Errorf("sim: request %d does not fit in the KV cache", i))
		r.release(s)
		r.admissionEnd(s)
		rep.outstanding--
		r.ended++
		return nil
	}
	if r.cfg.Delay > 0 {
		r.schedule(r.now+r.cfg.Delay, evDeliver, i)
		return nil
	}
	return rep.enqueue(s, r.now)
}

// finished is called by a replica when a request completes.
func (r *runner) finished(s *reqState) {
	r.release(s)
	r.admissionEnd(s)
	r.ended++
	r.lastEvent = r.now
}

// scrape refreshes router k's view of every replica.
func (r *runner) scrape(k int) {
	rt := r.routers[k]
	at := epoch.Add(r.now)
	for i, rep := range r.reps {
		rt.snap[i] = llmlb.Load{
			At:        at,
			Running:   rep.NumRunning(),
			Waiting:   rep.NumWaiting() + rep.NumReceiving(),
			KVUsage:   rep.KVUsage(),
			KVBlocks:  rep.KVTotal(),
			BlockSize: rep.Engine().BlockSize,
		}
		r.scrapeAdapters(&rt.snap[i], rep)
	}
}

// shareBatch has router k's Group build a batch, which reaches the other
// routers twice Config.Delay later: to the NATS server and on.
func (r *runner) shareBatch(k int) {
	if r.batches == nil {
		r.batches = make(map[int]shareBatch)
	}
	r.batchID++
	r.batches[r.batchID] = shareBatch{from: k, data: r.routers[k].group.AppendBatch(nil)}
	r.schedule(r.now+2*r.cfg.Delay, evShareArrive, r.batchID)
}

// shareArrive delivers batch id to every router but its sender.
func (r *runner) shareArrive(id int) error {
	b := r.batches[id]
	delete(r.batches, id)
	for k, rt := range r.routers {
		if k == b.from {
			continue
		}
		if err := rt.group.Receive(b.data); err != nil {
			return fmt.Errorf("sim: internal error: router %d refused a batch of router %d: %w", k, b.from, err)
		}
	}
	return nil
}

// observeDispatch updates the herding metrics after a dispatch to replica
// idx: the skew of outstanding requests across replicas, and whether every
// dispatch of the current scrape window went to one replica.
func (r *runner) observeDispatch(idx int) {
	lo, hi := r.reps[0].outstanding, r.reps[0].outstanding
	for _, rep := range r.reps[1:] {
		lo, hi = min(lo, rep.outstanding), max(hi, rep.outstanding)
	}
	r.skewSum += float64(hi - lo)
	r.skewN++
	r.skewPeak = max(r.skewPeak, hi-lo)

	w := int64(r.now / r.cfg.Scrape)
	if w != r.window {
		r.closeWindow()
		r.window, r.winCount, r.winFirst, r.winSame = w, 0, idx, true
	}
	r.winCount++
	r.winSame = r.winSame && idx == r.winFirst
}

func (r *runner) closeWindow() {
	if r.winCount >= 2 {
		r.windows++
		if r.winSame {
			r.pileups++
		}
	}
	r.winCount = 0
}

// maxSamples bounds the outstanding-request series of a run, so that its
// length follows the plot's resolution rather than the simulated span: a
// long drain, such as one request of many output tokens, would otherwise
// take a sample every interval until it ends.
const maxSamples = 1024

// sample records each replica's outstanding requests. Samples are taken at
// multiples of r.series; a full series keeps every other sample (those at
// multiples of twice the interval) and doubles the interval.
func (r *runner) sample() {
	if len(r.samples) == maxSamples {
		n := 0
		for i := 0; i < len(r.samples); i += 2 {
			r.samples[n] = r.samples[i]
			n++
		}
		clear(r.samples[n:])
		r.samples = r.samples[:n]
		r.series *= 2
	}
	s := Sample{At: r.now, Outstanding: make([]int, len(r.reps))}
	for i, rep := range r.reps {
		s.Outstanding[i] = rep.outstanding
	}
	r.samples = append(r.samples, s)
}

// replicaKey is the endpoint key of replica i.
func replicaKey(i int) string { return replicaPrefix + strconv.Itoa(i) }

const replicaPrefix = "replica-"

// replicaIndex returns the replica of key among n replicas, the inverse of
// replicaKey, or false if key is not the key of one of them.
func replicaIndex(key string, n int) (int, bool) {
	if len(key) <= len(replicaPrefix) || key[:len(replicaPrefix)] != replicaPrefix {
		return 0, false
	}
	d := key[len(replicaPrefix):]
	if len(d) > 1 && d[0] == '0' {
		return 0, false
	}
	i := 0
	for k := 0; k < len(d); k++ {
		c := d[k]
		if c < '0' || c > '9' || i >= n {
			return 0, false
		}
		i = i*10 + int(c-'0')
	}
	return i, i < n
}

// cancelEvery is the number of events an event loop runs between two checks
// of its context. Events of the heaviest runs, 1,024 routers sharing state
// every millisecond, average about half a millisecond, so a run stops within
// tens of milliseconds of being cancelled; and one check per cancelEvery
// events, a non-blocking receive, costs nothing measurable.
const cancelEvery = 64

// doneOf returns ctx's Done channel, or nil, never ready, for a nil ctx.
func doneOf(ctx context.Context) <-chan struct{} {
	if ctx == nil {
		return nil
	}
	return ctx.Done()
}

// isDone reports whether done is closed, without blocking. Unlike
// [context.Context.Err], it takes no lock.
func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}
