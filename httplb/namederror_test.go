package httplb

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/sse"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stream whose first event is named "error" produced nothing, whatever
// the event's data (Anthropic's SDKs raise it on the name alone): its
// attempt fails with the status the data gives, or 500, and is retried on
// the other replica if that is retryable, however the upstream's writes
// cut the stream; the client gets the other replica's stream only.
func TestNamedErrorEventRetried(t *testing.T) {
	cases := []struct {
		name   string
		stream string
		status int
	}{
		{"a message and a code", "event: error\ndata: {\"message\": \"overloaded\", \"code\": 503}\n\n", http.StatusServiceUnavailable},
		{"an Anthropic type", "event: error\ndata: {\"type\": \"rate_limit_error\", \"message\": \"slow down\"}\n\n", http.StatusTooManyRequests},
		{"text over CR LF lines, no space", "event:error\r\ndata: upstream timed out\r\n: keep-alive\r\ndata: after 30s\r\n\r\n", http.StatusInternalServerError},
		{"after a comment", ": ping\n\nevent: error\ndata: [\"x\"]\n\ndata: [DONE]\n\n", http.StatusInternalServerError},
		{"without data", "event: error\n\n", http.StatusInternalServerError},
		{"without data, then a chunk", "event: error\r\rdata: {\"i\":0}\r\r", http.StatusInternalServerError},
		{"after a preamble", "event: response.created\ndata: {\"type\": \"response.created\"}\n\nevent: error\ndata: {\"message\": \"x\"}\n\n", http.StatusInternalServerError},
		// The last "event:" line of an event names it, wherever it comes
		// before the blank line that ends the event, after its data
		// included: the wait for the first event ends there.
		{"named after its data", "data: {\"i\":0}\nevent: error\n\ndata: boom\n\n", http.StatusInternalServerError},
		{"named after a value of text", "data: boom\nevent: error\n\ndata: [DONE]\n\n", http.StatusInternalServerError},
		{"named after its data, a code", "data: {\"code\": 429}\r\nid: 1\r\nevent:error\r\n\r\n", http.StatusTooManyRequests},
		{"named otherwise, then error", "event: message\ndata: {\"i\":0}\nevent: error\n\n", http.StatusInternalServerError},
		{"a preamble's data, then named error", "data: {\"type\": \"response.created\"}\nevent: error\n\n", http.StatusInternalServerError},
	}
	for _, c := range cases {
		for _, size := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/writes=%d", c.name, size), func(t *testing.T) {
				a := newUpstream(t, writeIn(c.stream, size))
				b := newUpstream(t, streamTokens(2))
				rec := &recorder{}
				done := &doneLog{}
				h := newObservedHarness(t, Config{Retry: retry.LoopConfig{Reporter: rec}}, done, nil, a, b)
				code, body := postProxy(t, h)
				assert.Equal(t, http.StatusOK, code)
				assert.Equal(t, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: [DONE]\n\n", body)
				assert.EqualValues(t, 1, a.hits.Load())
				assert.EqualValues(t, 1, b.hits.Load())
				requireStatusFailure(t, done.get(a.URL), c.status)
				requireStatusFailure(t, rec.reported(a.URL), c.status)
				assert.Equal(t, []error{nil}, done.get(b.URL))
			})
		}
	}
}

// A first event named "error" whose data says the request is at fault (a
// 400) is not retried: the client gets the stream as sent, and the pick
// ends with that status.
func TestNamedErrorEventNotRetryable(t *testing.T) {
	stream := "event: error\ndata: {\"code\": 400, \"message\": \"The prompt is too long.\"}\n\n"
	a := newUpstream(t, sendStream(stream))
	b := newUpstream(t, streamTokens(2))
	done := &doneLog{}
	h := newObservedHarness(t, Config{}, done, nil, a, b)
	code, body := postProxy(t, h)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, stream, body)
	assert.Zero(t, b.hits.Load())
	requireStatusFailure(t, done.get(a.URL), http.StatusBadRequest)
}

// An event named "error" after the first event is past retrying: the
// stream reaches the client, its event's data made generic through the
// proxy, wherever its name comes in it, and the pick ends as a failure.
func TestNamedErrorEventAfterFirst(t *testing.T) {
	cases := []struct {
		name, stream string
		hidden       string // the data the client gets a generic message in place of; "": none
	}{
		{"a later event", "data: {\"i\":0}\n\nevent: error\ndata: {\"message\": \"boom\"}\n\ndata: [DONE]\n\n", `{"message": "boom"}`},
		{"a later event without data", "data: {\"i\":0}\n\nevent:error\n\ndata: [DONE]\n\n", ""},
		{"a later event named after its data", "data: {\"i\":0}\n\ndata: {\"message\": \"boom\"}\nevent: error\n\ndata: [DONE]\n\n", `{"message": "boom"}`},
		{"a later event named between its data lines", "data: {\"i\":0}\n\ndata: boom\r\nevent:error\r\ndata: again\r\n\r\ndata: [DONE]\n\n", "boom\r\nevent:error\r\ndata: again"},
		{"a later event named otherwise, then error", "data: {\"i\":0}\n\nevent: message\ndata: {\"message\": \"boom\"}\nevent: error\n\ndata: [DONE]\n\n", `{"message": "boom"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newUpstream(t, writeIn(c.stream, 1))
			b := newUpstream(t, streamTokens(2))
			done := &doneLog{}
			h := newObservedHarness(t, Config{}, done, nil, a, b)
			code, body := postProxy(t, h)
			assert.Equal(t, http.StatusOK, code)
			assert.Zero(t, b.hits.Load(), "committed at the first event")
			if c.hidden != "" {
				before, after, ok := strings.Cut(c.stream, c.hidden)
				require.True(t, ok)
				require.True(t, strings.HasPrefix(body, before), body)
				require.True(t, strings.HasSuffix(body, after), body)
				got := body[len(before) : len(body)-len(after)]
				assert.NotContains(t, got, "boom")
				// The value, then the event's other lines among its data.
				generic, others, _ := strings.Cut(got, "\r\n")
				assert.Contains(t, generic, "The upstream failed to answer. Request ID: ")
				assert.True(t, json.Valid([]byte(generic)), generic)
				if strings.Contains(c.hidden, "event:error") {
					assert.Equal(t, "event:error", others)
				}
			} else {
				assert.Equal(t, c.stream, body)
			}
			errs := done.get(a.URL)
			require.Len(t, errs, 1)
			assert.ErrorIs(t, errs[0], ErrErrorEvent)
			var se *retry.StatusError
			assert.NotErrorAs(t, errs[0], &se, "no status: the attempt committed")
		})
	}
}

// A first event named "error" that outgrows what the Transport holds back
// has what it held replaced, and the rest of it, up to its end, dropped
// but for its lines of other fields: the client gets one generic value
// as the event's data, and none of the data as sent.
func TestNamedErrorEventPastPeekLimit(t *testing.T) {
	const head = "event: error\ndata: aaaa\n"
	cases := []struct {
		name, stream string
		limit        int
	}{
		{"at a line's end", head + "data: " + secret + "\n\ndata: [DONE]\n\n", len(head)},
		{"in a line", head + "data: " + secret + "\n\ndata: [DONE]\n\n", len(head) - 3},
		{"in a line over CR LF lines", "event:error\r\ndata: aaaa\r\n: x\r\ndata: " + secret + "\r\n\r\ndata: [DONE]\r\n\r\n", len(head) - 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t, writeIn(c.stream, 0))
			h := newHarness(t, llmlb.RoundRobin(), Config{MaxPeekBytes: c.limit, Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
			resp, body, _ := postLogged(t, h)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.NotContains(t, body, secret)
			assert.NotContains(t, body, "aa")
			first, rest, _ := strings.Cut(strings.ReplaceAll(body, "\r\n", "\n"), "\n\n")
			data := sse.AppendData(nil, []byte(first))
			assert.Contains(t, string(data), "The upstream failed to answer.")
			assert.True(t, json.Valid(data), "%q", data)
			assert.Equal(t, "data: [DONE]\n\n", rest)
		})
	}
}

// The wait for a first event named "error" ends with the event, whatever
// its data is, a preamble event's included, and the event's data is what
// is replaced; an event named "error" without data before a first event
// makes that an error, with nothing in it to replace.
func TestPeekNamedErrorEvent(t *testing.T) {
	cases := []struct {
		name, stream, value string
		code                int
	}{
		{"a preamble's data", "event: error\ndata: {\"type\":\"response.created\"}\n\ndata: {\"i\":0}\n\n", `{"type":"response.created"}`, 500},
		{"over lines", "event:error\r\ndata: a\r\n: x\r\ndata: b\r\n\r\ndata: {\"i\":0}\r\n\r\n", "a\r\n: x\r\ndata: b", 500},
		{"a code", "event: error\ndata: {\"code\":429}\n\n", `{"code":429}`, 429},
		{"without data", "event: error\n\ndata: {\"i\":0}\n\n", "", 500},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &body{rc: io.NopCloser(&pieces{[]string{c.stream}})}
			code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
			require.NoError(t, err)
			assert.Equal(t, c.code, code)
			assert.Equal(t, c.value, string(b.buf[b.errAt:b.errEnd]))
		})
	}
}

// A stream whose held-back start has no data line is an error if a line of
// it names an event "error": one that has ended, or that the body ends
// with, not one the limit cuts, which may name another.
func TestPeekNamedErrorEventWithoutData(t *testing.T) {
	cases := []struct {
		stream string
		limit  int
		code   int
	}{
		{": ping\n\nevent: error\n\n: ping\n", 100, 500},
		{": ping\n\nevent: error", 100, 500},
		{": ping\n\nevent: errors\n\n", 20, 0},
		{": ping\n\nevent: error\r\n\r\n: ping\n", 22, 500},
	}
	for _, c := range cases {
		b := &body{rc: io.NopCloser(&pieces{[]string{c.stream}})}
		code, err := b.peek(&http.Response{Header: sseHeader}, c.limit)
		require.NoError(t, err)
		assert.Equal(t, c.code, code, "%q, limit %d", c.stream, c.limit)
	}
}
