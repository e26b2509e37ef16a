package retry

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultMaxPushback is the longest server-requested delay honoured by
// default; a longer one is ignored, as Envoy does.
const DefaultMaxPushback = 300 * time.Second

// PushbackKind says what a server asked for. It is a plain value, safe to
// use from any goroutine.
type PushbackKind uint8

const (
	// NoPushback: the header is absent, its delay is above the cap, or it is
	// an HTTP header (Retry-After, a rate-limit reset) whose value is
	// negative or malformed; such a value is ignored, as Envoy ignores it.
	// The caller's own back-off applies.
	NoPushback PushbackKind = iota
	// RetryLater: the server asked to wait Delay before retrying. A retry
	// waits max(back-off, Delay): pushback never shortens a back-off.
	RetryLater
	// DoNotRetry: the server asked not to retry. Only gRPC has a way to
	// say so: a grpc-retry-pushback-ms that is negative or unparseable
	// means it, as gRPC's retry design (gRFC A6) specifies, and so does
	// one sent more than once, as grpc-go has it. HTTP's Retry-After and
	// rate-limit resets only ever ask for a wait.
	DoNotRetry
)

// String returns the kind's name.
func (k PushbackKind) String() string {
	switch k {
	case NoPushback:
		return "none"
	case RetryLater:
		return "retry-later"
	case DoNotRetry:
		return "do-not-retry"
	}
	return "PushbackKind(" + strconv.Itoa(int(k)) + ")"
}

// Pushback is a server's answer to "when may I retry?".
type Pushback struct {
	// Kind says whether the server asked for nothing, a wait, or no retry.
	Kind PushbackKind
	// Delay is the requested wait when Kind is RetryLater, in [0, cap].
	Delay time.Duration
}

func later(d, limit time.Duration) Pushback {
	if d < 0 {
		d = 0
	}
	if d > limit {
		return Pushback{}
	}
	return Pushback{Kind: RetryLater, Delay: d}
}

func limitOr(limit time.Duration) time.Duration {
	if limit <= 0 {
		return DefaultMaxPushback
	}
	return limit
}

// ParseRetryAfter parses an HTTP Retry-After value: delay-seconds (a
// non-negative number; a fraction is accepted) or an HTTP-date, taken
// relative to now (a date in the past means retry now). A delay above limit
// (0 means [DefaultMaxPushback]) is ignored: NoPushback. An empty, negative
// or unparseable value is ignored too (NoPushback), as Envoy ignores a reset
// header it cannot parse: the field can only ask for a wait, so a malformed
// one does not forbid the retry.
func ParseRetryAfter(v string, now time.Time, limit time.Duration) Pushback {
	limit = limitOr(limit)
	v = strings.TrimSpace(v)
	if v == "" {
		return Pushback{}
	}
	if d, ok := parseSeconds(v); ok {
		return later(d, limit)
	}
	if t, err := http.ParseTime(v); err == nil {
		return later(t.Sub(now), limit)
	}
	return Pushback{}
}

// ParseGRPCPushback parses gRPC's grpc-retry-pushback-ms trailer: a
// non-negative integer of milliseconds. A delay above limit (0 means
// [DefaultMaxPushback]) is ignored: NoPushback. An empty value is NoPushback;
// a negative or unparseable one is DoNotRetry, as gRPC specifies.
func ParseGRPCPushback(v string, limit time.Duration) Pushback {
	limit = limitOr(limit)
	v = strings.TrimSpace(v)
	if v == "" {
		return Pushback{}
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return Pushback{Kind: DoNotRetry}
		}
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms > int64(limit/time.Millisecond) {
		return Pushback{} // all digits, so only too large
	}
	return later(time.Duration(ms)*time.Millisecond, limit)
}

// unixThreshold separates delta-seconds from Unix timestamps in rate-limit
// reset headers: no sane reset is 30 years away, and no timestamp since 2001
// is smaller.
const unixThreshold = 1e9

// ParseRateLimitReset parses a rate-limit reset header: delta seconds
// (RateLimit-Reset, X-RateLimit-Reset), a Unix timestamp in seconds (a
// number of at least 1e9, as GitHub sends), a Go-style duration ("1s",
// "6m0s", "20ms", as OpenAI sends in x-ratelimit-reset-requests and
// x-ratelimit-reset-tokens), or an RFC 3339 time. Times are taken relative to
// now. A delay above limit (0 means [DefaultMaxPushback]) is ignored:
// NoPushback; one too large for a Duration reads as the largest Duration.
// An empty, negative or unparseable value is ignored (NoPushback), as by
// [ParseRetryAfter].
func ParseRateLimitReset(v string, now time.Time, limit time.Duration) Pushback {
	limit = limitOr(limit)
	v = strings.TrimSpace(v)
	if v == "" {
		return Pushback{}
	}
	if isDecimal(v) {
		// Only a value out of range fails, as +Inf: a delay too large.
		f, _ := strconv.ParseFloat(v, 64)
		if f >= unixThreshold {
			sec, frac := math.Modf(f)
			if sec > math.MaxInt64/2/1e9 {
				return later(math.MaxInt64, limit)
			}
			return later(time.Unix(int64(sec), int64(frac*1e9)).Sub(now), limit)
		}
		d, _ := parseSeconds(v)
		return later(d, limit)
	}
	d, err := time.ParseDuration(v)
	switch {
	case err == nil && d < 0:
		return Pushback{}
	case err == nil:
		return later(d, limit)
	case durationTooLarge(v):
		return later(math.MaxInt64, limit)
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return later(t.Sub(now), limit)
	}
	return Pushback{}
}

// Header names read by [FromHeader]. Each is also found under its
// lowercase form, which gRPC metadata and headers copied from HTTP/2 have.
const (
	HeaderGRPCPushback       = "Grpc-Retry-Pushback-Ms"
	HeaderRetryAfter         = "Retry-After"
	HeaderRateLimitReset     = "Ratelimit-Reset"
	HeaderXRateLimitReset    = "X-Ratelimit-Reset"
	HeaderResetRequests      = "X-Ratelimit-Reset-Requests"
	HeaderResetTokens        = "X-Ratelimit-Reset-Tokens"
	headerRemainingRequests  = "X-Ratelimit-Remaining-Requests"
	headerRemainingTokensKey = "X-Ratelimit-Remaining-Tokens"
)

// lowerNames maps each header name read here to its lowercase form, so
// that looking a header up does not allocate.
var lowerNames = func() map[string]string {
	m := make(map[string]string)
	for _, name := range [...]string{
		HeaderGRPCPushback, HeaderRetryAfter, HeaderRateLimitReset, HeaderXRateLimitReset,
		HeaderResetRequests, HeaderResetTokens, headerRemainingRequests, headerRemainingTokensKey,
		headerLimitRequests, headerLimitTokens,
	} {
		m[name] = strings.ToLower(name)
	}
	return m
}()

// headerValues returns the values of the header name (one of the names
// above, in canonical form) in h: under name, as http.Header's methods
// store it, or else under its lowercase form. gRPC metadata keys are
// lowercase (grpc-go v1.85.0 metadata/metadata.go lowers every key, and
// stream.go reads trailer["grpc-retry-pushback-ms"]), so trailers passed on
// as http.Header(md) have them so, as do headers copied as an HTTP/2 frame
// carries them; h.Get would miss both.
func headerValues(h http.Header, name string) []string {
	if v, ok := h[name]; ok {
		return v
	}
	return h[lowerNames[name]]
}

// header returns the first value of the header name in h, or "".
func header(h http.Header, name string) string {
	if v := headerValues(h, name); len(v) > 0 {
		return v[0]
	}
	return ""
}

// FromHeader reads the server's pushback from response headers (or gRPC
// trailers: a metadata.MD converted with http.Header(md) will do), trying
// in order grpc-retry-pushback-ms, Retry-After, RateLimit-Reset,
// X-RateLimit-Reset, and x-ratelimit-reset-requests / -tokens. A header is
// found under its canonical name (http.Header's Set and Add store it so) or
// its lowercase one (gRPC metadata's). The first header that says anything
// decides; one whose delay is above limit, or an HTTP one whose value is
// negative or malformed, is skipped, as Envoy does. Only a negative or
// malformed grpc-retry-pushback-ms, or one sent more than once, means
// DoNotRetry. For the OpenAI pair, the reset of the limit whose remaining
// count is "0" is used, else the longer of the two. A nil header is
// NoPushback.
func FromHeader(h http.Header, now time.Time, limit time.Duration) Pushback {
	if h == nil {
		return Pushback{}
	}
	// Several values of grpc-retry-pushback-ms mean "do not retry", as for
	// grpc-go (v1.85.0 stream.go, shouldRetry).
	if len(headerValues(h, HeaderGRPCPushback)) > 1 {
		return Pushback{Kind: DoNotRetry}
	}
	if p := ParseGRPCPushback(header(h, HeaderGRPCPushback), limit); p.Kind != NoPushback {
		return p
	}
	if p := ParseRetryAfter(header(h, HeaderRetryAfter), now, limit); p.Kind != NoPushback {
		return p
	}
	for _, name := range [...]string{HeaderRateLimitReset, HeaderXRateLimitReset} {
		if p := ParseRateLimitReset(header(h, name), now, limit); p.Kind != NoPushback {
			return p
		}
	}
	rq := ParseRateLimitReset(header(h, HeaderResetRequests), now, limit)
	tk := ParseRateLimitReset(header(h, HeaderResetTokens), now, limit)
	switch {
	case rq.Kind != NoPushback && strings.TrimSpace(header(h, headerRemainingRequests)) == "0":
		return rq
	case tk.Kind != NoPushback && strings.TrimSpace(header(h, headerRemainingTokensKey)) == "0":
		return tk
	case rq.Kind == RetryLater && (tk.Kind != RetryLater || rq.Delay >= tk.Delay):
		return rq
	}
	return tk
}

// QuotaReset reads OpenAI's rate-limit headers (which Azure OpenAI and
// other providers copy) from any answer, successful or not: when a window
// has nothing remaining (x-ratelimit-remaining-requests or
// x-ratelimit-remaining-tokens is 0) it returns the wait until that window
// resets (x-ratelimit-reset-requests or -tokens), the longer of the two if
// both are spent, else NoPushback. A reset above limit (0 means
// [DefaultMaxPushback]) is ignored, as by [FromHeader].
func QuotaReset(h http.Header, now time.Time, limit time.Duration) Pushback {
	var p Pushback
	if h == nil {
		return p
	}
	if strings.TrimSpace(header(h, headerRemainingRequests)) == "0" {
		p = ParseRateLimitReset(header(h, HeaderResetRequests), now, limit)
	}
	if strings.TrimSpace(header(h, headerRemainingTokensKey)) == "0" {
		q := ParseRateLimitReset(header(h, HeaderResetTokens), now, limit)
		if q.Kind == RetryLater && (p.Kind != RetryLater || q.Delay > p.Delay) {
			p = q
		}
	}
	if p.Kind != RetryLater {
		return Pushback{}
	}
	return p
}

// Header names read by [QuotaHeadroom] besides the reset and remaining ones.
const (
	headerLimitRequests = "X-Ratelimit-Limit-Requests"
	headerLimitTokens   = "X-Ratelimit-Limit-Tokens"
)

// QuotaHeadroom reads OpenAI's rate-limit headers (which Azure OpenAI and
// many OpenAI-compatible servers also send) and returns the fraction of the
// tightest window that remains, x-ratelimit-remaining-requests over
// x-ratelimit-limit-requests or the same for tokens, whichever is lower, and
// the time until that window is full again (its x-ratelimit-reset-*; 0 if
// absent or unreadable). ok is false when h has no complete remaining and
// limit pair; a remaining count above its limit counts as the whole limit.
func QuotaHeadroom(h http.Header, now time.Time) (fraction float64, reset time.Duration, ok bool) {
	if h == nil {
		return 0, 0, false
	}
	fraction = 2
	for _, w := range [...]struct{ rem, lim, reset string }{
		{headerRemainingRequests, headerLimitRequests, HeaderResetRequests},
		{headerRemainingTokensKey, headerLimitTokens, HeaderResetTokens},
	} {
		rem, err1 := strconv.ParseFloat(strings.TrimSpace(header(h, w.rem)), 64)
		lim, err2 := strconv.ParseFloat(strings.TrimSpace(header(h, w.lim)), 64)
		if err1 != nil || err2 != nil || !(rem >= 0) || !(lim > 0) || math.IsInf(lim, 1) {
			continue
		}
		if f := min(rem/lim, 1); f < fraction {
			fraction, reset = f, 0
			if p := ParseRateLimitReset(header(h, w.reset), now, noPushbackLimit); p.Kind == RetryLater {
				reset = p.Delay
			}
		}
	}
	if fraction > 1 {
		return 0, 0, false
	}
	return fraction, reset, true
}

// isDecimal reports whether s is digits with at most one '.', and at least
// one digit.
func isDecimal(s string) bool {
	digits, dots := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return false
		}
	}
	return digits > 0 && dots <= 1
}

// durationTooLarge reports whether s, which time.ParseDuration rejected, is
// a well-formed positive Go duration ("9999999999h") and so was rejected
// only for being too large for a Duration.
func durationTooLarge(s string) bool {
	s = strings.TrimPrefix(s, "+")
	if s == "" {
		return false
	}
	for s != "" {
		i, digits, dot := 0, 0, false
		for ; i < len(s); i++ {
			if c := s[i]; c >= '0' && c <= '9' {
				digits++
			} else if c == '.' && !dot {
				dot = true
			} else {
				break
			}
		}
		if digits == 0 {
			return false
		}
		s = s[i:]
		j := 0
		for j < len(s) && s[j] != '.' && (s[j] < '0' || s[j] > '9') {
			j++
		}
		switch s[:j] {
		case "ns", "us", "\u00b5s", "\u03bcs", "ms", "s", "m", "h":
		default:
			return false
		}
		s = s[j:]
	}
	return true
}

// parseSeconds parses non-negative decimal seconds. A value too large for a
// Duration is returned as the largest Duration.
func parseSeconds(s string) (time.Duration, bool) {
	if !isDecimal(s) {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && f == 0 {
		return 0, false
	}
	if f*1e9 >= math.MaxInt64 || err != nil {
		return math.MaxInt64, true
	}
	return time.Duration(math.Round(f * 1e9)), true
}
