package httplb

import (
	"compress/gzip"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// advSecret is what an upstream's error events carry that no client may
// read.
const advSecret = "SECRET-worker-10.9.8.7"

// advLog records, by endpoint, the first tokens and the ends of picks.
type advLog struct {
	mu      sync.Mutex
	first   map[string]int
	latency map[string]time.Duration
	done    map[string][]error
	onFirst func() // called at each first token, if set
}

func (l *advLog) observer() *llmlb.Observer {
	return &llmlb.Observer{
		FirstToken: func(i llmlb.FirstTokenInfo) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.first == nil {
				l.first = map[string]int{}
			}
			if l.latency == nil {
				l.latency = map[string]time.Duration{}
			}
			l.first[i.Endpoint.Key()]++
			l.latency[i.Endpoint.Key()] = i.Latency
			if l.onFirst != nil {
				l.onFirst()
			}
		},
		Done: func(i llmlb.DoneInfo) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.done == nil {
				l.done = map[string][]error{}
			}
			l.done[i.Endpoint.Key()] = append(l.done[i.Endpoint.Key()], i.Err)
		},
	}
}

func (l *advLog) firstTokens(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first[key]
}

func (l *advLog) ttft(key string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latency[key]
}

func (l *advLog) errs(key string) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[key]
}

// newAdvHarness is newHarness with the fixed policy, a balancer that tells
// log of every first token and end, and base as the base transport if not
// nil.
func newAdvHarness(t *testing.T, cfg Config, log *advLog, base *http.Transport, ups ...*upstream) *harness {
	t.Helper()
	return harnessWith(t, cfg, log.observer(), base, nil, ups...)
}

// writeSteps sends steps as an event stream, each in a write of its own,
// flushed, with pause between them.
func writeSteps(pause time.Duration, steps ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i, s := range steps {
			if i > 0 && pause > 0 {
				time.Sleep(pause)
			}
			if _, err := io.WriteString(w, s); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

// lineEndings rewrites the LF line breaks of an LF stream as each of the
// format's line breaks.
var lineEndings = []struct {
	name string
	conv func(string) string
}{
	{"LF", func(s string) string { return s }},
	{"CRLF", func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }},
	{"CR", func(s string) string { return strings.ReplaceAll(s, "\n", "\r") }},
}

// splits cuts a stream into the writes an upstream sends it in: whole,
// byte by byte, and at every CR LF pair, between its CR and its LF.
var splits = []struct {
	name string
	cut  func(string) []string
}{
	{"whole", func(s string) []string { return []string{s} }},
	{"bytes", func(s string) []string {
		out := make([]string, len(s))
		for i := range len(s) {
			out[i] = s[i : i+1]
		}
		return out
	}},
	{"CR|LF", func(s string) []string {
		var out []string
		for {
			i := strings.Index(s, "\r\n")
			if i < 0 {
				return append(out, s)
			}
			out = append(out, s[:i+1])
			s = s[i+1:]
		}
	}},
}

// advOutcome is what an attempt at a stream comes to.
type advOutcome int

const (
	// passes: committed, the client reads the stream as sent, the pick
	// ends well.
	passes advOutcome = iota
	// retried: the first event is an error event, retried on the other
	// replica, whose stream the client reads.
	retried
	// failsLater: committed, the client reads no error data, the pick ends
	// with ErrErrorEvent.
	failsLater
)

// advStreams are streams of a hostile or quirky upstream, with LF line
// breaks, and what each comes to.
var advStreams = []struct {
	name   string
	stream string
	want   advOutcome
	status int // the status a retried first event stands for
}{
	{"plain", "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", passes, 0},
	{"named error after its data", "data: {\"message\":\"" + advSecret + "\"}\nevent: error\n\ndata: [DONE]\n\n", retried, 500},
	{"named error after its data, a code", "data: {\"code\":503,\"message\":\"" + advSecret + "\"}\nevent: error\n\n", retried, 503},
	{"named error, then message", "event: error\ndata: {\"i\":0}\nevent: message\n\ndata: [DONE]\n\n", passes, 0},
	{"named error, then event without a colon", "event: error\ndata: {\"i\":0}\nevent\n\ndata: [DONE]\n\n", passes, 0},
	{"named error without a space", "event:error\ndata: {\"message\":\"" + advSecret + "\"}\n\n", retried, 500},
	{"a leading space: no event field", " event: error\ndata: {\"i\":0}\n\ndata: [DONE]\n\n", passes, 0},
	{"many names, last error", "event: a\nevent: error\nevent: b\ndata: {\"m\":\"" + advSecret + "\"}\nevent: message\nevent: error\n\n", retried, 500},
	{"many names, last message", "event: error\nevent: b\nevent: error\ndata: {\"i\":0}\nevent: error\nevent: message\n\ndata: [DONE]\n\n", passes, 0},
	{"names that are not error", ": event: error\nevent: error \nevent:\terror\nEvent: error\ndata: {\"i\":0}\nevent:  error\n\ndata: event: error\n\n", passes, 0},
	{"an event field named error, no event field after", "data: {\"i\":0}\nevent: error\n: event: message\nevents: message\n\n", retried, 500},
	{"byte-order mark", "\ufeffdata: {\"i\":0}\n\ndata: [DONE]\n\n", passes, 0},
	{"byte-order mark cut short: no data line", "\xef\xbbdata: {\"i\":0}\n\ndata: {\"i\":1}\n\n", passes, 0},
	{"byte-order mark cut short: an event without data named error", "\xef\xbbdata: {\"i\":0}\nevent: error\n\ndata: {\"i\":1}\n\n", retried, 500},
	{"a preamble, then named error after its data", "event: response.created\ndata: {\"type\":\"response.created\"}\n\ndata: {\"m\":\"" + advSecret + "\"}\nevent: error\n\n", retried, 500},
	{"byte-order mark, named error after", "\ufeffdata: {\"m\":\"" + advSecret + "\"}\nevent: error\n\n", retried, 500},
	{"byte-order mark, named error before", "\ufeffevent: error\ndata: {\"m\":\"" + advSecret + "\"}\n\n", retried, 500},
	{"comments and fields in the first event", ": ping\nid: 1\ndata: {\"i\":0}\n: ping\nretry: 100\nid: 2\n\ndata: [DONE]\n\n", passes, 0},
	{"comments and fields, then named error", ": ping\nid: 1\ndata: {\"m\":\"" + advSecret + "\"}\n: ping\nretry: 100\nevent: error\nid: 2\n\n", retried, 500},
	{"ends in its first event", "data: {\"i\":0}", passes, 0},
	{"ends in its first event after a line", "data: {\"i\":0}\n", passes, 0},
	{"ends in its first event, named error", "data: {\"m\":\"" + advSecret + "\"}\nevent: error", retried, 500},
	{"ends in its first event, named error, a line", "data: {\"m\":\"" + advSecret + "\"}\nevent: error\n", retried, 500},
	{"error event later", "data: {\"i\":0}\n\nevent: error\ndata: {\"message\":\"" + advSecret + "\"}\n\ndata: [DONE]\n\n", failsLater, 0},
	{"error event later, named after its data", "data: {\"i\":0}\n\ndata: {\"message\":\"" + advSecret + "\"}\nevent: error\n\ndata: [DONE]\n\n", failsLater, 0},
	{"error event later, data lines around its name", "data: {\"i\":0}\n\ndata: " + advSecret + "\nevent: error\ndata: " + advSecret + "\n\ndata: [DONE]\n\n", failsLater, 0},
	{"error event later, named back", "data: {\"i\":0}\n\nevent: error\ndata: {\"i\":1}\nevent: message\n\ndata: [DONE]\n\n", passes, 0},
	{"error data later", "data: {\"i\":0}\n\ndata: {\"error\":{\"message\":\"" + advSecret + "\",\"code\":500}}\n\ndata: [DONE]\n\n", failsLater, 0},
	{"error event later, without a space", "data: {\"i\":0}\n\nevent:error\ndata: {\"message\":\"" + advSecret + "\"}\n\n", failsLater, 0},
	{"error event later, ends in it", "data: {\"i\":0}\n\ndata: {\"message\":\"" + advSecret + "\"}\nevent: error", failsLater, 0},
}

// okStream is the other replica's stream.
const okStream = "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n"

// Whatever line breaks an upstream writes and however it cuts them, a CR
// LF pair split between two writes included, a stream comes to what its
// events say, as it would with LF line breaks written whole: a first event
// named "error" by its last "event:" line is retried, a later error event
// reaches the client without a byte of its data and fails the pick, any
// other stream passes as sent; FirstToken is called once, on the replica
// committed to, and the balancer's counts return to zero.
func TestAdversarialStreamsOverSockets(t *testing.T) {
	for _, c := range advStreams {
		for _, le := range lineEndings {
			for _, sp := range splits {
				if sp.name == "CR|LF" && le.name != "CRLF" {
					continue
				}
				t.Run(c.name+"/"+le.name+"/"+sp.name, func(t *testing.T) {
					stream := le.conv(c.stream)
					a := newUpstream(t, writeSteps(0, sp.cut(stream)...))
					b := newUpstream(t, sendStream(okStream))
					log := &advLog{}
					h := newAdvHarness(t, Config{}, log, nil, a, b)
					code, body := postProxy(t, h)
					assert.Equal(t, http.StatusOK, code)
					assert.NotContains(t, body, advSecret)
					switch c.want {
					case passes:
						assert.Equal(t, stream, body)
						assert.Zero(t, b.hits.Load())
						assert.Equal(t, []error{nil}, log.errs(a.URL))
						assert.Equal(t, 1, log.firstTokens(a.URL))
					case retried:
						assert.Equal(t, okStream, body)
						assert.EqualValues(t, 1, b.hits.Load())
						requireStatusFailure(t, log.errs(a.URL), c.status)
						assert.Equal(t, []error{nil}, log.errs(b.URL))
						assert.Zero(t, log.firstTokens(a.URL))
						assert.Equal(t, 1, log.firstTokens(b.URL))
					case failsLater:
						assert.Zero(t, b.hits.Load())
						errs := log.errs(a.URL)
						require.Len(t, errs, 1)
						assert.ErrorIs(t, errs[0], ErrErrorEvent)
						var se *retry.StatusError
						assert.NotErrorAs(t, errs[0], &se)
						assert.Equal(t, 1, log.firstTokens(a.URL))
					}
				})
			}
		}
	}
}

// gatedSteps sends steps as an event stream, each in a write of its own,
// flushed; it tells sent of each write, and before each write after the
// first waits for a value from gate, or for the request's end.
func gatedSteps(sent chan<- int, gate <-chan struct{}, steps ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i, s := range steps {
			if i > 0 {
				select {
				case <-gate:
				case <-r.Context().Done():
					return
				}
			}
			if _, err := io.WriteString(w, s); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			sent <- i
		}
	}
}

// A first event whose blank line comes long after its data, in a write of
// its own, however its line breaks are cut (a CR LF pair between the two
// writes included), is committed when its blank line arrives, not before:
// RoundTrip returns and FirstToken is called then, and a first-event
// timeout that has not passed by then changes nothing. An "event: error"
// line in the late part makes it a retried error event.
func TestFirstEventEndsLate(t *testing.T) {
	cases := []struct {
		name  string
		steps []string
		error bool
	}{
		{"LF", []string{"data: {\"i\":0}\n", "\n" + okTail}, false},
		{"CRLF", []string{"data: {\"i\":0}\r\n", "\r\n" + okTail}, false},
		{"CR", []string{"data: {\"i\":0}\r", "\r" + okTail}, false},
		{"CR LF split", []string{"data: {\"i\":0}\r", "\n\r\n" + okTail}, false},
		{"CR LF split, the LF alone", []string{"data: {\"i\":0}\r", "\n", "\r\n" + okTail}, false},
		{"CR LF split, the LF alone, named error", []string{"data: {\"m\":\"" + advSecret + "\"}\r", "\n", "event: error\r", "\n", "\r", "\n"}, true},
		{"CR LF split, a comment", []string{"data: {\"i\":0}\r", "\n: ping\r", "\n\r\n" + okTail}, false},
		{"CR LF split, named error", []string{"data: {\"m\":\"" + advSecret + "\"}\r", "\nevent: error\r", "\n\r\n"}, true},
		{"CR, named error", []string{"data: {\"m\":\"" + advSecret + "\"}\r", "event: error\r", "\r"}, true},
		{"LF, named error, then message", []string{"data: {\"i\":0}\n", "event: error\n", "event: message\n", "\n" + okTail}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sent := make(chan int, len(c.steps))
			gate := make(chan struct{})
			a := newUpstream(t, gatedSteps(sent, gate, c.steps...))
			b := newUpstream(t, sendStream(okStream))
			log := &advLog{}
			var released atomic.Bool
			var early atomic.Int64 // first tokens before the last step
			log.onFirst = func() {
				if !released.Load() {
					early.Add(1)
				}
			}
			h := newAdvHarness(t, Config{FirstEventTimeout: time.Hour, Retry: retry.LoopConfig{After: time.After}}, log, nil, a, b)
			type result struct {
				resp *http.Response
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := do(t, h, chatBody)
				done <- result{resp, err}
			}()
			var r result
			committed := false
			for i := range c.steps {
				require.Equal(t, i, <-sent)
				if i == len(c.steps)-1 {
					break
				}
				if !committed {
					select {
					case r = <-done:
						committed = true
						t.Errorf("committed after step %d of %d", i+1, len(c.steps))
					case <-time.After(50 * time.Millisecond):
					}
				}
				if i == len(c.steps)-2 {
					released.Store(true)
				}
				gate <- struct{}{}
			}
			if !committed {
				r = <-done
			}
			require.NoError(t, r.err)
			body, err := readAll(t, r.resp)
			require.NoError(t, err)
			assert.Zero(t, early.Load(), "FirstToken before the first event's end")
			if c.error {
				assert.Equal(t, okStream, body)
				requireStatusFailure(t, log.errs(a.URL), http.StatusInternalServerError)
				assert.Equal(t, 1, log.firstTokens(b.URL))
				return
			}
			assert.Equal(t, strings.Join(c.steps, ""), body)
			assert.Zero(t, b.hits.Load())
			assert.Equal(t, []error{nil}, log.errs(a.URL))
			assert.Equal(t, 1, log.firstTokens(a.URL))
		})
	}
}

// okTail is what follows a first event of a healthy stream.
const okTail = "data: {\"i\":1}\n\ndata: [DONE]\n\n"

// A first event whose blank line does not come within the first-event
// timeout, its data line sent (and, over CR LF lines, the CR of its line
// break), is cancelled and retried on another replica as documented: its
// pick ends with ErrFirstEventTimeout, no FirstToken is called for it, and
// the client reads the other replica's stream only. With no other attempt
// allowed the request fails with a 502 through the proxy.
func TestFirstEventTimeoutBeforeItsEnd(t *testing.T) {
	for _, first := range []string{"data: {\"i\":0}\n", "data: {\"i\":0}\r", "data: {\"i\":0}\r\n", ": ping\r\ndata: {\"i\":0}\r\nid: 1\r"} {
		for _, attempts := range []int{0, 1} {
			t.Run(fmt.Sprintf("%q/attempts=%d", first, attempts), func(t *testing.T) {
				sent := make(chan int, 2)
				a := newUpstream(t, gatedSteps(sent, nil, first, "\n\n"))
				b := newUpstream(t, sendStream(okStream))
				log := &advLog{}
				const timeout = 17 * time.Second // only ever fired by hand
				fire := make(chan time.Time)
				var timers atomic.Int64
				h := newAdvHarness(t, Config{FirstEventTimeout: timeout, Retry: retry.LoopConfig{
					MaxAttempts: attempts,
					After: func(d time.Duration) <-chan time.Time {
						if d != timeout {
							return closedTime
						}
						if timers.Add(1) == 1 {
							return fire // a's
						}
						return nil
					},
				}}, log, nil, a, b)
				go func() {
					<-sent
					close(fire)
				}()
				code, body := postProxy(t, h)
				require.Len(t, log.errs(a.URL), 1)
				assert.ErrorIs(t, log.errs(a.URL)[0], ErrFirstEventTimeout)
				assert.Zero(t, log.firstTokens(a.URL))
				if attempts == 1 {
					assert.Equal(t, http.StatusBadGateway, code)
					assert.NotContains(t, body, "data:")
					assert.Zero(t, b.hits.Load())
					return
				}
				assert.Equal(t, http.StatusOK, code)
				assert.Equal(t, okStream, body)
				assert.Equal(t, []error{nil}, log.errs(b.URL))
				assert.Equal(t, 1, log.firstTokens(b.URL))
			})
		}
	}
}

// With the system clock, a healthy stream whose blank line comes a few
// hundred milliseconds after its data, within the first-event timeout, is
// not retried, and its time to first token includes the wait.
func TestFirstEventLateWithinTimeout(t *testing.T) {
	const pause = 300 * time.Millisecond
	a := newUpstream(t, writeSteps(pause, "data: {\"i\":0}\r", "\n\r\n"+okTail))
	b := newUpstream(t, sendStream(okStream))
	log := &advLog{}
	h := newAdvHarness(t, Config{FirstEventTimeout: 10 * time.Second, Retry: retry.LoopConfig{After: time.After}}, log, nil, a, b)
	code, body := postProxy(t, h)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "data: {\"i\":0}\r\n\r\n"+okTail, body)
	assert.Zero(t, b.hits.Load())
	assert.Equal(t, []error{nil}, log.errs(a.URL))
	assert.Equal(t, 1, log.firstTokens(a.URL))
	assert.GreaterOrEqual(t, log.ttft(a.URL), pause)
}

// OutputCounter counts the same tokens and fails the same streams whatever
// their line breaks and however they are cut, a CR LF pair between two
// pieces included: as the stream with LF line breaks, whole.
func TestOutputCounterLineBreaksAndCuts(t *testing.T) {
	h := http.Header{"Content-Type": {"text/event-stream"}}
	count := func(pieces []string) (int, bool) {
		c := NewOutputCounter(h)
		n := 0
		for _, p := range pieces {
			n += c.Count([]byte(p))
		}
		return n + c.End(), c.Failed()
	}
	extra := []string{
		"data: {\"i\":0}\n\ndata: {\"i\":1}\nevent: error\n\ndata: {\"i\":2}\n\n",
		"data: {\"i\":0}\n\nevent: error\ndata: {\"i\":1}\nevent: message\n\ndata: {\"i\":2}\n\n",
		"data: {\"i\":0}\n\nevent: error\ndata: {\"i\":1}\nevent\n\n",
		"data: {\"i\":0}\n\n event: error\ndata: {\"i\":1}\n\n",
		"\ufeffdata: {\"i\":0}\n\nevent:error\ndata: {\"i\":1}\n\n",
		"data: {\"i\":0}\nid: 1\n: ping\nretry: 5\ndata: {\"i\":1}\n\n",
		"\xef\xbbdata: {\"i\":0}\n\ndata: {\"i\":1}\n\n",
		"\ufeffevent: error\nevent: message\nevent: error\n\n",
	}
	streams := extra
	for _, c := range advStreams {
		streams = append(streams, c.stream)
	}
	for _, s := range streams {
		want, wantFailed := count([]string{s})
		for _, le := range lineEndings {
			for _, sp := range splits {
				got, failed := count(sp.cut(le.conv(s)))
				assert.Equal(t, want, got, "%q %s %s", s, le.name, sp.name)
				assert.Equal(t, wantFailed, failed, "%q %s %s", s, le.name, sp.name)
			}
		}
	}
	// The names the streams give their events count, from the line that
	// gives each on: a value before its event's name "error" counted
	// already, as no count is taken back.
	for _, c := range []struct {
		stream string
		tokens int
		failed bool
	}{
		{extra[0], 3, true},
		{extra[1], 3, false},
		{extra[2], 2, false},
		{extra[3], 2, false},
		{extra[4], 1, true},
		{extra[6], 1, false},
		{extra[7], 0, true},
	} {
		got, failed := count([]string{c.stream})
		assert.Equal(t, c.tokens, got, "%q", c.stream)
		assert.Equal(t, c.failed, failed, "%q", c.stream)
	}
}

// gzipSteps is writeSteps with the stream compressed, each step flushed
// through the compressor.
func gzipSteps(steps ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		z := gzip.NewWriter(w)
		for _, s := range steps {
			if _, err := io.WriteString(z, s); err != nil {
				return
			}
			_ = z.Flush()
			w.(http.Flusher).Flush()
		}
		_ = z.Close()
	}
}

// The streams come to the same over HTTP/2 upstreams, and compressed with
// gzip, which the base transport asked for and decodes: the Transport
// reads the events decoded.
func TestAdversarialStreamsOverHTTP2AndGzip(t *testing.T) {
	for _, c := range advStreams {
		for _, proto := range []string{"h2", "gzip"} {
			t.Run(c.name+"/"+proto, func(t *testing.T) {
				stream := strings.ReplaceAll(c.stream, "\n", "\r\n")
				steps := splits[2].cut(stream)
				var a *upstream
				var base *http.Transport
				switch proto {
				case "h2":
					a = &upstream{}
					a.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						a.hits.Add(1)
						assert.Equal(t, 2, r.ProtoMajor)
						writeSteps(0, steps...)(w, r)
					}))
					a.EnableHTTP2 = true
					a.StartTLS()
					t.Cleanup(a.Close)
					base = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
				case "gzip":
					a = newUpstream(t, gzipSteps(steps...))
				}
				b := newUpstream(t, sendStream(okStream))
				log := &advLog{}
				h := newAdvHarness(t, Config{}, log, base, a, b)
				code, body := postProxy(t, h)
				assert.Equal(t, http.StatusOK, code)
				assert.NotContains(t, body, advSecret)
				switch c.want {
				case passes:
					assert.Equal(t, stream, body)
					assert.Equal(t, []error{nil}, log.errs(a.URL))
					assert.Equal(t, 1, log.firstTokens(a.URL))
				case retried:
					assert.Equal(t, okStream, body)
					requireStatusFailure(t, log.errs(a.URL), c.status)
					assert.Equal(t, 1, log.firstTokens(b.URL))
				case failsLater:
					errs := log.errs(a.URL)
					require.Len(t, errs, 1)
					assert.ErrorIs(t, errs[0], ErrErrorEvent)
				}
			})
		}
	}
}

// A first event that MaxPeekBytes cuts short anywhere, its data, the
// secret in it, or the line that names it "error" after its data, however
// its line breaks are written and cut: a stream whose first event is named
// "error" is retried if held back whole, and otherwise committed with no
// byte of the event's data reaching the client and its pick failed; a
// healthy one passes as sent.
func TestFirstEventPastPeekLimit(t *testing.T) {
	firsts := []struct {
		name, event string
		error       bool
	}{
		{"named after", "data: {\"m\":\"" + advSecret + "\"}\nid: 3\nevent: error\n\n", true},
		{"named before, a mark", "\ufeffevent: error\ndata: aaaa\ndata: " + advSecret + "\n\n", true},
		{"named twice after two lines", "event: message\ndata: {\"m\":\"" + advSecret + "\"}\ndata: more\nevent: error\nevent: error\n\n", true},
		{"a bare data line first", "data\ndata: " + advSecret + "\nevent:error\n\n", true},
		{"an object over lines", "data: {\"m\":\ndata: \"" + advSecret + "\"}\nevent: error\n\n", true},
		{"healthy", "data: {\"i\":0,\"pad\":\"xxxxxxxxxxxxxxxx\"}\n: ping\nevent: message\n\n", false},
		{"healthy, named back", ": ping\nevent: error\nevent: message\ndata: {\"i\":0}\nevent: error\nevent\n\n", false},
	}
	for _, f := range firsts {
		for _, le := range lineEndings {
			for _, sp := range splits {
				if sp.name == "whole" || sp.name == "CR|LF" && le.name != "CRLF" {
					continue
				}
				ev := le.conv(f.event)
				stream := ev + le.conv(okTail)
				for limit := 1; limit <= len(ev)+1; limit++ {
					t.Run(fmt.Sprintf("%s/%s/%s/limit=%d", f.name, le.name, sp.name, limit), func(t *testing.T) {
						a := newUpstream(t, writeSteps(0, sp.cut(stream)...))
						b := newUpstream(t, sendStream(okStream))
						log := &advLog{}
						h := newAdvHarness(t, Config{MaxPeekBytes: limit}, log, nil, a, b)
						code, body := postProxy(t, h)
						assert.Equal(t, http.StatusOK, code)
						assert.NotContains(t, body, advSecret)
						if !f.error && body == okStream {
							// Cut short while an "event: error" line
							// named it so far: judged so, as documented.
							assert.Less(t, limit, len(ev))
							requireStatusFailure(t, log.errs(a.URL), http.StatusInternalServerError)
							return
						}
						if !f.error {
							assert.Equal(t, stream, body)
							assert.Equal(t, []error{nil}, log.errs(a.URL))
							return
						}
						errs := log.errs(a.URL)
						require.Len(t, errs, 1)
						assert.ErrorIs(t, errs[0], ErrErrorEvent)
						if body == okStream {
							requireStatusFailure(t, errs, http.StatusInternalServerError)
							return
						}
						assert.Less(t, limit, len(ev), "held back whole, not retried")
						assert.Contains(t, body, "The upstream failed to answer.")
						assert.True(t, strings.HasSuffix(body, le.conv(okTail)), "%q", body)
					})
				}
			}
		}
	}
}

// A first error event that is not retried (no other attempt allowed)
// reaches the client with no byte of its data, made generic, whatever its
// line breaks and however they are cut; its pick ends with its status.
func TestFirstErrorEventNotRetriedHidden(t *testing.T) {
	for _, c := range advStreams {
		if c.want != retried {
			continue
		}
		for _, le := range lineEndings {
			for _, sp := range splits {
				if sp.name == "CR|LF" && le.name != "CRLF" {
					continue
				}
				t.Run(c.name+"/"+le.name+"/"+sp.name, func(t *testing.T) {
					stream := le.conv(c.stream)
					a := newUpstream(t, writeSteps(0, sp.cut(stream)...))
					log := &advLog{}
					h := newAdvHarness(t, Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, log, nil, a)
					code, body := postProxy(t, h)
					assert.Equal(t, http.StatusOK, code)
					assert.NotContains(t, body, advSecret)
					if strings.Contains(c.stream, advSecret) {
						// An event without data has nothing to replace.
						assert.Contains(t, body, "The upstream failed to answer.")
					}
					requireStatusFailure(t, log.errs(a.URL), c.status)
				})
			}
		}
	}
}

// A scrubber that reads a stream from its start reads its first line past
// the byte-order mark the stream may start with, as a client does, however
// the mark is cut: an "event: error" line there names the event, whose
// data is replaced. A mark cut short by another byte is no mark: the first
// line is then no field, and passes as sent with its event. The mark
// itself passes as sent.
func TestScrubberByteOrderMark(t *testing.T) {
	cases := []struct{ stream, want string }{
		{"\ufeffevent: error\ndata: " + advSecret + "\n\n" + okTail, "\ufeffevent: error\ndata: {\"hidden\":500}\n\n" + okTail},
		{"\ufeffevent: error\r\ndata: a\r\ndata: " + advSecret + "\r\n\r\n", "\ufeffevent: error\r\ndata: {\"hidden\":500}\r\n\r\n"},
		{"\ufefferror: {\"code\":503,\"m\":\"" + advSecret + "\"}\n\n", "\ufefferror: {\"hidden\":503}\n\n"},
		{"\xef\xbbevent: error\ndata: x\n\n" + okTail, "\xef\xbbevent: error\ndata: x\n\n" + okTail},
		{"\xefevent: error\ndata: x\n\n", "\xefevent: error\ndata: x\n\n"},
		{"\ufeff\ufeffevent: error\ndata: x\n\n", "\ufeff\ufeffevent: error\ndata: x\n\n"},
	}
	for _, c := range cases {
		for size := 1; size <= len(c.stream); size++ {
			got := feedScrubber(t, c.stream, size, hideAll)
			require.Equal(t, c.want, got, "%q in pieces of %d", c.stream, size)
		}
	}
}

// A first event named "error" by its first line, after the stream's
// byte-order mark, whose data comes after more comments than the
// Transport holds back, and that is not retried: its data reaches the
// client replaced, however the stream is cut.
func TestNamedErrorAfterMarkPastPeekLimit(t *testing.T) {
	stream := "\ufeffevent: error\n" + strings.Repeat(": pad\n", 20) + "data: " + advSecret + "\n\n" + okTail
	for _, sp := range splits[:2] {
		t.Run(sp.name, func(t *testing.T) {
			a := newUpstream(t, writeSteps(0, sp.cut(stream)...))
			log := &advLog{}
			h := newAdvHarness(t, Config{MaxPeekBytes: 64, Retry: retry.LoopConfig{MaxAttempts: 1}}, log, nil, a)
			code, body := postProxy(t, h)
			assert.Equal(t, http.StatusOK, code)
			assert.NotContains(t, body, advSecret)
			assert.Contains(t, body, "The upstream failed to answer.")
			requireStatusFailure(t, log.errs(a.URL), http.StatusInternalServerError)
		})
	}
}

// Content codings are case-insensitive, and a header value may have spaces
// about it: an event stream whose Content-Encoding is "Identity" or
// " identity " is no compressed stream. Its first event named "error" is
// retried, a later error event reaches the client without its data, and
// OutputCounter counts its events and fails it.
func TestIdentityEncodingAnyCase(t *testing.T) {
	for _, ce := range []string{"Identity", "IDENTITY", " identity "} {
		send := func(stream string) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header()["Content-Encoding"] = []string{ce}
				_, _ = io.WriteString(w, stream)
			}
		}
		t.Run(ce, func(t *testing.T) {
			h := http.Header{"Content-Type": {"text/event-stream"}, "Content-Encoding": {ce}}
			c := NewOutputCounter(h)
			assert.Equal(t, 2, c.Count([]byte("data: {\"i\":0}\n\ndata: {\"i\":1}\n\nevent: error\ndata: {}\n\n"))+c.End())
			assert.True(t, c.Failed())

			a := newUpstream(t, send("data: {\"m\":\""+advSecret+"\"}\nevent: error\n\n"))
			b := newUpstream(t, sendStream(okStream))
			log := &advLog{}
			code, body := postProxy(t, newAdvHarness(t, Config{}, log, nil, a, b))
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, okStream, body)
			requireStatusFailure(t, log.errs(a.URL), http.StatusInternalServerError)

			a = newUpstream(t, send("data: {\"i\":0}\n\nevent: error\ndata: {\"m\":\""+advSecret+"\"}\n\n"))
			log = &advLog{}
			code, body = postProxy(t, newAdvHarness(t, Config{}, log, nil, a))
			assert.Equal(t, http.StatusOK, code)
			assert.NotContains(t, body, advSecret)
			errs := log.errs(a.URL)
			require.Len(t, errs, 1)
			assert.ErrorIs(t, errs[0], ErrErrorEvent)
		})
	}
}
