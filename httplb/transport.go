package httplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/signals"
)

// DefaultMaxPeekBytes bounds the response bytes a Transport holds back while
// it waits for the first event of a stream: a stream whose first "data:"
// line has not started within this many bytes is committed anyway.
const DefaultMaxPeekBytes = 64 << 10

// maxDrainBytes bounds what is read from a failed attempt's body so that its
// connection can be reused.
const maxDrainBytes = 4 << 10

// Config configures a Transport. Only Balancer is required; every other zero
// field is a documented default.
type Config struct {
	// Balancer picks an endpoint for each attempt. Required.
	Balancer *llmlb.Balancer
	// Base sends each attempt. nil means [http.DefaultTransport].
	Base http.RoundTripper
	// URL returns the base URL of a picked endpoint; the request's path is
	// appended to its path. nil means the endpoints are [*Endpoint]s.
	URL func(llmlb.Endpoint) *url.URL
	// Parser reads request bodies into an llmlb.Request. nil means a Parser
	// with the defaults of [ParserConfig].
	Parser *Parser
	// Adjust, if set, is called with each request and what the parser
	// made of it, before admission and the first pick, to add what the
	// caller knows: an output-length estimate (OutputTokens), endpoints to
	// exclude, an affinity key or tenant from authentication. It must not
	// read the request body.
	Adjust func(r *http.Request, lr *llmlb.Request)
	// MaxAttempts bounds the attempts per request, the first included.
	// 0 means [retry.DefaultMaxAttempts]; 1 disables retries.
	MaxAttempts int
	// Budget decides whether a retry may be sent. nil means a
	// [retry.PercentBudget] with default settings, private to the
	// transport.
	Budget retry.Budget
	// Backoff computes the wait before a retry. nil means
	// [retry.FullJitter] with default settings.
	Backoff retry.Backoff
	// Classify reports whether an attempt's error may be retried; a status
	// answer is passed as a [*retry.StatusError]. nil means
	// [retry.DefaultClassify] (connection errors, 408, 429, 500, 502, 503,
	// 504).
	Classify func(err error) bool
	// MaxPushback is the longest server-requested delay (Retry-After and
	// rate-limit reset headers) honoured; a longer one is ignored. 0 means
	// [retry.DefaultMaxPushback].
	MaxPushback time.Duration
	// Admission, if set, caps the requests in flight globally and per
	// session (the affinity key); a refused request fails at once with a
	// [*retry.OverloadError].
	Admission *retry.Admission
	// Reporter, if set, is told how every attempt ended, for example a
	// [*retry.Ejector].
	Reporter retry.Reporter
	// Store, if set, records the ORCA load report (the
	// endpoint-load-metrics header) of every response as a push observation
	// of its endpoint.
	Store *signals.Store
	// MaxPeekBytes bounds the bytes held back before the first event of a
	// stream. 0 means [DefaultMaxPeekBytes].
	MaxPeekBytes int
	// Clock tells the time. nil means the system clock.
	Clock llmlb.Clock
	// After returns a channel that receives after d, like time.After, which
	// is what nil means. Back-offs wait with it.
	After func(d time.Duration) <-chan time.Time
}

// Transport is an [http.RoundTripper] that sends each request to an endpoint
// chosen by an llmlb.Balancer, retries it elsewhere while nothing has been
// streamed, and accounts for it until its response body ends.
//
// For each request it parses the body (see [Parser.Parse]), asks the admission
// caps, and then, per attempt: picks an endpoint excluding the ones already
// tried, rewrites the URL to it and sends the request with the base
// transport. A connection error, a retryable status (by default 408, 429 and
// 5xx but 501) or an error before the first event of a 2xx stream is retried
// while attempts and the budget last, after a back-off that a Retry-After
// header may lengthen but never shorten and that must end before the
// request's deadline. When no endpoint other than the failed ones is left,
// the failed ones become candidates again.
//
// A 2xx response is committed when its first event arrives: for a
// text/event-stream, the first "data:" line; for anything else, the first
// byte. RoundTrip holds back those first bytes, calls the pick's FirstToken
// and returns the response; its body then passes every Read straight through
// (no buffering) and calls the pick's Done exactly once, at the end of the
// body, on a read error, or when it is closed early (a client disconnect).
// After the commitment nothing is retried: a failure mid-stream reaches the
// caller as a read error, never as a silent second attempt. A retryable
// status that cannot be retried any more is returned as the response; a
// transport failure that cannot be retried is returned as a
// [*retry.GiveUpError] wrapping [retry.ErrExhausted].
//
// A Transport is safe for concurrent use and starts no goroutines.
type Transport struct {
	b         *llmlb.Balancer
	base      http.RoundTripper
	url       func(llmlb.Endpoint) *url.URL
	parser    *Parser
	adjust    func(*http.Request, *llmlb.Request)
	attempts  int
	budget    retry.Budget
	backoff   retry.Backoff
	classify  func(error) bool
	pushLimit time.Duration
	adm       *retry.Admission
	reporter  retry.Reporter
	store     *signals.Store
	peek      int
	clock     llmlb.Clock
	after     func(time.Duration) <-chan time.Time
}

// NewTransport returns a Transport configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func NewTransport(cfg Config) (*Transport, error) {
	if cfg.Balancer == nil {
		return nil, configErrorf("nil Balancer")
	}
	if cfg.MaxAttempts < 0 || cfg.MaxPushback < 0 || cfg.MaxPeekBytes < 0 {
		return nil, configErrorf("negative MaxAttempts, MaxPushback or MaxPeekBytes")
	}
	t := &Transport{
		b:         cfg.Balancer,
		base:      cfg.Base,
		url:       cfg.URL,
		parser:    cfg.Parser,
		adjust:    cfg.Adjust,
		attempts:  cfg.MaxAttempts,
		budget:    cfg.Budget,
		backoff:   cfg.Backoff,
		classify:  cfg.Classify,
		pushLimit: cfg.MaxPushback,
		adm:       cfg.Admission,
		reporter:  cfg.Reporter,
		store:     cfg.Store,
		peek:      cfg.MaxPeekBytes,
		clock:     cfg.Clock,
		after:     cfg.After,
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
		b, err := retry.NewPercentBudget(retry.PercentConfig{Clock: cfg.Clock})
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
	if t.pushLimit == 0 {
		t.pushLimit = retry.DefaultMaxPushback
	}
	if t.peek == 0 {
		t.peek = DefaultMaxPeekBytes
	}
	if t.clock == nil {
		t.clock = systemClock{}
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

// CloseIdleConnections closes the idle connections of the base transport, if
// it has such a method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// attempt is the state of one request across its attempts.
type attempt struct {
	t       *Transport
	req     *http.Request // the parsed request, with a re-readable body
	lreq    llmlb.Request
	tried   []string
	release func() // admission
	n       int    // attempts sent
}

// RoundTrip implements [http.RoundTripper]; see [Transport].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	out := req.Clone(ctx)
	lreq, err := t.parser.Parse(out)
	if err != nil {
		return nil, err
	}
	if t.adjust != nil {
		t.adjust(out, &lreq)
	}
	a := &attempt{t: t, req: out, lreq: lreq, release: func() {}}
	if t.adm != nil {
		rel, err := t.adm.Acquire(lreq.AffinityKey)
		if err != nil {
			return nil, err
		}
		a.release = rel
	}
	t.budget.Start()
	resp, err := a.run(ctx)
	if err != nil {
		a.release()
	}
	return resp, err
}

// run sends attempts until one commits or retries run out. On error, every
// attempt's accounting is finished; on success the returned body finishes it.
func (a *attempt) run(ctx context.Context) (*http.Response, error) {
	t := a.t
	var prevWait time.Duration
	for {
		pick, err := a.pick(ctx)
		if err != nil {
			t.budget.Finish(a.n > 0, retry.Abandoned)
			if a.n == 0 {
				return nil, err
			}
			return nil, fmt.Errorf("httplb: pick for retry %d: %w", a.n, err)
		}
		a.n++
		isRetry := a.n > 1
		key := pick.Endpoint().Key()
		resp, err := a.send(ctx, pick)
		if err == nil {
			return resp, nil
		}
		// The attempt failed before its first token.
		var status *retry.StatusError
		retryable := t.classify(err)
		if errors.As(err, &status) && !retryable {
			// An answer that is not retried (a 400, a 404): the caller
			// gets it as it is.
			return a.commitStatus(resp, pick, isRetry, err, retry.Abandoned), nil
		}
		reason := a.giveUp(ctx, err, retryable)
		var wait time.Duration
		if reason == "" {
			wait = t.backoff.Backoff(a.n, prevWait)
			prevWait = wait
			var h http.Header
			if resp != nil {
				h = resp.Header
			}
			pb := retry.FromHeader(h, t.clock.Now(), t.pushLimit)
			switch {
			case pb.Kind == retry.DoNotRetry:
				reason = "pushback"
			case pb.Kind == retry.RetryLater && pb.Delay > wait:
				wait = pb.Delay
			}
			if reason == "" {
				if d, ok := ctx.Deadline(); ok && t.clock.Now().Add(wait).After(d) {
					reason = "deadline"
				}
			}
			if reason == "" && !t.budget.Withdraw() {
				reason = "budget"
			}
		}
		if reason != "" {
			if resp != nil && status != nil {
				// Give the caller the upstream's own answer (a 429 or 503
				// with its Retry-After).
				return a.commitStatus(resp, pick, isRetry, err, outcome(err, retryable)), nil
			}
			a.finish(pick, key, isRetry, err, outcome(err, retryable))
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case !retryable:
				return nil, err
			}
			return nil, &retry.GiveUpError{Attempts: a.n, Reason: reason, Err: err}
		}
		if resp != nil {
			drain(resp.Body)
		}
		a.finish(pick, key, isRetry, err, outcome(err, retryable))
		a.tried = append(a.tried, key)
		if wait > 0 {
			if err := t.sleep(ctx, wait); err != nil {
				t.budget.Finish(true, retry.Abandoned) // the withdrawn retry
				return nil, err
			}
		}
	}
}

// giveUp returns why no retry may follow err, or "" if one may (subject to
// the pushback, the deadline and the budget).
func (a *attempt) giveUp(ctx context.Context, err error, retryable bool) string {
	switch {
	case ctx.Err() != nil:
		return "canceled"
	case !retryable:
		return "error"
	case a.n >= a.t.attempts:
		return "attempts"
	}
	return ""
}

// finish ends one attempt: its pick, the reporter and the budget learn how.
func (a *attempt) finish(pick llmlb.Pick, key string, isRetry bool, err error, o retry.Outcome) {
	pick.Done(err)
	if a.t.reporter != nil {
		a.t.reporter.Report(key, err)
	}
	a.t.budget.Finish(isRetry, o)
}

// outcome classifies a failed attempt for the budget: cancelled attempts and
// answers that are not retried say nothing about the upstream's health.
func outcome(err error, retryable bool) retry.Outcome {
	switch {
	case err == nil:
		return retry.Succeeded
	case !retryable || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return retry.Abandoned
	}
	return retry.Failed
}

// pick picks an endpoint not tried yet, or, if none is left, any endpoint the
// request allows.
func (a *attempt) pick(ctx context.Context) (llmlb.Pick, error) {
	r := a.lreq
	if len(a.tried) > 0 {
		r.Exclude = append(slices.Clip(a.lreq.Exclude), a.tried...)
	}
	p, err := a.t.b.Pick(ctx, &r)
	if err != nil && len(a.tried) > 0 && errors.Is(err, llmlb.ErrNoCandidates) {
		r.Exclude = a.lreq.Exclude
		p, err = a.t.b.Pick(ctx, &r)
	}
	return p, err
}

// send sends one attempt to pick's endpoint. It returns the committed
// response, or an error and, for a status answer, the response whose body
// the caller must close or hand on.
func (a *attempt) send(ctx context.Context, pick llmlb.Pick) (*http.Response, error) {
	t := a.t
	base := t.url(pick.Endpoint())
	if base == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoURL, pick.Endpoint().Key())
	}
	out := a.req.Clone(ctx)
	if a.req.GetBody != nil {
		body, err := a.req.GetBody()
		if err != nil {
			return nil, err
		}
		out.Body = body
	}
	u := *a.req.URL
	u.Scheme, u.Host = base.Scheme, base.Host
	u.Path = joinPath(base.Path, u.Path)
	u.RawPath = ""
	out.URL = &u
	out.Host = ""
	out.RequestURI = ""
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	if t.store != nil {
		_, _ = t.store.RecordResponse(pick.Endpoint().Key(), resp, t.clock.Now(), signals.OrcaMapping{})
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp, &retry.StatusError{Code: resp.StatusCode, Header: resp.Header}
	}
	b := &body{rc: resp.Body}
	if err := b.peek(resp, t.peek); err != nil {
		_ = resp.Body.Close()
		return nil, err
	}
	pick.FirstToken()
	key := pick.Endpoint().Key()
	isRetry := a.n > 1
	b.finish = func(err error) {
		// The attempt produced a response: a success for the budget even if
		// the stream broke later; the reporter sees the error.
		a.finish(pick, key, isRetry, err, retry.Succeeded)
		a.release()
	}
	resp.Body = b
	return resp, nil
}

// commitStatus hands a status answer to the caller; its pick is done when
// the body is.
func (a *attempt) commitStatus(resp *http.Response, pick llmlb.Pick, isRetry bool, err error, o retry.Outcome) *http.Response {
	key := pick.Endpoint().Key()
	b := &body{rc: resp.Body}
	b.finish = func(error) {
		a.finish(pick, key, isRetry, err, o)
		a.release()
	}
	resp.Body = b
	return resp
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

func drain(rc io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, rc, maxDrainBytes)
	_ = rc.Close()
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
