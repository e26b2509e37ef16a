package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Workload describes open-loop traffic: Poisson arrivals of streamed
// completions whose prompts start with one of Groups shared heads (a system
// prompt, a document) and end with a unique tail, and whose output lengths
// are short, or long with probability LongShare, optionally with a cap on
// the requests in flight. Zero fields are defaults.
type Workload struct {
	// Requests is the number of requests; 0 means 200.
	Requests int
	// Rate is the mean arrival rate per second; 0 means 50.
	Rate float64
	// Groups is the number of distinct shared heads; 0 means 16.
	Groups int
	// PrefixBytes and SuffixBytes size the shared head and the unique tail;
	// 0 means 2048 and 256.
	PrefixBytes, SuffixBytes int
	// Short and Long bound the output tokens (uniform, inclusive) of short
	// and long requests; zero means [4, 16] and [64, 128].
	Short, Long [2]int
	// LongShare is the probability of a long request; 0 means 0.25, a
	// negative value none.
	LongShare float64
	// Path is the endpoint posted to; "" means /v1/completions.
	Path string
	// MaxInFlight, if positive, caps the requests in flight: a request
	// whose arrival comes while MaxInFlight are in flight starts when one of
	// them ends. The emulated engines run in real time, so on a busy machine
	// they serve fewer requests per second than on an idle one; the cap keeps
	// a fixed arrival rate from then building unbounded queues, which would
	// make every policy's latencies alike. 0 means no cap.
	MaxInFlight int
	// Seed makes the workload deterministic.
	Seed uint64
}

func (w *Workload) defaults() {
	if w.Requests == 0 {
		w.Requests = 200
	}
	if w.Rate == 0 {
		w.Rate = 50
	}
	if w.Groups == 0 {
		w.Groups = 16
	}
	if w.PrefixBytes == 0 {
		w.PrefixBytes = 2048
	}
	if w.SuffixBytes == 0 {
		w.SuffixBytes = 256
	}
	if w.Short == [2]int{} {
		w.Short = [2]int{4, 16}
	}
	if w.Long == [2]int{} {
		w.Long = [2]int{64, 128}
	}
	if w.LongShare == 0 {
		w.LongShare = 0.25
	}
	if w.Path == "" {
		w.Path = "/v1/completions"
	}
}

// Outcome is what the client saw of one request.
type Outcome struct {
	// Want is the number of tokens requested, Got the number of token
	// events received: chunks with text or delta content, not a chat
	// stream's role chunk or a usage chunk.
	Want, Got int
	// Status is the HTTP status, 0 if none arrived, and RetryAfter the
	// response's Retry-After header.
	Status     int
	RetryAfter string
	// TTFT is the time from sending to the first token event.
	TTFT time.Duration
	// Started reports whether a token event arrived; Done whether the
	// stream ended with [DONE].
	Started, Done bool
	// Truncated reports a stream that ended cleanly without [DONE]: a
	// silent loss, which a gateway must never produce.
	Truncated bool
	// Err is the error that ended the request, if any: a failed
	// connection, or a read error of a broken stream.
	Err error
}

// Complete reports whether the request got exactly its tokens and [DONE].
func (o *Outcome) Complete() bool {
	return o.Status == http.StatusOK && o.Done && o.Got == o.Want && o.Err == nil && !o.Truncated
}

// Result holds the outcomes of a load run, in arrival order.
type Result struct {
	// Outcomes has one entry per request, in arrival order.
	Outcomes []Outcome
	// Elapsed is the wall-clock time of the run, until the last answer.
	Elapsed time.Duration
}

// Count returns the number of outcomes for which f is true.
func (r *Result) Count(f func(o *Outcome) bool) int {
	n := 0
	for i := range r.Outcomes {
		if f(&r.Outcomes[i]) {
			n++
		}
	}
	return n
}

// TTFT returns the q-quantile (0 to 1) of the time to first token over the
// requests that started streaming, or 0 if none did.
func (r *Result) TTFT(q float64) time.Duration {
	var d []time.Duration
	for i := range r.Outcomes {
		if r.Outcomes[i].Started {
			d = append(d, r.Outcomes[i].TTFT)
		}
	}
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// Generate sends w to baseURL open loop: each request starts at its Poisson
// arrival time whatever happened to the earlier ones, unless w.MaxInFlight
// requests are in flight; it then starts when one of them ends. It returns
// when every request has ended or ctx is done (requests in flight are then
// cancelled). Each request carries an X-Session-ID header naming its group.
func Generate(ctx context.Context, client *http.Client, baseURL string, w Workload) Result {
	w.defaults()
	rng := rand.New(rand.NewPCG(w.Seed, 0x11b))
	heads := make([]string, w.Groups)
	for g := range heads {
		heads[g] = text(rng, w.PrefixBytes)
	}
	type job struct {
		at      time.Duration
		body    string
		session string
		want    int
	}
	jobs := make([]job, w.Requests)
	var at time.Duration
	for i := range jobs {
		at += time.Duration(rng.ExpFloat64() / w.Rate * float64(time.Second))
		g := rng.IntN(w.Groups)
		span := w.Short
		if w.LongShare > 0 && rng.Float64() < w.LongShare {
			span = w.Long
		}
		want := span[0] + rng.IntN(span[1]-span[0]+1)
		jobs[i] = job{
			at:      at,
			body:    fmt.Sprintf(`{"model":"emulated","prompt":"%s%s","max_tokens":%d,"stream":true}`, heads[g], text(rng, w.SuffixBytes), want),
			session: fmt.Sprintf("group-%d", g),
			want:    want,
		}
	}
	res := Result{Outcomes: make([]Outcome, len(jobs))}
	var slots chan struct{} // one element per request in flight, if capped
	if w.MaxInFlight > 0 {
		slots = make(chan struct{}, w.MaxInFlight)
	}
	start := time.Now()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	<-timer.C
	for i := range jobs {
		if d := jobs[i].at - time.Since(start); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
			}
		}
		if slots != nil && ctx.Err() == nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			res.Outcomes[i] = Outcome{Want: jobs[i].want, Err: ctx.Err()}
			continue
		}
		wg.Go(func() {
			res.Outcomes[i] = send(ctx, client, baseURL+w.Path, jobs[i].body, jobs[i].session, jobs[i].want)
			if slots != nil {
				<-slots
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res
}

// send posts one streamed request and reads its events.
func send(ctx context.Context, client *http.Client, url, body, session string, want int) Outcome {
	o := Outcome{Want: want}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		o.Err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		o.Err = err
		return o
	}
	defer resp.Body.Close()
	o.Status = resp.StatusCode
	o.RetryAfter = resp.Header.Get("Retry-After")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return o
	}
	br := bufio.NewReaderSize(resp.Body, 4096)
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(line, "data: "); ok && strings.HasSuffix(line, "\n") {
			if strings.HasPrefix(data, "[DONE]") {
				o.Done = true
			} else if carriesToken(data) {
				if !o.Started {
					o.Started = true
					o.TTFT = time.Since(start)
				}
				o.Got++
			}
		}
		if err != nil {
			if err != io.EOF {
				o.Err = err
			} else if !o.Done {
				o.Truncated = true
			}
			return o
		}
	}
}

// carriesToken reports whether the data of a stream's event is a chunk
// that carries output: its choice has text (a completions chunk) or delta
// content (a chat chunk). A chat stream's role chunk, whose content is
// empty, and a usage chunk, which has no choices, carry none.
func carriesToken(data string) bool {
	var chunk struct {
		Choices []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(data), &chunk) != nil || len(chunk.Choices) == 0 {
		return false
	}
	return chunk.Choices[0].Text != "" || chunk.Choices[0].Delta.Content != ""
}

const letters = "abcdefghijklmnopqrstuvwxyz      "

// text returns n bytes of random lowercase words.
func text(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return string(b)
}
