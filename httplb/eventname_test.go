package httplb

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/sse"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstEventReference reads the event stream whole, as the event-stream
// format's interpretation does, to its first event with a data field, its
// lines up to a blank line or to the stream's end: whether that event is
// named "error" by its last "event:" line, whether an event before it,
// without data, was, and its data. ok is false if no event has data.
func firstEventReference(stream []byte) (named, prior bool, data []byte, ok bool) {
	stream = bytes.TrimPrefix(stream, []byte(sse.ByteOrderMark))
	norm := strings.ReplaceAll(strings.ReplaceAll(string(stream), "\r\n", "\n"), "\r", "\n")
	var lines []byte // the current event's
	hasData := false
	for line := range strings.SplitSeq(norm, "\n") {
		if line != "" {
			name, value, _ := strings.Cut(line, ":")
			switch name {
			case "event":
				named = strings.TrimPrefix(value, " ") == sse.ErrorEvent
			case "data":
				hasData = true
			}
			lines = append(append(lines, line...), '\n')
			continue
		}
		if hasData {
			return named, prior, sse.AppendData(nil, lines), true
		}
		prior, named, lines = prior || named, false, lines[:0]
	}
	return named, prior, sse.AppendData(nil, lines), hasData
}

// The last "event:" line before an event's blank line names it, as the
// event-stream format has it: an event named "error" and then otherwise
// is no error event, and one named otherwise and then "error" is one,
// whatever its data; an "event" line without a value leaves the default
// name. The first event is judged so, however the stream is cut into
// reads, and held back to its blank line.
func TestPeekLastEventNameCounts(t *testing.T) {
	cases := []struct {
		name, stream string
		code         int
		value        string // the data replaced for an error
	}{
		{"error, then message", "event: error\nevent: message\ndata: {\"i\":0}\n\ndata: [DONE]\n\n", 0, ""},
		{"message, then error", "event: message\nevent: error\ndata: {\"code\":503}\n\ndata: [DONE]\n\n", 503, `{"code":503}`},
		{"error, then no value", "event:error\r\nevent\r\ndata: {\"i\":0}\r\n\r\n", 0, ""},
		{"error, then an empty value", "event: error\nevent: \ndata: {\"i\":0}\n\n", 0, ""},
		{"error after the data", "data: {\"i\":0}\nevent: error\n\n", 500, `{"i":0}`},
		{"error after the data of two lines", "data: a\nid: 1\ndata: b\nevent: error\n\n", 500, "a\nid: 1\ndata: b"},
		{"error between the data, then message", "data: {\"i\":0}\nevent: error\ndata: {\"i\":1}\nevent: message\n\n", 0, ""},
		{"an error value, named otherwise", "event: error\ndata: {\"error\":{\"code\":429}}\nevent: message\n\n", 429, `{"error":{"code":429}}`},
		{"without data, error then message, before", "event: error\nevent: message\n\ndata: {\"i\":0}\n\n", 0, ""},
		{"without data, message then error, before", "event: message\nevent: error\n\ndata: {\"i\":0}\n\n", 500, ""},
		{"a preamble named error after its data", "data: {\"type\":\"response.created\"}\nevent: error\n\ndata: {\"i\":0}\n\n", 500, `{"type":"response.created"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The end of the first event with data: its blank line, a
			// CR LF's CR.
			d := strings.Index(c.stream, "data")
			end := d + strings.Index(c.stream[d:], "\n\n") + 2
			if i := strings.Index(c.stream[d:], "\r\n\r\n"); i >= 0 {
				end = d + i + 3
			}
			for cut := range len(c.stream) + 1 {
				b := &body{rc: io.NopCloser(&pieces{[]string{c.stream[:cut], c.stream[cut:]}})}
				code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
				require.NoError(t, err)
				require.Equal(t, c.code, code, "cut at %d", cut)
				if code != 0 {
					require.Equal(t, c.value, string(b.buf[b.errAt:b.errEnd]), "cut at %d", cut)
				}
				require.GreaterOrEqual(t, len(b.buf), end, "held back to the first event's end, cut at %d", cut)
				got, err := io.ReadAll(b)
				require.NoError(t, err)
				require.Equal(t, c.stream, string(got))
			}
		})
	}
}

// The wait for the first event ends at its blank line, however late it
// comes after the event's data: a read that brings the data line does not
// end it, the read that brings the blank line does. Without a blank line
// before the body's end, the body's end ends it.
func TestPeekWaitsForEventEnd(t *testing.T) {
	t.Run("blank line later", func(t *testing.T) {
		r := &stepReader{steps: []string{"data: {\"i\":0}\n", ": ping\n", "id: 7\n", "\n", "data: [DONE]\n\n"}}
		b := &body{rc: io.NopCloser(r)}
		code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
		require.NoError(t, err)
		assert.Zero(t, code)
		assert.Equal(t, 4, r.reads, "the wait ends with the read of the blank line")
		assert.Equal(t, "data: {\"i\":0}\n: ping\nid: 7\n\n", string(b.buf))
	})
	t.Run("named after a later read", func(t *testing.T) {
		r := &stepReader{steps: []string{"data: {\"i\":0}\n", "event: error\n", "\n", "data: [DONE]\n\n"}}
		b := &body{rc: io.NopCloser(r)}
		code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
		require.NoError(t, err)
		assert.Equal(t, http.StatusInternalServerError, code)
		assert.Equal(t, 3, r.reads)
	})
	t.Run("no blank line before the end", func(t *testing.T) {
		for _, s := range []string{"data: {\"i\":0}\n", "data: {\"i\":0}\nevent: message", "data: {\"i\":0}\r"} {
			r := &stepReader{steps: []string{s}}
			b := &body{rc: io.NopCloser(r)}
			code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
			require.NoError(t, err)
			assert.Zero(t, code, "%q", s)
			got, err := io.ReadAll(b)
			require.NoError(t, err)
			assert.Equal(t, s, string(got))
		}
		r := &stepReader{steps: []string{"data: {\"i\":0}\n", "event: error"}}
		b := &body{rc: io.NopCloser(r)}
		code, err := b.peek(&http.Response{Header: sseHeader}, DefaultMaxPeekBytes)
		require.NoError(t, err)
		assert.Equal(t, http.StatusInternalServerError, code, "named by the body's last line")
	})
	t.Run("limit before the blank line", func(t *testing.T) {
		const stream = "data: {\"i\":0}\n: padding\n\ndata: [DONE]\n\n"
		r := &stepReader{steps: []string{stream}}
		b := &body{rc: io.NopCloser(r)}
		code, err := b.peek(&http.Response{Header: sseHeader}, len("data: {\"i\":0}\n: pa"))
		require.NoError(t, err)
		assert.Zero(t, code)
		got, err := io.ReadAll(b)
		require.NoError(t, err)
		assert.Equal(t, stream, string(got))
	})
}

// stepReader returns one of its steps at each Read, counting the reads,
// then EOF.
type stepReader struct {
	steps []string
	reads int
}

func (r *stepReader) Read(p []byte) (int, error) {
	if len(r.steps) == 0 {
		return 0, io.EOF
	}
	r.reads++
	n := copy(p, r.steps[0])
	if r.steps[0] = r.steps[0][n:]; r.steps[0] == "" {
		r.steps = r.steps[1:]
	}
	return n, nil
}

// The scrubber replaces the data of an event that its last "event:" line
// names "error", and passes that of one named so and then otherwise.
func TestScrubberLastEventNameCounts(t *testing.T) {
	cases := []struct{ name, event, want string }{
		{"error, then message", "event: error\nevent: message\ndata: {\"message\": \"x\"}\n\n", "event: error\nevent: message\ndata: {\"message\": \"x\"}\n\n"},
		{"message, then error", "event: message\ndata: {\"message\": \"" + secret + "\"}\nevent: error\n\n", "event: message\ndata: {\"hidden\":500}\nevent: error\n\n"},
		{"error, then none", "event:error\r\ndata: x\r\nevent\r\n\r\n", "event:error\r\ndata: x\r\nevent\r\n\r\n"},
		{"error, then empty", "event: error\ndata: x\nevent:\n\n", "event: error\ndata: x\nevent:\n\n"},
		{"none, then error", "event:\ndata: " + secret + "\revent:error\r\r", "event:\ndata: {\"hidden\":500}\revent:error\r\r"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream := tokenEvents + c.event + tokenEvents
			want := tokenEvents + c.want + tokenEvents
			assert.Equal(t, want, scrubAll(stream, nil, hideAll))
			for cut := range len(stream) {
				require.Equal(t, want, scrubAll(stream, []int{cut}, hideAll), "cut at %d", cut)
			}
		})
	}
}

// An OutputCounter takes an event's name from its last "event:" line: the
// stream fails for an event so named "error", at the event's end or the
// body's, and not for one named so and then otherwise, whose values count
// their tokens.
func TestOutputCounterLastEventNameCounts(t *testing.T) {
	cases := []struct {
		name, stream string
		tokens       int
		failed       bool
	}{
		{"error, then message", "event: error\nevent: message\ndata: {\"a\":1}\n\n", 1, false},
		{"message, then error", "event: message\nevent: error\ndata: {\"a\":1}\n\n", 0, true},
		{"error after the data", "data: {\"a\":1}\nevent: error\n\n", 1, true},
		{"error between the data, then message", "event: error\ndata: {\"a\":1}\nevent: message\ndata: {\"b\":2}\n\n", 2, false},
		{"error, then none", "event:error\r\nevent\r\ndata: x\r\n\r\n", 1, false},
		{"error, then empty", "event: error\ndata: x\nevent: \n\n", 1, false},
		{"error at the body's end", "data: x\n\nevent: message\nevent: error", 1, true},
		{"message at the body's end", "event: error\ndata: x\nevent: message", 1, false},
		{"error, then a longer name", "event: error\nevent: errors\ndata: x\n\n", 1, false},
		{"error without data, then message", "event: error\nevent: message\n\ndata: x\n\n", 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for cut := range len(c.stream) + 1 {
				oc := NewOutputCounter(sseHeader)
				n := oc.Count([]byte(c.stream[:cut]))
				n += oc.Count([]byte(c.stream[cut:]))
				n += oc.End()
				require.Equal(t, c.tokens, n, "cut at %d", cut)
				require.Equal(t, c.failed, oc.Failed(), "cut at %d", cut)
			}
		})
	}
}
