package httplb

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
)

// DefaultRetryAfter is the Retry-After suggested when no endpoint can take a
// request and nothing more precise is known.
const DefaultRetryAfter = time.Second

// requestIDHeader carries a request's id, both ways.
const requestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds the length of a client's request id that is reused.
const maxRequestIDLen = 128

// NewProxy returns a reverse proxy that sends every request through t:
// its Rewrite sets the X-Forwarded headers and leaves the upstream URL to
// the transport, it flushes every write at once so that streamed events reach
// the client as they are produced (FlushInterval -1), and its ErrorHandler
// is the handler of [NewErrorHandler] with a nil logger, which logs the
// details of each failure with [slog.Default]; set it to NewErrorHandler
// with another logger to log them elsewhere. The returned proxy may be
// modified before use.
func NewProxy(t *Transport) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			pr.Out.Host = ""
		},
		Transport:     t,
		FlushInterval: -1,
		ErrorHandler:  errorHandler,
	}
}

// errorHandler is the handler returned by [NewErrorHandler] with a nil
// logger: it logs with [slog.Default]. [NewProxy] installs it.
func errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	handleError(slog.Default(), w, r, err)
}

// NewErrorHandler returns a handler for [httputil.ReverseProxy.ErrorHandler]
// that answers a request a [Transport] could not serve. The client gets a
// generic message in the OpenAI error format,
//
//	{"error":{"message":"... Request ID: req_...","type":"upstream_error","code":502}}
//
// and never the error itself, whose text may name upstream addresses, TLS
// or DNS details; the status is
//
//   - 413 Request Entity Too Large for a body over the cap ([ErrBodyTooLarge]);
//   - 429 Too Many Requests with a Retry-After header when no endpoint may
//     take the request: an admission cap is reached ([retry.ErrOverloaded],
//     with the cap's suggested wait), the request excludes every endpoint
//     ([llmlb.ErrNoCandidates]: all were tried) or there are none
//     ([llmlb.ErrNoEndpoints]), with [DefaultRetryAfter];
//   - nothing when the client has gone away (its context is cancelled);
//   - 502 Bad Gateway for every other failure (connection errors, retries
//     given up).
//
// Each answer carries a request id, in its message and in the X-Request-Id
// response header: the request's own X-Request-Id if it has one of at most
// 128 letters, digits, '-', '_', '.' or ':', or else a new random one. The
// error itself goes to log (nil means [slog.Default] at the time of the
// failure) with the same id, so that an operator can find what a client
// reports: a 502 at level Error, a 413 or 429 at Info, a client gone at
// Debug, each with the attributes request_id, method, path, status and
// error.
func NewErrorHandler(log *slog.Logger) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		l := log
		if l == nil {
			l = slog.Default()
		}
		handleError(l, w, r, err)
	}
}

func handleError(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	id := requestID(r)
	var (
		code    int
		typ     string
		message string
		level   = slog.LevelInfo
		oe      *retry.OverloadError
	)
	switch {
	case errors.Is(err, ErrUnauthenticated):
		code, typ, message = http.StatusUnauthorized, "authentication_error", "The request could not be authenticated."
	case errors.Is(err, ErrBodyTooLarge):
		code, typ, message = http.StatusRequestEntityTooLarge, "invalid_request_error", "The request body is too large."
	case errors.As(err, &oe):
		writeRetryAfter(w, oe.RetryAfter)
		code, typ, message = http.StatusTooManyRequests, "rate_limit_error", "Too many requests are in flight; retry later."
	case errors.Is(err, retry.ErrOverloaded), errors.Is(err, llmlb.ErrNoCandidates), errors.Is(err, llmlb.ErrNoEndpoints):
		writeRetryAfter(w, DefaultRetryAfter)
		code, typ, message = http.StatusTooManyRequests, "rate_limit_error", "No upstream can take the request now; retry later."
	case r.Context().Err() != nil && errors.Is(err, context.Canceled):
		// The client is gone; there is no one to answer.
		logError(log, slog.LevelDebug, r, id, 0, err)
		return
	default:
		code, typ, message, level = http.StatusBadGateway, "upstream_error", "The upstream failed to answer.", slog.LevelError
	}
	logError(log, level, r, id, code, err)
	w.Header().Set(requestIDHeader, id)
	writeError(w, code, typ, message+" Request ID: "+id)
}

func logError(log *slog.Logger, level slog.Level, r *http.Request, id string, code int, err error) {
	log.LogAttrs(r.Context(), level, "httplb: proxy error",
		slog.String("request_id", id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", code),
		slog.Any("error", err))
}

// requestID returns r's X-Request-Id if it is short and plain, or a new
// random id.
func requestID(r *http.Request) string {
	if id := r.Header.Get(requestIDHeader); validRequestID(id) {
		return id
	}
	return "req_" + rand.Text()
}

func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

func writeRetryAfter(w http.ResponseWriter, d time.Duration) {
	if d <= 0 {
		d = DefaultRetryAfter
	}
	secs := int64(math.Ceil(d.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
}

func writeError(w http.ResponseWriter, code int, typ, message string) {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	body.Error.Message = message
	body.Error.Type = typ
	body.Error.Code = code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&body)
}
