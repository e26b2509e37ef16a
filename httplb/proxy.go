package httplb

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/apierror"
	"github.com/llmlb/llmlb/retry"
)

// DefaultRetryAfter is the Retry-After suggested with a 429 when the
// refusal suggests no wait of its own.
const DefaultRetryAfter = time.Second

// requestIDHeader carries a request's id, both ways.
const requestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds the length of a client's request id that is reused.
const maxRequestIDLen = 128

// NewProxy returns a reverse proxy that sends every request through t:
// its Rewrite sets the X-Forwarded headers, gives a request without a valid
// X-Request-Id (as [NewErrorHandler] defines it) a new one, which is sent
// upstream and names the request in every log record about it, and leaves
// the upstream URL to the transport, it flushes every write at once so that
// streamed events reach the client as they are produced (FlushInterval -1),
// its ErrorHandler is the handler of [NewErrorHandler] and its
// ModifyResponse that of [NewUpstreamErrorHandler], both with a nil logger,
// which log the details of each failure with [slog.Default]; set them to
// the same with another logger to log elsewhere. No answer through it
// carries the upstream's headers about the operator's account: its
// organisation, project, deployment, region, rate limits or cookies (see
// NewUpstreamErrorHandler), nor does an upstream's interim (1xx) answer
// reach the client, since t does not report them (see [Transport]). The
// returned proxy may be modified before use.
func NewProxy(t *Transport) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			pr.Out.Host = ""
			id := pr.Out.Header.Get(requestIDHeader)
			if !validRequestID(id) {
				id = newRequestID()
				pr.Out.Header.Set(requestIDHeader, id)
			}
			// The client's id, whatever tiers and attempts (package spill,
			// the Transport) make of the header sent upstream.
			ctx := context.WithValue(pr.Out.Context(), requestIDKey{}, id)
			if upgradeType(pr.In.Header) != "" { // see proxiedKey
				ctx = context.WithValue(ctx, proxiedKey{}, true)
			}
			pr.Out = pr.Out.WithContext(ctx)
		},
		Transport:      t,
		FlushInterval:  -1,
		ErrorHandler:   errorHandler,
		ModifyResponse: upstreamErrorHandler,
	}
}

// upstreamErrorHandler is the function returned by
// [NewUpstreamErrorHandler] with a nil logger. [NewProxy] installs it.
func upstreamErrorHandler(resp *http.Response) error {
	handleUpstreamError(slog.Default(), resp)
	return nil
}

// NewUpstreamErrorHandler returns a function for
// [httputil.ReverseProxy.ModifyResponse] that treats the error answers of
// upstreams as [NewErrorHandler] treats the failures of a [Transport]. An
// answer of 500 or more (one the Transport did not retry, or the last one
// when it gave up) reaches the client with its status and headers, such as
// Retry-After, but with a generic body in the OpenAI error format and a
// request id instead of the upstream's own body, which may carry stack
// traces, paths or addresses; the status and the first kilobyte of the
// upstream's body go to log at level Error. So does a 424, which
// text-generation-inference answers only for a failure of its model shard
// ("Request failed during generation: " and the shard's own error). A 407
// Proxy Authentication Required, which a forward proxy on the gateway's way
// to the upstream sends about the gateway's own credentials, is treated
// alike but reaches the client as a 502 Bad Gateway without any of its
// headers. A 401, 402, 403 or 429 reaches the client with its status, its
// Retry-After and Retry-After-Ms headers and a generic body, keeping the
// error's type and code if they are plain tokens ("insufficient_quota"),
// but none of its
// other headers or its message: it is about the upstream's credentials,
// account or capacity rather than the request, and a managed provider's
// names the operator's organisation or part of its key. The upstream's body
// is logged at Info. Any other answer from 400 to 499 (a context length exceeded, a
// validation error) reaches the client unchanged, since it describes the
// client's request, and is logged at Info. Either carries the request id in its X-Request-Id header, chosen as
// by NewErrorHandler: the id of the request the [Transport] (or NewProxy)
// was given, not the one the answering attempt was sent with, which has a
// suffix on a retry or a hedge ("-2") or in a later tier of package spill.
// Each log record has the attributes request_id, method, path, status and
// upstream (the endpoint that answered), and upstream_request_id, the id the
// upstream was sent, when that differs. nil log means [slog.Default] at the
// time of the answer. An answer whose body package spill replaced with a
// generic one, and logged with the tier's own, is neither logged nor
// replaced again.
//
// A 2xx stream whose first event is an error event the Transport did not
// retry (see the package documentation), read from the body the Transport
// returned or through a body that wraps it and returns it from an Unwrap
// method (as package spill's Transport does), is treated as an answer of the
// status the event stands for: the event as sent goes to the log, with the
// attribute event in place of body, and, for a 5xx, 401, 402, 403, 407,
// 424 or 429, the client gets it in its own shape (an "error" object, a
// text-generation-inference "error" string, a Responses "error" or
// "response.failed" event, llama.cpp's error line; the data of an event
// named "error" of no such shape, all its data lines, becomes one line of
// {"error": {...}}, or keeps its other members if it is a JSON object with
// a "message") with a generic message naming the request id, and the
// error's type and code only if they are plain tokens; the 200 stays, and
// so does every other byte of the stream.
// An error event of another status, a 400 for a prompt too long say,
// reaches the client as sent. Each later error event of an uncompressed
// event stream (the engine failing mid-generation) is treated alike as the
// client reads the stream, logged with the message "httplb: upstream's
// stream failed after its first event" (or "refused the request"), the
// first 8 of a stream only. The stream's lines are held back until their
// ends, and the lines of an event from its first data line on until the
// event's end, its blank line, which a streaming engine writes with each
// event and where a client dispatches the event: the last "event:" line
// before that names the event, after the event's data too, and the data
// of an event so named "error" is replaced whole, all its data lines; that
// of an event named "error" and then otherwise passes as sent. The first
// event, which the Transport committed to if the peek limit cut it short
// before it was named "error", is treated alike: its data is held back to
// its event's end too. At most 64 KiB of a stream is held back: an event that
// outgrows it before its end passes as sent, the rest of it as it comes,
// unless it is named "error" by then, when the data held is replaced and
// the rest of its data dropped up to its end (the stream still ends its
// pick as failed either way, if it carried an error event).
//
// Every answer, a 200 as much as an error, loses the headers that name or
// describe the operator's account with the upstream rather than the answer:
// its organisation, project, deployment or region (OpenAI's
// openai-organization and openai-project, Anthropic's
// anthropic-organization-id, Azure's x-ms-region and x-ms-deployment-name,
// azureml-model-deployment), its quota (x-ratelimit-*,
// anthropic-ratelimit-*, RateLimit: the operator's, which the [Transport]
// has read before the answer gets here), and the cookies it sets
// (Set-Cookie: a provider's CDN's, such as Cloudflare's __cf_bm, or a
// replica's, which are theirs and not the gateway's). It loses too the
// headers that are the upstream's own rather than the answer's: Server,
// X-Powered-By and Via, which name the engine, its version and the hosts
// and proxies behind the gateway; endpoint-load-metrics, a replica's ORCA
// load report, which the Transport's Store has read; and the upstream
// origin's policies that a browser would apply to the gateway's
// (Strict-Transport-Security, Alt-Svc, NEL, Report-To,
// Reporting-Endpoints). Its trailers lose the same, those its Trailer
// header announces and those that arrive unannounced after its body
// (which the ReverseProxy forwards too), and an answer whose body is
// replaced with a generic one loses them all: they were its upstream
// body's. Retry-After and Retry-After-Ms stay; a 429 or 503
// with neither, whose rate-limit reset asks for a wait (OpenAI's
// x-ratelimit-reset-requests or -tokens, Anthropic's
// anthropic-ratelimit-*-reset) of at most [retry.DefaultMaxCooldown], gets
// a Retry-After of that wait in whole seconds, as package spill gives it.
// Answers under 400 are otherwise untouched, but for a stream's first
// error event, above. In every answer, a Location header
// (a redirect's, a 201 Created's) that names the upstream's own host loses
// its scheme and host, becoming relative to the gateway: a server builds
// such a URL (a redirect for a trailing slash, say) from the address it
// was sent. So do a Content-Location of that host and each such URI of a
// Link header.
func NewUpstreamErrorHandler(log *slog.Logger) func(*http.Response) error {
	return func(resp *http.Response) error {
		l := log
		if l == nil {
			l = slog.Default()
		}
		handleUpstreamError(l, resp)
		return nil
	}
}

// maxLoggedBody is how much of an upstream's error body is logged, and
// maxParsedBody how much is read for its type and code.
const (
	maxLoggedBody = 1 << 10
	maxParsedBody = 8 << 10
)

func handleUpstreamError(log *slog.Logger, resp *http.Response) {
	defer stripTrailer(resp, resp.Body)
	// The Transport has read the rate-limit headers already (its
	// retry.QuotaReporter, at the first event, and its retries' waits),
	// and its Store the ORCA load report: RoundTrip returned before the
	// proxy calls this. A 429's or 503's rate-limit reset, when it asks
	// for a wait and no Retry-After does, becomes the client's
	// Retry-After, as package spill has it: the client gets no other hint
	// of the wait.
	retryAfter := apierror.RetryAfter(resp.StatusCode, resp.Header, time.Now(), retry.DefaultMaxCooldown)
	apierror.StripUpstream(resp.Header)
	if retryAfter != "" {
		resp.Header.Set("Retry-After", retryAfter)
	}
	if resp.Request == nil {
		return
	}
	relativeLocation(resp.Header, resp.Request.URL.Host)
	if resp.StatusCode < 400 {
		handleFirstError(log, resp)
		return
	}
	r := resp.Request // the request sent upstream
	id := requestID(r)
	resp.Header.Set(requestIDHeader, id)
	// An answer whose body package spill replaced, and logged with the
	// tier's own body, is not logged again with the generic one; nor is
	// its body, generic already and keeping the error's plain type and
	// code, replaced again (spill makes a 407 a 502, as below).
	if _, replaced := resp.Body.(*apierror.Replaced); replaced {
		return
	}
	attrs := upstreamAttrs(r, id, resp.StatusCode)
	typ, message := "upstream_error", "The upstream failed to answer."
	var code any = resp.StatusCode
	refused := false // an answer about the upstream's credentials, account or capacity
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		typ, message, refused = "authentication_error", "The upstream refused the request's credentials.", true
	case http.StatusPaymentRequired, http.StatusForbidden:
		typ, message, refused = "permission_error", "The upstream refused the request.", true
	case http.StatusTooManyRequests:
		typ, message, refused = "rate_limit_error", "The upstream is rate limited; retry later.", true
	case http.StatusProxyAuthRequired, http.StatusFailedDependency:
		// A 424 is text-generation-inference's answer to a failure of
		// its model shard and to nothing else: only
		// InferError::GenerationError maps to it
		// (router/src/server.rs, impl From<InferError> for (StatusCode,
		// Json<ErrorResponse>), v3.3.7; see tgiErrors), "Request failed
		// during generation: " and the shard's own error, which is the
		// engine's and not the request's.
	default:
		if resp.StatusCode < 500 {
			log.LogAttrs(r.Context(), slog.LevelInfo, "httplb: upstream refused the request", attrs...)
			return
		}
	}
	head := readHead(resp.Body, maxParsedBody)
	logged := slog.String("body", string(head[:min(len(head), maxLoggedBody)]))
	if refused {
		// The error's type and code, if plain tokens ("insufficient_quota"),
		// tell the client what happened without naming anything.
		if t, c := apierror.Fields(head); t != "" || c != nil {
			if t != "" {
				typ = t
			}
			if c != nil {
				code = c
			}
		}
		log.LogAttrs(r.Context(), slog.LevelInfo, "httplb: upstream refused the request", append(attrs, logged)...)
	} else {
		log.LogAttrs(r.Context(), slog.LevelError, "httplb: upstream failed", append(attrs, logged)...)
	}
	if resp.StatusCode == http.StatusProxyAuthRequired {
		// A proxy between the gateway and the upstream wants the
		// gateway's credentials: nothing the client can send, and its
		// page and headers (Via, Server) name the proxy. The gateway got
		// no answer.
		resp.StatusCode, resp.Status, code = http.StatusBadGateway, "502 Bad Gateway", http.StatusBadGateway
		clear(resp.Header)
		resp.Header.Set(requestIDHeader, id)
	}
	if refused {
		// Its headers name the upstream's account too (a managed
		// provider's organisation and project, its rate-limit windows):
		// only the wait it asks for is the client's.
		for k := range resp.Header {
			switch k {
			case "Retry-After", "Retry-After-Ms", requestIDHeader:
			default:
				delete(resp.Header, k)
			}
		}
	}
	var buf bytes.Buffer
	encodeError(&buf, code, typ, message+" Request ID: "+id)
	resp.Body = io.NopCloser(&buf)
	resp.ContentLength = int64(buf.Len())
	resp.TransferEncoding = nil
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Set("Content-Length", strconv.Itoa(buf.Len()))
	resp.Header.Del("Content-Encoding")
}

// upstreamAttrs returns the attributes of a log record about the answer of
// status to r, the request sent upstream, whose client knows it as id.
func upstreamAttrs(r *http.Request, id string, status int) []slog.Attr {
	attrs := []slog.Attr{
		slog.String("request_id", id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.String("upstream", r.URL.Host),
	}
	if sent := r.Header.Get(requestIDHeader); sent != "" && sent != id {
		// A retry's or another tier's id, which the upstream logged.
		attrs = append(attrs, slog.String("upstream_request_id", sent))
	}
	return attrs
}

// relativeLocation makes h's Location and Content-Location relative to the
// gateway, without scheme and host, if they are absolute URLs of the
// upstream's host, and so each URI of its Link header: see relativeURL.
func relativeLocation(h http.Header, host string) {
	if host == "" {
		return
	}
	for _, name := range [...]string{"Location", "Content-Location"} {
		if rel, ok := relativeURL(h.Get(name), host); ok {
			h.Set(name, rel)
		}
	}
	var links []string // h's Link values, once one is rewritten
	for i, v := range h.Values("Link") {
		if rel, ok := relativeLinks(v, host); ok {
			if links == nil {
				links = slices.Clone(h.Values("Link"))
			}
			links[i] = rel
		}
	}
	if links != nil {
		h["Link"] = links
	}
}

// relativeURL returns loc relative to the gateway, without scheme and host,
// and true, if it is an absolute URL of the upstream's host, on any port
// (as servers build redirects and resource URLs from the Host they were
// sent, such as a trailing slash's redirect): the client must not learn the
// address of the upstream, nor bypass the gateway by following it. A path
// that starts with several slashes, which a server echoes from the
// request's own path ("http://upstream//evil.example/x"), keeps one:
// without its host, "//evil.example/x" would be a URL of another host,
// where the client would follow the gateway's redirect.
func relativeURL(loc, host string) (string, bool) {
	if loc == "" {
		return "", false
	}
	u, err := url.Parse(loc)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Hostname(), (&url.URL{Host: host}).Hostname()) {
		return "", false
	}
	u.Scheme, u.Host, u.User, u.OmitHost = "", "", nil, false
	if u.Path == "" {
		u.Path = "/"
	}
	rel := u.String()
	if strings.HasPrefix(rel, "//") {
		rel = "/" + strings.TrimLeft(rel, "/")
	}
	return rel, true
}

// relativeLinks returns v, a Link header's value (RFC 8288: link-values,
// each a URI in angle brackets and its parameters), with each URI that
// relativeURL rewrites rewritten, and true if one was. Quoted parameter
// values are passed over, so that an angle bracket in one does not count
// as a URI.
func relativeLinks(v, host string) (string, bool) {
	var out strings.Builder
	changed := false
	last := 0 // v[:last] is in out
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			for i++; i < len(v) && v[i] != '"'; i++ {
				if v[i] == '\\' {
					i++
				}
			}
		case '<':
			end := strings.IndexByte(v[i+1:], '>')
			if end < 0 {
				i = len(v)
				break
			}
			end += i + 1
			if rel, ok := relativeURL(v[i+1:end], host); ok {
				out.WriteString(v[last : i+1])
				out.WriteString(rel)
				last, changed = end, true
			}
			i = end
		}
	}
	if !changed {
		return v, false
	}
	out.WriteString(v[last:])
	return out.String(), true
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
//   - 401 Unauthorized when the tenant could not be established
//     ([ErrUnauthenticated]);
//   - 413 Request Entity Too Large for a body over the cap ([ErrBodyTooLarge]);
//   - 408 Request Timeout for a body not received before the connection's
//     read deadline, and 400 Bad Request for another failure to read it
//     ([ErrBodyRead]);
//   - 429 Too Many Requests with a Retry-After header when the request is
//     refused under load: an admission cap is reached or the fair queue
//     sheds it ([retry.ErrOverloaded]), with the suggested wait of its
//     [*retry.OverloadError] or else [DefaultRetryAfter];
//   - 503 Service Unavailable, of type "service_unavailable", when there
//     is no endpoint to send the request to: the balancer has none
//     ([llmlb.ErrNoEndpoints], a configuration or discovery outage) or the
//     request excludes every one ([llmlb.ErrNoCandidates]);
//   - 500 Internal Server Error, of type "server_error", when the request
//     could not be routed for a configuration error: an endpoint without a
//     usable URL ([ErrNoURL], [ErrInvalidConfig]) or a request out of range
//     after [Config.Adjust] ([llmlb.ErrInvalidRequest]);
//   - nothing when the client has gone away (its context is cancelled);
//   - 502 Bad Gateway for every other failure (connection errors, retries
//     given up).
//
// Each answer carries a request id, in its message and in the X-Request-Id
// response header: the request's own X-Request-Id if it has one of at most
// 128 letters, digits, '-', '_', '.' or ':', or else a new random one. The
// error itself goes to log (nil means [slog.Default] at the time of the
// failure) with the same id, so that an operator can find what a client
// reports: a 5xx at level Error, a 4xx at Info, a client gone at Debug,
// each with the attributes request_id, method, path, status and error.
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
	case errors.Is(err, ErrBodyRead) && isTimeout(err):
		// The server cancels the request's context when a read of its
		// connection fails, but the client is there to be told.
		code, typ, message = http.StatusRequestTimeout, "invalid_request_error", "The request body was not received in time."
	case errors.Is(err, ErrBodyRead) && r.Context().Err() == nil:
		code, typ, message = http.StatusBadRequest, "invalid_request_error", "The request body could not be read."
	case errors.As(err, &oe):
		writeRetryAfter(w, oe.RetryAfter)
		code, typ, message = http.StatusTooManyRequests, "rate_limit_error", "Too many requests are in flight; retry later."
	case errors.Is(err, retry.ErrOverloaded):
		writeRetryAfter(w, DefaultRetryAfter)
		code, typ, message = http.StatusTooManyRequests, "rate_limit_error", "No upstream can take the request now; retry later."
	case errors.Is(err, llmlb.ErrNoEndpoints), errors.Is(err, llmlb.ErrNoCandidates):
		code, typ, message, level = http.StatusServiceUnavailable, "service_unavailable", "No model server is available.", slog.LevelError
	case misconfigured(err), errors.Is(err, llmlb.ErrInvalidRequest):
		code, typ, message, level = http.StatusInternalServerError, "server_error", "The request could not be routed.", slog.LevelError
	case r.Context().Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, ErrBodyRead)):
		// The client is gone (the server cancels the request's context
		// when a read of its connection fails, as when the client goes
		// away while sending its body); there is no one to answer.
		logError(log, slog.LevelDebug, r, id, 0, err)
		return
	default:
		code, typ, message, level = http.StatusBadGateway, "upstream_error", "The upstream failed to answer.", slog.LevelError
	}
	logError(log, level, r, id, code, err)
	w.Header().Set(requestIDHeader, id)
	writeError(w, code, typ, message+" Request ID: "+id)
}

// isTimeout reports whether err is a network timeout, such as a read
// deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func logError(log *slog.Logger, level slog.Level, r *http.Request, id string, code int, err error) {
	log.LogAttrs(r.Context(), level, "httplb: proxy error",
		slog.String("request_id", id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", code),
		slog.Any("error", err))
}

// requestIDKey is the context key of the id of the request as its client
// knows it: the X-Request-Id that [NewProxy] sent on, or that a Transport
// was given. The header of each attempt sent upstream may differ (see
// attemptID); answers and log records name the request by this id.
type requestIDKey struct{}

// withRequestID returns ctx carrying id as the request's id, unless ctx
// already carries one, which an outer Transport or NewProxy set.
func withRequestID(ctx context.Context, id string) context.Context {
	if !validRequestID(id) || ctx.Value(requestIDKey{}) != nil {
		return ctx
	}
	return context.WithValue(ctx, requestIDKey{}, id)
}

// requestID returns the id of r as its client knows it: the one r's
// context carries (see requestIDKey), else r's X-Request-Id if it is short
// and plain, or else a new random id.
func requestID(r *http.Request) string {
	if id, ok := r.Context().Value(requestIDKey{}).(string); ok {
		return id
	}
	if id := r.Header.Get(requestIDHeader); validRequestID(id) {
		return id
	}
	return newRequestID()
}

// newRequestID returns a new random request id.
func newRequestID() string { return "req_" + rand.Text() }

func validRequestID(id string) bool {
	return id != "" && len(id) <= maxRequestIDLen && apierror.Plain(id)
}

func writeRetryAfter(w http.ResponseWriter, d time.Duration) {
	if d <= 0 {
		d = DefaultRetryAfter
	}
	secs := int64(math.Ceil(d.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
}

func writeError(w http.ResponseWriter, code int, typ, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	encodeError(w, code, typ, message)
}

// encodeError writes the OpenAI error format's body to w; code is a status
// number or an error's plain token.
func encodeError(w io.Writer, code any, typ, message string) {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	body.Error.Message = message
	body.Error.Type = typ
	body.Error.Code = code
	_ = json.NewEncoder(w).Encode(&body)
}
