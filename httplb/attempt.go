package httplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/retry"
	"github.com/llmlb/llmlb/signals"
)

// RoundTrip implements [http.RoundTripper]; see [Transport].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	// The id answers and logs name the request by, whatever the attempts
	// send upstream.
	ctx := withoutInterim(withRequestID(req.Context(), req.Header.Get(requestIDHeader)))
	out := req.Clone(ctx)
	// The answer must be readable here (its first event, error events,
	// the output tokens): the base transport asks for the encodings it
	// decodes, an *http.Transport gzip, rather than the client's.
	out.Header.Del("Accept-Encoding")
	resolveDotSegments(out.URL)
	var info bodyInfo
	lreq, err := t.parser.parse(out, &info)
	if err != nil {
		return nil, err
	}
	if t.adjust != nil {
		t.adjust(out, &lreq)
	}
	a := &attempt{t: t, req: out, release: func() {}, attempts: t.attempts}
	if t.ids != nil {
		unpinned := lreq.Exclude
		if isResponses(out) {
			a.learn = !info.noStore
			if info.prevID != nil {
				if t.pin(&lreq, info.prevID) {
					// The response continued is in the memory of one
					// endpoint: any other would answer 404, so none is
					// tried.
					a.attempts, a.pinned, a.unpinned = 1, true, unpinned
				} else {
					// Produced through another router, or forgotten: the
					// endpoints are probed for it (see probeNext).
					a.probeID = string(info.prevID)
				}
			}
		} else if id, ok := storedResponseID(out.Method, out.URL.Path); ok {
			// A retrieve, cancel or delete of a stored response: sent
			// once, to the endpoint holding it if it is known, else to
			// each endpoint in turn while they answer 404. Its answer is
			// no new output.
			a.attempts, a.stored = 1, true
			if t.pinString(&lreq, id) {
				a.pinned, a.unpinned = true, unpinned
			} else {
				a.probeID = id
			}
		}
	}
	a.lreq = lreq
	if t.adm != nil {
		rel, err := t.adm.Acquire(admissionKey(&lreq))
		if err != nil {
			return nil, err
		}
		a.release = rel
	}
	if t.queue != nil {
		if err := a.admitFair(ctx); err != nil {
			a.release()
			return nil, err
		}
	}
	t.budget.Start()
	var resp *http.Response
	if t.hedging && a.attempts > 1 && a.probeID == "" {
		resp, err = a.runHedged(ctx)
	} else {
		resp, err = a.run(ctx)
	}
	if err != nil {
		a.release()
		return nil, err
	}
	// The caller's response: its end also releases the admission slot.
	b := resp.Body.(*body)
	inner := b.finish
	b.finish = func(err error) {
		inner(err)
		a.release()
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		u := upgradeBody{b, b.rc.(io.Writer)} // see checkUpgrade
		if ctx.Value(proxiedKey{}) != nil {
			// NewProxy's ReverseProxy leaves the switched connection open
			// when it cannot take over the client's (a ResponseWriter
			// that cannot be hijacked) and closes it when the request
			// ends otherwise: close it then in every case.
			context.AfterFunc(ctx, func() { _ = u.Close() })
		}
		resp.Body = u
	} else {
		b.watch(ctx)
	}
	return resp, nil
}

// attempt is the state of one request across its attempts.
type attempt struct {
	t        *Transport
	req      *http.Request // the parsed request, with a re-readable body
	lreq     llmlb.Request
	tried    []string     // endpoints picked so far
	release  func()       // admission caps and fair queue
	ticket   *fair.Ticket // the fair queue's admission, if any
	n        int          // attempts sent
	prevWait time.Duration
	// attempts bounds the attempts sent: Config.Retry.MaxAttempts, or 1
	// for a request pinned to the endpoint holding the response it
	// continues (see Transport.pin).
	attempts int
	// learn is set for a Responses request whose response may be stored:
	// the id of a committed answer is remembered with its endpoint.
	learn bool
	// stored is set for a request addressing a stored response (see
	// storedResponseID): its answer is committed at its first byte, even
	// an event stream, and its output is not counted.
	stored bool
	// pinned is set while the request is pinned to one endpoint, all
	// others being in lreq.Exclude; unpinned is lreq.Exclude without
	// them.
	pinned   bool
	unpinned []string
	// probeID is the id of the stored response that a request not pinned
	// addresses (continues, retrieves, cancels or deletes): while the
	// endpoints answer 404, it is sent to the next one (see probeNext).
	probeID string
	// probe is the pick of the next endpoint probed, made by probeNext and
	// taken by next.
	probe *llmlb.Pick

	// committed is set by the attempt that commits: the first to receive
	// its first event, or the one whose status answer is handed to the
	// caller. Once it is set no attempt is started and no other commits.
	committed atomic.Bool
}

// try is one attempt: the pick, and once sent, its response or error. A
// committed response's body (a *body) finishes the attempt when it ends.
type try struct {
	pick    llmlb.Pick
	key     string
	start   time.Time          // when picked; set only with a hedge Percentile or a retry.ElapsedReporter
	n       int                // the attempt's number, from 1
	isRetry bool               // sent with a budget withdrawal (a retry or a hedge)
	probe   bool               // sent to look for a stored response (see probeNext)
	cancel  context.CancelFunc // cancels a hedged attempt; nil otherwise
	// endCtx releases the context of an attempt with a first-event timer;
	// nil otherwise. Set by send, called by finish.
	endCtx context.CancelCauseFunc
	resp   *http.Response
	err    error
}

// next picks the endpoint of the next attempt (see pick) and makes it the
// request's next attempt.
func (a *attempt) next(ctx context.Context, fallback bool) (*try, error) {
	if p := a.probe; p != nil {
		a.probe = nil
		tr := a.add(*p)
		tr.probe = true
		return tr, nil
	}
	p, err := a.pick(ctx, fallback)
	if err != nil {
		return nil, err
	}
	return a.add(p), nil
}

// pick picks the endpoint of the next attempt: one not tried yet, or, if
// none is left and fallback is set, any endpoint the request allows. The
// pick is not an attempt until add makes it one; one that is not sent is
// ended with errNotSent.
func (a *attempt) pick(ctx context.Context, fallback bool) (llmlb.Pick, error) {
	r := a.lreq
	if len(a.tried) > 0 {
		r.Exclude = append(slices.Clip(a.lreq.Exclude), a.tried...)
	}
	p, err := a.t.b.Pick(ctx, &r)
	if err != nil && a.pinned && errors.Is(err, llmlb.ErrNoCandidates) {
		// The endpoint left since the request was pinned to it: its
		// response is gone with it, and the request is routed as any
		// other.
		a.lreq.Exclude, a.pinned = a.unpinned, false
		r.Exclude = append(slices.Clip(a.lreq.Exclude), a.tried...)
		p, err = a.t.b.Pick(ctx, &r)
	}
	if err != nil && fallback && len(a.tried) > 0 && errors.Is(err, llmlb.ErrNoCandidates) {
		r.Exclude = a.lreq.Exclude
		p, err = a.t.b.Pick(ctx, &r)
	}
	return p, err
}

// add makes p the request's next attempt.
func (a *attempt) add(p llmlb.Pick) *try {
	a.n++
	tr := &try{pick: p, key: p.Endpoint().Key(), n: a.n, isRetry: a.n > 1}
	if a.t.hedge.Percentile > 0 || a.t.elapsed != nil {
		tr.start = a.t.clock.Now()
	}
	a.tried = append(a.tried, tr.key)
	return tr
}

// pickError is what Do returns when a pick fails.
func (a *attempt) pickError(err error) error {
	a.t.budget.Finish(a.n > 0, retry.Abandoned)
	if a.n == 0 {
		return err
	}
	return fmt.Errorf("httplb: pick for retry %d: %w", a.n, err)
}

// run sends attempts one after the other until one commits or retries run
// out. On error every attempt is finished; on success the returned body
// finishes the winner.
func (a *attempt) run(ctx context.Context) (*http.Response, error) {
	var prev *try // the failed attempt the next one retries
	for {
		tr, err := a.next(ctx, true)
		if err != nil {
			return nil, a.pickError(err)
		}
		if prev != nil {
			a.retried(tr, prev)
		}
		a.send(ctx, tr)
		if tr.err == nil {
			return tr.resp, nil
		}
		wait, done, resp, err := a.failed(ctx, tr)
		if done {
			return resp, err
		}
		if wait > 0 {
			if err := a.t.sleep(ctx, wait); err != nil {
				a.t.budget.Finish(true, retry.Abandoned) // the withdrawn retry
				return nil, err
			}
		}
		prev = tr
	}
}

// retried tells the observer that tr, about to be sent, follows the
// failed attempt prev: as a probe if it looks for a stored response, else
// as a retry.
func (a *attempt) retried(tr, prev *try) {
	f := a.t.obs.Retry
	if tr.probe {
		f = a.t.obs.Probe
	}
	if f != nil {
		f(tr.n, a.retryCause(prev))
	}
}

// runHedged is run with hedging: when an attempt has not committed after
// the hedge delay, another is sent to another endpoint (within the attempts
// and the budget); the first to commit wins and the others are cancelled and
// finished before it is returned. Each attempt runs on its own goroutine, and
// all have returned when runHedged does.
func (a *attempt) runHedged(ctx context.Context) (*http.Response, error) {
	t := a.t
	// Every result is received before runHedged returns: the buffer only
	// spares the attempts in flight at once (the first and its hedges) a
	// wait, and MaxAttempts, which has no upper bound, must not size it.
	results := make(chan *try, 1+min(t.hedge.MaxHedges, a.attempts-1, 16))
	inflight := 0
	var sent []*try // every attempt launched
	launch := func(tr *try) {
		actx, cancel := context.WithCancel(ctx)
		tr.cancel = cancel
		inflight++
		sent = append(sent, tr)
		go func() {
			a.send(actx, tr)
			results <- tr
		}()
	}
	// abandon cancels and finishes the attempts in flight other than the
	// winner.
	abandon := func(winner *try) {
		for _, tr := range sent {
			if tr != winner {
				tr.cancel() // cancelling a finished attempt is harmless
			}
		}
		for ; inflight > 0; inflight-- {
			// Only the winner commits: the others all failed.
			tr := <-results
			tr.cancel()
			if tr.resp != nil {
				drain(tr.resp.Body)
			}
			err, o := error(context.Canceled), retry.Abandoned
			var status *retry.StatusError
			if errors.As(tr.err, &status) {
				// Its upstream answered before it was cancelled: the
				// answer (a 429 and the wait it asks for, say) is the
				// endpoint's, whichever attempt won.
				err, o = tr.err, outcome(tr.err, t.classify(tr.err))
			}
			a.finish(tr, err, o)
		}
	}
	tr, err := a.next(ctx, true)
	if err != nil {
		return nil, a.pickError(err)
	}
	launch(tr)
	hedges := 0
	hedgeAt := t.hedgeTimer()
	for {
		select {
		case tr := <-results:
			inflight--
			if tr.err == nil {
				abandon(tr)
				return tr.resp, nil
			}
			if inflight > 0 {
				// Another attempt is still on its way: this failure is
				// only recorded, unless it is an answer to give the caller
				// and no attempt has committed meanwhile (the winner's
				// result is then on its way).
				var status *retry.StatusError
				if errors.As(tr.err, &status) && !t.classify(tr.err) && a.committed.CompareAndSwap(false, true) {
					abandon(tr)
					return a.commitStatus(tr, retry.Abandoned), nil
				}
				if tr.resp != nil {
					drain(tr.resp.Body)
				}
				a.finish(tr, tr.err, outcome(tr.err, t.classify(tr.err)))
				continue
			}
			wait, done, resp, err := a.failed(ctx, tr)
			if done {
				return resp, err
			}
			if wait > 0 {
				if err := t.sleep(ctx, wait); err != nil {
					t.budget.Finish(true, retry.Abandoned)
					return nil, err
				}
			}
			next, err := a.next(ctx, true)
			if err != nil {
				return nil, a.pickError(err)
			}
			a.retried(next, tr)
			launch(next)
			hedgeAt = t.hedgeTimer()
		case <-hedgeAt:
			hedgeAt = nil
			// An attempt that committed may not have reported yet: its
			// result is on its way, and nothing is hedged after it.
			if a.committed.Load() || hedges >= t.hedge.MaxHedges || a.n >= a.attempts {
				continue
			}
			// The pick comes before the withdrawal, so that a hedge with
			// no endpoint to go to takes no budget.
			p, err := a.pick(ctx, false)
			if err != nil {
				continue // no other endpoint, or the client is gone: keep waiting
			}
			// The client may have gone during the pick (Pick checks its
			// context first), or an attempt committed: no hedge starts
			// after either.
			if ctx.Err() != nil || a.committed.Load() {
				p.Done(errNotSent)
				continue
			}
			if !t.budget.Withdraw() {
				p.Done(errNotSent)
				if t.obs.Denied != nil {
					t.obs.Denied()
				}
				continue
			}
			next := a.add(p)
			hedges++
			if t.obs.Hedge != nil {
				t.obs.Hedge(a.n)
			}
			launch(next)
			hedgeAt = t.hedgeTimer()
		}
	}
}

// failed handles an attempt that failed before its first token, with no
// other attempt in flight. It either ends the request (done, with the
// caller's response or error) or allows a retry after wait, with the budget
// withdrawn and the failed attempt finished.
func (a *attempt) failed(ctx context.Context, tr *try) (wait time.Duration, done bool, resp *http.Response, err error) {
	t := a.t
	var status *retry.StatusError
	isStatus := errors.As(tr.err, &status)
	if isStatus && status.Code == http.StatusNotFound && a.probeID != "" {
		if a.probeNext(ctx) {
			if tr.resp != nil {
				drain(tr.resp.Body)
			}
			a.finish(tr, tr.err, retry.Abandoned)
			return 0, false, nil, nil
		}
		return 0, true, a.commitStatus(tr, retry.Abandoned), nil
	}
	retryable := t.classify(tr.err)
	if isStatus && !retryable {
		// An answer that is not retried (a 400, a 404): the caller gets
		// it as it is.
		return 0, true, a.commitStatus(tr, retry.Abandoned), nil
	}
	reason := ""
	switch {
	case ctx.Err() != nil:
		reason = "canceled"
	case !retryable:
		reason = "error"
	case a.n >= a.attempts:
		reason = "attempts"
	}
	if reason == "" {
		wait = t.backoff.Backoff(a.n, a.prevWait)
		a.prevWait = wait
		var h http.Header
		if tr.resp != nil {
			h = tr.resp.Header
		}
		pb := retry.FromHeader(h, t.clock.Now(), t.pushLimit)
		switch {
		case pb.Kind == retry.DoNotRetry:
			reason = "pushback"
		case pb.Kind == retry.RetryLater && pb.Delay > wait && t.pushLimit > 0:
			wait = pb.Delay
		}
		if reason == "" {
			// The context's deadline is on the wall clock, not t.clock.
			if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
				reason = "deadline"
			}
		}
		if reason == "" && !t.budget.Withdraw() {
			reason = "budget"
			if t.obs.Denied != nil {
				t.obs.Denied()
			}
		}
	}
	o := outcome(tr.err, retryable)
	if reason == "" {
		if tr.resp != nil {
			drain(tr.resp.Body)
		}
		a.finish(tr, tr.err, o)
		return wait, false, nil, nil
	}
	if isStatus {
		// Give the caller the upstream's own answer (a 429 or 503 with its
		// Retry-After).
		return 0, true, a.commitStatus(tr, o), nil
	}
	a.finish(tr, tr.err, o)
	switch {
	case ctx.Err() != nil:
		return 0, true, nil, ctx.Err()
	case !retryable:
		return 0, true, nil, tr.err
	}
	return 0, true, nil, &retry.GiveUpError{Attempts: a.n, Reason: reason, Err: tr.err}
}

// probeNext picks the next endpoint to probe for the stored response that
// the request addresses, after an endpoint answered 404, and reports
// whether there is one: an endpoint not tried yet, and the retry budget's
// leave to send it. The stores are per process, so a response unknown to
// this Transport (produced through another replica of the router, or
// before it restarted) is on any endpoint, and vLLM and SGLang answer 404
// for a response they do not hold before they compute anything
// (vllm/entrypoints/openai/serving_responses.py, _make_not_found_error,
// for a retrieve, a cancel and a previous_response_id). Each endpoint is
// tried once at most, so a request makes at most one attempt per member,
// and each probe after the first is a retry for the budget, which bounds
// what a client sending unknown ids can make the pool answer.
func (a *attempt) probeNext(ctx context.Context) bool {
	t := a.t
	if ctx.Err() != nil {
		return false
	}
	p, err := a.pick(ctx, false)
	if err != nil {
		return false
	}
	if !t.budget.Withdraw() {
		p.Done(errNotSent)
		if t.obs.Denied != nil {
			t.obs.Denied()
		}
		return false
	}
	a.probe = &p
	return true
}

// retryCause is the cause given to the Retry and Probe observers for the
// failed attempt tr: its error, with the endpoint and the id the attempt
// was sent with, which the error alone does not name (a status answer's
// says only the status).
func (a *attempt) retryCause(tr *try) error {
	if id := attemptID(a.req, tr.n); id != "" {
		return fmt.Errorf("httplb: request %s, endpoint %s: %w", id, tr.key, tr.err)
	}
	return fmt.Errorf("httplb: endpoint %s: %w", tr.key, tr.err)
}

// attemptID returns the X-Request-Id that attempt n of req is sent with, or
// "" if req has none this package would send: the request's own for the
// first attempt, with "-n" appended for each later one (a retry or a
// hedge), which may go to the same engine while it still holds an earlier
// attempt: vLLM takes the header for its own request id and refuses one it
// is running.
func attemptID(req *http.Request, n int) string {
	id := req.Header.Get(requestIDHeader)
	switch {
	case !validRequestID(id):
		return ""
	case n <= 1:
		return id
	}
	return id + "-" + strconv.Itoa(n)
}

// finish ends one attempt: its pick, the reporter and the budget learn how,
// and a hedged attempt's context is released.
func (a *attempt) finish(tr *try, err error, o retry.Outcome) {
	tr.pick.Done(pickError(err))
	switch {
	case a.t.elapsed != nil:
		a.t.elapsed.ReportElapsed(tr.key, a.t.clock.Now().Sub(tr.start), err)
	case a.t.reporter != nil:
		a.t.reporter.Report(tr.key, err)
	}
	a.t.budget.Finish(tr.isRetry, o)
	if tr.cancel != nil {
		tr.cancel()
	}
	if tr.endCtx != nil {
		tr.endCtx(nil)
	}
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

// send sends the attempt to its endpoint. On success tr.resp is committed:
// its first event has arrived, no other attempt had committed, FirstToken was
// called, and its body finishes the attempt when it ends. Otherwise tr.err
// says why, and for a status answer tr.resp holds the response, whose body the
// caller must close or hand on.
func (a *attempt) send(ctx context.Context, tr *try) {
	t := a.t
	if a.committed.Load() {
		// A hedge launched as another attempt committed: not sent.
		tr.err = errOutrun
		return
	}
	var timer *eventTimer
	if t.firstWait > 0 {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		tr.endCtx = cancel
		timer = t.startEventTimer(cancel, fmt.Errorf("%w: none from %s within %v", ErrFirstEventTimeout, tr.key, t.firstWait))
	}
	resp, b, err := a.roundTrip(ctx, tr)
	if timer != nil && !timer.stop() {
		// Too late, whatever the attempt got (typically an error caused
		// by the cancellation).
		if resp != nil {
			drain(resp.Body)
		}
		tr.err = timer.err
		return
	}
	switch {
	case err != nil:
		tr.resp, tr.err = resp, err // resp is a status answer or nil
		return
	case !a.committed.CompareAndSwap(false, true):
		_ = resp.Body.Close()
		tr.err = errOutrun
		return
	}
	tr.pick.FirstToken()
	if t.hedge.Percentile > 0 {
		t.ttft.Add(t.clock.Now().Sub(tr.start))
	}
	if q, ok := t.reporter.(retry.QuotaReporter); ok {
		q.ReportQuota(tr.key, resp.Header)
	}
	if a.stored && a.probeID != "" {
		// The endpoint answered for the response: it holds it. (The
		// response a continuation continues is not remembered: its answer
		// is, and the conversation goes on from there.)
		t.ids.learnString(a.probeID, tr.key)
	}
	if a.learn && resp.StatusCode != http.StatusSwitchingProtocols {
		if id := heldResponseID(b.buf, isEventStream(resp.Header)); id != nil {
			t.ids.learn(id, tr.key)
		}
	}
	if t.afterCommit != nil {
		t.afterCommit()
	}
	if !a.stored {
		b.out.c, b.out.pick, b.out.tk, b.metered = NewOutputCounter(resp.Header), tr.pick, a.ticket, true
	}
	b.finish = func(err error) {
		// The attempt produced a response: a success for the budget even if
		// the stream broke later (the reporter sees the error).
		a.finish(tr, err, retry.Succeeded)
	}
	resp.Body = b
	tr.resp = resp
}

// roundTrip sends the attempt with the base transport and waits for the
// first event of a 2xx response, which it returns with its held-back body b.
// A status answer is returned with a [*retry.StatusError], and so is a 2xx
// stream whose first event is an error event (see [body.peek]), with the
// event's code and a *body holding the bytes held back; any other failure
// with a nil response.
func (a *attempt) roundTrip(ctx context.Context, tr *try) (resp *http.Response, b *body, err error) {
	t := a.t
	base, err := t.baseURL(tr.pick.Endpoint(), a.req.URL.Path)
	if err != nil {
		return nil, nil, err
	}
	out := a.req.Clone(ctx)
	if id := attemptID(a.req, tr.n); id != "" {
		out.Header.Set(requestIDHeader, id)
	}
	if a.req.GetBody != nil {
		body, err := a.req.GetBody()
		if err != nil {
			return nil, nil, err
		}
		out.Body = body
		// The body is read already and sent from memory: a client's
		// 100-continue expectation was for the server that read it.
		// Forwarded, it would hold each attempt's body until the endpoint
		// answers 100 Continue (up to a second with DefaultTransport).
		out.Header.Del("Expect")
	}
	u := *a.req.URL
	u.Scheme, u.Host = base.Scheme, base.Host
	u.Path = joinPath(base.Path, u.Path)
	u.RawPath = ""
	if a.req.URL.RawPath != "" || base.RawPath != "" {
		// Keep the path's escaping, such as an escaped slash.
		u.RawPath = joinPath(base.EscapedPath(), a.req.URL.EscapedPath())
	}
	out.URL = &u
	out.Host = ""
	out.RequestURI = ""
	resp, err = t.base.RoundTrip(out)
	if err != nil {
		return nil, nil, err
	}
	if resp == nil {
		return nil, nil, fmt.Errorf("httplb: base RoundTripper %T returned a nil response and a nil error", t.base)
	}
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	if t.store != nil {
		_, _ = t.store.RecordResponse(tr.key, resp, t.clock.Now(), signals.OrcaMapping{})
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if err := checkUpgrade(out.Header, resp); err != nil {
			_ = resp.Body.Close()
			return nil, nil, err
		}
		// The switch is the commitment: the session streams from here,
		// whichever side speaks first.
		return resp, &body{rc: resp.Body}, nil
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp, nil, &retry.StatusError{Code: resp.StatusCode, Header: resp.Header}
	}
	b = &body{rc: resp.Body}
	code, err := b.peekAs(isEventStream(resp.Header) && !a.stored, peekSize(a.req), t.peek+preambleAllowance(a.req))
	if err != nil {
		_ = resp.Body.Close()
		return nil, nil, err
	}
	if code != 0 {
		// The first event is an error: nothing was produced, as with a
		// status answer, which the attempt then is. Handed to the caller,
		// it is the stream as sent.
		resp.Body = b
		return resp, nil, fmt.Errorf("%w first: %w", ErrErrorEvent, &retry.StatusError{Code: code, Header: resp.Header})
	}
	return resp, b, nil
}

// commitStatus hands a status answer to the caller; its attempt is finished
// when the body is.
func (a *attempt) commitStatus(tr *try, o retry.Outcome) *http.Response {
	resp := tr.resp
	err := tr.err
	b := &body{rc: resp.Body}
	if held, ok := resp.Body.(*body); ok {
		// The *body, finishing nothing, of a stream whose first event was
		// an error: its bytes held back, and where the error is in them.
		b.rc, b.buf, b.firstErr, b.errAt, b.errEnd = held.rc, held.buf, held.firstErr, held.errAt, held.errEnd
		b.stream, b.scanned, b.cut, b.named = held.stream, held.scanned, held.cut, held.named
		b.holdValue, b.valueAt = held.holdValue, held.valueAt
	}
	b.finish = func(error) { a.finish(tr, err, o) }
	resp.Body = b
	return resp
}

// hedgeTimer returns a channel that receives when a hedge is due: after the
// hedge Delay or, with a Percentile, after that quantile of the winners'
// times to first event if it is longer and enough were seen. It returns nil
// while there is no delay to wait.
func (t *Transport) hedgeTimer() <-chan time.Time {
	d := t.hedge.Delay
	if t.hedge.Percentile > 0 {
		if q, ok := t.ttft.Quantile(t.hedge.Percentile); ok {
			d = max(d, q)
		}
	}
	if d <= 0 {
		return nil
	}
	return t.wait(d)
}

// wait returns a channel that receives after d.
func (t *Transport) wait(d time.Duration) <-chan time.Time {
	if t.after != nil {
		return t.after(d)
	}
	return time.After(d)
}

// peekSize returns the capacity with which an attempt of req starts holding
// back its answer's first bytes: for an OpenAI Responses request, 4 KiB,
// which holds vLLM's two preamble events, each of which repeats the
// response object (about 1 KiB without instructions or tools), in one
// buffer; for any other request, 512 bytes, more than a first chat or
// completion chunk. The buffer grows, up to the peek limit, if needed.
func peekSize(req *http.Request) int {
	if isResponses(req) {
		return 4 << 10
	}
	return 512
}

// preambleAllowance is how many bytes beyond Config.MaxPeekBytes an
// attempt of req may hold back before its first event: for an OpenAI
// Responses request, twice its body, since each of the preamble events
// held back before its first output (response.created and
// response.in_progress; see preambleEvent) repeats the request's
// instructions and tools; for any other request, none. The body is held in
// memory already, bounded by Config.MaxBodyBytes.
func preambleAllowance(req *http.Request) int {
	if req.ContentLength <= 0 || !strings.HasSuffix(req.URL.Path, "/responses") {
		return 0
	}
	return int(min(req.ContentLength, math.MaxInt32)) * 2
}
