package llmlb

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Endpoint is one replica of an inference service. Key is its stable identity,
// such as "10.0.0.7:8000"; two endpoints with the same key are the same replica.
//
// An Endpoint may also implement interface{ Weight() float64 } to declare a
// relative capacity for heterogeneous replicas. The weight is read when the
// endpoint is passed to [Balancer.Update]; it must be finite and positive, and
// defaults to 1. Weights are relative: when the largest weight of a
// membership is below 2^-64 or above 2^64, Update scales every weight by the
// power of two that brings the largest into [1, 2), which keeps their
// ratios, so that scores divided by them stay within the range of a float64
// ([EndpointLoad].Weight and [Candidates.Weight] report the scaled weight).
// The balancer calls Key and Weight only in Update (two
// concurrent Updates with one endpoint call them at once) and keeps what
// they return: the key must not change while the endpoint is a member.
type Endpoint interface {
	Key() string
}

// Request is what is known about a request at dispatch. The zero value is a
// valid request about which nothing is known; a nil *Request is treated as the
// zero value.
type Request struct {
	// PromptTokens is the prompt length after tokenization, or an estimate
	// from its size in bytes (about 4 bytes a token for English text).
	PromptTokens int
	// MaxTokens is the output cap; 0 means unknown.
	MaxTokens int
	// OutputTokens is the caller's estimate of the output length; 0 means use
	// the balancer's decode allowance (see [WithDecodeAllowance]).
	OutputTokens int
	// Choices is the number of completions generated from the one prompt
	// (OpenAI's and vLLM's "n"): the engine prefills the prompt once and
	// decodes every completion, so the request is charged Choices times
	// the decode work of one, whose length OutputTokens, MaxTokens and the
	// allowance give. 0 means 1; at most 65,536.
	Choices int
	// Prefix holds chained block hashes of the prompt head (see package
	// prefix); nil means unknown. Only prefix-aware policies read it.
	Prefix []uint64
	// AffinityKey is a session or conversation key for hashing policies.
	AffinityKey string
	// Tenant is the isolation and fairness principal.
	Tenant string
	// Feature is a caller's label for the kind of request, such as the API
	// route, the prompt template or the agent step, for learning its
	// output length ([WithOutputPrediction]); requests of one Feature
	// should have outputs of alike lengths. No policy routes on it.
	Feature string
	// Adapter names the LoRA adapter the request is served with (the
	// model name an OpenAI-style request gives, when it names an adapter);
	// "" means the base model. Only [AdapterAffinity] routes on it.
	Adapter string
	// Exclude lists endpoint keys that must not be picked, for example those
	// a retry already failed on.
	Exclude []string
}

// maxTokens bounds every token count in a Request so that sums over many
// requests cannot overflow.
const maxTokens = 1<<31 - 1

// maxChoices bounds Request.Choices.
const maxChoices = 1 << 16

// choices returns the completions r generates: Choices, or 1 for 0.
func (r *Request) choices() int64 { return int64(max(r.Choices, 1)) }

// perChoice returns the decode work charged for one of r's completions
// from the whole request's, total.
func perChoice(total, choices int64) int64 { return total / max(choices, 1) }

func (r *Request) validate() error {
	switch {
	case r.PromptTokens < 0 || r.PromptTokens > maxTokens:
		return invalidf("PromptTokens %d out of range [0, %d]", r.PromptTokens, maxTokens)
	case r.MaxTokens < 0 || r.MaxTokens > maxTokens:
		return invalidf("MaxTokens %d out of range [0, %d]", r.MaxTokens, maxTokens)
	case r.OutputTokens < 0 || r.OutputTokens > maxTokens:
		return invalidf("OutputTokens %d out of range [0, %d]", r.OutputTokens, maxTokens)
	case r.Choices < 0 || r.Choices > maxChoices:
		return invalidf("Choices %d out of range [0, %d]", r.Choices, maxChoices)
	}
	return nil
}

// Load is one observation of an endpoint, reported by the engine itself (a
// metrics scrape, an ORCA load report, a KV event). It describes the whole
// replica, including work sent by other routers.
type Load struct {
	// At is when the engine was observed. An observation with a zero At is
	// ignored. Take it from the balancer's clock (time.Now for the default
	// one): when both carry the monotonic clock, the observation's age is
	// measured on it, and a step of the wall clock does not age it.
	At time.Time
	// Running is the number of requests in the engine's running batch.
	Running int
	// Waiting is the number of requests queued in the engine.
	Waiting int
	// KVUsage is the fraction of KV-cache blocks in use, in [0, 1]. NaN means
	// the engine does not report it.
	KVUsage float64
	// KVBlocks is the KV-cache capacity in blocks; 0 means unknown.
	KVBlocks int
	// BlockSize is the number of tokens per KV block; 0 means unknown.
	BlockSize int
	// Adapters lists the LoRA adapters the engine has in use: those of its
	// running and waiting requests (vLLM's vllm:lora_requests_info labels
	// running_lora_adapters and waiting_lora_adapters). Nil means the
	// engine does not report them. The slice is shared: do not modify it.
	Adapters []string
	// MaxAdapters is how many adapters the engine serves in one batch
	// (vLLM's max_lora label, its --max-loras setting); 0 means unknown.
	MaxAdapters int
	// PeerWaiting and PeerPrefillTokens describe the requests other routers
	// sent that have not streamed their first token, for a Signal that
	// relays them (package share): how many, and the prompt tokens, net of
	// cache hits, that they have still to prefill. The engine counts most
	// of them in Waiting, and those it is prefilling in Running, so
	// PeerWaiting may exceed the peers' part of Waiting. Zero when unknown,
	// as from an engine: [Default] then prices every waiting request that is
	// not this balancer's at the mean prompt length.
	PeerWaiting       int
	PeerPrefillTokens int64
}

// valid reports whether l can be trusted at all: a zero At, a negative count
// or token count,
// or a KV usage that is infinite or outside [0, 1] make it unusable (NaN
// KVUsage is allowed and means "not reported").
func (l *Load) valid() bool {
	if l.At.IsZero() || l.Running < 0 || l.Waiting < 0 || l.KVBlocks < 0 || l.BlockSize < 0 || l.MaxAdapters < 0 ||
		l.PeerWaiting < 0 || l.PeerPrefillTokens < 0 {
		return false
	}
	if math.IsNaN(l.KVUsage) {
		return true
	}
	return l.KVUsage >= 0 && l.KVUsage <= 1
}

// Signal supplies the last observation of each endpoint. It may be stale; the
// balancer corrects it with its own dispatches (see [WithSignal]). Load must be
// safe for concurrent use and fast: it is called during Pick and by the pick
// handle's Done.
type Signal interface {
	Load(key string) (Load, bool)
}

// Policy chooses one of the candidates of a pick. Choose returns an index in
// [0, c.Len()); c.Len() is at least 1. Choose is called for every pick, even
// one with a single candidate, so a policy that keeps state (a prefix index)
// sees every request. Choose is called concurrently from every
// goroutine that calls [Balancer.Pick], must not block, and must not retain c
// after it returns.
type Policy interface {
	Choose(c *Candidates) int
}

// Sentinel errors. Errors returned by this package wrap one of them, so
// callers branch with [errors.Is]; the exceptions are the context's error,
// which [Balancer.Pick] returns as it is, and package prefix's errors from
// creating a policy's default index.
var (
	// ErrNoEndpoints: the balancer has no endpoints. Update it with at least one.
	ErrNoEndpoints = errors.New("llmlb: no endpoints")
	// ErrNoCandidates: the request excludes every endpoint
	// ([Request.Exclude]). Unhealthy endpoints do not cause it: when only
	// unhealthy ones remain, the balancer picks among them. A retry loop
	// should give up rather than pick again.
	ErrNoCandidates = errors.New("llmlb: every endpoint is excluded")
	// ErrInvalidRequest: a Request field is out of range.
	ErrInvalidRequest = errors.New("llmlb: invalid request")
	// ErrInvalidEndpoints: Update was given a nil endpoint, an empty or
	// duplicate key, or an invalid weight; membership is unchanged.
	ErrInvalidEndpoints = errors.New("llmlb: invalid endpoints")
	// ErrUnknownEndpoint: no endpoint with that key is a member.
	ErrUnknownEndpoint = errors.New("llmlb: unknown endpoint")
	// ErrInvalidOption: an option passed to New is out of range.
	ErrInvalidOption = errors.New("llmlb: invalid option")
	// ErrInvalidPolicy: a policy constructor was given a configuration out
	// of range, or a policy chose a candidate that does not exist.
	ErrInvalidPolicy = errors.New("llmlb: invalid policy")
	// ErrNotSent, wrapped by the error a pick's Done is given, says that
	// the request never reached the picked endpoint: the caller discarded
	// the pick, or connecting to the endpoint failed. A prefix-aware
	// policy that recorded the prompt's blocks at the endpoint for the pick
	// then forgets those it recorded beyond what the endpoint already held,
	// so that later requests with the prompt's prefix are not sent after a
	// cache the endpoint never filled. It is no outcome by itself: wrap
	// context.Canceled as well for a pick that should count as neither a
	// success nor a failure of the endpoint, and not for a connection that
	// failed. The request's Prefix must be unchanged until Done.
	ErrNotSent = errors.New("llmlb: request not sent to the endpoint")
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, args...)...)
}

// policyErrorf returns an error wrapping [ErrInvalidPolicy].
func policyErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidPolicy}, args...)...)
}
