package httplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/internal/quantile"
	"github.com/llmlb/llmlb/internal/token"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/signals"
)

// DefaultMaxPeekBytes bounds the response bytes a Transport holds back while
// it waits for the first event of a stream: a stream whose first event
// with a "data:" line (after any preamble events, see [Transport]) has not
// ended within this many bytes is committed anyway, unless what it holds
// of that event is already an error event.
const DefaultMaxPeekBytes = 64 << 10

// maxDrainBytes bounds what is read from a failed attempt's body so that its
// connection can be reused.
const maxDrainBytes = 4 << 10

// maxDrainTime bounds how long a failed attempt's body is read for (see
// drain). It is wall-clock time, as a network deadline is, not the
// Transport's clock: an error body normally arrives with its headers.
const maxDrainTime = 100 * time.Millisecond

// Config configures a Transport. Only Balancer is required; every other zero
// field is a documented default.
type Config struct {
	// Balancer picks an endpoint for each attempt. Required.
	Balancer *llmlb.Balancer
	// Base sends each attempt. nil means [http.DefaultTransport]. The
	// engines' servers close a connection idle for 5 seconds (uvicorn's
	// default, kept by vLLM and SGLang), and an attempt sent on one just as
	// it closes fails (net/http retries no POST): a Transport that keeps
	// idle connections for less (IdleConnTimeout), as package gateway's
	// does, never meets that.
	Base http.RoundTripper
	// URL returns the base URL of a picked endpoint; the request's path is
	// appended to its path (see [Endpoint]). nil means the endpoints are
	// [*Endpoint] values, as [NewEndpoints] makes them. An attempt fails, and is
	// not retried, with an error wrapping [ErrNoURL] when its endpoint has
	// no URL (URL returned nil, or URL is nil and the endpoint is not an
	// [*Endpoint]), and with one wrapping [ErrInvalidConfig] when both the
	// base URL's path ends in /v1 and the request's starts with /v1/.
	URL func(llmlb.Endpoint) *url.URL
	// Parser reads request bodies into an llmlb.Request. nil means a Parser
	// with the defaults of [ParserConfig].
	Parser *Parser
	// Adjust, if set, is called with each request and what the parser
	// made of it, before admission and the first pick, to add what the
	// caller knows: an output-length estimate (OutputTokens), a Feature of
	// its own, or endpoints to exclude. Set the tenant with [ParserConfig.Tenant], not here: the
	// prefix hashes, which the tenant salts, are computed before Adjust
	// runs. It must not read the request body.
	Adjust func(r *http.Request, lr *llmlb.Request)
	// Retry configures the retries and hedges of each request as for a
	// [retry.Loop], with the same defaults for its zero fields: up to
	// [retry.DefaultMaxAttempts] attempts, [retry.FullJitter] back-offs, a
	// [retry.PercentBudget] of [retry.DefaultPercentConfig] on Retry.Clock
	// private to the transport, [retry.DefaultClassify] (connection
	// errors, [ErrFirstEventTimeout], 408, 429, 500, 502, 503, 504),
	// [retry.DefaultMaxPushback], no hedging. The Transport's commitment
	// point is the first event where a Loop's is the first token (see
	// [Transport]). For the Transport:
	//
	//   - MaxAttempts bounds the attempts per request, the first and the
	//     hedges included, as in a Loop; 1 disables retries and hedges.
	//     Unlike [retry.NewLoop], NewTransport sets no upper bound.
	//   - Backoff is passed as n the number of attempts sent so far,
	//     hedges included, where a Loop passes the retry's number: the two
	//     agree when nothing was hedged (1 for the first retry).
	//   - Classify is given a status answer as a [*retry.StatusError]
	//     carrying the response's header, and a 2xx stream whose first
	//     event is an error event as an error wrapping one with the error's
	//     code (see [Transport]). An endpoint without a usable URL
	//     ([ErrNoURL], [ErrInvalidConfig]) is a configuration error, never
	//     retried, whatever Classify says.
	//   - MaxPushback bounds the delay a server asks for with Retry-After or
	//     rate-limit reset headers. A negative value honours none: a retry,
	//     which goes to another endpoint, waits only for its back-off, as a
	//     tier that spills (package spill) wants, since the endpoint that
	//     asked for the wait is not the one retried (a server's "do not
	//     retry" still stops the retries).
	//   - Hedge: when an attempt has not committed after the hedge delay,
	//     another attempt is sent to an endpoint not tried yet, within
	//     MaxAttempts and the budget; the first to commit wins and the
	//     others are cancelled at once. With Percentile, the delay is
	//     learned from the winners' times from pick to first event. Hedged
	//     attempts run on goroutines of their own, which end before
	//     RoundTrip returns. NewTransport validates Hedge as NewLoop does.
	//   - Reporter is told how every attempt ended, including, unlike a
	//     Loop's, the attempts cancelled because another one won (with
	//     [context.Canceled], or with the status answer the upstream had
	//     already sent, such as a 429 and its Retry-After); a committed
	//     attempt is reported when its body ends. If it is also a
	//     [retry.QuotaReporter], as a [*retry.Ejector] is, it is given the
	//     headers of every successful answer, whose rate-limit headers may
	//     say that the endpoint's quota is spent. If it has the method
	//     ReportElapsed, as a [*retry.Ejector] has, it is told how long ago
	//     each attempt was picked, so that a stream sent before an
	//     endpoint's ejection does not count against it once it is back.
	//   - Observer is told of every retry, probe and hedge sent and every
	//     one the budget refuses (its Retry, Probe, Hedge and Denied
	//     functions; package telemetry provides one). Retry is called as
	//     the retry is sent, after its back-off; Probe instead of Retry for
	//     an attempt that looks for a stored response on the next endpoint
	//     (see the package doc); a hedge is picked before the budget is
	//     asked, so one with no endpoint to go to takes no budget and is
	//     not counted as refused. The cause given to Retry and Probe wraps
	//     the failed attempt's error with a message that names the endpoint
	//     and, if the request has a valid X-Request-Id (as [NewProxy] gives
	//     each request), its id.
	//   - Clock also stamps the load reports recorded into Store.
	//   - After also times the first-event timeouts: with After set, an
	//     attempt with a FirstEventTimeout has a goroutine of its own that
	//     waits on the channel until the attempt commits or fails.
	Retry retry.LoopConfig
	// Admission, if set, caps the requests in flight globally and per
	// session (the affinity key); a refused request fails at once with a
	// [*retry.OverloadError].
	Admission *retry.Admission
	// Queue, if set, admits each request through a token-fair queue after
	// the Admission caps (which therefore count the requests waiting in it
	// too): the request waits while the queue's capacity is used, and fails
	// with a [*retry.OverloadError] (a 429 from the proxy's error handler)
	// when the queue is full or the request's deadline passes. Its principal
	// is the request's tenant, or, with no tenant, the client's address
	// (the request's RemoteAddr without its port; for IPv6, its /48
	// prefix, a site's). A request a server received is never counted by
	// its session key, which a client chooses freely: one sending each
	// request under a new key would otherwise count as that many
	// principals. Behind another proxy every request has that proxy's
	// address: set a tenant to tell the clients apart. A request without a
	// RemoteAddr, sent by the program that uses the Transport as its own
	// client, has its session key prefixed with "session:", or else "". A
	// tenant whose name starts with "addr:", "session:" or "tenant:" is
	// counted as "tenant:" and its name, apart from those. Its prompt tokens are charged at
	// admission; output tokens are charged as the response body is read,
	// as they are reported to the pick (see [OutputCounter]): one per event
	// of a server-sent event stream, or the usage count of any other 2xx
	// body (one token per [BytesPerToken] bytes without one) when it ends;
	// the ticket is released when the body ends. See package fair.
	Queue *fair.Queue
	// TrustClassHeader, if not "", names a request header whose value,
	// "interactive", "standard" or "batch", is the request's priority class
	// in Queue; a missing or other value means standard. Anyone who can set
	// this header chooses their priority, so name one only when every
	// request passes through a component that sets or removes it. "" reads
	// no header: every request is standard. It requires Queue.
	TrustClassHeader string
	// Store, if set, records the ORCA load report (the
	// endpoint-load-metrics header) of every response as a push observation
	// of its endpoint. A Store that holds its MaxKeys endpoints evicts one
	// not reported lately for each new one (see
	// signals.StoreConfig.MaxKeys): size it for every endpoint routed to
	// (or Delete the endpoints that leave), so that endpoints in use do not
	// evict each other.
	Store *signals.Store
	// MaxPeekBytes bounds the bytes held back before the first event of a
	// stream, to the end of its first event with a "data:" line that is no
	// preamble event (see [Transport]). 0 means [DefaultMaxPeekBytes]. A Responses
	// request (a path ending in /responses) may hold back twice its body
	// more, since vLLM's preamble events repeat its instructions and tools.
	MaxPeekBytes int
	// FirstEventTimeout, if positive, bounds each attempt's wait for its
	// first event, from the moment it is sent: an attempt that has not
	// committed by then (no response, a stream of nothing but SSE
	// comments, keep-alives and preamble events, or one whose first
	// event has not ended) is cancelled and fails with [ErrFirstEventTimeout], which
	// [retry.DefaultClassify] retries on another endpoint like a
	// connection error, within Retry.MaxAttempts and the budget. Its pick is finished with that error and the
	// Retry.Reporter is told of it.
	//
	// 0, the default, means no timeout: an attempt waits for its first
	// event until the request's context ends. There is no safe universal
	// value: the first event arrives only after the engine has queued and
	// prefilled the prompt, which takes tens of seconds for long prompts on
	// a busy replica, and the first byte of a non-streaming response only
	// after the whole completion has been generated, which can take
	// minutes. A timeout shorter than that cancels healthy work and sends
	// it again elsewhere, adding load when replicas are already slow. Set
	// it above the longest expected time to first token of the traffic
	// served (non-streaming requests included), and bound each request as
	// a whole with its context's deadline.
	FirstEventTimeout time.Duration
	// MaxResponseIDs bounds the OpenAI Responses API response ids the
	// Transport remembers for response affinity (see [Transport]): the
	// least recently used is forgotten beyond it, and a request continuing,
	// retrieving or cancelling a forgotten response is routed as any other,
	// probing the endpoints in turn while they answer 404 (see the package
	// documentation). Each id costs about 60
	// bytes whatever its length (about 4 MiB at the default). 0 means
	// [DefaultMaxResponseIDs]; a negative value remembers none, which
	// turns response affinity off: a request addressing a stored response
	// is then routed, and retried, as any other, without probing.
	MaxResponseIDs int
}

// Transport is an [http.RoundTripper] that sends each request to an endpoint
// chosen by an llmlb.Balancer, retries it elsewhere while nothing has been
// streamed, and accounts for it until its response body ends.
//
// For each request it parses the body (see [Parser.Parse]), asks the admission
// caps, waits for the fair queue if there is one ([Config.Queue]), and then,
// per attempt: picks an endpoint excluding the ones already
// tried, rewrites the URL to it and sends the request with the base
// transport. A connection error, a retryable status (by default 408, 429,
// 500, 502, 503 and 504) or an error before the first event of a 2xx stream
// is retried while attempts and the budget last, after a back-off that a Retry-After
// header may lengthen but never shorten and that must end before the
// request's deadline. When no endpoint other than the failed ones is left,
// the failed ones become candidates again.
//
// A 2xx response is committed when its first event arrives: for a
// text/event-stream, the first event with a "data:" line, once it has
// ended with its blank line, where a client dispatches it and its name
// (its last "event:" line) is known; for anything else, the first byte. The preamble events of an OpenAI Responses stream
// (response.created, response.in_progress, response.queued: a top-level
// "type" of one of those), which vLLM and SGLang send as soon as they
// accept the request, before the prompt is prefilled, are no first event:
// they are held back with it and passed on before it, so that a failure
// during the prefill is retried and the time to the first event is the
// time to the first token, and hedges wait for it. A stream of nothing but
// preamble events is committed at its end, or when it reaches
// [Config.MaxPeekBytes]. A stream whose first event is an error event
// (data with an "error" object at its top level, which vLLM and SGLang
// send when generation fails after their 200, or an "error" string, which
// text-generation-inference sends, or an event named "error", whatever its
// data, which is held back to the event's end) is not committed: its
// attempt fails as a status answer would, with the error's "code" as the
// status (429 for OpenAI's "rate_limit_exceeded" and "insufficient_quota";
// without a code from 100 to 599, the status of the error's type, 400 for an
// "invalid_request_error", else 500; for text-generation-inference's, that
// of its error_type, 422 for "validation", 429 for "overloaded", or, on its
// OpenAI-compatible routes, which say 422 for every error, that of the error
// its message names, 429 for "Model is overloaded"; for an event named
// "error" of no such data, its "code" or Anthropic error "type", else 500),
// and is retried or
// returned as such, with the
// bytes as sent. RoundTrip holds back the first bytes, calls the pick's
// FirstToken and returns the response; its body then passes every Read straight through
// (no buffering), reports the output tokens it carries to the pick with
// Generated as they pass (see [OutputCounter]), and calls the pick's Done
// exactly once, at the end of the body, on a read error, or when it is
// closed early (a client disconnect).
// After the commitment nothing is retried: a failure mid-stream reaches the
// caller as a read error, never as a silent second attempt. A retryable
// status that cannot be retried any more is returned as the response; a
// transport failure that cannot be retried is returned as a
// [*retry.GiveUpError] wrapping [retry.ErrExhausted].
//
// A request's Accept-Encoding is not sent upstream: the Transport reads
// each answer (its first event, error events, the output tokens), which it
// could not do in an encoding a client chose, so a client could turn that
// off by asking for gzip. The base transport asks for what it decodes
// instead (an [http.Transport] asks for gzip and decompresses it), and the
// caller gets the answer decoded. An answer the upstream compresses unasked
// is read as compressed: a stream's first byte is its first event.
//
// An attempt's interim answers (1xx, such as 103 Early Hints) are not
// passed to the request's [httptrace.ClientTrace] Got1xxResponse, its other
// hooks being called as usual: the attempt may yet fail and be retried, or
// lose to a hedge, and the answer's headers are the upstream's own, which
// [httputil.ReverseProxy] would forward to its client as they came.
//
// A 101 Switching Protocols answer (a WebSocket, say) is returned with the
// switched connection as its body, writable as the base transport's is; the
// switch counts as the request's first token, and its pick is done when the
// body is closed. One that switches to another
// protocol than the one the request's Upgrade header names (with the
// Connection option "upgrade"), or to none it asked for, fails like a
// connection error.
//
// With a hedge delay set ([Config.Retry]'s Hedge), an attempt still waiting
// for its first event after the delay is hedged: another attempt goes to an
// endpoint with none in flight, the first to commit wins, and the others are
// cancelled and finished before RoundTrip returns. Once an attempt has
// committed no hedge or retry is started, and no other attempt can commit.
//
// With [Config.FirstEventTimeout] set, an attempt whose first event has not
// arrived within the timeout fails with [ErrFirstEventTimeout] and is
// retried like a connection error.
//
// A POST to a path ending in /responses (the OpenAI Responses API) whose
// body continues a stored response ("previous_response_id") that an
// endpoint's earlier answer through this Transport produced is sent to that
// endpoint only, once: not retried or hedged, since any other endpoint
// would answer 404 (see the package documentation and
// [Config.MaxResponseIDs]); so is a retrieve, cancel or delete of a stored
// response by its id. Such a request with an id it does not know goes to
// the endpoint the balancer picks, and then to each other endpoint in turn
// while they answer 404, within the retry budget; the endpoint that answers
// is remembered.
//
// A Transport is safe for concurrent use. It starts no goroutines, except,
// when hedging, one per attempt, each of which has ended when RoundTrip
// returns, and, with a FirstEventTimeout and Config.Retry.After set, one
// per attempt until it commits or fails.
type Transport struct {
	b         *llmlb.Balancer
	base      http.RoundTripper
	url       func(llmlb.Endpoint) *url.URL
	customURL bool // Config.URL set
	parser    *Parser
	adjust    func(*http.Request, *llmlb.Request)
	attempts  int
	budget    retry.Budget
	backoff   retry.Backoff
	classify  func(error) bool
	pushLimit time.Duration
	adm       *retry.Admission
	queue     *fair.Queue
	classHdr  string // Config.TrustClassHeader
	reporter  retry.Reporter
	elapsed   retry.ElapsedReporter // reporter, if it has ReportElapsed
	obs       retry.Observer
	store     *signals.Store
	peek      int
	hedge     retry.HedgeConfig // MaxHedges set
	hedging   bool              // hedge.Delay or hedge.Percentile set
	firstWait time.Duration     // Config.FirstEventTimeout
	clock     llmlb.Clock
	after     func(time.Duration) <-chan time.Time
	ttft      quantile.Window // with hedge.Percentile: the winners' times to first event
	ids       *responseIDs    // response affinity; nil if off

	// afterCommit, if set, is called by an attempt right after it
	// committed, before RoundTrip learns of it. Tests use it to order
	// events deterministically.
	afterCommit func()
}

// NewTransport returns a Transport configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func NewTransport(cfg Config) (*Transport, error) {
	if cfg.Balancer == nil {
		return nil, configErrorf("nil Balancer")
	}
	if cfg.MaxPeekBytes < 0 || cfg.FirstEventTimeout < 0 {
		return nil, configErrorf("negative MaxPeekBytes or FirstEventTimeout")
	}
	rc := cfg.Retry
	if rc.MaxAttempts < 0 {
		return nil, configErrorf("Retry.MaxAttempts %d is negative", rc.MaxAttempts)
	}
	// As retry.NewLoop validates them.
	h := rc.Hedge
	if h.Delay < 0 {
		return nil, configErrorf("hedge Delay %v is negative", h.Delay)
	}
	if !(h.Percentile >= 0 && h.Percentile < 1) {
		return nil, configErrorf("hedge Percentile %v must be in [0, 1)", h.Percentile)
	}
	if h.MaxHedges < 0 {
		return nil, configErrorf("hedge MaxHedges %d is negative", h.MaxHedges)
	}
	if h.MaxHedges == 0 {
		h.MaxHedges = 1
	}
	if cfg.TrustClassHeader != "" && cfg.Queue == nil {
		return nil, configErrorf("TrustClassHeader without a Queue")
	}
	if cfg.TrustClassHeader != "" && !token.Valid(cfg.TrustClassHeader) {
		return nil, configErrorf("TrustClassHeader %q is not a header name", cfg.TrustClassHeader)
	}
	t := &Transport{
		b:         cfg.Balancer,
		base:      cfg.Base,
		url:       cfg.URL,
		customURL: cfg.URL != nil,
		parser:    cfg.Parser,
		adjust:    cfg.Adjust,
		attempts:  rc.MaxAttempts,
		budget:    rc.Budget,
		backoff:   rc.Backoff,
		classify:  rc.Classify,
		pushLimit: rc.MaxPushback,
		adm:       cfg.Admission,
		queue:     cfg.Queue,
		classHdr:  cfg.TrustClassHeader,
		reporter:  rc.Reporter,
		elapsed:   elapsedReporter(rc.Reporter),
		store:     cfg.Store,
		peek:      cfg.MaxPeekBytes,
		hedge:     h,
		hedging:   h.Delay > 0 || h.Percentile > 0,
		firstWait: cfg.FirstEventTimeout,
		clock:     rc.Clock,
		after:     rc.After,
	}
	if rc.Observer != nil {
		t.obs = *rc.Observer
	}
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.url == nil {
		t.url = endpointURL
	}
	if t.parser == nil {
		p, err := NewParser(ParserConfig{})
		if err != nil {
			return nil, err
		}
		t.parser = p
	}
	if t.attempts == 0 {
		t.attempts = retry.DefaultMaxAttempts
	}
	if t.budget == nil {
		bc := retry.DefaultPercentConfig()
		bc.Clock = rc.Clock
		b, err := retry.NewPercentBudget(bc)
		if err != nil {
			return nil, configErrorf("budget: %v", err)
		}
		t.budget = b
	}
	if t.backoff == nil {
		f, err := retry.NewFullJitter(retry.BackoffConfig{})
		if err != nil {
			return nil, configErrorf("backoff: %v", err)
		}
		t.backoff = f
	}
	if t.classify == nil {
		t.classify = retry.DefaultClassify
	}
	classify := t.classify
	t.classify = func(err error) bool { return !misconfigured(err) && classify(err) }
	if t.pushLimit == 0 {
		t.pushLimit = retry.DefaultMaxPushback
	}
	if t.peek == 0 {
		t.peek = DefaultMaxPeekBytes
	}
	if t.clock == nil {
		t.clock = systemClock{}
	}
	switch n := cfg.MaxResponseIDs; {
	case n == 0:
		t.ids = newResponseIDs(DefaultMaxResponseIDs)
	case n > 0:
		t.ids = newResponseIDs(n)
	}
	return t, nil
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func endpointURL(ep llmlb.Endpoint) *url.URL {
	if e, ok := ep.(*Endpoint); ok {
		return e.u
	}
	return nil
}

// baseURL returns the base URL of ep for a request for path, or an error
// that says how to give it one: wrapping [ErrNoURL] when there is none,
// [ErrInvalidConfig] when both it and path carry the API's /v1.
func (t *Transport) baseURL(ep llmlb.Endpoint, path string) (*url.URL, error) {
	base := t.url(ep)
	switch {
	case base == nil && t.customURL:
		return nil, fmt.Errorf("%w: Config.URL returned nil for endpoint %q", ErrNoURL, ep.Key())
	case base == nil:
		return nil, fmt.Errorf("%w: endpoint %q, of type %T, is not an *httplb.Endpoint, and Config.URL is nil: "+
			"make the endpoints with httplb.NewEndpoints, or set Config.URL to return their base URLs", ErrNoURL, ep.Key(), ep)
	}
	if err := checkJoin(base, path); err != nil {
		return nil, configErrorf("endpoint %q, request for %s: %v", ep.Key(), path, err)
	}
	return base, nil
}

// misconfigured reports whether err is an attempt's configuration error,
// which no retry can mend.
func misconfigured(err error) bool {
	return errors.Is(err, ErrNoURL) || errors.Is(err, ErrInvalidConfig)
}

// CloseIdleConnections closes the idle connections of the base transport, if
// it has such a method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	var c <-chan time.Time
	if t.after != nil {
		c = t.after(d)
	} else {
		timer := time.NewTimer(d)
		defer timer.Stop()
		c = timer.C
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// eventTimer bounds an attempt's wait for its first event: if it fires
// before stop, it cancels the attempt's context with err.
type eventTimer struct {
	err    error
	cancel context.CancelCauseFunc
	state  atomic.Int32  // timerRunning, timerStopped or timerFired
	timer  *time.Timer   // with the system clock
	stopC  chan struct{} // with Config.After: closed by stop
	exited chan struct{} // with Config.After: closed when the waiting goroutine ends
}

const (
	timerRunning = iota
	timerStopped
	timerFired
)

// startEventTimer starts a first-event timer of t.firstWait that cancels
// with err.
func (t *Transport) startEventTimer(cancel context.CancelCauseFunc, err error) *eventTimer {
	e := &eventTimer{err: err, cancel: cancel}
	if t.after == nil {
		e.timer = time.AfterFunc(t.firstWait, e.fire)
		return e
	}
	c := t.after(t.firstWait)
	e.stopC, e.exited = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.exited)
		select {
		case <-c:
			e.fire()
		case <-e.stopC:
		}
	}()
	return e
}

func (e *eventTimer) fire() {
	if e.state.CompareAndSwap(timerRunning, timerFired) {
		e.cancel(e.err)
	}
}

// stop stops the timer and reports whether it had not fired; after it
// returns, the timer never fires. It must be called exactly once.
func (e *eventTimer) stop() bool {
	stopped := e.state.CompareAndSwap(timerRunning, timerStopped)
	if e.timer != nil {
		e.timer.Stop()
	} else {
		close(e.stopC)
		<-e.exited
	}
	return stopped
}

// drain reads what is left of a failed attempt's body, up to maxDrainBytes
// and for at most maxDrainTime, so that its connection can carry another
// request, and closes it. A body that stalls is closed unread after
// maxDrainTime (its connection is then dropped): a retry never waits on an
// upstream that answered an error and then stopped sending.
func drain(rc io.ReadCloser) {
	stop := time.AfterFunc(maxDrainTime, func() { _ = rc.Close() })
	_, _ = io.CopyN(io.Discard, rc, maxDrainBytes)
	stop.Stop()
	_ = rc.Close()
}

// readHead reads up to n bytes of rc, for at most maxDrainTime (see drain),
// and closes it.
func readHead(rc io.ReadCloser, n int64) []byte {
	stop := time.AfterFunc(maxDrainTime, func() { _ = rc.Close() })
	head, _ := io.ReadAll(io.LimitReader(rc, n))
	stop.Stop()
	_ = rc.Close()
	return head
}

// resolveDotSegments removes the dot segments ("." and "..") of u's path,
// as a reference is resolved (RFC 3986, section 5.2.4), if it has any once
// unescaped ("%2e%2e" is ".."), so that the path, appended to an endpoint's
// base path, stays under it: an upstream that resolves them, such as a
// path-routing ingress in front of several backends, would otherwise be
// sent "/base/../other", another backend's path. A path with a dot segment
// is nothing an API client sends: it also loses its escaping (an escaped
// slash becomes a slash, and may make a dot segment of its own).
func resolveDotSegments(u *url.URL) {
	if u == nil || !hasDotSegment(u.Path) {
		return
	}
	dir := strings.HasSuffix(u.Path, "/") || strings.HasSuffix(u.Path, "/.") || strings.HasSuffix(u.Path, "/..")
	p := path.Clean("/" + u.Path)
	if dir && p != "/" {
		p += "/"
	}
	u.Path, u.RawPath = p, ""
}

// hasDotSegment reports whether p has a segment "." or "..".
func hasDotSegment(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func joinPath(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	case strings.HasSuffix(a, "/") && strings.HasPrefix(b, "/"):
		return a + b[1:]
	case !strings.HasSuffix(a, "/") && !strings.HasPrefix(b, "/"):
		return a + "/" + b
	}
	return a + b
}

// elapsedReporter returns r as a [retry.ElapsedReporter], told each
// attempt's age, or nil if it is not one.
func elapsedReporter(r retry.Reporter) retry.ElapsedReporter {
	e, _ := r.(retry.ElapsedReporter)
	return e
}
