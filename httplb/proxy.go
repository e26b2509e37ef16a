package httplb

import (
	"context"
	"encoding/json"
	"errors"
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

// NewProxy returns a reverse proxy that sends every request through t:
// its Rewrite sets the X-Forwarded headers and leaves the upstream URL to
// the transport, it flushes every write at once so that streamed events reach
// the client as they are produced (FlushInterval -1), and its ErrorHandler
// is [ErrorHandler]. The returned proxy may be modified before use.
func NewProxy(t *Transport) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			pr.Out.Host = ""
		},
		Transport:     t,
		FlushInterval: -1,
		ErrorHandler:  ErrorHandler,
	}
}

// ErrorHandler answers a request that a [Transport] could not serve, in the
// OpenAI error format:
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
// Its signature is that of [httputil.ReverseProxy.ErrorHandler].
func ErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	var oe *retry.OverloadError
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", err)
	case errors.As(err, &oe):
		writeRetryAfter(w, oe.RetryAfter)
		writeError(w, http.StatusTooManyRequests, "rate_limit_error", err)
	case errors.Is(err, retry.ErrOverloaded), errors.Is(err, llmlb.ErrNoCandidates), errors.Is(err, llmlb.ErrNoEndpoints):
		writeRetryAfter(w, DefaultRetryAfter)
		writeError(w, http.StatusTooManyRequests, "rate_limit_error", err)
	case r.Context().Err() != nil && errors.Is(err, context.Canceled):
		// The client is gone; there is no one to answer.
	default:
		writeError(w, http.StatusBadGateway, "upstream_error", err)
	}
}

func writeRetryAfter(w http.ResponseWriter, d time.Duration) {
	if d <= 0 {
		d = DefaultRetryAfter
	}
	secs := int64(math.Ceil(d.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
}

func writeError(w http.ResponseWriter, code int, typ string, err error) {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	body.Error.Message = err.Error()
	body.Error.Type = typ
	body.Error.Code = code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&body)
}
