package sim

import (
	"context"
	"fmt"
	"github.com/llmlb/llmlb/internal/model"
	"math/rand/v2"
	"time"

	"github.com/llmlb/llmlb"
)

// A disaggregated run (a policy with [PolicySpec].Decode) splits the
// replicas into prefill workers, 0 to [Config].Prefill-1, and decode
// workers, the rest, as vLLM, SGLang and NVIDIA Dynamo deploy prefill/decode
// disaggregation. Each router holds a Balancer per pool, composed by
// [llmlb.Disaggregated], whose Pick names a decode worker and, unless the
// request prefills locally, a prefill worker. A request then goes through
// three stages:
//
//  1. The prefill worker runs the prompt as a sequence of one output token,
//     as a prefill instance runs a request with max_tokens 1, matching and
//     filling its own prefix cache; the token is not the client's. Its
//     answer calls FirstToken on the request's [llmlb.DisaggPick].Prefill.
//  2. When it ends, the request is submitted to the decode worker, which
//     matches its own prefix cache, takes KV blocks for the whole prompt
//     when its scheduler admits it, and pulls the blocks it does not hold
//     (vLLM's NIXL connector: the decode side computes its local prefix
//     hits and reads only the missing blocks from the prefill worker). The
//     pull takes [KVTransfer.Time] of the pulled tokens, during which the
//     decode worker runs its other sequences; the received blocks then
//     enter its prefix cache. The request's [llmlb.DisaggPick.Prefilled]
//     is called then.
//  3. The request joins the decode batch; its first token, which TTFT
//     measures, comes at the end of its first decode iteration.
//
// A request that prefills locally runs on its decode worker as on a
// co-located replica. The prefill worker is released when the KV arrives
// ([llmlb.DisaggPick.Prefilled]) and the decode worker when the request
// ends. The prefill worker frees its KV blocks when its prefill ends, not
// when the decode worker has read them, as vLLM does; its prompt blocks stay
// in its prefix cache, so the difference is only in memory pressure, which
// the prefill workers of the scenarios do not feel.

// KV transfer defaults, for an 8B model such as Llama 3.1 8B: 32 layers,
// 8 KV heads of 128 dimensions, keys and values in bf16, 32*8*128*2*2 bytes =
// 128 KiB of KV per token.
const (
	// DefaultTransferPerToken is [KVTransfer].PerToken when 0: 128 KiB
	// per token over one 400 Gb/s RDMA NIC (50 GB/s), 2.62 us a token,
	// 10.5 ms for a 4k-token prompt. It is line rate; a deployment whose
	// transfers reach less of it, or that moves a larger model's KV,
	// sets a larger figure.
	DefaultTransferPerToken = 2621 * time.Nanosecond
	// DefaultTransferLatency is [KVTransfer].Latency when 0: the fixed
	// cost of one transfer, which the prefill worker's notification, the
	// decode worker's read request and completion notice (RDMA round trips
	// of microseconds each) and the two engines noticing them between
	// scheduler steps add up to; of the order of a millisecond.
	DefaultTransferLatency = time.Millisecond
	// PDLocalPrefillTokens is the LocalPrefillTokens of pd-default-local:
	// Dynamo's default effective-input-length threshold for conditional
	// disaggregation (DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD in
	// lib/kv-router/src/conditional_disagg.rs of ai-dynamo/dynamo).
	PDLocalPrefillTokens = 2048
)

// KVTransfer is the model of moving a prompt's KV from a prefill worker to
// a decode worker: Latency plus PerToken per token pulled. The zero value is
// the default. Time only reads it and may be called concurrently.
type KVTransfer struct {
	// PerToken is the transfer time of one token's KV. 0 means
	// [DefaultTransferPerToken].
	PerToken time.Duration
	// Latency is the fixed time of one transfer. 0 means
	// [DefaultTransferLatency].
	Latency time.Duration
}

// Time returns the time to pull the KV of tokens prompt tokens, defaults
// filled in.
func (t KVTransfer) Time(tokens int) time.Duration {
	per, lat := t.PerToken, t.Latency
	if per == 0 {
		per = DefaultTransferPerToken
	}
	if lat == 0 {
		lat = DefaultTransferLatency
	}
	return lat + time.Duration(tokens)*per
}

func (t KVTransfer) validate() error {
	if t.PerToken < 0 || t.PerToken > time.Millisecond || t.Latency < 0 || t.Latency > time.Minute {
		return fmt.Errorf("%w: KV transfer %v per token and %v per transfer, want 0 to 1ms and 0 to 1m", ErrInvalidConfig, t.PerToken, t.Latency)
	}
	return nil
}

// pdState is the disaggregated part of a request's progress.
type pdState struct {
	pick    llmlb.DisaggPick
	pre     Sequence // the prefill on the prefill replica; its ID is -1-i for request i
	prefill int      // the prefill replica; -1 when the request prefills on its decode replica
	pulled  int      // prompt tokens whose KV the decode replica pulled
}

// checkDisagg validates and completes the configuration of a disaggregated
// run.
func (r *runner) checkDisagg() error {
	c := &r.cfg
	switch {
	case c.Replicas < 2:
		return fmt.Errorf("%w: a disaggregated run needs at least 2 replicas, not %d", ErrInvalidConfig, c.Replicas)
	case c.Share > 0:
		return fmt.Errorf("%w: a disaggregated run does not share routing state", ErrInvalidConfig)
	}
	if c.Prefill == 0 {
		c.Prefill = max(c.Replicas/4, 1)
	}
	return nil
}

// checkDisaggDone checks, at the end of a disaggregated run, that both
// pools' Balancers of every router hold no work: every pick was finished.
func (r *runner) checkDisaggDone() error {
	for k, rt := range r.routers {
		if rt.dis == nil {
			continue
		}
		for _, bal := range []*llmlb.Balancer{rt.pre, rt.bal} {
			for _, st := range bal.Stats() {
				if st.Outstanding != 0 || st.Queued != 0 || st.PrefillTokens != 0 || st.DecodeTokens != 0 {
					return fmt.Errorf("sim: internal error: router %d ended with work charged to %s: %+v", k, st.Key, st)
				}
			}
		}
	}
	return nil
}

// scrapeOffset is the time of router k's first scrape.
func (r *runner) scrapeOffset(k int) time.Duration {
	if !r.cfg.Stagger {
		return 0
	}
	return time.Duration(k) * r.cfg.Scrape / time.Duration(r.cfg.Routers)
}

// disaggRouter gives rt, router k, the two Balancers of spec over the
// prefill and decode pools of eps and their composition.
func (r *runner) disaggRouter(rt *router, k int, spec PolicySpec, eps []llmlb.Endpoint, blockTokens int, longShare float64) error {
	cfg := &r.cfg
	pool := func(lo, hi int, prefill bool, newPolicy func(*PolicyEnv) (llmlb.Policy, error), stream uint64) (*llmlb.Balancer, error) {
		env := &PolicyEnv{
			Replicas:    hi - lo,
			BlockTokens: blockTokens,
			LongShare:   longShare,
			Router:      k,
			Slots:       r.reps[0].Engine().MaxRunning,
			SLO:         r.cfg.SLO,
			Stale:       func(m int) llmlb.Load { return rt.snap[lo+m] },
			run:         r,
			lo:          lo,
			prefill:     prefill,
		}
		pol, err := newPolicy(env)
		if err != nil {
			return nil, fmt.Errorf("sim: policy %s: %w", spec.Name, err)
		}
		opts := []llmlb.Option{
			llmlb.WithClock(simClock{r}),
			llmlb.WithRand(rand.NewPCG(cfg.Seed, stream)),
			llmlb.WithSignal(rt, cfg.MaxSignalAge),
		}
		if cfg.Outputs == OutputsPredicted && !prefill {
			opts = append(opts, llmlb.WithOutputPrediction(cfg.Prediction))
		}
		bal, err := llmlb.New(pol, opts...)
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		if err := bal.Update(eps[lo:hi]); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		return bal, nil
	}
	p := cfg.Prefill
	pre, err := pool(0, p, true, spec.New, uint64(k)+1)
	if err != nil {
		return err
	}
	dec, err := pool(p, cfg.Replicas, false, spec.Decode, uint64(k)+1|1<<32)
	if err != nil {
		return err
	}
	dis, err := llmlb.NewDisaggregated(pre, dec, spec.Disagg)
	if err != nil {
		return fmt.Errorf("sim: policy %s: %w", spec.Name, err)
	}
	rt.bal, rt.pre, rt.dis = dec, pre, dis
	return nil
}

// routeDisagg has router k pick a decode replica and, unless request i
// prefills there, a prefill replica, and sends it to the replica that
// computes its prompt.
func (r *runner) routeDisagg(i, k int, lr *llmlb.Request) error {
	req := &r.reqs[i]
	s := &r.st[i]
	pick, err := r.routers[k].dis.Pick(context.Background(), lr)
	if err != nil {
		return fmt.Errorf("sim: pick for request %d: %w", i, err)
	}
	dec := r.reps[replicaOf(pick.Decode.Endpoint())]
	s.pd = &pdState{pick: pick, prefill: -1}
	s.replica, s.router = dec.idx, k
	dec.assigned++
	dec.outstanding++
	if r.cfg.onPick != nil {
		r.cfg.onPick(r.now, dec.idx)
	}
	r.observeDispatch(dec.idx)
	fits := dec.Fits(&s.Sequence)
	var pre *replica
	if !pick.Local() {
		pre = r.reps[replicaOf(pick.Prefill.Endpoint())]
		s.pd.prefill = pre.idx
		s.pd.pre = Sequence{
			ID:           -1 - i,
			PromptTokens: req.PromptTokens,
			OutputTokens: 1,
			Prefix:       req.Prefix,
			BlockTokens:  req.BlockTokens,
			Adapter:      req.Adapter,
		}
		pre.assigned++
		pre.outstanding++
		fits = fits && pre.Fits(&s.pd.pre)
	}
	if !fits {
		s.Reject()
		pick.Done(fmt.Errorf("sim: request %d does not fit in the KV cache", i))
		if pre != nil {
			r.releasePool(s, true, pre.idx)
			pre.outstanding--
		}
		r.release(s)
		r.admissionEnd(s)
		dec.outstanding--
		r.ended++
		return nil
	}
	if r.cfg.Delay > 0 {
		r.schedule(r.now+r.cfg.Delay, evDeliver, i)
		return nil
	}
	if pre != nil {
		return pre.enqueueSeq(&s.pd.pre, r.now)
	}
	return dec.enqueue(s, r.now)
}

// prefilled is called when the prefill of request i ends on its prefill
// replica: the request goes to its decode replica, to wait there for its
// KV.
func (r *runner) prefilled(i int) {
	s := &r.st[i]
	// The prefill worker answered with its token: its prompt no longer
	// counts as queued prefill there, though the request holds the worker
	// until its KV has been read (Prefilled).
	s.pd.pick.Prefill.FirstToken()
	s.SetRemote()
	if err := r.reps[s.replica].enqueue(s, r.now); err != nil {
		// routeDisagg checked that the request fits.
		panic(fmt.Sprintf("sim: internal error: request %d refused by its decode replica: %v", i, err))
	}
}

// transfer starts the KV transfers of the remote sequences rep admitted.
func (r *runner) transfer(rep *replica) {
	for _, q := range rep.Started() {
		s := &r.st[q.ID]
		n := q.Target() - q.Computed()
		d := r.cfg.Transfer.Time(n)
		s.pd.pulled = n
		if r.cfg.onTransfer != nil {
			r.cfg.onTransfer(q.ID, n, d)
		}
		r.schedule(r.now+d, evReceive, q.ID)
	}
	rep.ClearStarted()
}

// receive is called when the KV of request i reaches its decode replica.
func (r *runner) receive(i int) {
	s := &r.st[i]
	rep := r.reps[s.replica]
	rep.Receive(&s.Sequence)
	s.pd.pick.Prefilled()
	r.releasePool(s, true, s.pd.prefill)
	rep.kick(r.now)
}

// finishDisagg is replica.finish for a token of a disaggregated request.
func (r *replica) finishDisagg(s *reqState, now time.Duration) {
	if s.Generated() == 1 {
		s.firstToken = now
		s.pd.pick.FirstToken()
	}
	if s.State() == model.StateDone {
		s.finished = now
		r.outstanding--
		if r.run.cfg.Outputs != OutputsUntold {
			s.pd.pick.Decode.Generated(s.Generated())
		}
		s.pd.pick.Done(nil)
		r.run.finished(s)
	}
}

// newPDDefault is llmlb.Default for one pool of a disaggregated run, as
// the default policy runs it.
func newPDDefault(env *PolicyEnv) (llmlb.Policy, error) {
	return newEventsDefault(env, llmlb.DefaultConfig{Slots: env.Slots})
}

// newDynamoPrefill is the policy of Dynamo's prefill router under
// disaggregation: its KV cost on the prefill pool, cache state from the
// replicas' KV events, without the decode term. The prefill router turns
// router_track_active_blocks off, prefill workers not decoding
// (ai-dynamo/dynamo, docs/components/router, "Automatic Prefill Router
// Activation"); the configuration then yields no active sequence hashes
// (KvRouterConfig::compute_seq_hashes_for_tracking in
// lib/kv-router/src/scheduling/config.rs).
func newDynamoPrefill(env *PolicyEnv) (llmlb.Policy, error) {
	ix, err := newEventIndex(env)
	if err != nil {
		return nil, err
	}
	cfg := llmlb.DynamoKVCostConfig()
	cfg.Index, cfg.NoDecode = ix, true
	return llmlb.KVCost(cfg)
}

// newDynamoDecode is the policy of Dynamo's decode router under
// disaggregation: its KV cost with the overlap credit at 0, so that only
// the decode load counts. The router configuration Dynamo passes with
// every decode request (build_decode_router_override in
// lib/llm/src/kv_router/prefill_router of ai-dynamo/dynamo) sets
// overlap_score_credit to 0 (overlap_score_weight before the weight was
// split), assume_kv_reuse off and track_prefill_tokens off; it relaxes
// this only for a request it keeps local under conditional disaggregation.
// Without KV reuse every active request's prompt blocks count in full
// (random tracking hashes, compute_seq_hashes_for_tracking), as
// KVCostConfig.Active nil counts them.
func newDynamoDecode(env *PolicyEnv) (llmlb.Policy, error) {
	ix, err := newEventIndex(env)
	if err != nil {
		return nil, err
	}
	cfg := llmlb.DynamoKVCostConfig()
	cfg.Index, cfg.OverlapScoreWeight = ix, 0
	return llmlb.KVCost(cfg)
}
