package extproc_test

import (
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
	"github.com/llmlb/llmlb/httplb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstEventEnded reads prefix, the start of an event stream, as a client
// does, with every line break it has (a CR at its end included) ending a
// line, and reports whether an event with data whose last "event:" line
// does not name it "error" has ended in it, or, if the stream ends there
// (end), is cut short by its end.
func firstEventEnded(prefix string, end bool) bool {
	s := strings.TrimPrefix(prefix, "\ufeff")
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
	lines := strings.Split(s, "\n")
	last := lines[len(lines)-1] // not ended, unless the stream ends
	lines = lines[:len(lines)-1]
	if end && last != "" {
		lines = append(lines, last, "")
	} else if end {
		lines = append(lines, "")
	}
	data, named := false, false
	for _, line := range lines {
		if line == "" {
			if data && !named {
				return true
			}
			data, named = false, false
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		switch name {
		case "data":
			data = true
		case "event":
			named = strings.TrimPrefix(value, " ") == "error"
		}
	}
	return false
}

// The streams an engine or a hostile upstream may send through Envoy, with
// LF line breaks, and whether each fails its pick.
var adversarialStreams = []struct {
	name   string
	stream string
	failed bool
}{
	{"plain", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", false},
	{"named error after its data", "data: {\"m\":\"x\"}\nevent: error\n\ndata: {\"choices\":[]}\n\n", true},
	{"named error, then message", "event: error\ndata: {\"choices\":[]}\nevent: message\n\ndata: [DONE]\n\n", false},
	{"named error, then event without a colon", "event: error\ndata: {\"choices\":[]}\nevent\n\ndata: [DONE]\n\n", false},
	{"named error without a space", "event:error\ndata: {\"m\":\"x\"}\n\ndata: {\"choices\":[]}\n\n", true},
	{"a leading space: no event field", " event: error\ndata: {\"choices\":[]}\n\ndata: [DONE]\n\n", false},
	{"many names, last error", "event: a\nevent: error\nevent: b\ndata: {}\nevent: message\nevent: error\n\ndata: {\"choices\":[]}\n\n", true},
	{"many names, last message", "event: error\nevent: b\nevent: error\ndata: {\"choices\":[]}\nevent: error\nevent: message\n\ndata: [DONE]\n\n", false},
	{"names that are not error", ": event: error\nevent: error \nevent:\terror\nEvent: error\ndata: {\"choices\":[]}\nevent:  error\n\ndata: event: error\n\n", false},
	{"an event field named error, no event field after", "data: {}\nevent: error\n: event: message\nevents: message\n\ndata: {\"choices\":[]}\n\n", true},
	{"a long name after error", "event: error\ndata: {\"choices\":[]}\nevent: response.in_progress.and.more\n\n", false},
	{"byte-order mark", "\ufeffdata: {\"choices\":[]}\n\ndata: [DONE]\n\n", false},
	{"byte-order mark cut short", "\xef\xbbevent: error\ndata: {}\n\ndata: {\"choices\":[]}\n\n", false},
	{"byte-order mark, named error before", "\ufeffevent: error\ndata: {}\n\ndata: {\"choices\":[]}\n\n", true},
	{"comments and fields in the first event", ": ping\nid: 1\ndata: {\"choices\":[]}\n: ping\nretry: 100\nid: 2\n\ndata: [DONE]\n\n", false},
	{"comments and fields, then named error", ": ping\nid: 1\ndata: {}\n: ping\nretry: 100\nevent: error\nid: 2\n\ndata: {\"choices\":[]}\n\n", true},
	{"ends in its first event", "data: {\"choices\":[]}", false},
	{"ends in its first event after a line", "data: {\"choices\":[]}\n", false},
	{"ends in its first event, named error", "data: {}\nevent: error", true},
	{"ends in its first event, named error, a line", "data: {}\nevent: error\n", true},
	{"error event later", "data: {\"choices\":[]}\n\nevent: error\ndata: {\"message\":\"x\"}\n\ndata: [DONE]\n\n", true},
	{"error event later, named back", "data: {\"choices\":[]}\n\nevent: error\ndata: {}\nevent: message\n\ndata: [DONE]\n\n", false},
}

// Whatever line breaks a stream has and however Envoy's body chunks cut
// them, a CR LF pair between two chunks included, FirstToken is called
// with the chunk that ends the first event whose last "event:" line does
// not name it "error" (its blank line, or the stream's end in it), never
// before, and the pick fails exactly when the stream's events say so.
func TestFirstTokenLineBreaksAndChunks(t *testing.T) {
	endings := []struct {
		name string
		conv func(string) string
	}{
		{"LF", func(s string) string { return s }},
		{"CRLF", func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }},
		{"CR", func(s string) string { return strings.ReplaceAll(s, "\n", "\r") }},
	}
	chunkings := []struct {
		name string
		cut  func(string) []string
	}{
		{"whole", func(s string) []string { return []string{s} }},
		{"bytes", func(s string) []string { return cut(s, 1) }},
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
	for _, c := range adversarialStreams {
		for _, le := range endings {
			for _, ch := range chunkings {
				if ch.name == "CR|LF" && le.name != "CRLF" {
					continue
				}
				t.Run(c.name+"/"+le.name+"/"+ch.name, func(t *testing.T) {
					var rec infoRecorder
					b := newBalancer(t, 1, nil, llmlb.WithObserver(rec.observer()))
					h := start(t, extproc.Config{Balancer: b})
					e, picked := exchange(t, h, reasoningBody("low"))
					e.send(responseHeaders(200, "text/event-stream", false))
					require.NotNil(t, e.recv().GetResponseHeaders())
					stream := le.conv(c.stream)
					chunks := ch.cut(stream)
					sent := ""
					for i, p := range chunks {
						last := i == len(chunks)-1
						e.send(responseBody(p, last))
						streamedBack(t, e.recv(), false)
						sent += p
						if !last {
							want := int64(1)
							if firstEventEnded(sent, false) {
								want = 0
							}
							require.Equal(t, want, stats(b, picked).Queued, "first token after %q", sent)
						}
					}
					require.NoError(t, e.closeAndWait())
					waitIdle(t, b)
					d := rec.only(t)
					assert.Equal(t, firstEventEnded(stream, true), d.Streamed, "FirstToken")
					if c.failed {
						assert.ErrorIs(t, d.Err, httplb.ErrErrorEvent)
					} else {
						assert.NoError(t, d.Err)
					}
				})
			}
		}
	}
}

// An event stream whose Content-Encoding is identity in another case is
// no compressed stream: its first token is the end of its first event,
// and an error event after it fails the pick.
func TestIdentityEncodingAnyCase(t *testing.T) {
	var rec infoRecorder
	b := newBalancer(t, 1, nil, llmlb.WithObserver(rec.observer()))
	h := start(t, extproc.Config{Balancer: b})
	e, picked := exchange(t, h, reasoningBody("low"))
	m := responseHeaders(200, "text/event-stream", false)
	hs := m.GetResponseHeaders().GetHeaders()
	hs.Headers = append(hs.Headers, header("content-encoding", "Identity"))
	e.send(m)
	require.NotNil(t, e.recv().GetResponseHeaders())
	e.send(responseBody("data: {\"choices\":[]}\n", false))
	streamedBack(t, e.recv(), false)
	require.Equal(t, int64(1), stats(b, picked).Queued, "a first token before the first event's end")
	e.send(responseBody("\nevent: error\ndata: {\"message\":\"x\"}\n\n", true))
	streamedBack(t, e.recv(), false)
	require.NoError(t, e.closeAndWait())
	waitIdle(t, b)
	d := rec.only(t)
	assert.True(t, d.Streamed)
	assert.ErrorIs(t, d.Err, httplb.ErrErrorEvent)
}
