package apierror

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/retry"
)

// anthropicWindows are the rate-limit windows Anthropic reports on every
// answer, as anthropic-ratelimit-<window>-remaining and -reset, the reset
// an RFC 3339 time (docs.anthropic.com/en/api/rate-limits, "Response
// headers").
var anthropicWindows = [...]string{"requests", "tokens", "input-tokens", "output-tokens"}

// RetryAfter returns the Retry-After value, whole seconds rounded up, that
// a client should get with an answer of status code whose header h has
// neither Retry-After nor Retry-After-Ms, but says in its rate-limit
// headers when to come back: a 429 or 503 with a wait that [retry.FromHeader]
// reads (OpenAI's x-ratelimit-reset-requests or -tokens, "1s" or "6m0s",
// RateLimit-Reset, X-RateLimit-Reset), or else Anthropic's
// anthropic-ratelimit-*-reset time of a window with nothing remaining
// (the latest of those, or of all windows if none says 0). A wait above
// limit (0 or less: [retry.DefaultMaxPushback]) is ignored, as
// retry.FromHeader ignores it. It returns "" for any
// other answer: the rate-limit headers do not reach the client (see
// [StripAccount]), so this is read before they are dropped.
func RetryAfter(code int, h http.Header, now time.Time, limit time.Duration) string {
	if code != http.StatusTooManyRequests && code != http.StatusServiceUnavailable {
		return ""
	}
	if limit <= 0 {
		limit = retry.DefaultMaxPushback
	}
	if len(h.Values("Retry-After")) > 0 || len(h.Values("Retry-After-Ms")) > 0 {
		return ""
	}
	// Read without a limit first, then held to it: retry.FromHeader
	// skips a wait above its limit for the next header's, which would
	// tell the client the shorter wait of a window that is not spent
	// (x-ratelimit-reset-requests "1s" beside a spent tokens window's
	// "6m0s").
	p := retry.FromHeader(h, now, math.MaxInt64)
	if p.Kind != retry.RetryLater {
		p = anthropicReset(h, now)
	}
	if p.Kind != retry.RetryLater || p.Delay <= 0 || p.Delay > limit {
		return ""
	}
	return strconv.FormatInt(int64(math.Ceil(p.Delay.Seconds())), 10)
}

// anthropicReset returns the wait Anthropic's rate-limit headers in h ask
// for (see RetryAfter), or retry.NoPushback.
func anthropicReset(h http.Header, now time.Time) retry.Pushback {
	var spent, longest retry.Pushback
	for _, w := range anthropicWindows {
		p := retry.ParseRateLimitReset(h.Get("Anthropic-Ratelimit-"+w+"-Reset"), now, math.MaxInt64)
		if p.Kind != retry.RetryLater {
			continue
		}
		if longest.Kind != retry.RetryLater || p.Delay > longest.Delay {
			longest = p
		}
		if strings.TrimSpace(h.Get("Anthropic-Ratelimit-"+w+"-Remaining")) == "0" &&
			(spent.Kind != retry.RetryLater || p.Delay > spent.Delay) {
			spent = p
		}
	}
	if spent.Kind == retry.RetryLater {
		return spent
	}
	return longest
}
