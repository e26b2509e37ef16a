package httplb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/sse"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errorStream is what vLLM streams when it fails a request after its 200,
// with the error's message and code (JSON text).
func errorStream(msg, code string) string {
	return `data: {"error": {"message": "` + msg + `", "type": "InternalServerError", "param": null, "code": ` + code + "}}\n\ndata: [DONE]\n\n"
}

// sendStream answers with an event stream of s in one write.
func sendStream(s string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, s)
	}
}

// doneLog records the error each pick ended with, by endpoint.
type doneLog struct {
	mu   sync.Mutex
	errs map[string][]error
}

func (d *doneLog) observer() *llmlb.Observer {
	return &llmlb.Observer{Done: func(i llmlb.DoneInfo) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.errs == nil {
			d.errs = map[string][]error{}
		}
		d.errs[i.Endpoint.Key()] = append(d.errs[i.Endpoint.Key()], i.Err)
	}}
}

func (d *doneLog) get(key string) []error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.errs[key]
}

// newObservedHarness is newHarness with the fixed policy, whose balancer
// tells done how every pick ended, and whose base transport is wrap's
// wrapping of a loopback one (wrap may be nil).
func newObservedHarness(t *testing.T, cfg Config, done *doneLog, wrap func(http.RoundTripper) http.RoundTripper, ups ...*upstream) *harness {
	t.Helper()
	return harnessWith(t, cfg, done.observer(), nil, wrap, ups...)
}

// harnessWith is newHarness with the fixed policy, a balancer that tells
// obs of its picks, and base as the loopback base transport if not nil,
// wrapped by wrap if not nil.
func harnessWith(t *testing.T, cfg Config, obs *llmlb.Observer, base *http.Transport, wrap func(http.RoundTripper) http.RoundTripper, ups ...*upstream) *harness {
	t.Helper()
	b, err := llmlb.New(fixed{}, llmlb.WithRand(rand.NewPCG(1, 2)), llmlb.WithObserver(obs))
	require.NoError(t, err)
	urls := make([]string, len(ups))
	for i, u := range ups {
		urls[i] = u.URL
	}
	eps, err := NewEndpoints(urls...)
	require.NoError(t, err)
	require.NoError(t, b.Update(eps))
	if base == nil {
		base = &http.Transport{}
	}
	t.Cleanup(base.CloseIdleConnections)
	cfg.Balancer = b
	cfg.Base = base
	if wrap != nil {
		cfg.Base = wrap(base)
	}
	if cfg.Retry.After == nil {
		cfg.Retry.After = func(time.Duration) <-chan time.Time { return closedTime }
	}
	tr, err := NewTransport(cfg)
	require.NoError(t, err)
	h := &harness{b: b, tr: tr, base: base, cfg: cfg}
	t.Cleanup(func() { h.requireIdle(t) })
	return h
}

// postProxy sends chatBody through a proxy over h and returns the status
// and the body the client receives.
func postProxy(t *testing.T, h *harness) (int, string) {
	t.Helper()
	s := h.proxy(t)
	resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	return resp.StatusCode, body
}

// reported returns the errors the reporter was told of for key.
func (r *recorder) reported(key string) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for i, k := range r.keys {
		if k == key {
			errs = append(errs, r.errs[i])
		}
	}
	return errs
}

// requireStatusFailure asserts that errs is one error: a first error event
// standing for the status code.
func requireStatusFailure(t *testing.T, errs []error, code int) {
	t.Helper()
	require.Len(t, errs, 1)
	var se *retry.StatusError
	require.ErrorAs(t, errs[0], &se, "%v", errs[0])
	assert.Equal(t, code, se.Code)
	assert.ErrorIs(t, errs[0], ErrErrorEvent)
}

// A 2xx stream whose first event is an error event (vLLM's when its engine
// fails before the first token) produced nothing for the client: it fails
// its attempt like a 500 answer, which is retried on the other replica, and
// the client sees only the other replica's stream.
func TestFirstEventErrorRetried(t *testing.T) {
	const hedgeDelay = time.Hour // marks the hedge timer
	cases := []struct {
		name  string
		hedge bool
		after func(time.Duration) <-chan time.Time
	}{
		{"serial", false, nil},
		{"hedging, no hedge sent", true, func(d time.Duration) <-chan time.Time {
			if d == hedgeDelay {
				return nil
			}
			return closedTime
		}},
		{"hedged at once", true, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, sendStream(errorStream("EngineCore encountered an issue.", "500")))
			rec := &recorder{}
			aFailed := make(chan struct{})
			b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if c.hedge && c.after == nil {
					// The hedge answers once the first attempt has failed,
					// while it is still in flight.
					select {
					case <-aFailed:
					case <-r.Context().Done():
						return
					}
				}
				streamTokens(2)(w, r)
			})
			budget := &outcomes{}
			done := &doneLog{}
			var once sync.Once
			rep := reporterFunc(func(key string, err error) {
				rec.Report(key, err)
				if key == a.URL {
					once.Do(func() { close(aFailed) })
				}
			})
			cfg := Config{Retry: retry.LoopConfig{Reporter: rep, Budget: budget, After: c.after}}
			if c.hedge {
				cfg.Retry.Hedge.Delay = hedgeDelay
			}
			h := newObservedHarness(t, cfg, done, nil, a, b)
			code, body := postProxy(t, h)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
			assert.EqualValues(t, 1, a.hits.Load())
			assert.EqualValues(t, 1, b.hits.Load())
			requireStatusFailure(t, rec.reported(a.URL), http.StatusInternalServerError)
			requireStatusFailure(t, done.get(a.URL), http.StatusInternalServerError)
			assert.Equal(t, []error{nil}, rec.reported(b.URL))
			assert.Equal(t, []error{nil}, done.get(b.URL))
			budget.mu.Lock()
			assert.ElementsMatch(t, []retry.Outcome{retry.Failed, retry.Succeeded}, budget.got)
			budget.mu.Unlock()
		})
	}
}

// A first error event whose code is not retryable (a 400: the request
// itself is at fault) is not retried: the client receives the stream as the
// upstream sent it, its 200 and its error event, and the attempt ends as a
// failure with that status.
// With a hedge in flight, that answer wins and the hedge is cancelled.
func TestFirstEventErrorNotRetryable(t *testing.T) {
	for _, hedged := range []bool{false, true} {
		t.Run(fmt.Sprintf("hedged=%v", hedged), func(t *testing.T) {
			stream := errorStream("This model's maximum context length is 8 tokens.", "400")
			reached := make(chan struct{}) // the hedge reached b, if hedged
			a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if hedged {
					<-reached
				}
				sendStream(stream)(w, r)
			})
			var cancelled atomic.Int64
			b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				close(reached)
				slow(&cancelled)(w, r)
			})
			rec := &recorder{}
			done := &doneLog{}
			cfg := Config{Retry: retry.LoopConfig{Reporter: rec}}
			if hedged {
				cfg.Retry.Hedge.Delay = time.Hour // hedged at once: After is closedTime
			}
			h := newObservedHarness(t, cfg, done, nil, a, b)
			code, body := postProxy(t, h)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, stream, body)
			requireStatusFailure(t, rec.reported(a.URL), http.StatusBadRequest)
			requireStatusFailure(t, done.get(a.URL), http.StatusBadRequest)
			if !hedged {
				assert.EqualValues(t, 0, b.hits.Load(), "not retried")
				return
			}
			require.Eventually(t, func() bool { return cancelled.Load() == 1 }, 5*time.Second, time.Millisecond, "the hedge is cancelled")
			errs := rec.reported(b.URL)
			require.Len(t, errs, 1)
			assert.ErrorIs(t, errs[0], context.Canceled)
		})
	}
}

// When every attempt's first event is an error, the client receives the
// last attempt's stream as its upstream sent it, but for the error's
// message, which is generic, and every attempt ends as a failure, once.
func TestFirstEventErrorAllFail(t *testing.T) {
	cases := []struct {
		name, code string // the error's code as sent
		status     int    // the status it stands for
		shown      string // the code the client is shown
	}{
		{"503", "503", http.StatusServiceUnavailable, "503"},
		{"no code", "null", http.StatusInternalServerError, "500"},
		{"code out of range", "700", http.StatusInternalServerError, "700"},
		{"code a string", `"429"`, http.StatusInternalServerError, `"429"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, sendStream(errorStream("a is down", c.code)))
			bStream := errorStream("b is down", c.code)
			b := newUpstream(t, sendStream(bStream))
			rec := &recorder{}
			done := &doneLog{}
			h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec, MaxAttempts: 2}}, done, nil, a, b)
			code, body := postProxy(t, h)
			assert.Equal(t, http.StatusOK, code)
			// The stream as sent, but for its error's message, which may
			// carry the engine's internals.
			assert.NotEqual(t, bStream, body)
			assert.NotContains(t, body, "b is down")
			assert.Regexp(t, `^data: \{"error":\{"message":"The upstream failed to answer. Request ID: req_[A-Z0-9]+","type":"InternalServerError","code":`+
				regexp.QuoteMeta(c.shown)+`\}\}\n\ndata: \[DONE\]\n\n$`, body)
			for _, u := range []*upstream{a, b} {
				assert.EqualValues(t, 1, u.hits.Load())
				requireStatusFailure(t, rec.reported(u.URL), c.status)
				requireStatusFailure(t, done.get(u.URL), c.status)
			}
		})
	}
}

// halfSignal closes read once the first read of a response body from host
// has returned bytes.
type halfSignal struct {
	base http.RoundTripper
	host string
	read chan struct{}
	once sync.Once
}

func (s *halfSignal) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err == nil && r.URL.Host == s.host {
		resp.Body = &signalBody{ReadCloser: resp.Body, s: s}
	}
	return resp, err
}

type signalBody struct {
	io.ReadCloser
	s *halfSignal
}

func (b *signalBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.s.once.Do(func() { close(b.s.read) })
	}
	return n, err
}

// A first error event split across writes, the second sent only once the
// gateway has read the first (which already has "data:"), is still seen as
// an error and retried.
func TestFirstEventErrorSplitAcrossWrites(t *testing.T) {
	stream := errorStream("engine dead", "500")
	cut := strings.Index(stream, `"message"`)
	var a *upstream
	sig := &halfSignal{read: make(chan struct{})}
	a = newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream[:cut])
		w.(http.Flusher).Flush()
		select {
		case <-sig.read:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, stream[cut:])
	})
	b := newUpstream(t, streamTokens(1))
	sig.host = strings.TrimPrefix(a.URL, "http://")
	rec := &recorder{}
	h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, &doneLog{}, func(base http.RoundTripper) http.RoundTripper {
		sig.base = base
		return sig
	}, a, b)
	code, body := postProxy(t, h)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body)
	assert.EqualValues(t, 1, b.hits.Load())
	requireStatusFailure(t, rec.reported(a.URL), http.StatusInternalServerError)
}

// reporterFunc is a retry.Reporter.
type reporterFunc func(key string, err error)

func (f reporterFunc) Report(key string, err error) { f(key, err) }

// pieces reads s in the pieces given, one per Read.
type pieces struct{ p []string }

func (r *pieces) Read(b []byte) (int, error) {
	for len(r.p) > 0 && r.p[0] == "" {
		r.p = r.p[1:]
	}
	if len(r.p) == 0 {
		return 0, io.EOF
	}
	n := copy(b, r.p[0])
	r.p[0] = r.p[0][n:]
	return n, nil
}

// Wherever the first event is cut, an error is retried and any other first
// event committed, its stream passed on intact.
func TestFirstEventCutAnywhere(t *testing.T) {
	streams := []struct {
		name, a string
		failed  bool // a's first event is an error
	}{
		{"vllm error", ": ping\n\n" + errorStream("engine dead", "500"), true},
		{"anthropic error", "event: error\r\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\r\n\r\n", true},
		{"byte-order mark", "\xef\xbb\xbfdata:{\"error\":{\"code\":502}}", true},
		{"chunk", "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: [DONE]\n\n", false},
		{"error deeper", "data: {\"choices\":[{\"error\":{\"code\":500}}]}\n\n", false},
		{"error after a chunk", "data: {\"i\":0}\n\n" + errorStream("x", "500"), false},
		{"not an object", "data: [DONE]\n\ndata: {\"error\":{}}\n\n", false},
		{"escaped key", `data: {"\u0065rror":{"code":500}}` + "\n\n", true},
		{"escaped type", `data: {"type":"response.f\u0061iled","response":{}}` + "\n\n", true},
		{"error in a string", `data: {"text":"\"error\":","n":{"\u0065rror":{}},"x":"\u0065rror"}` + "\n\n", false},
		{"data over lines", "data: {\"error\":\ndata: {\"code\":500}}\n\n", true},
		{"data over CR LF lines, a mark, others between", "\xef\xbb\xbfdata: {\r\n: keep-alive\r\nevent: error\r\ndata: \"error\": {\"code\": 503}\r\ndata: }\r\n\r\n", true},
		{"data over CR lines", "data:\rdata:{\"error\"\rdata::{}}\r\r", true},
		{"data without a colon first", "data\ndata: {\"error\":{\"code\":500}}\n\n", true},
		{"data over lines, not an error", "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"\\\"error\\\":{}\"}}]}\n\ndata: [DONE]\n\n", false},
		{"data over lines, error deeper", "data: {\"choices\":[\ndata: {\"error\":{}}]}\n\n", false},
		{"value ended at the event's end", "data: {\"error\":{\"code\":500}\n\ndata: b\n\n", true},
		{"preamble over lines", "event: response.created\ndata: {\"type\":\ndata: \"response.created\"}\n\n" + errorStream("x", "500"), true},
		// An event named "error" is one whatever its data, held back to
		// its end.
		{"named error", "event: error\ndata: {\"message\":\"boom\"}\n\n", true},
		{"named error, no space, text over CR LF lines", "event:error\r\ndata: Internal\r\ndata: error\r\n\r\n", true},
		{"named error after a comment", ": ping\r\n\r\n: x\r\nevent: error\r\ndata: [1]\r\n\r\n", true},
		{"named error without data", "event: error\n\ndata: {\"i\":0}\n\n", true},
		{"named error without data at the end", "\xef\xbb\xbfevent: error", true},
		{"named error in a value", "data: {\"a\":\nevent: error\ndata: 1}\n\n", true},
		{"named error after a preamble", "event: response.created\ndata: {\"type\":\"response.created\"}\n\nevent:error\ndata: x\n\n", true},
		{"named otherwise", "event: errors\ndata: {\"message\":\"x\"}\n\nevent:  error\ndata: x\n\n", false},
		{"named error after its first value", "data: {\"i\":0}\nevent: error\n\n", true},
		{"named error, then otherwise", "event: error\nevent: message\ndata: {\"i\":0}\n\n", false},
		{"named error, then without a value", "event: error\r\nevent\r\ndata: {\"i\":0}\r\n\r\n", false},
		{"named otherwise, then error", "event: message\nevent:error\ndata: {\"i\":0}\n\n", true},
		{"named error between values, then otherwise", "data: {\"i\":0}\nevent: error\ndata: {\"i\":1}\nevent: message\n\n", false},
	}
	for _, s := range streams {
		t.Run(s.name, func(t *testing.T) {
			for cut := range len(s.a) + 1 {
				h := newMemHarness(t, Config{}, func(r *http.Request) (*http.Response, error) {
					resp := sseResponse(r, "data: b\n\n")
					if r.URL.Host == "a.test" {
						resp.Body = io.NopCloser(&pieces{[]string{s.a[:cut], s.a[cut:]}})
					}
					return resp, nil
				}, 2)
				resp, err := do(t, h, chatBody)
				require.NoError(t, err)
				body, err := readAll(t, resp)
				require.NoError(t, err)
				want := s.a
				if s.failed {
					want = "data: b\n\n"
				}
				require.Equal(t, want, body, "cut at %d", cut)
			}
		})
	}
}

// FuzzPeek checks that holding back the start of a body for its first event
// loses, adds and reorders no byte, however the body is cut into reads and
// whatever the peek limit, and that whether its first event is an error
// does not depend on the cuts.
func FuzzPeek(f *testing.F) {
	for _, s := range []string{
		errorStream("x", "500"),
		": ping\r\n\r\ndata: {\"a\":1}\n\n",
		"\xef\xbb\xbfdata:  {\"error\":{\"code\":429}}",
		"data:\n\ndata: x",
		"data: {\"error\":{\"code\":4e2}, \"x\": \"\n",
		"event: e\ndata: {\"type\":\"error\",\"error\":{}}\r",
		"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\",\"sequence_number\":0}\n\n",
		"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":503}}}\n",
		"event: response.created\ndata: {\"response\":{\"error\":null},\"type\":\"response.created\"}\n\n",
		"error: {\"code\": 400, \"message\": \"x\", \"type\": \"exceed_context_size_error\"}\n\ndata: [DONE]\n\n",
		"\xef\xbb\xbferror: {\"error\":{\"code\":503}}",
		"data:{\"error\":\"Input validation error: x\",\"error_type\":\"validation\"}\n\n",
		"data: {\"\\u0065rror\":{\"code\":503}}\n\n",
		"\xef\xbb\xbfdata: {\r\n: c\r\nevent: error\r\ndata: \"error\":\r\ndata\r\ndata: {\"code\": 429}}\r\n\r\n",
		"data\rdata:\rdata: {\"type\":\"response.created\",\rdata:\"x\":1}\r\rdata: {\"error\":\n\ndata: {}}\n",
		"event: response.created\ndata: {\"type\":\ndata: \"response.created\"}\n\ndata: {\"a\":\"\ndata: \\\"error\\\":{}\"}\n\n",
		"event: error\ndata: {\"message\":\"x\",\"code\":503}\n\ndata: [DONE]\n\n",
		": c\r\nevent:error\r\ndata: Internal\r\n: c\r\ndata: error\r\n\r\n",
		"event: error\n\ndata: {\"a\":1}\n\n",
		"\xef\xbb\xbfevent: error\rdata\rdata: x",
		"event: response.created\ndata: {\"type\":\"response.created\"}\nevent: error\n\ndata: {\"a\":1}\n",
		"data:\"\"\"\nevent:error\n",
		"data:\nevent: error\ndata: x\n\n",
		"data: {\"a\":1}\nevent: error\n\ndata: [DONE]\n\n",
		"data: text\r\nid: 1\r\nevent:error\r\n\r\n",
		": c\n\ndata: {\"a\":\ndata: 1}\ndata: x\nevent: error\n",
		// The last "event:" line of an event names it, and the wait ends
		// with the event.
		"event: error\nevent: message\ndata: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: message\nevent: error\ndata: {\"a\":1}\n\ndata: [DONE]\n\n",
		"data: {\"a\":1}\nevent: error\n\nevent: error\nevent\ndata: {\"b\":2}\n\n",
		"event:error\r\ndata: {\"a\":1}\r\nevent:\r\n\r\ndata: x\r\nevent: error\r\n\r\n",
		"data: {\"type\":\"response.created\"}\nevent: error\n\ndata: {\"a\":1}\n\n",
		"event: error\nevent: e\n\ndata: {\"a\":1}\nevent: message\nevent: error",
		"",
	} {
		f.Add([]byte(s), uint8(3), uint16(0), true)
		f.Add([]byte(s), uint8(1), uint16(7), false)
	}
	f.Fuzz(func(t *testing.T, stream []byte, step uint8, limit uint16, sse bool) {
		h := jsonHeader
		if sse {
			h = sseHeader
		}
		lim := int(limit)
		if lim == 0 {
			lim = len(stream) + 1
		}
		// read peeks and reads the stream in pieces of step bytes, through
		// a scrubber that hides as hide does if it is set, as
		// handleFirstError hands the body on.
		read := func(step int, hide func(int, []byte) []byte) (int, []byte) {
			var p []string
			for i := 0; i < len(stream); i += step {
				p = append(p, string(stream[i:min(i+step, len(stream))]))
			}
			b := &body{rc: io.NopCloser(&pieces{p})}
			code, err := b.peek(&http.Response{Header: h}, lim)
			if err != nil {
				t.Fatal(err)
			}
			if code != 0 && (!sse || code < 100 || code > 599) {
				t.Fatalf("code %d", code)
			}
			if hide != nil {
				b.scrubEvents(hide, false)
			}
			got, err := io.ReadAll(b)
			if err != nil {
				t.Fatal(err)
			}
			return code, got
		}
		code, got := read(int(step%16)+1, nil)
		if !bytes.Equal(got, stream) {
			t.Fatalf("read %q, want %q", got, stream)
		}
		if lim > len(stream) {
			if whole, _ := read(len(stream)+1, nil); whole != code {
				t.Fatalf("code %d, %d when read whole", code, whole)
			}
		}
		// The first event with data, as a client reads it, against the
		// verdict: one named "error" by its last "event:" line, or after
		// an event so named without data, is an error; one that is not,
		// whose data has no error (nor a preamble to skip), is none.
		if named, prior, data, ok := firstEventReference(stream); sse && ok && lim > len(stream) {
			if (named || prior) && code == 0 {
				t.Fatalf("%q: the first event is named \"error\", or one before it without data, and no error", stream)
			}
			if !named && !prior && code != 0 && !mayFail(data) && !bytes.Contains(stream, []byte(errorField)) &&
				!bytes.Contains(stream, []byte(responsePrefix)) {
				t.Fatalf("%q: code %d for a first event that is no error", stream, code)
			}
		}
		if _, kept := read(int(step%16)+1, func(int, []byte) []byte { return nil }); !bytes.Equal(kept, stream) {
			t.Fatalf("read through a scrubber that hides nothing %q, want %q", kept, stream)
		}
		// A first event that the peek took for no error event is held
		// back to its event's end by the scrubber, as every later one:
		// no data of an event named "error" passes, the first's included.
		if _, scrubbed := read(int(step%16)+1, hideAll); sse && code == 0 && len(stream) <= maxHeldEvent &&
			namedDataLeaked(scrubbed) {
			t.Fatalf("let the data of an event named \"error\" go: %q -> %q", stream, scrubbed)
		}
	})
}

// Holding back an ordinary first event allocates only its buffer: telling
// an error event from it costs nothing per request.
func TestPeekOrdinaryAllocs(t *testing.T) {
	const stream = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	r := strings.NewReader(stream)
	resp := &http.Response{Header: sseHeader}
	b := &body{}
	rc := io.NopCloser(r)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(stream)
		*b = body{rc: rc}
		if code, err := b.peek(resp, DefaultMaxPeekBytes); code != 0 || err != nil {
			t.Fatal(code, err)
		}
	})
	assert.LessOrEqual(t, allocs, 1.0)
}

// An error that is not an error event (a broken connection) before the
// first event is still a connection error, not a status.
func TestPeekReadError(t *testing.T) {
	errBroken := errors.New("broken")
	b := &body{rc: io.NopCloser(io.MultiReader(strings.NewReader("data: {\"err"), iotestErr{errBroken}))}
	code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
	assert.Zero(t, code)
	assert.ErrorIs(t, err, errBroken)
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// secret is what an upstream's error message may tell that no client
// should read.
const secret = "Traceback: /srv/vllm/worker.py line 7, 10.1.2.3"

// hiddenEvents are error events, each as a stream sends it, with the level
// and status it is logged with and the line the client gets in place of
// its value's line (ID for the request id), or in place of sent, the lines
// of a value over several.
var hiddenEvents = []struct {
	name   string
	stream string
	level  string
	status int
	want   string // the error event's line as the client gets it
	sent   string // the lines it replaces, if not errorLine(stream)
}{
	{"vLLM", `data: {"error": {"message": "` + secret + `", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\ndata: [DONE]\n\n",
		"ERROR", 500, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"InternalServerError","code":500}}`, ""},
	{"vLLM, a type that is no token", `data: {"error": {"message": "` + secret + `", "type": "` + secret + `", "code": 503}}` + "\n\n",
		"ERROR", 503, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"upstream_error","code":503}}`, ""},
	{"OpenAI rate limit", `data: {"error": {"message": "Rate limit reached in organization org-secret", "type": "requests", "code": "rate_limit_exceeded"}}` + "\n\n",
		"INFO", 429, `data: {"error":{"message":"The upstream is rate limited; retry later. Request ID: ID","type":"requests","code":"rate_limit_exceeded"}}`, ""},
	{"Anthropic", "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"" + secret + "\"}}\n\n",
		"ERROR", 503, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"overloaded_error","code":503},"type":"error"}`, ""},
	{"TGI", `data: {"error":"Incomplete generation: ` + secret + `","error_type":"incomplete_generation"}` + "\n\n",
		"ERROR", 500, `data: {"error":"The upstream failed to answer. Request ID: ID","error_type":"incomplete_generation"}`, ""},
	{"TGI generation", `data: {"error":"Request failed during generation: ` + secret + `","error_type":"generation"}` + "\n\n",
		"ERROR", 424, `data: {"error":"The upstream failed to answer. Request ID: ID","error_type":"generation"}`, ""},
	{"TGI OpenAI-compatible generation", `data: {"error":{"message":"Request failed during generation: ` + secret + `","http_status_code":422}}` + "\n\ndata: [DONE]\n\n",
		"ERROR", 424, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"upstream_error","code":424}}`, ""},
	{"Responses error", "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"" + secret + "\",\"param\":null,\"sequence_number\":0}\n\n",
		"ERROR", 500, `data: {"code":"server_error","message":"The upstream failed to answer. Request ID: ID","param":null,"sequence_number":0,"type":"error"}`, ""},
	{"Responses failed", "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"" + secret + "\"}}}\n\n",
		"ERROR", 500, `data: {"response":{"error":{"code":"server_error","message":"The upstream failed to answer. Request ID: ID"},"id":"resp_1","status":"failed"},"type":"response.failed"}`, ""},
	{"llama.cpp error line", "error: {\"code\":500,\"message\":\"" + secret + "\",\"type\":\"server_error\"}\n\n",
		"ERROR", 500, `error: {"code":500,"message":"The upstream failed to answer. Request ID: ID","type":"server_error"}`, ""},
	{"400", `data: {"error": {"message": "This model's maximum context length is 8 tokens.", "type": "BadRequestError", "param": null, "code": 400}}` + "\n\n",
		"INFO", 400, `data: {"error": {"message": "This model's maximum context length is 8 tokens.", "type": "BadRequestError", "param": null, "code": 400}}`, ""},
	// Keys and types are what JSON decodes them to, escapes and all.
	{"vLLM, escaped key", `data: {"\u0065rror": {"message": "` + secret + `", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\ndata: [DONE]\n\n",
		"ERROR", 500, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"InternalServerError","code":500}}`, ""},
	{"Responses error, escaped type", "event: error\ndata: {\"t\\u0079pe\":\"\\u0065rror\",\"code\":\"server_error\",\"message\":\"" + secret + "\",\"param\":null,\"sequence_number\":0}\n\n",
		"ERROR", 500, `data: {"code":"server_error","message":"The upstream failed to answer. Request ID: ID","param":null,"sequence_number":0,"type":"\u0065rror"}`, ""},
	{"Responses failed, escaped type", "data: {\"type\":\"response.f\\u0061iled\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"" + secret + "\"}}}\n\n",
		"ERROR", 500, `data: {"response":{"error":{"code":"server_error","message":"The upstream failed to answer. Request ID: ID"},"id":"resp_1","status":"failed"},"type":"response.f\u0061iled"}`, ""},
	// An event's data lines are joined with a LF: one value may spread
	// over several, among the lines of other fields, which stay.
	{"vLLM, data over lines", "data: {\"error\":\ndata: {\"message\": \"" + secret + "\", \"type\": \"InternalServerError\", \"code\": 500}}\n\ndata: [DONE]\n\n",
		"ERROR", 500, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"InternalServerError","code":500}}`,
		"data: {\"error\":\ndata: {\"message\": \"" + secret + "\", \"type\": \"InternalServerError\", \"code\": 500}}"},
	{"Anthropic, data over CR LF lines among others", "event: error\r\ndata: {\"type\": \"error\",\r\n: keep-alive\r\ndata:\"error\": {\"type\": \"overloaded_error\",\r\nid: 7\r\ndata:  \"message\": \"" + secret + "\"}}\r\n\r\n",
		"ERROR", 503, "data: {\"error\":{\"message\":\"The upstream failed to answer. Request ID: ID\",\"type\":\"overloaded_error\",\"code\":503},\"type\":\"error\"}\r\n: keep-alive\r\nid: 7",
		"data: {\"type\": \"error\",\r\n: keep-alive\r\ndata:\"error\": {\"type\": \"overloaded_error\",\r\nid: 7\r\ndata:  \"message\": \"" + secret + "\"}}"},
	{"vLLM, data without a colon first", "data\ndata: {\"error\": {\"message\": \"" + secret + "\", \"type\": \"InternalServerError\", \"code\": 502}}\n\n",
		"ERROR", 502, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"InternalServerError","code":502}}`, ""},
	{"TGI, data over lines, CR", "data:{\"error\":\"Request failed during generation: " + secret + "\",\rdata:\"error_type\":\"generation\"}\r\r",
		"ERROR", 424, `data:{"error":"The upstream failed to answer. Request ID: ID","error_type":"generation"}`,
		"data:{\"error\":\"Request failed during generation: " + secret + "\",\rdata:\"error_type\":\"generation\"}"},
	// An event named "error" is an error event whatever its data, which
	// is replaced whole, all its data lines, its status the data's code
	// or type if it has one, else 500.
	{"named, a message and a code", "event: error\ndata: {\"message\": \"" + secret + "\", \"code\": 503}\n\n",
		"ERROR", 503, `data: {"code":503,"message":"The upstream failed to answer. Request ID: ID"}`,
		"data: {\"message\": \"" + secret + "\", \"code\": 503}"},
	{"named, an Anthropic type", "event: error\ndata: {\"type\": \"overloaded_error\", \"message\": \"" + secret + "\"}\n\n",
		"ERROR", 503, `data: {"code":503,"message":"The upstream failed to answer. Request ID: ID","type":"overloaded_error"}`,
		"data: {\"type\": \"overloaded_error\", \"message\": \"" + secret + "\"}"},
	{"named, no space, text over CR LF lines", "event:error\r\n: keep-alive\r\ndata: " + secret + "\r\nid: 7\r\ndata: RuntimeError: engine dead\r\n\r\n",
		"ERROR", 500, "data: {\"error\":{\"message\":\"The upstream failed to answer. Request ID: ID\",\"type\":\"upstream_error\",\"code\":500}}\r\nid: 7",
		"data: " + secret + "\r\nid: 7\r\ndata: RuntimeError: engine dead"},
	{"named, text after a comment, CR", ": ping\r\revent: error\rdata: " + secret + "\r\r",
		"ERROR", 500, `data: {"error":{"message":"The upstream failed to answer. Request ID: ID","type":"upstream_error","code":500}}`,
		"data: " + secret},
	{"named, a 400", "event: error\ndata: {\"code\": 400, \"message\": \"The prompt is too long.\"}\n\n",
		"INFO", 400, "data: {\"code\": 400, \"message\": \"The prompt is too long.\"}",
		"data: {\"code\": 400, \"message\": \"The prompt is too long.\"}"},
}

// sentLines returns the lines of the stream of hiddenEvents[i] that the
// client gets its want in place of.
func sentLines(i int) string {
	if c := hiddenEvents[i]; c.sent != "" {
		return c.sent
	}
	return errorLine(hiddenEvents[i].stream)
}

// loggedEvent reports whether event, logged for the error event of stream,
// is its value as sent: a line's, or the data of a value over several
// lines, as the event-stream format joins them.
func loggedEvent(stream, event string) bool {
	return event != "" && (strings.Contains(stream, event) || strings.Contains(string(sse.AppendData(nil, []byte(stream))), event))
}

// A stream whose first event is an error that is not retried reaches the
// client with the event's message generic, as the body of an error answer
// of the status it stands for would be, in the event's own shape, with its
// type and code if they are plain tokens; the event as sent goes to the
// log. An event that describes the request (a 400) reaches it as sent.
// So it is however the upstream's writes cut it, a byte each, say.
func TestFirstEventErrorHidden(t *testing.T) {
	for i, c := range hiddenEvents {
		for _, size := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/writes=%d", c.name, size), func(t *testing.T) {
				up := newUpstream(t, writeIn(c.stream, size))
				h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
				resp, body, logs := postLogged(t, h)
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				id := resp.Header.Get(requestIDHeader)
				require.True(t, validRequestID(id), id)
				want := strings.ReplaceAll(c.want, "Request ID: ID", "Request ID: "+id)
				if c.status == http.StatusBadRequest {
					assert.Equal(t, c.stream, body, "an error about the request reaches the client as sent")
				} else {
					assert.NotContains(t, body, "secret")
					assert.NotContains(t, body, "Traceback")
				}
				// The rest of the stream is as sent.
				assert.Equal(t, strings.Replace(c.stream, sentLines(i), want, 1), body)
				var rec struct {
					Level     string `json:"level"`
					RequestID string `json:"request_id"`
					Status    int    `json:"status"`
					Event     string `json:"event"`
				}
				require.NoError(t, json.Unmarshal([]byte(logs.String()), &rec), logs.String())
				assert.Equal(t, c.level, rec.Level)
				assert.Equal(t, id, rec.RequestID)
				assert.Equal(t, c.status, rec.Status)
				assert.True(t, loggedEvent(c.stream, rec.Event), "the operator sees the event as sent: %q", rec.Event)
			})
		}
	}
}
