package sim

import (
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/llmlb/llmlb/retry"
)

// Deployment models one deployment of a model behind an API, seen only
// through its answers, as a router sees a managed provider's deployment
// (OpenAI, Azure OpenAI, Bedrock) or a self-hosted server behind an
// admission cap: no engine metrics, only latencies, 429s and rate-limit
// headers. It is independent of the engine model of [Replica].
//
// A request the deployment accepts is served at once if fewer than
// Concurrency are, else it waits in a queue inside the deployment, in
// arrival order. Its time to first token is TTFT plus PerPromptToken per
// prompt token, then each output token takes PerOutputToken; both are
// multiplied by SpikeFactor when its service starts during a latency
// spike. A request is refused at once with HTTP 429 when the rate limit
// has no request left (Retry-After: the seconds until it has one, rounded
// up), when QueueLimit requests already wait (Retry-After: 1), or during
// an Exhausted window.
type Deployment struct {
	// Name is the endpoint key. Required and unique in a scenario.
	Name string
	// Concurrency is how many requests are served at once; required.
	Concurrency int
	// QueueLimit bounds the requests waiting for service; 0 means no
	// bound.
	QueueLimit int
	// RPM is the rate limit in requests per minute, a token bucket refilled
	// continuously that holds Burst requests; 0 means no rate limit. Every
	// answer of a rate-limited deployment carries OpenAI's headers:
	// x-ratelimit-remaining-requests, what the bucket holds after the
	// request, and x-ratelimit-reset-requests, the time until it is full
	// again ("the time until the rate limit resets to its initial state").
	RPM float64
	// Burst is the bucket's size in requests; 0 means RPM/6, ten seconds
	// of the rate, as Azure OpenAI enforces its per-minute limits over
	// 10-second windows.
	Burst float64
	// TTFT is the time to first token of an empty prompt.
	TTFT time.Duration
	// PerPromptToken is the prefill time per prompt token.
	PerPromptToken time.Duration
	// PerOutputToken is the time per output token after the first.
	PerOutputToken time.Duration
	// SpikeEvery is the mean time between the starts of latency spikes, a
	// Poisson process drawn per deployment and seed; 0 means no spikes.
	SpikeEvery time.Duration
	// SpikeLength is how long a spike lasts.
	SpikeLength time.Duration
	// SpikeFactor multiplies the latencies of the requests whose service
	// starts during a spike.
	SpikeFactor float64
	// Exhausted, if its To is after its From, is a window in which the
	// deployment refuses every request with 429 and a Retry-After of
	// ExhaustedRetryAfter, as a provider whose quota or spend limit ran out
	// does, asking for a wait far longer than the window.
	Exhausted struct{ From, To time.Duration }
	// ExhaustedRetryAfter is the Retry-After of the Exhausted window.
	ExhaustedRetryAfter time.Duration
}

// depState is a deployment during a run.
type depState struct {
	cfg     *Deployment
	tier    int
	tokens  float64       // the rate limit's bucket
	at      time.Duration // when tokens was last refilled
	running int
	queue   []int // calls waiting for service, oldest first
	spikes  [][2]time.Duration
}

func (d *depState) burst() float64 {
	if d.cfg.Burst > 0 {
		return d.cfg.Burst
	}
	return max(d.cfg.RPM/6, 1)
}

// perSec is the rate limit's refill in requests per second.
func (d *depState) perSec() float64 { return d.cfg.RPM / 60 }

func (d *depState) refill(now time.Duration) {
	d.tokens = min(d.burst(), d.tokens+(now-d.at).Seconds()*d.perSec())
	d.at = now
}

// spiking reports whether a spike is under way at t.
func (d *depState) spiking(t time.Duration) bool {
	i, _ := slices.BinarySearchFunc(d.spikes, t, func(s [2]time.Duration, t time.Duration) int {
		switch {
		case s[1] <= t:
			return -1
		case s[0] > t:
			return 1
		}
		return 0
	})
	return i < len(d.spikes) && d.spikes[i][0] <= t && t < d.spikes[i][1]
}

// admit decides on a request arriving at now: whether it is accepted, and
// the headers of the answer.
func (d *depState) admit(now time.Duration) (bool, http.Header) {
	h := http.Header{}
	if e := d.cfg.Exhausted; now >= e.From && now < e.To {
		h.Set(retry.HeaderRetryAfter, strconv.FormatInt(int64(math.Ceil(d.cfg.ExhaustedRetryAfter.Seconds())), 10))
		return false, h
	}
	if d.cfg.QueueLimit > 0 && d.running >= d.cfg.Concurrency && len(d.queue) >= d.cfg.QueueLimit {
		h.Set(retry.HeaderRetryAfter, "1")
		return false, h
	}
	if d.cfg.RPM <= 0 {
		return true, h
	}
	d.refill(now)
	ok := d.tokens >= 1
	if ok {
		d.tokens--
	}
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(int(d.burst())))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(int(d.tokens)))
	reset := time.Duration((d.burst() - d.tokens) / d.perSec() * float64(time.Second)).Round(time.Millisecond)
	h.Set(retry.HeaderResetRequests, reset.String())
	if !ok {
		wait := math.Ceil((1 - d.tokens) / d.perSec())
		h.Set(retry.HeaderRetryAfter, strconv.Itoa(max(int(wait), 1)))
	}
	return ok, h
}

// drawSpikes draws the spikes of d over the window [0, until) from rng.
func drawSpikes(d *Deployment, rng *rand.Rand, until time.Duration) [][2]time.Duration {
	if d.SpikeEvery <= 0 || d.SpikeLength <= 0 {
		return nil
	}
	var out [][2]time.Duration
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() * float64(d.SpikeEvery))
		if t >= until {
			return out
		}
		end := t + d.SpikeLength
		if n := len(out); n > 0 && t <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], end)
		} else {
			out = append(out, [2]time.Duration{t, end})
		}
	}
}
