package spill

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/internal/apierror"
)

// hidden reports whether an answer of status code is about the tier rather
// than the request, so that its body reaches the client only as a generic
// error (see replaceBody): the tier's credentials, account or quota (401,
// 402, 403, 429: a managed provider's 429 names the operator's
// organisation, its 401 part of the operator's key) or its failure (5xx,
// whose body may carry stack traces, paths or addresses, and see
// tierFailure). Any other answer describes the request, as a 400 or a 404
// does, and reaches the client as it is.
func hidden(code int) bool {
	switch code {
	case http.StatusUnauthorized, http.StatusPaymentRequired, http.StatusForbidden,
		http.StatusTooManyRequests:
		return true
	}
	return tierFailure(code)
}

// tierFailure reports whether an answer of status code is a failure of the
// tier, logged at level Error: a 5xx; a 407, which a forward proxy on the
// tier's way sends about the gateway's own credentials (the client gets a
// 502, see replaceBody); or a 424, which text-generation-inference answers
// only for a failure of its model shard, InferError::GenerationError,
// "Request failed during generation: " and the shard's error
// (router/src/server.rs, impl From<InferError> for (StatusCode,
// Json<ErrorResponse>), v3.3.7): the engine's, not the request's.
func tierFailure(code int) bool {
	return code >= 500 || code == http.StatusProxyAuthRequired || code == http.StatusFailedDependency
}

// requestFault reports whether a tier's answer, resp or err, says that the
// request itself is at fault, so that another tier would refuse it alike:
// an answer from 400 to 499 other than 408 and 409, which a later try may
// not get, and the statuses about the tier (see hidden); or an error of the
// tier's own checks of the request: a tenant not established
// (httplb.ErrUnauthenticated), a body too large or not read.
func requestFault(resp *http.Response, err error) bool {
	if err != nil || resp == nil {
		return errors.Is(err, httplb.ErrUnauthenticated) || errors.Is(err, httplb.ErrBodyTooLarge) ||
			errors.Is(err, httplb.ErrBodyRead)
	}
	switch c := resp.StatusCode; {
	case c < 400 || c >= 500, c == http.StatusRequestTimeout, c == http.StatusConflict:
		return false
	default:
		return !hidden(c)
	}
}

// failed reports whether a tier's answer, resp or err, is a failure of the
// tier, which says less to the client than a refusal of its request by an
// earlier tier (see requestFault): an error, or a status of 400 or more
// that is no refusal of the request.
func failed(resp *http.Response, err error) bool {
	if err != nil || resp == nil {
		return !requestFault(nil, err)
	}
	return resp.StatusCode >= 400 && !requestFault(resp, nil)
}

// maxLoggedBody is how much of a tier's answer is logged.
const maxLoggedBody = 1 << 10

// drain reads at most n bytes of resp's body, for at most maxDiscardTime,
// and closes it. It returns what it read, and whether that is the whole
// body. A body that stalls is closed unread after maxDiscardTime: an error
// body normally arrives with its headers.
func drain(resp *http.Response, n int) ([]byte, bool) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return nil, true
	}
	stop := time.AfterFunc(maxDiscardTime, func() { _ = resp.Body.Close() })
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(n)+1))
	stopped := stop.Stop()
	_ = resp.Body.Close()
	whole := err == nil && len(b) <= n && stopped
	return b[:min(len(b), n)], whole
}

// logText returns the text of head, the first bytes of an answer's body, to
// log: decoded as its Content-Encoding says (see decoded), or as it came if
// it cannot be, at most maxLoggedBody bytes.
func logText(head []byte, h http.Header) string {
	if text := decoded(head, h.Get("Content-Encoding")); text != nil {
		head = text
	}
	return string(head[:min(len(head), maxLoggedBody)])
}

// keptHeaders are the headers of a tier's answer that reach the client
// when its body does not (see replaceBody): when to come back, as the
// OpenAI SDKs read it. Every other header may name the operator's account
// (OpenAI's openai-organization and openai-project), deployment or region,
// and the rate-limit headers its quota; those do not reach the client of
// any answer (see apierror.StripAccount).
var keptHeaders = []string{"Retry-After", "Retry-After-Ms"}

// replaceBody replaces the body and headers of resp, an answer of a status
// that hidden reports, with an error in the OpenAI format whose message is
// generic, naming the request by id if it has one (see clientID): the
// status stays, and so do the error's type and code if they are plain
// tokens (OpenAI's "insufficient_quota" or "rate_limit_exceeded", say),
// which tell a client what happened without naming anything, and the
// headers of keptHeaders. A 429 or 503 that asks for a wait with a
// rate-limit reset alone gets a Retry-After of that wait, if at most limit
// (see apierror.RetryAfter). A 407, about the gateway's own credentials
// with a forward proxy, becomes a 502 with none of its headers, type or
// code. The new body
// is an *apierror.Replaced, which tells httplb's NewUpstreamErrorHandler
// that the answer is logged already. It returns what it read of the body,
// which it closes.
func replaceBody(resp *http.Response, id string, now time.Time, limit time.Duration) []byte {
	body, whole := drain(resp, maxPeekBytes)
	var typ string
	var code any
	if whole {
		typ, code = apierror.Fields(decoded(body, resp.Header.Get("Content-Encoding")))
	}
	defTyp, message := "upstream_error", "The upstream failed to answer."
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		defTyp, message = "rate_limit_error", "The upstream is rate limited; retry later."
	case http.StatusUnauthorized:
		defTyp, message = "authentication_error", "The upstream refused the request's credentials."
	case http.StatusPaymentRequired, http.StatusForbidden:
		defTyp, message = "permission_error", "The upstream refused the request."
	}
	if typ == "" {
		typ = defTyp
	}
	if code == nil {
		code = resp.StatusCode
	}
	if id != "" {
		message += " Request ID: " + id
	}
	h := make(http.Header)
	if resp.StatusCode == http.StatusProxyAuthRequired {
		// A forward proxy on the tier's way to its upstream wants the
		// gateway's own credentials: nothing the client can send, so
		// the gateway got no answer, as httplb's NewUpstreamErrorHandler
		// has it. The proxy's type, code and headers (Retry-After
		// included) are the proxy's.
		resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
		typ, code = defTyp, http.StatusBadGateway
	} else {
		for _, k := range keptHeaders {
			if v := resp.Header.Values(k); len(v) > 0 {
				h[k] = v
			}
		}
		if v := apierror.RetryAfter(resp.StatusCode, resp.Header, now, limit); v != "" {
			h.Set("Retry-After", v)
		}
	}
	var buf bytes.Buffer
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   any    `json:"param"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type, e.Error.Code = message, typ, code
	_ = json.NewEncoder(&buf).Encode(&e)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	if id != "" {
		h.Set(requestIDHeader, id)
	}
	resp.Header = h
	resp.Body = apierror.NewReplaced(buf.Bytes())
	resp.ContentLength = int64(buf.Len())
	resp.TransferEncoding = nil
	resp.Trailer = nil
	resp.Uncompressed = false
	return body
}

// clientID returns r's X-Request-Id, the id its client knows it by, if it
// is one httplb would send (see apierror.Plain), or "".
func clientID(r *http.Request) string {
	if id := r.Header.Get(requestIDHeader); id != "" && len(id) <= maxRequestIDLen && apierror.Plain(id) {
		return id
	}
	return ""
}

// logInterval is how long the log of a tier's answers that requests
// spilled past stays quiet about one tier and upstream once it has told of
// one: an endpoint that fails every request is logged once in each
// interval, with the number of answers left unlogged since the last record.
const logInterval = 10 * time.Second

// maxLogKeys bounds the tiers and upstreams whose last record is kept.
const maxLogKeys = 1024

// limiter spaces out the log records of a key (see logInterval). The zero
// value is ready; it is safe for concurrent use.
type limiter struct {
	mu   sync.Mutex           // protects last
	last map[string]*logEntry // lazily initialized
}

type logEntry struct {
	at         time.Time // of the last record
	suppressed int       // answers not logged since
}

// allow reports whether a record of key may be logged at now and, if so,
// how many were not since the last one. Past maxLogKeys keys, those whose
// interval is over are forgotten, and a new key is logged unrecorded if
// none is.
func (l *limiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.last[key]; ok {
		if now.Sub(e.at) < logInterval && !now.Before(e.at) {
			e.suppressed++
			return false, 0
		}
		n := e.suppressed
		e.at, e.suppressed = now, 0
		return true, n
	}
	if l.last == nil {
		l.last = make(map[string]*logEntry)
	}
	if len(l.last) >= maxLogKeys {
		for k, e := range l.last {
			if now.Sub(e.at) >= logInterval {
				delete(l.last, k)
			}
		}
		if len(l.last) >= maxLogKeys {
			return true, 0
		}
	}
	l.last[key] = &logEntry{at: now}
	return true, 0
}

// answerAttrs returns the log attributes of tier's answer, resp or err, to
// request r: the tier, the request's id, the status and the upstream that
// answered (its host, as the tier's transport sent the request there), or
// the error, and the start of the body, decoded as its header h says.
func answerAttrs(r *http.Request, tier string, resp *http.Response, err error, body []byte, h http.Header) []slog.Attr {
	attrs := []slog.Attr{slog.String("tier", tier)}
	if id := clientID(r); id != "" {
		attrs = append(attrs, slog.String("request_id", id))
	}
	attrs = append(attrs, slog.String("method", r.Method), slog.String("path", r.URL.Path))
	if err != nil {
		return append(attrs, slog.Any("error", err))
	}
	if resp == nil {
		return attrs
	}
	attrs = append(attrs, slog.Int("status", resp.StatusCode))
	if resp.Request != nil && resp.Request.URL != nil {
		attrs = append(attrs, slog.String("upstream", resp.Request.URL.Host))
	}
	return append(attrs, slog.String("body", logText(body, h)))
}

// upstreamOf returns the host resp answered from, or "".
func upstreamOf(resp *http.Response) string {
	if resp == nil || resp.Request == nil || resp.Request.URL == nil {
		return ""
	}
	return resp.Request.URL.Host
}

// logger returns the Transport's logger.
func (t *Transport) logger() *slog.Logger {
	if t.log != nil {
		return t.log
	}
	return slog.Default()
}

// logSpilled logs tier i's answer, resp or err, that request r spilled
// past for reason, with body, what was read of it: at level Warn for a
// failure of the tier (a 5xx, or unreachable), which would otherwise never
// reach the operator's log, and at Info for a refusal under load or a
// context too long. One record in each logInterval is logged for a tier and
// upstream, with the number of answers left out since the last.
func (t *Transport) logSpilled(r *http.Request, i int, to string, reason Reason, resp *http.Response, err error, body []byte) {
	level := slog.LevelInfo
	if reason == ServerError || reason == Unreachable {
		level = slog.LevelWarn
	}
	t.logLimited(r, level, "spill: tier refused the request, sent to the next tier", i, resp, err, body,
		slog.String("to", to), slog.String("reason", string(reason)))
}

// logLimited logs msg about tier i's answer to r, resp or err, one record
// in each logInterval for the tier and upstream.
func (t *Transport) logLimited(r *http.Request, level slog.Level, msg string, i int, resp *http.Response, err error, body []byte, extra ...slog.Attr) {
	log := t.logger()
	if !log.Enabled(r.Context(), level) {
		return
	}
	ok, suppressed := t.limit.allow(t.tiers[i].Name+"\x00"+upstreamOf(resp), t.clock.Now())
	if !ok {
		return
	}
	var h http.Header
	if resp != nil {
		h = resp.Header
	}
	attrs := append(answerAttrs(r, t.tiers[i].Name, resp, err, body, h), extra...)
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	log.LogAttrs(r.Context(), level, msg, attrs...)
}
