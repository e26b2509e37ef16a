package httplb

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// responsesPreamble is what vLLM and SGLang send of a streamed Responses
// request as soon as they accept it, before the engine prefills the
// prompt: its response.created and response.in_progress events.
func responsesPreamble() string {
	s := responsesStream(nil, "")
	return s[:strings.Index(s, "event: response.output_item.added")]
}

// firstOutput is the Responses event vLLM sends with the engine's first
// output: the first non-preamble event of responsesStream.
const firstOutput = "event: response.output_item.added\n"

// Which events are sent before generation: only response.created,
// response.in_progress and response.queued, wherever their "type" is in
// the object, however it is spaced or escaped, and not if the event is an
// error too, nor for a "type" that is nested or merely similar.
func TestPreambleEvent(t *testing.T) {
	cases := []struct {
		value string
		want  bool
	}{
		{`{"response":{"id":"resp_1","status":"in_progress","error":null},"sequence_number":0,"type":"response.created"}`, true},
		{`{"type":"response.in_progress","response":{"status":"in_progress"},"sequence_number":1}`, true},
		{` { "type" : "response.queued" , "response" : { } } `, true},
		{`{"type":"response.output_item.added","item":{"type":"message"}}`, false},
		{`{"type":"response.output_text.delta","delta":"x"}`, false},
		{`{"type":"response.in_progres"}`, false},
		{`{"type":"response.in_progresx"}`, false},
		{`{"type":"response.in_progress2"}`, false},
		{`{"type":"response.created.x"}`, false},
		{`{"type":"response.create"}`, false},
		{`{"type":"response.queue"}`, false},
		{`{"type":"response.completed","response":{}}`, false},
		{`{"type":"response.\u0063reated"}`, true},
		{`{"type":"\u0072esponse.in\u005Fprogress"}`, true},
		{`{"type":"response.\u0063reate"}`, false},
		{`{"item":{"type":"response.created"},"type":"x"}`, false},
		{`{"type":"response.created","type":"response.output_text.delta"}`, false},
		{`{"type":"response.output_text.delta","type":"response.created"}`, true},
		{`{"type":"response.created","error":{"code":500}}`, false},
		{`{"type":"response.created","error":null}`, true},
		{`["type","response.created"]`, false},
		{`"type":"response.created"`, false},
		{`{"type":["response.created"]}`, false},
		{`{"delta":"\"type\":\"response.created\""}`, false},
		{`{"type":"message_start","message":{"id":"msg_1"}}`, false},
		{`{"type": "ping"}`, false},
		{`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"role":"assistant"}}]}`, false},
		{`[DONE]`, false},
		{`00{"type":"response.in_progress"}`, false},
		{``, false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, preambleEvent([]byte(c.value)), c.value)
	}
	v := []byte(cases[0].value)
	allocs := testing.AllocsPerRun(100, func() {
		preambleEvent(v)
	})
	assert.Zero(t, allocs)
}

// A Responses stream is held back past its preamble events to the end of
// its first event that is not one, however it is cut into reads; that
// event may be an error, which then stands for its status. A stream of
// nothing but preamble events is committed at its end, or at the peek
// limit; a chat stream is held back to the end of its first event only.
func TestPeekPastPreamble(t *testing.T) {
	pre := responsesPreamble()
	cases := []struct {
		name   string
		stream string
		limit  int
		to     string // the bytes are held back at least to the end of this
		code   int
	}{
		{"output", responsesStream([]string{`"a"`}, completed(1)), DefaultMaxPeekBytes,
			`"type":"response.output_item.added"}` + "\n", 0},
		{"error", pre + event("error", `"code":"server_error","message":"x","sequence_number":2`), DefaultMaxPeekBytes,
			`"type":"error"}` + "\n", http.StatusInternalServerError},
		{"rate limited", pre + event("error", `"code":"rate_limit_exceeded","message":"x","sequence_number":2`), DefaultMaxPeekBytes,
			`"type":"error"}` + "\n", http.StatusTooManyRequests},
		{"vllm error", pre + errorStream("engine dead", "503"), DefaultMaxPeekBytes,
			`"code": 503}}` + "\n", http.StatusServiceUnavailable},
		{"failed", pre + event("response.failed", `"response":{"status":"failed","error":{"code":"server_error","message":"x"}}`), DefaultMaxPeekBytes,
			`"type":"response.failed"}` + "\n", http.StatusInternalServerError},
		{"queued, CRLF and a byte-order mark", "\xef\xbb\xbfevent: response.queued\r\ndata: {\"type\":\"response.queued\"}\r\n\r\n: ping\r\ndata: {\"type\":\"response.created\"}\r\n\r\ndata: {\"error\":{\"code\":502}}\r\n\r\n", DefaultMaxPeekBytes,
			`{"error":{"code":502}}` + "\r", http.StatusBadGateway},
		{"preamble only", pre, DefaultMaxPeekBytes, pre, 0},
		{"limit", pre + errorStream("x", "500"), len(pre) - 10, pre[:len(pre)-10], 0},
		{"not an object", pre + "data: [DONE]\n\n", DefaultMaxPeekBytes, pre + "data: [", 0},
		{"chat", "data: {\"i\":0}\n\ndata: {\"error\":{\"code\":500}}\n\n", DefaultMaxPeekBytes, "data: {\"i\":0}\n\n", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			held := strings.Index(c.stream, c.to) + len(c.to)
			require.GreaterOrEqual(t, held, len(c.to))
			for cut := range len(c.stream) + 1 {
				b := &body{rc: io.NopCloser(&pieces{[]string{c.stream[:cut], c.stream[cut:]}})}
				code, err := b.peek(&http.Response{Header: sseHeader}, c.limit)
				require.NoError(t, err)
				require.Equal(t, c.code, code, "cut at %d", cut)
				require.GreaterOrEqual(t, len(b.buf), held, "cut at %d", cut)
				switch c.name {
				case "chat":
					// Held back as before: no read past the first event.
					if cut >= held {
						require.Equal(t, cut, len(b.buf), "cut at %d", cut)
					}
				case "limit":
					require.Equal(t, c.limit, len(b.buf), "cut at %d", cut)
				}
				got, err := io.ReadAll(b)
				require.NoError(t, err)
				require.Equal(t, c.stream, string(got))
			}
		})
	}
}

// The first token of a Responses stream is its first event after the
// preamble, which vLLM sends only once the engine has produced something:
// FirstToken is not called, and the attempt not committed, while only the
// preamble has arrived.
func TestResponsesFirstTokenAfterPreamble(t *testing.T) {
	var firstTokens atomic.Int64
	var atPreamble atomic.Int64 // FirstToken calls when the stream went past its preamble
	atPreamble.Store(-1)
	stream := responsesStream([]string{`"a"`}, completed(1))
	pre := responsesPreamble()
	h := newMemHarness(t, Config{}, func(r *http.Request) (*http.Response, error) {
		resp := sseResponse(r, "")
		resp.Body = io.NopCloser(&hookPieces{p: []string{pre, stream[len(pre):]}, before: func(i int) {
			if i == 1 {
				atPreamble.Store(firstTokens.Load())
			}
		}})
		return resp, nil
	}, 1, llmlb.WithObserver(&llmlb.Observer{FirstToken: func(llmlb.FirstTokenInfo) { firstTokens.Add(1) }}))
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	assert.EqualValues(t, 0, atPreamble.Load(), "FirstToken called at the preamble")
	assert.EqualValues(t, 1, firstTokens.Load())
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, stream, body)
}

// hookPieces reads its pieces one per Read, calling before with a piece's
// index before returning its first byte.
type hookPieces struct {
	p      []string
	i      int
	began  bool
	before func(i int)
}

func (r *hookPieces) Read(b []byte) (int, error) {
	for r.i < len(r.p) && r.p[r.i] == "" {
		r.i++
		r.began = false
	}
	if r.i == len(r.p) {
		return 0, io.EOF
	}
	if !r.began {
		r.began = true
		r.before(r.i)
	}
	n := copy(b, r.p[r.i])
	r.p[r.i] = r.p[r.i][n:]
	return n, nil
}

// A Responses attempt that fails during the prefill, after vLLM sent its
// preamble (an error event, or the engine dying with the connection), has
// produced nothing: it is retried on the other replica, and the client
// sees only that replica's stream.
func TestResponsesPrefillFailureRetried(t *testing.T) {
	pre := responsesPreamble()
	want := responsesStream([]string{`"b"`}, completed(1))
	cases := []struct {
		name   string
		a      http.HandlerFunc
		status int // the status a's error event stands for; 0: a connection error
	}{
		{"error event", sendStream(pre + event("error", `"code":"server_error","message":"x","param":null,"sequence_number":2`)), http.StatusInternalServerError},
		{"rate limited", sendStream(pre + event("error", `"code":"rate_limit_exceeded","message":"x","param":null,"sequence_number":2`)), http.StatusTooManyRequests},
		{"vllm error", sendStream(pre + errorStream("Internal server error", "500")), http.StatusInternalServerError},
		{"connection lost", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, pre)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection closes mid-body
		}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, c.a)
			b := newUpstream(t, sendStream(want))
			rec := &recorder{}
			done := &doneLog{}
			h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
			code, body := postProxy(t, h)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, want, body)
			if c.status != 0 {
				requireStatusFailure(t, rec.reported(a.URL), c.status)
				requireStatusFailure(t, done.get(a.URL), c.status)
			} else {
				require.Len(t, done.get(a.URL), 1)
				assert.Error(t, done.get(a.URL)[0])
			}
			assert.Equal(t, []error{nil}, done.get(b.URL))
		})
	}
}

// An attempt whose engine has sent only its preamble has not committed: a
// hedge is sent after the hedge delay, wins, and the first attempt is
// cancelled.
func TestResponsesHedgedDuringPrefill(t *testing.T) {
	const hedgeDelay = time.Hour // marks the hedge timer
	hedgeC := make(chan time.Time, 1)
	prefilling := make(chan struct{}) // a's preamble has been read, and more asked for
	pre := responsesPreamble()
	want := responsesStream([]string{`"b"`}, completed(1))
	var cancelled atomic.Bool
	h := newMemHarness(t, Config{Retry: retry.LoopConfig{
		Hedge:  retry.HedgeConfig{Delay: hedgeDelay},
		Budget: unlimited{},
		After: func(d time.Duration) <-chan time.Time {
			if d == hedgeDelay {
				return hedgeC
			}
			return closedTime
		},
	}}, func(r *http.Request) (*http.Response, error) {
		resp := sseResponse(r, want)
		if r.URL.Host == "a.test" {
			resp.Body = io.NopCloser(io.MultiReader(strings.NewReader(pre), &prefill{ctx: r.Context(), started: prefilling, cancelled: &cancelled}))
		}
		return resp, nil
	}, 2)
	type result struct {
		resp *http.Response
		err  error
	}
	results := make(chan result, 1)
	go func() {
		resp, err := do(t, h, chatBody)
		results <- result{resp, err}
	}()
	var res result
	select {
	case <-prefilling:
		hedgeC <- time.Time{}
		res = <-results
	case res = <-results:
		t.Error("the attempt committed on its preamble")
	}
	require.NoError(t, res.err)
	body, err := readAll(t, res.resp)
	require.NoError(t, err)
	assert.Equal(t, want, body)
	assert.True(t, cancelled.Load(), "the first attempt is cancelled")
}

// prefill is the rest of a stream whose engine is prefilling: a Read
// signals started once and waits until ctx ends, then fails.
type prefill struct {
	ctx       context.Context
	started   chan struct{}
	cancelled *atomic.Bool
	once      bool
}

func (p *prefill) Read([]byte) (int, error) {
	if !p.once {
		p.once = true
		close(p.started)
	}
	select {
	case <-p.ctx.Done():
		p.cancelled.Store(true)
		return 0, p.ctx.Err()
	case <-time.After(5 * time.Second):
		return 0, io.ErrUnexpectedEOF
	}
}

// vLLM's preamble repeats a Responses request's instructions, twice: with
// long instructions it runs past MaxPeekBytes. The attempt may hold it
// back up to twice the request's body beyond that, so that a failure
// during the prefill is still retried.
func TestResponsesLongPreambleRetried(t *testing.T) {
	instructions := strings.Repeat("You are a careful assistant. ", 4000) // 116 KB
	pre := event("response.created", `"response":{"instructions":"`+instructions+`","status":"in_progress"},"sequence_number":0`) +
		event("response.in_progress", `"response":{"instructions":"`+instructions+`","status":"in_progress"},"sequence_number":1`)
	require.Greater(t, len(pre), 2*DefaultMaxPeekBytes)
	want := responsesStream([]string{`"b"`}, completed(1))
	a := newUpstream(t, sendStream(pre+event("error", `"code":"server_error","message":"x","param":null,"sequence_number":2`)))
	b := newUpstream(t, sendStream(want))
	done := &doneLog{}
	h := newObservedHarness(t, Config{}, done, nil, a, b)
	s := h.proxy(t)
	req := `{"model":"m","stream":true,"input":"hi","instructions":"` + instructions + `"}`
	resp, err := http.Post(s.URL+"/v1/responses", "application/json", strings.NewReader(req))
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, want, body)
	requireStatusFailure(t, done.get(a.URL), http.StatusInternalServerError)
	assert.Equal(t, []error{nil}, done.get(b.URL))
}
