package httplb

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"

	"github.com/llmlb/llmlb/internal/apierror"
)

// handleFirstError treats the error event that resp, a 2xx stream the
// Transport committed to without retrying it, starts with (see
// [body.peek]) as handleUpstreamError treats an answer of the status the
// event stands for: the event, held back and not yet read, is logged, and,
// for a status about the upstream rather than the request (5xx, 401, 402,
// 403, 407, 429, and text-generation-inference's 424 for a failure of its
// model shard), replaced in the stream with one of the same shape whose
// message is generic and names the request by its id, keeping the error's
// type and code if they are plain tokens. The error's message may carry
// engine internals (a stack trace, a path, an address) or the operator's
// account. An event of any other status (a 400 for a prompt too long, say)
// describes the request and reaches the client as sent. resp then gets the
// request's id in X-Request-Id. Each later error event of the stream is
// treated alike as the stream is read (see [body.scrubEvents]), but for
// the log records after the first few; every other byte passes unchanged.
func handleFirstError(log *slog.Logger, resp *http.Response) {
	b, ok := heldBody(resp.Body)
	if !ok {
		return
	}
	r := resp.Request
	id := requestID(r)
	hidden := false // the first event's value was replaced
	if b.firstErr != 0 && b.errAt < b.errEnd && b.errEnd <= len(b.buf) {
		resp.Header.Set(requestIDHeader, id)
		span := b.buf[b.errAt:b.errEnd]
		if generic := hideEvent(log, r, id, b.firstErr, spanValue(span), "at its first event"); generic != nil {
			hidden = true
			generic = appendRewritten(nil, span, generic)
			if b.scanned >= b.errEnd {
				b.scanned += len(generic) - (b.errEnd - b.errAt)
			}
			b.buf = slices.Concat(b.buf[:b.errAt], generic, b.buf[b.errEnd:])
		}
		b.firstErr, b.errAt, b.errEnd = 0, 0, 0
	}
	logged := 0
	b.scrubEvents(func(status int, value []byte) []byte {
		l := log
		if logged++; logged > maxLoggedEvents {
			l = discardLog
		}
		return hideEvent(l, r, id, status, value, "after its first event")
	}, hidden)
	if b.scrub != nil {
		// Its length is no longer the upstream's once an error event is
		// replaced, at its first event or later.
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
}

// heldBody returns the *body that rc is, or that it reads through: a body
// that wraps another says so with an Unwrap method returning it, as
// package spill's does, which strips its answers' trailers. It looks
// through at most maxUnwrap wrappers.
func heldBody(rc io.ReadCloser) (*body, bool) {
	for range maxUnwrap {
		switch b := rc.(type) {
		case *body:
			return b, true
		case interface{ Unwrap() io.ReadCloser }:
			rc = b.Unwrap()
		default:
			return nil, false
		}
	}
	return nil, false
}

// maxUnwrap bounds the wrappers heldBody looks through, so that one whose
// Unwrap returns itself does not hold it.
const maxUnwrap = 8

// maxLoggedEvents is how many of a stream's error events after its first
// go to the log: an upstream that sends them by the thousand has them
// replaced, not logged, past these.
const maxLoggedEvents = 8

// discardLog is a logger that logs nothing.
var discardLog = slog.New(slog.DiscardHandler)

// hideEvent logs value, the value of an error event of a stream to r
// standing for status, and returns the value it is replaced by for the
// client, whose request's id is id, or nil if it reaches the client as
// sent (see handleFirstError). where says where in the stream it came.
func hideEvent(log *slog.Logger, r *http.Request, id string, status int, value []byte, where string) []byte {
	attrs := append(upstreamAttrs(r, id, status),
		slog.String("event", string(value[:min(len(value), maxLoggedBody)])))
	typ, message, level := "upstream_error", "The upstream failed to answer.", slog.LevelError
	switch c := status; {
	case c == http.StatusUnauthorized:
		typ, message, level = "authentication_error", "The upstream refused the request's credentials.", slog.LevelInfo
	case c == http.StatusPaymentRequired, c == http.StatusForbidden:
		typ, message, level = "permission_error", "The upstream refused the request.", slog.LevelInfo
	case c == http.StatusTooManyRequests:
		typ, message, level = "rate_limit_error", "The upstream is rate limited; retry later.", slog.LevelInfo
	case c == http.StatusProxyAuthRequired, c == http.StatusFailedDependency, c >= 500:
	default:
		log.LogAttrs(r.Context(), slog.LevelInfo, "httplb: upstream's stream refused the request "+where, attrs...)
		return nil
	}
	log.LogAttrs(r.Context(), level, "httplb: upstream's stream failed "+where, attrs...)
	return genericErrorEvent(value, status, typ, message+" Request ID: "+id)
}

// genericErrorEvent returns value, the JSON of an error event, with its
// error's message replaced by message, and its error's type and code kept
// only if they are plain tokens (else typ and status): the "error" object
// of vLLM's, SGLang's, OpenAI's and Anthropic's events, replaced whole by
// {"message", "type", "code"}; the "error" string of
// text-generation-inference's, beside its "error_type" if that is a plain
// token; the error of an OpenAI Responses "response.failed" event's
// response, replaced by {"code", "message"}; the "message" and "code" of
// an OpenAI Responses "error" event or of llama.cpp's error line. The
// event's other members stay. A value of no such shape becomes {"error":
// {"message", "type", "code"}}.
func genericErrorEvent(value []byte, status int, typ, message string) []byte {
	t, c := apierror.Fields(value)
	if t == "" {
		t = typ
	}
	if c == nil {
		c = status
	}
	errObj := marshalJSON(struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	}{message, t, c})
	var top map[string]json.RawMessage
	if json.Unmarshal(value, &top) != nil {
		return marshalJSON(map[string]json.RawMessage{errorKey: errObj})
	}
	e := bytes.TrimSpace(top[errorKey])
	switch {
	case len(e) > 0 && e[0] == '{':
		top[errorKey] = errObj
	case len(e) > 0 && e[0] == '"':
		top[errorKey] = marshalJSON(message)
		var et string
		if json.Unmarshal(top["error_type"], &et) != nil || !apierror.IsToken(et) {
			delete(top, "error_type")
		}
	case jsonString(top[typeKey]) == failedType && len(top["response"]) > 0:
		var resp map[string]json.RawMessage
		if json.Unmarshal(top["response"], &resp) != nil {
			return marshalJSON(map[string]json.RawMessage{errorKey: errObj})
		}
		_, rc := apierror.Fields(resp[errorKey])
		if rc == nil {
			rc = status
		}
		resp[errorKey] = marshalJSON(struct {
			Code    any    `json:"code"`
			Message string `json:"message"`
		}{rc, message})
		top["response"] = marshalJSON(resp)
	case top["message"] != nil:
		top["message"] = marshalJSON(message)
		var code any = status
		if _, tc := apierror.Fields(value); tc != nil {
			code = tc
		}
		top["code"] = marshalJSON(code)
		var et string
		if top[typeKey] != nil && (json.Unmarshal(top[typeKey], &et) != nil || !apierror.IsToken(et)) {
			delete(top, typeKey)
		}
	default:
		return marshalJSON(map[string]json.RawMessage{errorKey: errObj})
	}
	return marshalJSON(top)
}

// marshalJSON returns the JSON of v, which must be encodable, without HTML
// escaping.
func marshalJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
