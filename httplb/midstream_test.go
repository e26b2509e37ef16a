package httplb

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/sse"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokenEvents are two chat completion chunks, as a stream starts.
const tokenEvents = `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" +
	`data: {"choices":[{"delta":{"content":"b"}}]}` + "\n\n"

// errorLine returns the line of stream that carries its error event's
// value: its first data or error line that names an error.
func errorLine(stream string) string {
	for line := range strings.SplitSeq(stream, "\n") {
		if (strings.HasPrefix(line, "data:") || strings.HasPrefix(line, "error:")) && mayFail([]byte(line)) {
			return line
		}
	}
	return ""
}

// writeIn sends s as an event stream in writes of size bytes (all of it
// if size is 0), flushing each.
func writeIn(s string, size int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for len(s) > 0 {
			n := len(s)
			if size > 0 {
				n = min(n, size)
			}
			if _, err := io.WriteString(w, s[:n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			s = s[n:]
		}
	}
}

// postLogged sends chatBody through a proxy over h whose upstream errors
// are logged as JSON into the returned buffer, and returns the answer and
// its body.
func postLogged(t *testing.T, h *harness) (*http.Response, string, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	proxy := NewProxy(h.tr)
	proxy.ModifyResponse = NewUpstreamErrorHandler(slog.New(slog.NewJSONHandler(&logs, nil)))
	gw := httptest.NewServer(proxy)
	defer gw.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	return resp, body, &logs
}

// An error event after a stream's first reaches the client through the
// proxy as the first event's would: in its own shape with a generic message
// naming the request id, unless it describes the request (a 400), which
// passes as sent. The operator's log gets the event as sent. Every other
// byte passes unchanged, however the upstream's writes cut the stream.
func TestMidStreamErrorHidden(t *testing.T) {
	for i, c := range hiddenEvents {
		for _, size := range []int{0, 1, 7, 64} {
			t.Run(fmt.Sprintf("%s/writes=%d", c.name, size), func(t *testing.T) {
				stream := tokenEvents + c.stream
				up := newUpstream(t, writeIn(stream, size))
				h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
				resp, body, logs := postLogged(t, h)
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				var rec struct {
					Level     string `json:"level"`
					Msg       string `json:"msg"`
					RequestID string `json:"request_id"`
					Status    int    `json:"status"`
					Event     string `json:"event"`
				}
				require.NoError(t, json.Unmarshal([]byte(logs.String()), &rec), logs.String())
				id := rec.RequestID
				require.True(t, validRequestID(id), id)
				want := strings.Replace(stream, sentLines(i), strings.ReplaceAll(c.want, "Request ID: ID", "Request ID: "+id), 1)
				assert.Equal(t, want, body)
				if c.status != http.StatusBadRequest {
					assert.NotContains(t, body, secret)
					assert.Equal(t, "httplb: upstream's stream failed after its first event", rec.Msg)
				} else {
					assert.Equal(t, stream, body, "an error about the request reaches the client as sent")
					assert.Equal(t, "httplb: upstream's stream refused the request after its first event", rec.Msg)
				}
				assert.Equal(t, c.level, rec.Level)
				assert.Equal(t, c.status, rec.Status)
				assert.True(t, loggedEvent(c.stream, rec.Event), "the operator sees the event as sent: %q", rec.Event)
			})
		}
	}
}

// A stream that fails again and again has each error event replaced, and
// only the first few logged.
func TestMidStreamErrorsLogBounded(t *testing.T) {
	ev := `data: {"error": {"message": "` + secret + `", "type": "InternalServerError", "code": 500}}` + "\n\n"
	stream := tokenEvents + strings.Repeat(ev, 3*maxLoggedEvents) + "data: [DONE]\n\n"
	up := newUpstream(t, writeIn(stream, 0))
	h := newHarness(t, llmlb.RoundRobin(), Config{}, up)
	_, body, logs := postLogged(t, h)
	assert.NotContains(t, body, secret)
	assert.Equal(t, 3*maxLoggedEvents, strings.Count(body, "The upstream failed to answer."))
	assert.True(t, strings.HasPrefix(body, tokenEvents), body)
	assert.True(t, strings.HasSuffix(body, "}\n\ndata: [DONE]\n\n"), body)
	assert.Equal(t, maxLoggedEvents, strings.Count(logs.String(), "\n"), logs.String())
}

// A client asking for gzip does not get the error events of a stream that
// the upstream would compress for it passed as sent: its Accept-Encoding is
// not sent upstream, and the base transport decodes the gzip it asked for
// itself. A stream compressed unasked (a base transport that does not
// decompress) is not read, so it passes as sent; so does a stream read
// through a Transport without the proxy's ModifyResponse.
func TestMidStreamErrorNotRead(t *testing.T) {
	stream := tokenEvents + hiddenEvents[0].stream
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = io.WriteString(zw, stream)
	require.NoError(t, zw.Close())
	var asked []string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(zipped.Bytes())
	})
	post := func(h *harness) []byte {
		t.Helper()
		gw := httptest.NewServer(NewProxy(h.tr))
		defer gw.Close()
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		require.NoError(t, err)
		req.Header.Set("Accept-Encoding", "gzip, br")
		resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.NoError(t, err)
		return got
	}
	got := post(newHarness(t, llmlb.RoundRobin(), Config{}, up))
	assert.Equal(t, []string{"gzip"}, asked, "the base transport's own Accept-Encoding, not the client's")
	assert.NotContains(t, string(got), secret)
	assert.Contains(t, string(got), "The upstream failed to answer.")

	h := newHarness(t, llmlb.RoundRobin(), Config{}, up)
	h.base.DisableCompression = true
	got = post(h)
	assert.Equal(t, []string{"gzip", ""}, asked)
	assert.Equal(t, zipped.Bytes(), got, "compressed unasked: passed as sent")

	plain := newUpstream(t, writeIn(stream, 3))
	h = newHarness(t, llmlb.RoundRobin(), Config{}, plain)
	req, err := http.NewRequest(http.MethodPost, plain.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	resp, err := h.tr.RoundTrip(req)
	require.NoError(t, err)
	body, err := readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, stream, body)
}

// feedScrubber feeds stream to a scrubber that hides with hide, in pieces
// of size bytes, and returns what it let through; it checks after each
// piece that the scrubber holds no more than maxHeldEvent.
func feedScrubber(t *testing.T, stream string, size int, hide func(int, []byte) []byte) string {
	t.Helper()
	s := &scrubber{hide: hide}
	var out []byte
	for p := []byte(stream); len(p) > 0; {
		n := min(len(p), size)
		out = s.feed(out, p[:n])
		p = p[n:]
		require.LessOrEqual(t, len(s.line)+len(s.val), maxHeldEvent)
	}
	return string(s.flush(out))
}

// scrubAll feeds stream to a scrubber in the pieces cut at the given
// offsets, through a body as Read serves it, and returns what it lets go.
func scrubAll(stream string, cuts []int, hide func(int, []byte) []byte) string {
	var p []string
	from := 0
	for _, c := range cuts {
		if c > from && c < len(stream) {
			p = append(p, stream[from:c])
			from = c
		}
	}
	p = append(p, stream[from:])
	b := &body{rc: io.NopCloser(&pieces{p: p}), stream: true}
	b.scrubEvents(hide, false)
	var out bytes.Buffer
	buf := make([]byte, 5)
	for {
		n, err := b.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			return out.String()
		}
	}
}

// hideAll replaces every error event's value with its status.
func hideAll(status int, _ []byte) []byte { return fmt.Appendf(nil, `{"hidden":%d}`, status) }

// Wherever the stream is cut into reads, the scrubber lets the same bytes
// go: each error event's value replaced, every other byte as sent.
func TestScrubberCutAnywhere(t *testing.T) {
	stream := "\ufeff: comment\r\n" + tokenEvents + hiddenEvents[0].stream[:len(hiddenEvents[0].stream)-len("data: [DONE]\n\n")] +
		"event: error\r\ndata:" + `{"type":"error","error":{"type":"overloaded_error","message":"x"}}` + "\r\n\r\n" +
		hiddenEvents[9].stream + `data: {"choices":[{"delta":{"content":"error"}}]}` + "\n\n" +
		`data: {"\u0065rror":{"code":502}}` + "\r\n" + "data: {\"choices\":\r\n: x\r\ndata:[]}\r\n\r\n" +
		"data: {\"type\":\"error\",\r: x\rdata: \"message\":\"" + secret + "\"}\r\r" +
		"event:error\r\n: x\r\ndata: " + secret + "\r\nid: 1\r\ndata: engine dead\r\n\r\n" + tokenEvents +
		"event: error\ndata: {\"message\":\"boom\",\"code\":503}\n\n" + "data: [DONE]"
	want := strings.NewReplacer(
		`{"error": {"message": "`+secret+`", "type": "InternalServerError", "param": null, "code": 500}}`, `{"hidden":500}`,
		`{"type":"error","error":{"type":"overloaded_error","message":"x"}}`, `{"hidden":503}`,
		`{"code":500,"message":"`+secret+`","type":"server_error"}`, `{"hidden":500}`,
		`{"\u0065rror":{"code":502}}`, `{"hidden":502}`,
		"{\"type\":\"error\",\r: x\rdata: \"message\":\""+secret+"\"}", "{\"hidden\":500}\r: x",
		secret+"\r\nid: 1\r\ndata: engine dead", "{\"hidden\":500}\r\nid: 1",
		`{"message":"boom","code":503}`, `{"hidden":503}`,
	).Replace(stream)
	require.NotEqual(t, stream, want)
	assert.Equal(t, want, scrubAll(stream, nil, hideAll))
	assert.Equal(t, stream, scrubAll(stream, nil, func(int, []byte) []byte { return nil }))
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		cuts := make([]int, r.IntN(12))
		for i := range cuts {
			cuts[i] = r.IntN(len(stream))
		}
		slices.Sort(cuts)
		require.Equal(t, want, scrubAll(stream, cuts, hideAll), "cuts %v", cuts)
	}
	// One byte a read.
	cuts := make([]int, len(stream))
	for i := range cuts {
		cuts[i] = i
	}
	assert.Equal(t, want, scrubAll(stream, cuts, hideAll))
}

// A line that outgrows what the scrubber holds passes as sent, even an
// error event's, and so does a value over lines that does, to its event's
// end; the scrubber holds no more than maxHeldEvent of either, and the
// events after them are read as ever.
func TestScrubberLongLine(t *testing.T) {
	long := `data: {"error": {"message": "` + strings.Repeat("x", 2*maxHeldEvent) + `", "code": 500}}`
	longLines := "data: {\"error\": {\"message\": \"x\",\n" + strings.Repeat("data: \"x\": 1,\n", maxHeldEvent/10) + "data: \"code\": 500}}"
	for _, long := range []string{long, longLines} {
		stream := tokenEvents + long + "\n\n" + hiddenEvents[0].stream
		want := tokenEvents + long + "\n\n" + strings.Replace(hiddenEvents[0].stream, errorLine(hiddenEvents[0].stream), `data: {"hidden":500}`, 1)
		for _, size := range []int{1000, 3} {
			assert.Equal(t, want, feedScrubber(t, stream, size, hideAll))
		}
	}
}

// Reading a stream of events with nothing to rewrite costs no allocation.
func TestScrubbedReadAllocs(t *testing.T) {
	chunk := []byte(tokenEvents)
	b := &body{rc: io.NopCloser(&repeatReader{p: chunk}), stream: true}
	b.scrubEvents(hideAll, false)
	buf := make([]byte, len(chunk))
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := b.Read(buf); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

// repeatReader returns p at each Read.
type repeatReader struct{ p []byte }

func (r *repeatReader) Read(b []byte) (int, error) { return copy(b, r.p), nil }

// BenchmarkReadEventStream reads a stream of chat completion chunks through
// a body as the proxy does, without and with its error events rewritten,
// in reads that end at the ends of events (as a streaming engine's writes
// arrive) or cut them.
func BenchmarkReadEventStream(b *testing.B) {
	chunk := []byte(strings.Repeat(tokenEvents, 8))
	for _, scrub := range []bool{false, true} {
		for _, cut := range []bool{false, true} {
			b.Run(fmt.Sprintf("scrub=%v/cut=%v", scrub, cut), func(b *testing.B) {
				src := &repeatReader{p: chunk}
				if cut {
					src.p = chunk[:len(chunk)-7]
				}
				body := &body{rc: io.NopCloser(src), stream: true}
				if scrub {
					body.scrubEvents(hideAll, false)
				}
				buf := make([]byte, 32<<10)
				b.SetBytes(int64(len(src.p)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := body.Read(buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// FuzzScrubber checks that a scrubber never panics, lets every byte of a
// stream with no error event go as sent, lets the same bytes go wherever
// the stream is cut, and holds no more than maxHeldEvent; and that no
// event it lets go is an error event, its data read with encoding/json
// (hideAll's values are none), nor has any other data than one of
// hideAll's values after a line that names it "error".
func FuzzScrubber(f *testing.F) {
	for _, c := range hiddenEvents {
		f.Add([]byte(tokenEvents+c.stream), uint64(3))
	}
	f.Add([]byte("error: {\"code\":503}\r\ndata:{\"error\":\"x\"}\rdata: [DONE]"), uint64(1))
	f.Add([]byte("data: {\"a\":1}\ndata: {\r\n: x\r\ndata: \"\\u0065rror\":\r\ndata\r\ndata: {}}\r\n\r\ndata: {\"b\":\"\ndata: \\\"error\\\":{}\"}\n\n"), uint64(2))
	f.Add([]byte("data:\rdata:  \rdata:{\"type\":\"response.failed\"\r\rdata: {\"error\":\n\ndata: {}}\n\n"), uint64(4))
	f.Add([]byte("event:error\r\n: c\r\ndata: x\r\ndata\r\ndata: {\"a\":\r\n\r\ndata: y\nevent: error\ndata: z\n\nevent: error\ndata: w"), uint64(5))
	f.Add([]byte("data: {\"a\":\nevent: error\ndata: 1}\ndata: x\n\nevent: error\n\ndata: y\n\n"), uint64(6))
	f.Add([]byte("data: {\"a\":1}\n\ndata: x\ndata: {\"b\":\r\nevent: error\r\ndata: 2}\r\n\r\ndata: y\revent:error\r\rdata: z\nevent: error"), uint64(7))
	f.Add([]byte("data: a\n\ndata: {\"error\":{}}\ndata: b\nevent: error\n: c\ndata: {\"error\":\"x\"}\n\n"), uint64(8))
	// The last "event:" line of an event names it.
	f.Add([]byte("data: a\n\nevent: error\nevent: message\ndata: b\n\nevent: message\nevent: error\ndata: c\n\n"), uint64(9))
	f.Add([]byte("data: a\r\n\r\nevent:error\r\ndata: b\r\nevent\r\n\r\ndata: c\revent: error\revent:\r\rdata: d\nevent: message\nevent: error"), uint64(10))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64) {
		whole := scrubAll(string(stream), nil, hideAll)
		if !mayFail(stream) && whole != string(stream) {
			t.Fatalf("changed a stream without error events: %q -> %q", stream, whole)
		}
		if failed, ok := dataErrorReference([]byte(whole), false); ok && failed && len(stream) <= maxHeldEvent {
			t.Fatalf("let an error event go: %q -> %q", stream, whole)
		}
		if len(stream) <= maxHeldEvent && namedDataLeaked([]byte(whole)) {
			t.Fatalf("let the data of an event named \"error\" go: %q -> %q", stream, whole)
		}
		if len(stream) == 0 {
			return
		}
		r := rand.New(rand.NewPCG(seed, 1))
		cuts := make([]int, r.IntN(8))
		for i := range cuts {
			cuts[i] = r.IntN(len(stream))
		}
		slices.Sort(cuts)
		if got := scrubAll(string(stream), cuts, hideAll); len(stream) <= maxHeldEvent && got != whole {
			t.Fatalf("cuts %v: %q, whole: %q", cuts, got, whole)
		}
		if kept := scrubAll(string(stream), cuts, func(int, []byte) []byte { return nil }); kept != string(stream) {
			t.Fatalf("kept %q as %q", stream, kept)
		}
	})
}

// hiddenValue matches a value of hideAll.
var hiddenValue = regexp.MustCompile(`^\{"hidden":\d+\}$`)

// namedDataLeaked reports whether an event of the event stream body that
// is named "error", by its last "event:" line, before its data lines or
// after, has data, its data lines joined as the event-stream format joins
// them, that is neither blank nor one of hideAll's values.
func namedDataLeaked(body []byte) bool {
	named, any := false, false
	var data []byte
	leaked := func() bool {
		d := bytes.TrimSpace(data)
		return named && len(d) > 0 && !hiddenValue.Match(d)
	}
	for rest := body; len(rest) > 0; {
		line, after, ended := sse.Line(rest)
		switch {
		case len(line) == 0 && ended: // the event's end
			if leaked() {
				return true
			}
			named, any, data = false, false, data[:0]
		case isEventField(line):
			_, v := sse.Field(line)
			named = string(v) == "error" // the last name counts
		case sse.IsData(line):
			if any {
				data = append(data, '\n')
			}
			_, v := sse.Field(line)
			data, any = append(data, v...), true
		}
		rest = after
	}
	return leaked()
}

// isEventField reports whether line is an event field, as the event-stream
// format's interpretation reads it: its name, up to its first colon or the
// whole line, is "event".
func isEventField(line []byte) bool {
	name, _, _ := bytes.Cut(line, []byte(":"))
	return string(name) == "event"
}

// A stream whose first event is an error not retried, and that sends
// another after it, has both replaced, each logged where it came.
func TestFirstAndLaterErrorsHidden(t *testing.T) {
	ev := `data: {"error": {"message": "` + secret + `", "type": "InternalServerError", "code": 500}}` + "\n\n"
	for _, size := range []int{0, 1} {
		up := newUpstream(t, writeIn(ev+ev+"data: [DONE]\n\n", size))
		h := newHarness(t, llmlb.RoundRobin(), Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
		resp, body, logs := postLogged(t, h)
		id := resp.Header.Get(requestIDHeader)
		line := `data: {"error":{"message":"The upstream failed to answer. Request ID: ` + id + `","type":"InternalServerError","code":500}}` + "\n\n"
		assert.Equal(t, line+line+"data: [DONE]\n\n", body, "writes of %d", size)
		l := logs.String()
		assert.Equal(t, 1, strings.Count(l, "failed at its first event"), l)
		assert.Equal(t, 1, strings.Count(l, "failed after its first event"), l)
	}
}
