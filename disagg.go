package llmlb

import (
	"context"
	"errors"
	"math"
)

// DefaultLocalPrefillRatio is [DisaggConfig.LocalPrefillRatio] when it is 0:
// NVIDIA Dynamo's default effective-input-length ratio for conditional
// disaggregation (DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_RATIO_THRESHOLD in
// lib/kv-router/src/conditional_disagg.rs, 2026).
const DefaultLocalPrefillRatio = 0.7

// DisaggConfig configures [NewDisaggregated]. The zero value sends every
// request's prefill to the prefill pool.
type DisaggConfig struct {
	// LocalPrefillTokens enables conditional disaggregation. A request
	// whose prompt, net of the tokens its decode endpoint is expected to
	// hold, is shorter than LocalPrefillTokens and less than
	// LocalPrefillRatio of the whole prompt prefills on its decode
	// endpoint: for a mostly cached prompt, such as a conversation's next
	// turn, moving the KV costs more than computing the rest where it
	// decodes. This is Dynamo's "isl bounding" rule, whose default
	// threshold is 2048 tokens when it is enabled. And so that local
	// prefills do not crowd a decode batch, a decode endpoint takes one
	// only while the prompt tokens it has to prefill, this one's included,
	// stay under LocalPrefillTokens too (Dynamo gates its rule on the
	// decode worker's load as well, optionally). 0 disables the rule.
	//
	// The expected cached tokens are those the decode pool's policy
	// priced: with a policy that reads no prefix index (round robin,
	// LeastKV) nothing is expected cached, and only LocalPrefillRatio 1
	// lets the rule fire.
	LocalPrefillTokens int
	// LocalPrefillRatio is the second bound of the rule above, a fraction
	// in (0, 1]. 0 means [DefaultLocalPrefillRatio]. 1 removes the bound,
	// so that every short uncached prompt prefills locally, as Dynamo's
	// earlier rule did (max_local_prefill_length).
	LocalPrefillRatio float64
}

// Disaggregated picks, for each request, a decode endpoint and a prefill
// endpoint from two pools, for engines that run the two phases on
// different workers (vLLM and SGLang prefill/decode disaggregation, NVIDIA
// Dynamo). Each pool is an ordinary [Balancer] with its own policy: the
// prefill pool's should weigh prefix affinity against queued prefill (as
// [Default] does), the decode pool's KV capacity and batch. The decode
// pool's policy also prices the KV transfer: a decode endpoint that
// already holds the head of the prompt pulls only the rest, so its
// expected cached tokens make it cheaper, as they make a co-located
// endpoint cheaper to prefill on.
//
// The decode endpoint is picked first, then the prefill endpoint (unless
// the request prefills locally, see [DisaggConfig.LocalPrefillTokens]).
// When the prefill pool cannot give an endpoint (it has none, or the
// request excludes all of them), the request prefills on its decode
// endpoint rather than fail.
//
// A Disaggregated is safe for concurrent use. It holds no state of its own:
// the two Balancers account for everything, and their other users (such as
// membership updates) keep working on them directly. Each Balancer's
// [Observer] sees its own part: the prefill pool's first token is the end of
// the prefill, and the decode pool's observer sees the first token of a
// request prefilled remotely at its pick, marked
// [FirstTokenInfo].Transferred: the decode endpoint receives the prompt
// rather than computes it, so the balancer counts the request as streaming
// from then on, and so does an observer that follows the requests in
// flight (such as share.Group's), whose [DoneInfo].Streamed then agrees
// with the first tokens it saw; one that measures times to first token
// skips it (package telemetry does). The
// speeds [Default] learns follow the work instead: the prefill pool's
// learns each endpoint's time to first token and no decode speed (after its
// one token, a prefill request waits only for its KV to move), and the
// decode pool's learns the decode from the request's own first token
// ([DisaggPick.FirstToken]) on, and no time to first token.
type Disaggregated struct {
	prefill, decode *Balancer
	localTokens     int
	localRatio      float64
}

// NewDisaggregated returns the two-stage picker over a prefill and a decode
// Balancer, which must be distinct. Errors wrap [ErrInvalidPolicy].
func NewDisaggregated(prefill, decode *Balancer, cfg DisaggConfig) (*Disaggregated, error) {
	switch {
	case prefill == nil || decode == nil:
		return nil, policyErrorf("disaggregation needs a prefill and a decode balancer")
	case prefill == decode:
		return nil, policyErrorf("disaggregation needs two balancers, got one for both pools")
	case cfg.LocalPrefillTokens < 0:
		return nil, policyErrorf("local prefill tokens %d is negative", cfg.LocalPrefillTokens)
	case math.IsNaN(cfg.LocalPrefillRatio) || cfg.LocalPrefillRatio < 0 || cfg.LocalPrefillRatio > 1:
		return nil, policyErrorf("local prefill ratio %v is not in [0, 1]", cfg.LocalPrefillRatio)
	}
	ratio := cfg.LocalPrefillRatio
	if ratio == 0 {
		ratio = DefaultLocalPrefillRatio
	}
	return &Disaggregated{prefill: prefill, decode: decode, localTokens: cfg.LocalPrefillTokens, localRatio: ratio}, nil
}

// Pick picks the endpoints of one request. The decode pool sees the request
// as it is; the prefill pool sees it with its output capped at one token,
// the token a prefill worker computes. A request whose prompt length is
// unknown (PromptTokens 0, or a nil request) prefills on the prefill pool:
// the rule of [DisaggConfig].LocalPrefillTokens needs the length. On error,
// nothing stays charged to either pool, nor when a pool's policy or
// Observer function panics.
func (d *Disaggregated) Pick(ctx context.Context, r *Request) (DisaggPick, error) {
	dec, err := d.decode.Pick(ctx, r)
	if err != nil {
		return DisaggPick{}, err
	}
	if r == nil {
		r = &zeroRequest // only read
	}
	if d.local(r.PromptTokens, int(dec.cached), dec) {
		return DisaggPick{Decode: dec}, nil
	}
	// If the prefill pool's Pick or the decode pool's Observer.FirstToken
	// panics (or exits the goroutine), Pick never returns the handles, and
	// its caller could never release them: they are released before the
	// panic goes on, as a Balancer releases a pick whose Observer.Pick
	// panics.
	var pre Pick
	returned := false
	defer func() {
		if !returned {
			pre.Done(errPickPanicked)
			dec.Done(errPickPanicked)
		}
	}()
	pr := *r
	pr.MaxTokens, pr.OutputTokens, pr.Choices = 1, 1, 1 // one prefill, one token
	pre, err = d.prefill.Pick(ctx, &pr)
	switch {
	case errors.Is(err, ErrNoEndpoints) || errors.Is(err, ErrNoCandidates):
		returned = true
		return DisaggPick{Decode: dec}, nil // prefill where it decodes
	case err != nil:
		returned = true
		dec.Done(err)
		return DisaggPick{}, err
	}
	// The prefill endpoint's answer ends at its first token: the time from
	// it to Done is the transfer's, not a decode, and teaches no decode
	// speed. Nothing else holds the handle yet.
	pre.rec.prefillOnly = true
	// The decode endpoint computes none of the prompt: it receives its KV.
	// From now on it is charged the KV footprint and the decode work only,
	// as a streaming request, and its observer is told so; the prompt
	// Default counted into its prefill flow (with objectives) is taken
	// back, since it stalls no decode there.
	dec.firstToken(false)
	if n := dec.rec.flowed; n > 0 {
		dec.rec.st.aux.flow.withdraw(float64(n))
	}
	d.decode.notifyTransfer(dec)
	returned = true
	return DisaggPick{Prefill: pre, Decode: dec}, nil
}

// errPickPanicked ends the handles of a request whose pick panicked in a
// pool's policy or Observer function.
var errPickPanicked = errors.New("llmlb: disaggregated pick panicked")

// notifyTransfer tells b's observer of the first token of dec, a decode
// pick moved to streaming by [Pick.firstToken](false) before its handle
// was returned: from the pick on, the balancer counts the request as
// streaming, and an Observer that follows requests in flight (share.Group's
// does) must see the same, or the Done that reports it streamed would find
// no request streaming. The latency is the pick's own, and the call says
// so (FirstTokenInfo.Transferred).
func (b *Balancer) notifyTransfer(dec Pick) {
	if b.obs == nil || b.obs.FirstToken == nil {
		return
	}
	b.obs.FirstToken(FirstTokenInfo{Endpoint: dec.Endpoint(), Latency: b.since(dec.rec.picked), Transferred: true})
}

// local reports whether a prompt of the given tokens, of which cached are
// expected on the decode endpoint, prefills there.
func (d *Disaggregated) local(prompt, cached int, dec Pick) bool {
	if prompt == 0 || d.localTokens == 0 { // a length unknown, or no rule
		return false
	}
	uncached := prompt - min(cached, prompt)
	if !(uncached < d.localTokens && (d.localRatio == 1 || float64(uncached) < d.localRatio*float64(prompt))) {
		return false
	}
	// The decode endpoint's prefill queue, this request's included: only
	// local prefills charge it.
	return dec.rec.st.counts().prefill < int64(d.localTokens)
}

// DisaggPick is the handle of one request picked by [Disaggregated]. Its
// zero value (returned with an error) is inert, and it may be copied. Like
// [Pick]'s, its methods are idempotent and safe to call concurrently; after
// Done they are no-ops.
type DisaggPick struct {
	// Prefill is the prefill endpoint's handle: the zero Pick, whose
	// Endpoint is nil, when the request prefills on its decode endpoint.
	Prefill Pick
	// Decode is the decode endpoint's handle.
	Decode Pick
}

// Local reports whether the request prefills on its decode endpoint, with
// no prefill endpoint.
func (p DisaggPick) Local() bool { return p.Prefill.Endpoint() == nil }

// Prefilled records that the prefill endpoint finished the prompt and its KV
// reached the decode endpoint: the prefill endpoint is released. For a local
// prefill it does nothing. When the prefill endpoint answers before the
// transfer ends, call Prefill.FirstToken then, so that its prompt stops
// counting as queued prefill while the KV moves.
func (p DisaggPick) Prefilled() {
	p.Prefill.FirstToken()
	p.Prefill.Done(nil)
}

// FirstToken records that the decode endpoint streamed the first token,
// which implies Prefilled.
func (p DisaggPick) FirstToken() {
	p.Prefilled()
	if p.Local() {
		p.Decode.FirstToken()
	} else {
		p.Decode.decodeBegins()
	}
}

// decodeBegins starts the decode clock of a request that moved to streaming
// without a first token (see firstToken), so that a balancer that learns
// speeds measures its decode from here, not from the pick. Calls after the
// first, and after Done, do nothing.
func (p Pick) decodeBegins() {
	rec := p.rec
	if rec == nil || !rec.state.CompareAndSwap(p.base|phaseStreaming, p.base|phaseBusy) {
		return
	}
	if b := rec.b; b.learn && rec.first == never {
		now := b.now()
		rec.first = now
		if st := rec.st; st.est != nil {
			rec.area0 = st.loadArea(now)
		}
	}
	rec.state.Store(p.base | phaseStreaming)
}

// Done records that the request finished (err is informational) and
// releases both endpoints. A request that failed before its prefill ended
// passes the error to the prefill endpoint too.
func (p DisaggPick) Done(err error) {
	p.Prefill.Done(err)
	p.Decode.Done(err)
}
