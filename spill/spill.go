// Package spill sends each request to the first of an ordered list of tiers
// that can take it, and spills it to the next tier on an explicit trigger:
// a provisioned deployment first, pay-as-you-go next, another provider
// last; or a self-hosted pool first and a managed API behind it.
//
// A [Tier] is an [http.RoundTripper], usually an httplb.Transport over the
// tier's own balancer (which retries within the tier first, and whose
// retry.Ejector cools down each endpoint that asks for a wait). A
// [Transport] tries the tiers in order and moves a request on when its
// tier answers it with one of the triggers [DefaultSpill] names:
//
//   - [Throttled]: HTTP 429, once the tier's own retries are spent;
//   - [Overloaded]: the tier's admission caps or fair queue refused the
//     request (an error wrapping retry.ErrOverloaded), or HTTP 503 asking
//     for a wait;
//   - [ContextLength]: HTTP 400 (422 from text-generation-inference)
//     whose error says the prompt exceeds the model's context, by its code
//     or the start of its message, which a tier with a longer context may
//     serve (the body is read ahead, on a goroutine of
//     its own, and waited for at most a second: one that has not said so
//     by then stays with its tier, whose caller still reads it whole);
//   - [ServerError]: HTTP 5xx;
//   - [Unreachable]: the tier could not be reached, or did not answer
//     within its transport's timeouts (a transport error).
//
// A tier is skipped while it is not ready ([Cooling]): when its
// [Tier.Ready] says so (a gateway's tier is not ready while every one of its
// endpoints cools down after the waits they asked for), or, for a tier
// without Ready, such as a single managed endpoint, for the wait its last
// answer asked (Retry-After or a rate-limit reset on a 429 or 503, or the
// reset of a rate-limit window with nothing remaining,
// x-ratelimit-remaining-requests or -tokens at 0, on any answer), at most
// [Config.MaxCooldown]. Requests come back to it as soon as it is ready.
// When every tier is cooling, the request is refused at once with a
// *retry.OverloadError suggesting the shortest remaining wait (a 429 with
// Retry-After from httplb's error handler), rather than sent to a tier that
// asked to be left alone. The last tier's answer is returned whatever it
// is, but for a failure (a 5xx, a 429, an unreachable tier) that follows a
// refusal of the request itself by an earlier tier, such as a context-length
// 400: that refusal, which tells the client what to change, is the answer.
// An invalid request does not spill: the default triggers move no other
// 4xx, nor an error of a tier's own checks of the request (a tenant it
// could not establish, a body it could not take).
//
// An answer whose status is about the tier rather than the request (401,
// 402, 403, 429, 5xx, and text-generation-inference's 424 for a failure of
// its model shard: a managed provider's 429 names the operator's
// organisation, its 401 part of the operator's key, a 5xx or a 424 may
// carry a stack trace) reaches the client with its status, Retry-After and
// Retry-After-Ms (or, for a 429 or 503 with neither, a Retry-After of the
// wait its rate-limit reset asks: OpenAI's x-ratelimit-reset-requests or
// -tokens, Anthropic's anthropic-ratelimit-*-reset), but none of its other
// headers, and with an
// OpenAI-style error of a generic message, the request's id, and the type
// and code of the tier's error when they are plain tokens (such as
// "insufficient_quota"); its body goes to [Config.Logger], and only
// there: httplb's NewUpstreamErrorHandler, told by the body it is given,
// does not log the generic one again. A 407 Proxy Authentication Required,
// which a forward proxy on the tier's way sends about the gateway's own
// credentials, is treated alike but reaches the client as a 502 Bad
// Gateway without any of its headers, as through httplb's handler. So does every answer a request
// spilled past, which the client never sees: a failure at level Warn, a
// refusal under load or a context too long at Info, once every ten seconds
// for each tier and upstream, with the count of those left out.
//
// No answer, a success included, passes on the headers that name or
// describe the operator's account with the tier rather than the answer:
// its organisation, project, deployment or region (OpenAI's
// openai-organization and openai-project, Anthropic's
// anthropic-organization-id, Azure's x-ms-region), its rate limits
// (x-ratelimit-*, anthropic-ratelimit-*: the operator's quota, which the
// tier's cooldown reads first), or the cookies it sets (Set-Cookie, a
// provider's CDN's or a replica's, not the gateway's); nor those that are
// the tier's own: the software that answered and the hosts behind it
// (Server, X-Powered-By, Via), its ORCA load report
// (endpoint-load-metrics), and its origin's policies, which a browser
// would apply to the gateway's (Strict-Transport-Security, Alt-Svc, NEL,
// Report-To, Reporting-Endpoints). Its trailers, the fields that follow
// its body, lose the same, whatever proxy or client reads it: those its
// Trailer header announces at once, and those that arrive after the body,
// announced or not, as the body ends. To strip these, the Transport wraps
// the body of each answer it passes on (but a 101 Switching Protocols
// answer's), in a body whose Unwrap method returns the tier's: httplb's
// NewUpstreamErrorHandler reads through it to an httplb.Transport tier's
// body, whose error events it rewrites.
//
// A spilled response carries the header [DefaultHeader] naming the first
// tier the request left (as Azure OpenAI's spillover marks its responses),
// and [Config.Observer] is told of every spill, for metrics (package
// telemetry provides one).
//
// Each tier after the first of [Config.Tiers] is sent the request with its
// X-Request-Id suffixed with "." and the tier's name, such as
// req_abc.paygo (or with the tier's index from 0, for a name not made of
// letters, digits, '-', '_', '.' and ':'), so that tiers over the same
// engines never receive two requests with one id (vLLM takes the header for
// its own request id and refuses one it is running); an httplb.Transport
// then appends "-2", "-3" to the id of each later attempt in the tier. The
// first tier gets the id unchanged, and so does every tier when the id is
// not one httplb would send (as httplb.NewErrorHandler defines it) or has no
// room for the suffix within 128 characters.
//
// The request body is read once and replayed to each tier, up to
// [Config.MaxBodyBytes]. Responses are never spilled once returned: a
// streamed response belongs to the tier that started it.
//
// This package's plain data types (Config, Event, Tier) hold no lock: any
// number of goroutines may read a value of one at once, but none may write
// it meanwhile.
package spill

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/apierror"
	"github.com/llmlb/llmlb/retry"
)

// Defaults of [Config].
const (
	// DefaultHeader names the response header that marks a spilled
	// response with the first tier the request left.
	DefaultHeader = "X-Llmlb-Spillover-From"
	// DefaultMaxCooldown caps the wait a tier may ask for.
	DefaultMaxCooldown = 5 * time.Minute
	// DefaultMaxBodyBytes bounds the request body kept for replay.
	DefaultMaxBodyBytes = 32 << 20
)

// maxPeekBytes bounds what is read of a 400 or 422 answer's body to tell a
// context-length error, and of a spilled answer's body to reuse its
// connection.
const maxPeekBytes = 64 << 10

// ErrInvalidConfig wraps the configuration errors of [New].
var ErrInvalidConfig = errors.New("spill: invalid config")

// Reason says why a request left a tier. It is a plain value, safe to use
// from any goroutine.
type Reason string

// The reasons of a spill.
const (
	Throttled     Reason = "throttled"
	Overloaded    Reason = "overloaded"
	ContextLength Reason = "context_length"
	ServerError   Reason = "server_error"
	Unreachable   Reason = "unreachable"
	// Cooling: the tier was skipped, since it asked for a wait that has not
	// passed.
	Cooling Reason = "cooling"
)

// Tier is one group of backends.
type Tier struct {
	// Name identifies the tier in the spill header, to the observer and in
	// errors. Required and unique; it should be a short token.
	Name string
	// Transport sends a request to the tier. Required.
	Transport http.RoundTripper
	// Ready, if set, reports whether the tier may take a request now and,
	// if not, the time until it may: for example, not while every endpoint
	// of the tier is cooling down after the waits they asked for
	// (gateway.Gateway.Tier reads its retry.Ejector). A tier that is not
	// ready is skipped without a request. With Ready, the tier's answers
	// do not cool it down: it knows its endpoints better. nil means the
	// waits its answers ask for decide, as for a single backend.
	Ready func() (bool, time.Duration)
}

// Event is one spill, as [Config.Observer] is told of it.
type Event struct {
	// From is the tier the request left; To the tier it goes to next.
	From, To string
	// Reason says why.
	Reason Reason
}

// Config configures a [Transport].
type Config struct {
	// Tiers, in order of preference. At least one is required.
	Tiers []Tier
	// Spill decides whether a tier's answer moves the request to the next
	// tier, and why: resp and err are what the tier's Transport returned.
	// It must not consume resp.Body beyond what it restores. nil means
	// [DefaultSpill].
	Spill func(resp *http.Response, err error) (Reason, bool)
	// MaxCooldown caps the time a tier asking for a wait is skipped; a
	// longer wait asked is capped, not ignored. It caps as well the wait
	// suggested when every tier is cooling, whatever a Tier.Ready says. 0
	// means [DefaultMaxCooldown]; a negative value never skips a tier for
	// the waits its answers ask (a tier's Ready still decides for its
	// tier), and the wait suggested is then capped at DefaultMaxCooldown.
	MaxCooldown time.Duration
	// MaxBodyBytes bounds the request body kept for replay; a larger body
	// fails with an error wrapping httplb.ErrBodyTooLarge (413 from httplb's
	// error handler). 0 means [DefaultMaxBodyBytes].
	MaxBodyBytes int64
	// Header names the response header that marks a spilled response. ""
	// means [DefaultHeader].
	Header string
	// Observer, if set, is called for every spill, synchronously; it must
	// be safe for concurrent use and must not block.
	Observer func(Event)
	// Clock tells the time; nil means the system clock. A cooldown set at a
	// reading more than MaxCooldown ahead of a later one (a clock without
	// monotonic readings that went back) ends MaxCooldown after the later
	// one.
	Clock llmlb.Clock
	// Logger receives the operator's log: the bodies of the tiers' error
	// answers that a client gets only as a generic error, and the answers
	// that requests spilled past (see the package documentation). nil means
	// [slog.Default] at the time of the answer.
	Logger *slog.Logger
}

// Transport is an [http.RoundTripper] over ordered tiers; see the package
// documentation. Create one with [New]. It is safe for concurrent use.
type Transport struct {
	tiers    []Tier
	spill    func(*http.Response, error) (Reason, bool)
	cooldown time.Duration
	maxBody  int64
	header   string
	observer func(Event)
	clock    llmlb.Clock
	idSuffix []string // per tier: appended to the request's X-Request-Id
	log      *slog.Logger
	limit    limiter // spaces out the records of the answers spilled past

	mu    sync.Mutex
	until []time.Time // per tier: the end of its cooldown
}

// New returns a Transport configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func New(cfg Config) (*Transport, error) {
	if len(cfg.Tiers) == 0 {
		return nil, fmt.Errorf("%w: no tiers", ErrInvalidConfig)
	}
	seen := make(map[string]bool, len(cfg.Tiers))
	for i, t := range cfg.Tiers {
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("%w: tier %d has no name", ErrInvalidConfig, i)
		case seen[t.Name]:
			return nil, fmt.Errorf("%w: tier name %q used twice", ErrInvalidConfig, t.Name)
		case t.Transport == nil:
			return nil, fmt.Errorf("%w: tier %q has no Transport", ErrInvalidConfig, t.Name)
		}
		seen[t.Name] = true
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidConfig, cfg.MaxBodyBytes)
	}
	t := &Transport{
		tiers:    append([]Tier(nil), cfg.Tiers...),
		spill:    cfg.Spill,
		cooldown: cfg.MaxCooldown,
		maxBody:  cfg.MaxBodyBytes,
		header:   cfg.Header,
		observer: cfg.Observer,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		until:    make([]time.Time, len(cfg.Tiers)),
		idSuffix: make([]string, len(cfg.Tiers)),
	}
	for i, tier := range t.tiers[1:] {
		if apierror.Plain(tier.Name) {
			t.idSuffix[i+1] = "." + tier.Name
		} else {
			t.idSuffix[i+1] = "." + strconv.Itoa(i+1)
		}
	}
	if t.spill == nil {
		t.spill = DefaultSpill
	}
	if t.cooldown == 0 {
		t.cooldown = DefaultMaxCooldown
	}
	if t.maxBody == 0 {
		t.maxBody = DefaultMaxBodyBytes
	}
	if t.header == "" {
		t.header = DefaultHeader
	}
	if t.clock == nil {
		t.clock = systemClock{}
	}
	return t, nil
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// RoundTrip sends r to the first tier that is not cooling, and on to the
// next while the answer is a trigger of [Config.Spill]. It returns the
// answer of the tier that kept the request, or the last tier's answer, or
// an earlier tier's refusal of the request itself if the later tiers failed
// (see the package documentation), marked with the spill header if it is
// not the first tier's, and with a generic body if its status is about the
// tier rather than the request. When every tier is cooling it returns a
// *retry.OverloadError suggesting the shortest remaining wait, at most
// MaxCooldown. A body larger than MaxBodyBytes fails with an error wrapping
// httplb.ErrBodyTooLarge, and one that cannot be read with an error
// wrapping httplb.ErrBodyRead.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := t.readBody(r)
	if err != nil {
		return nil, err
	}
	now := t.clock.Now()
	start, wait := t.firstReady(now)
	if start < 0 {
		return nil, fmt.Errorf("spill: every tier asked to wait: %w",
			&retry.OverloadError{Scope: "spill", RetryAfter: wait})
	}
	for i := range start {
		t.notify(Event{From: t.tiers[i].Name, To: t.tiers[start].Name, Reason: Cooling})
	}
	// kept is the answer of a tier that refused the request itself and
	// that the request spilled past all the same (see keep): it is the
	// answer if every later tier fails.
	var kept *keptAnswer
	for i := start; ; {
		resp, err := t.tiers[i].Transport.RoundTrip(withBody(r, body, t.idSuffix[i]))
		if resp == nil && err == nil {
			// A broken tier: taken as a transport error, as http.Client
			// takes it, rather than passed on for callers to dereference.
			err = fmt.Errorf("spill: tier %q returned a nil *http.Response with a nil error", t.tiers[i].Name)
		}
		next := t.nextReady(i+1, t.clock.Now())
		if t.tiers[i].Ready == nil {
			if d := t.pushback(resp, t.clock.Now()); d > 0 {
				t.cool(i, d)
			}
		}
		reason, spill := Reason(""), false
		if next >= 0 {
			reason, spill = t.spill(resp, err)
		}
		if !spill {
			return t.answer(r, i, resp, err, kept)
		}
		var head []byte
		if requestFault(resp, err) {
			kept, head = keep(i, resp, err)
		} else {
			head, _ = drain(resp, maxPeekBytes)
		}
		if err := r.Context().Err(); err != nil {
			// The client is gone: the request goes to no next tier.
			return nil, err
		}
		t.logSpilled(r, i, t.tiers[next].Name, reason, resp, err, head)
		t.notify(Event{From: t.tiers[i].Name, To: t.tiers[next].Name, Reason: reason})
		for j := i + 1; j < next; j++ {
			t.notify(Event{From: t.tiers[j].Name, To: t.tiers[next].Name, Reason: Cooling})
		}
		i = next
	}
}

// keptAnswer is a tier's refusal of the request itself, its body read
// whole (see keep).
type keptAnswer struct {
	tier int
	resp *http.Response // with its body in memory; nil for err
	err  error
}

// keep returns tier i's answer, resp or err, which refused the request
// itself (see requestFault), as a keptAnswer, with what was read of its
// body; nil if its body could not be read whole, within maxPeekBytes and
// maxDiscardTime, so that it cannot be answered.
func keep(i int, resp *http.Response, err error) (*keptAnswer, []byte) {
	if resp == nil {
		return &keptAnswer{tier: i, err: err}, nil
	}
	b, whole := drain(resp, maxPeekBytes)
	if !whole {
		return nil, b
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return &keptAnswer{tier: i, resp: resp}, b
}

// answer returns tier i's answer to r, resp or err, as RoundTrip returns
// it: or, if it is a failure of the tier (see failed) and an earlier tier
// refused the request itself (kept), that refusal, which tells the client
// more, as a 400 saying its prompt is too long says more than the 503 of
// the tier with the longer context. An answer from a tier after the first
// is marked with the spill header, and one whose status is about the tier
// rather than the request (see hidden) has its body and headers replaced
// with a generic error, the body going to the log.
func (t *Transport) answer(r *http.Request, i int, resp *http.Response, err error, kept *keptAnswer) (*http.Response, error) {
	if kept != nil && failed(resp, err) && r.Context().Err() == nil {
		head, _ := drain(resp, maxPeekBytes)
		t.logLimited(r, slog.LevelWarn, "spill: tier failed after an earlier tier refused the request; the client gets the refusal",
			i, resp, err, head, slog.String("refused_by", t.tiers[kept.tier].Name))
		i, resp, err = kept.tier, kept.resp, kept.err
	}
	if resp == nil {
		return nil, err
	}
	if hidden(resp.StatusCode) {
		limit := t.cooldown
		if limit <= 0 {
			limit = DefaultMaxCooldown
		}
		level := slog.LevelInfo
		if tierFailure(resp.StatusCode) {
			level = slog.LevelError
		}
		tier := *resp // the tier's status, for the log: a 407 becomes a 502
		body := replaceBody(resp, clientID(r), t.clock.Now(), limit)
		if log := t.logger(); log.Enabled(r.Context(), level) {
			log.LogAttrs(r.Context(), level, "spill: tier's error answer replaced with a generic one for the client",
				answerAttrs(r, t.tiers[i].Name, &tier, nil, body, tier.Header)...)
		}
	}
	// Read by pushback and replaceBody already, the headers that name the
	// operator's account with the tier are the operator's, not the
	// client's, and the tier's own (its software, its load report, its
	// origin's policies) the tier's; so are such trailers.
	apierror.StripUpstream(resp.Header)
	resp = detach(resp)
	stripTrailer(resp)
	if i > 0 {
		if resp.Header == nil {
			resp.Header = make(http.Header)
		}
		resp.Header.Set(t.header, t.tiers[0].Name)
	}
	return resp, err
}

// Cooling returns the names of the tiers skipped now: those not ready, or
// waiting out a wait they asked for.
func (t *Transport) Cooling() []string {
	now := t.clock.Now()
	var names []string
	for i := range t.tiers {
		if ok, _ := t.ready(i, now); !ok {
			names = append(names, t.tiers[i].Name)
		}
	}
	return names
}

// readBody reads r's body for replay, or returns nil if it has none. A
// body that cannot be read fails with an error wrapping httplb.ErrBodyRead.
func (t *Transport) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	defer r.Body.Close()
	// One byte past the cap tells a body over it, unless the cap is the
	// largest int64, which that byte would overflow.
	b, err := io.ReadAll(io.LimitReader(r.Body, t.maxBody+min(1, math.MaxInt64-t.maxBody)))
	if err != nil {
		return nil, fmt.Errorf("spill: %w: %w", httplb.ErrBodyRead, err)
	}
	if int64(len(b)) > t.maxBody {
		return nil, fmt.Errorf("spill: %w (more than %d bytes)", httplb.ErrBodyTooLarge, t.maxBody)
	}
	return b, nil
}

// withBody returns a copy of r whose body is a fresh reader of body and
// whose X-Request-Id, if it is one httplb would send, has idSuffix appended
// where it fits within maxRequestIDLen.
func withBody(r *http.Request, body []byte, idSuffix string) *http.Request {
	c := r.Clone(r.Context())
	if id := c.Header.Get(requestIDHeader); idSuffix != "" && id != "" &&
		len(id)+len(idSuffix) <= maxRequestIDLen && apierror.Plain(id) {
		c.Header.Set(requestIDHeader, id+idSuffix)
	}
	if body == nil {
		return c
	}
	c.Body = io.NopCloser(bytes.NewReader(body))
	c.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	c.ContentLength = int64(len(body))
	return c
}

// requestIDHeader carries a request's id upstream, as httplb sends it.
const requestIDHeader = "X-Request-Id"

// maxRequestIDLen is the length of the longest X-Request-Id httplb sends on
// as the request's own.
const maxRequestIDLen = 128

// ready reports whether tier i may take a request at now and, if not, the
// time until it may. A cooldown is at most MaxCooldown from the reading
// that set it, so one that ends further from now was set at a reading of a
// clock that has since gone back (an injected clock without monotonic
// readings, read once far ahead): it ends MaxCooldown from now instead of
// holding the tier until the clock catches up.
func (t *Transport) ready(i int, now time.Time) (bool, time.Duration) {
	if f := t.tiers[i].Ready; f != nil {
		return f()
	}
	t.mu.Lock()
	u := t.until[i]
	if t.cooldown > 0 && u.Sub(now) > t.cooldown {
		u = now.Add(t.cooldown)
		t.until[i] = u
	}
	t.mu.Unlock()
	if !now.Before(u) {
		return true, 0
	}
	return false, u.Sub(now)
}

// firstReady returns the first tier ready at now, or -1 and the shortest
// remaining wait if none is. A negative wait (a Ready racing its own
// deadline) counts as none, and the wait suggested is at most MaxCooldown
// (DefaultMaxCooldown when cooldowns are off), whatever a Ready says.
func (t *Transport) firstReady(now time.Time) (int, time.Duration) {
	var wait time.Duration
	for i := range t.tiers {
		ok, d := t.ready(i, now)
		if ok {
			return i, 0
		}
		if d = max(d, 0); i == 0 || d < wait {
			wait = d
		}
	}
	limit := t.cooldown
	if limit < 0 {
		limit = DefaultMaxCooldown
	}
	return -1, min(wait, limit)
}

// nextReady returns the first tier from i on that is ready at now, or -1.
func (t *Transport) nextReady(i int, now time.Time) int {
	for ; i < len(t.tiers); i++ {
		if ok, _ := t.ready(i, now); ok {
			return i
		}
	}
	return -1
}

// cool skips tier i for d from now, or until the end of a longer cooldown
// already set.
func (t *Transport) cool(i int, d time.Duration) {
	until := t.clock.Now().Add(d)
	t.mu.Lock()
	if until.After(t.until[i]) {
		t.until[i] = until
	}
	t.mu.Unlock()
}

// noPushbackLimit reads every wait asked, so that a long one is capped
// rather than ignored.
const noPushbackLimit = time.Duration(1<<63 - 1)

// pushback returns the wait a tier's answer asks for, capped at
// MaxCooldown, or 0 if none or if cooldowns are off: that of an overload
// answer (429, or 503) read by retry.FromHeader, or, for any other answer,
// the reset of a rate-limit window with nothing remaining, so that the
// tier is skipped before it refuses.
func (t *Transport) pushback(resp *http.Response, now time.Time) time.Duration {
	if t.cooldown < 0 || resp == nil {
		return 0
	}
	var p retry.Pushback
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		p = retry.FromHeader(resp.Header, now, noPushbackLimit)
	default:
		p = retry.QuotaReset(resp.Header, now, noPushbackLimit)
	}
	if p.Kind != retry.RetryLater || p.Delay <= 0 {
		return 0
	}
	return min(p.Delay, t.cooldown)
}

func (t *Transport) notify(e Event) {
	if t.observer != nil {
		t.observer(e)
	}
}

// maxDiscardTime bounds how long a spilled or replaced answer's body is
// read for (see drain). It is wall-clock time, as a network deadline is,
// not the Transport's clock: an error body normally arrives with its
// headers.
const maxDiscardTime = 100 * time.Millisecond

// DefaultSpill spills on HTTP 429; on an error wrapping retry.ErrOverloaded
// (the tier's admission or queue is full) or HTTP 503 with a wait asked
// (Retry-After or a rate-limit reset); on HTTP 400 or 422 whose error,
// plain or compressed with gzip, deflate, br or zstd, says the prompt
// exceeds the model's context: the code or type of its error is OpenAI's
// context_length_exceeded or llama.cpp's exceed_context_size_error, or its
// error's message starts as OpenAI's, vLLM's, SGLang's, Anthropic's,
// Gemini's, Bedrock's, llama.cpp's or text-generation-inference's (a 422)
// do ("This model's maximum context length is", "prompt is too long", ...),
// not merely quotes them further on, as a validation error quoting the
// prompt does; in the first 64 KiB of the body and within a second of the
// call: a body that stalls is taken as no such error, and its answer stays
// whole); on any other
// HTTP 5xx; and on a transport error other than a cancellation, a timeout
// included (net/http's dial and response header timeouts satisfy
// errors.Is(err, context.DeadlineExceeded) as a deadline does;
// [Transport.RoundTrip] itself moves no request whose own context ended).
// Other answers, 2xx and other 4xx, stay: the next tier would answer them
// alike; and so do the errors of a tier's own checks of the request, which
// an httplb.Transport wraps in httplb.ErrUnauthenticated (its tenant could
// not be established: the next tier must not serve a client this one
// refused), httplb.ErrBodyTooLarge or httplb.ErrBodyRead. A nil resp with
// a nil err, which no RoundTripper may return, spills as unreachable.
func DefaultSpill(resp *http.Response, err error) (Reason, bool) {
	if resp == nil && err == nil {
		return Unreachable, true
	}
	if err != nil {
		switch {
		case errors.Is(err, retry.ErrOverloaded):
			return Overloaded, true
		case errors.Is(err, context.Canceled):
			// A deadline is not taken as the caller's: a dial timeout
			// (net/net.go) and ResponseHeaderTimeout (net/http/transport.go)
			// are errors whose Is reports context.DeadlineExceeded (Go
			// 1.26), though the tier, not the caller, gave up. RoundTrip
			// checks the request's own context before it spills.
			return "", false
		case errors.Is(err, httplb.ErrBodyTooLarge), errors.Is(err, httplb.ErrUnauthenticated),
			errors.Is(err, httplb.ErrBodyRead):
			// The request itself is at fault, as with a 400: the next
			// tier would refuse it too, or, if it does not authenticate
			// as this one does, serve a client this one refused.
			return "", false
		}
		return Unreachable, true
	}
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests:
		return Throttled, true
	case code == http.StatusServiceUnavailable && asksWait(resp.Header):
		return Overloaded, true
	case code >= 500:
		return ServerError, true
	case (code == http.StatusBadRequest || code == http.StatusUnprocessableEntity) && isContextLength(resp):
		return ContextLength, true
	}
	return "", false
}

// asksWait reports whether h, an answer's header, asks for a wait, however
// long (see retry.FromHeader). Whether it asks does not depend on the time
// it is read at, only how long it asks: with no limit on the wait, a time
// past or future reads as a wait, of 0 for one past. So no time is read,
// and DefaultSpill, which has no clock, decides the same under any
// Config.Clock.
func asksWait(h http.Header) bool {
	return retry.FromHeader(h, time.Time{}, noPushbackLimit).Kind == retry.RetryLater
}

// contextLengthCodes are the error codes and types, lower-cased, that say
// a prompt is beyond the model's context: OpenAI's code, and llama.cpp's
// server's type (tools/server: ERROR_TYPE_EXCEED_CONTEXT_SIZE, a 400), which
// Ollama's OpenAI-compatible API passes on.
var contextLengthCodes = []string{"context_length_exceeded", "exceed_context_size_error"}

// contextLengthMessages are how the engines and providers start the message
// of an error saying a prompt is beyond the model's context, lower-cased;
// '#' stands for a number. They are matched at the start of the error's
// message only, never elsewhere in the body: the 400 with which vLLM
// (vllm/entrypoints/openai/api_server.py) and SGLang
// (python/sglang/srt/entrypoints/http_server.py) answer a request that fails
// validation (their validation_exception_handler) has the message
// str(exc) + str(exc.errors()), pydantic's errors, each with the offending
// "input", which may be the client's prompt: a prompt quoting these words
// would otherwise make any invalid request spill. That message starts with
// pydantic's account of the errors (their count, or "[{'type': ..."),
// never with the input.
var contextLengthMessages = []string{
	// OpenAI's, and vLLM's (OpenAIServing._validate_input, in
	// vllm/entrypoints/openai/serving_engine.py, engine/serving.py in later
	// versions): "This model's maximum context length is N tokens.
	// However, ..."
	"this model's maximum context length is #",
	// vLLM's for max_tokens beyond what the prompt leaves: "'max_tokens' or
	// 'max_completion_tokens' is too large: N. This model's maximum context
	// length is M tokens and your request has K input tokens ..."
	"'max_tokens' or 'max_completion_tokens' is too large: #. this model's maximum context length is #",
	// vLLM's check of the prompt after multimodal processing
	// (vllm/v1/engine/processor.py, Processor._validate_model_input,
	// v0.11): "The decoder prompt (length N) is longer than the maximum
	// model length of M.", "... plus the number of requested output tokens
	// (at least 1) is longer than ..." in later versions.
	"the decoder prompt (length #)",
	"the encoder prompt (length #)",
	// SGLang's (python/sglang/srt/managers/tokenizer_manager.py,
	// TokenizerManager._validate_one_request): "The input (N tokens) is
	// longer than the model's context length (M tokens)." and "Requested
	// token count exceeds the model's maximum context length of M tokens.
	// ..."
	"the input (# tokens) is longer than the model's context length",
	"requested token count exceeds the model's maximum context length",
	// OpenAI's later wording, with the code context_length_exceeded.
	"your input exceeds the context window",
	// Anthropic's: "prompt is too long: N tokens > M maximum".
	"prompt is too long",
	// Google Gemini's INVALID_ARGUMENT: "The input token count (N) exceeds
	// the maximum number of tokens allowed (M)."
	"the input token count (#) exceeds the maximum number of tokens allowed",
	// Amazon Bedrock's ValidationException.
	"input is too long for requested model",
	// llama.cpp's server, whose type says so too.
	"request (# tokens) exceeds the available context size",
	"the request exceeds the available context size",
	// Hugging Face text-generation-inference, a 422 "Input validation
	// error: ..." (router/src/validation.rs, ValidationError::
	// MaxTotalTokens and InputLength, and router/src/server.rs, v3.3.6).
	"input validation error: `inputs` tokens + `max_new_tokens` must be <= #",
	"input validation error: `inputs` must have less than #",
}

// isContextLength reports whether resp, a 400 or 422, says the prompt
// exceeds the model's context (see contextLengthError). It reads at most
// maxPeekBytes of the body ahead (see readAhead) and waits for them at most
// maxPeekTime: a body that has not said so by then, because it stalls after
// its headers, is taken as no context-length error, and resp, whose body
// still returns every byte the tier sends, stays with its tier. A body that
// fails is none either.
func isContextLength(resp *http.Response) bool {
	if resp.Body == nil || resp.Body == http.NoBody {
		return false
	}
	p := readAhead(resp)
	timer := time.NewTimer(maxPeekTime)
	select {
	case <-p.done:
	case <-timer.C:
	}
	timer.Stop()
	head, err := p.head()
	if err != nil && err != io.EOF {
		return false
	}
	return contextLengthError(decoded(head, resp.Header.Get("Content-Encoding")))
}

// contextLengthError reports whether body, an error answer's JSON, says the
// prompt exceeds the model's context: its error's code or type is one of
// contextLengthCodes, or its error's message starts as one of
// contextLengthMessages. The error is the body's "error" object (OpenAI,
// Anthropic, vLLM, Gemini, llama.cpp), or its "error" string
// (text-generation-inference), or the body itself (vLLM's and SGLang's
// {"object": "error", "message": ...}, Bedrock's {"message": ...}). A body
// that is not JSON, or is cut short, says nothing.
func contextLengthError(body []byte) bool {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message json.RawMessage `json:"message"`
		Type    json.RawMessage `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(body, &v) != nil {
		return false
	}
	fields := [][3]json.RawMessage{{v.Message, v.Type, v.Code}}
	if len(v.Error) > 0 {
		switch v.Error[0] {
		case '{':
			var e struct {
				Message json.RawMessage `json:"message"`
				Type    json.RawMessage `json:"type"`
				Code    json.RawMessage `json:"code"`
			}
			if json.Unmarshal(v.Error, &e) == nil {
				fields = append(fields, [3]json.RawMessage{e.Message, e.Type, e.Code})
			}
		case '"':
			fields = append(fields, [3]json.RawMessage{v.Error, nil, nil})
		}
	}
	for _, f := range fields {
		for _, raw := range f[1:] {
			if s, ok := jsonString(raw); ok && slices.Contains(contextLengthCodes, strings.ToLower(s)) {
				return true
			}
		}
		msg, ok := jsonString(f[0])
		if !ok {
			continue
		}
		msg = strings.ToLower(strings.TrimSpace(msg))
		for _, m := range contextLengthMessages {
			if hasPattern(msg, m) {
				return true
			}
		}
	}
	return false
}

// jsonString returns the string raw holds, if it holds one.
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// hasPattern reports whether s starts with pattern, in which '#' stands for
// one or more ASCII digits.
func hasPattern(s, pattern string) bool {
	i := 0
	for j := 0; j < len(pattern); j++ {
		if pattern[j] != '#' {
			if i >= len(s) || s[i] != pattern[j] {
				return false
			}
			i++
			continue
		}
		n := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		if i == n {
			return false
		}
	}
	return true
}

// decoded returns the text of head, the first bytes of a body sent with
// Content-Encoding enc: head itself without an encoding, and otherwise the
// start of its decoding, at most maxPeekBytes of it, and nil for an
// encoding it cannot read. It reads gzip, deflate, br and zstd, and a list
// of them applied in turn ("gzip, br"), which net/http leaves encoded when
// the request asked for an encoding itself, as a gateway passing on its
// client's Accept-Encoding does: the answer then reaches the client as the
// tier sent it, and only this peek is decoded. What a small head decodes to
// is bounded by maxPeekBytes whatever its ratio, at each coding of a list,
// and the memory of a decoder by its window (16 MiB for brotli,
// maxZstdWindow for zstd).
func decoded(head []byte, enc string) []byte {
	// Counted before the split, which for a header of many commas would
	// allocate many times its size.
	if strings.Count(enc, ",") >= maxCodings {
		return nil
	}
	codings := strings.Split(enc, ",")
	var r io.Reader = bytes.NewReader(head)
	identity := true
	// RFC 9110, section 8.4: the codings are listed in the order applied,
	// so the last is undone first.
	for i := len(codings) - 1; i >= 0; i-- {
		switch strings.ToLower(strings.TrimSpace(codings[i])) {
		case "", "identity":
			continue
		case "gzip", "x-gzip":
			z, err := gzip.NewReader(r)
			if err != nil {
				return nil
			}
			r = z
		case "deflate":
			// RFC 9110, section 8.4.1.2: the zlib format; some servers
			// send the raw deflate stream instead.
			b := bufio.NewReader(r)
			if h, err := b.Peek(2); err == nil && isZlibHeader(h) {
				z, err := zlib.NewReader(b)
				if err != nil {
					return nil
				}
				r = z
			} else {
				r = flate.NewReader(b)
			}
		case "br":
			r = brotli.NewReader(r)
		case "zstd":
			z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(maxZstdWindow))
			if err != nil {
				return nil
			}
			defer z.Close()
			r = z
		default:
			return nil
		}
		// What each coding decodes to is bounded, not only the text: an
		// inner coding may read a great deal to produce nothing (empty
		// gzip members, say), which an outer one makes from a few bytes.
		r = io.LimitReader(r, maxPeekBytes)
		identity = false
	}
	if identity {
		return head
	}
	// head may be cut short of the stream's end: what was decoded before
	// the cut is kept.
	text, _ := io.ReadAll(r)
	return text
}

// maxCodings bounds the content codings of an answer that are undone.
const maxCodings = 4

// maxZstdWindow bounds the window of a zstd stream decoded: 8 MiB, as RFC
// 8878 (section 3) requires of a Content-Encoding "zstd" sender.
const maxZstdWindow = 8 << 20

// isZlibHeader reports whether h starts a zlib stream (RFC 1950, section
// 2.2): the deflate method, a window of at most 32 KiB, and a check that
// makes the two bytes a multiple of 31.
func isZlibHeader(h []byte) bool {
	return h[0]&0x0f == 8 && h[0]>>4 <= 7 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0
}
