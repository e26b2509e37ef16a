package extproc

import (
	"bytes"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/sse"
)

// The first event that is not a preamble event, however the stream is cut:
// the end of the first event with a data line, its blank line, unless its
// last "event:" line names it response.created, response.in_progress,
// response.queued or error; an event's name lasts until the blank line
// that ends it. At the stream's end, the event it cuts short is one too.
func TestFirstEvent(t *testing.T) {
	const (
		created    = "event: response.created\ndata: {\"type\":\"response.created\"}\n\n"
		inProgress = "event: response.in_progress\r\ndata: {\"type\":\"response.in_progress\"}\r\n\r\n"
		queued     = "event:response.queued\rdata: {}\r\r"
		output     = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\"}\n\n"
	)
	cases := []struct {
		name, stream string
		at           int  // the offset in stream where the first event is known; -1: none
		end          bool // the stream's end makes one known
	}{
		{"chat", "data: {\"i\":0}\n\ndata: [DONE]\n\n", len("data: {\"i\":0}\n\n"), true},
		{"chat, CR LF", "data: {\"i\":0}\r\n\r\ndata: [DONE]\r\n\r\n", len("data: {\"i\":0}\r\n\r"), true},
		{"chat, the blank line later", "data: {\"i\":0}\n: ping\nid: 1\n\n", len("data: {\"i\":0}\n: ping\nid: 1\n\n"), true},
		{"comment first", ": ping\n\ndata: x\n\n", len(": ping\n\ndata: x\n\n"), true},
		{"cut short by the end", ": ping\n\ndata: x", -1, true},
		{"responses", created + inProgress + output, len(created + inProgress + output), true},
		{"queued", queued + created + output, len(queued + created + output), true},
		{"preamble only", created + inProgress, -1, false},
		{"error after the preamble", created + "event: error\ndata: {\"type\":\"error\"}\n\n" + output,
			len(created + "event: error\ndata: {\"type\":\"error\"}\n\n" + output), true},
		{"error only", "event: error\ndata: {\"message\":\"overloaded\"}\n\n", -1, false},
		{"error, no space, CR", "event:error\rdata: x\rdata\r\rdata: y\r\r", len("event:error\rdata: x\rdata\r\rdata: y\r\r"), true},
		{"error named after data", "data: x\nevent: error\n\n", -1, false},
		{"error named after data, at the end", "data: x\nevent: error", -1, false},
		{"error, then another name", "event: error\nevent: message\ndata: x\n\ndata: y", len("event: error\nevent: message\ndata: x\n\n"), true},
		{"another name, then error", "event: message\ndata: x\nevent: error\n\ndata: y", -1, true},
		{"error, then no name", "event: error\ndata: x\nevent\n\n", len("event: error\ndata: x\nevent\n\n"), true},
		{"error, then an empty name", "event: error\r\nevent: \r\ndata: x\r\n\r\n", len("event: error\r\nevent: \r\ndata: x\r\n\r"), true},
		{"errors", "event: errors\ndata: x\n\n", len("event: errors\ndata: x\n\n"), true},
		{"unnamed event after the preamble", created + "data: {}\n\n", len(created + "data: {}\n\n"), true},
		{"empty data line after the preamble", created + "data\n\n", len(created + "data\n\n"), true},
		{"empty data line of the preamble", "event: response.created\ndata\n\ndata: x", -1, true},
		{"byte-order mark", "\xef\xbb\xbf" + created + output, len("\xef\xbb\xbf" + created + output), true},
		{"broken byte-order mark", "\xef\xbbdata: x\n\ndata: y\n\n", len("\xef\xbbdata: x\n\ndata: y\n\n"), true},
		{"data before the name", "data: {}\nevent: response.created\n\ndata: x\n\n", len("data: {}\nevent: response.created\n\ndata: x\n\n"), true},
		{"name after data", "event: response.created\ndata: a\nevent: x\ndata: b\n\n", len("event: response.created\ndata: a\nevent: x\ndata: b\n\n"), true},
		{"name without a space", "event:response.in_progress\ndata: a\n\ndata: b\n\n", len("event:response.in_progress\ndata: a\n\ndata: b\n\n"), true},
		{"two spaces", "event:  response.created\ndata: a\n\n", len("event:  response.created\ndata: a\n\n"), true},
		{"similar names", "event: response.created2\ndata: a\n\n", len("event: response.created2\ndata: a\n\n"), true},
		{"long name", "event: response.in_progress.long\ndata: a\n\n", len("event: response.in_progress.long\ndata: a\n\n"), true},
		{"prefix of a name", "event: response.create\ndata: a", -1, true},
		{"event without a colon", "event: response.created\nevent\ndata: a\n\n", len("event: response.created\nevent\ndata: a\n\n"), true},
		{"eventx field", "event: response.created\neventx: y\ndata: a\n\ndata: b\n\n", len("event: response.created\neventx: y\ndata: a\n\ndata: b\n\n"), true},
		{"CRLF is one line break", "event: response.created\r\ndata: a\r\n\r\ndata: b\r\n\r\n", len("event: response.created\r\ndata: a\r\n\r\ndata: b\r\n\r"), true},
		{"named at the end", "event: response.created\ndata: a\n\ndata: b\nevent: response.queued", -1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for cut := range len(c.stream) + 1 {
				for step := 1; step <= len(c.stream)+1; step++ {
					var e firstEvent
					from, at := -1, -1 // the piece it is known in
					p := []byte(c.stream)
					// The pieces: up to cut, then step bytes at a time.
					for i := 0; i < len(p) && at < 0; {
						j := min(i+step, len(p))
						if i < cut {
							j = min(j, cut)
						}
						if e.Feed(p[i:j]) {
							from, at = i, j
						}
						i = j
					}
					// The first event is known in the piece that holds its
					// offset.
					if c.at < 0 && at >= 0 || c.at >= 0 && !(from < c.at && c.at <= at) {
						t.Fatalf("cut %d, step %d: known in [%d, %d], want at %d", cut, step, from, at, c.at)
					}
					if got := e.End(); got != c.end {
						t.Fatalf("cut %d, step %d: End %v, want %v", cut, step, got, c.end)
					}
				}
			}
		})
	}
	var e firstEvent
	if !e.Feed([]byte("data: x\n\n")) || !e.Feed([]byte("\n")) || !e.End() {
		t.Error("a stream whose first event ended stopped reporting it")
	}
}

// firstEvent finds the first event where firstEventAt does, and its End
// what firstEventAt's end says, however the stream is cut.
func FuzzFirstEvent(f *testing.F) {
	f.Add([]byte("event: x\ndata: y\n\n"), uint8(3))
	f.Add([]byte("\xef\xbb\xbfdata"), uint8(1))
	f.Add([]byte(": c\r\ndata\r\n\r\n"), uint8(2))
	f.Add([]byte("event: error\ndata: x\n\nevent:error\revent: y\rdata\r\rdata: z"), uint8(4))
	f.Add([]byte("data: x\nevent: error\n\n"), uint8(5))
	f.Add([]byte("event: response.created\nevent: error\nevent: response.queued\ndata: a\r\n\r\nevent\ndata: b"), uint8(6))
	f.Add([]byte("\xef\xbbevent: error\ndata: x"), uint8(7))
	// The last "event:" line of an event names it.
	f.Add([]byte("event: error\nevent: message\ndata: x\n\n"), uint8(8))
	f.Add([]byte("event: message\nevent: error\ndata: x\n\ndata: y\nevent\r\n\r\n"), uint8(9))
	f.Add([]byte("event: error\r\ndata: x\r\nevent:\r\n\r\ndata: y\nevent: error"), uint8(10))
	f.Fuzz(func(t *testing.T, stream []byte, split uint8) {
		step := int(split%16) + 1
		at, end := firstEventAt(stream)
		var e firstEvent
		found := false
		for i := 0; i < len(stream) && !found; i += step {
			p := stream[i:min(i+step, len(stream))]
			got := e.Feed(p)
			if got && !(i < at && at <= i+len(p)) {
				t.Fatalf("%q: found in the piece at [%d, %d), want at %d", stream, i, i+len(p), at)
			}
			found = got
		}
		if !found && at >= 0 {
			t.Fatalf("%q: not found, want at %d", stream, at)
		}
		if got := e.End(); got != (at >= 0 || end) {
			t.Fatalf("%q: End %v, want %v", stream, got, !got)
		}
	})
}

// firstEventAt returns the offset in stream where its first event that
// firstEvent finds is known, read line by line as the event-stream format
// reads them: past the first byte of the blank line that ends an event
// with a data line (one that starts with "data:" or is "data"); -1 if
// there is none. The event is skipped if its last "event:" line names a
// preamble event or "error". end reports whether the event that the
// stream's end cuts short, its last line read as ended, is one that would
// not be skipped.
func firstEventAt(stream []byte) (at int, end bool) {
	off := 0
	broken := false // the first line is no field: it starts with part of a byte-order mark
	if bytes.HasPrefix(stream, []byte(sse.ByteOrderMark)) {
		off = len(sse.ByteOrderMark)
	} else {
		n := 0
		for n < len(stream) && n < len(sse.ByteOrderMark) && stream[n] == sse.ByteOrderMark[n] {
			n++
		}
		broken = n > 0 && n < len(stream)
	}
	data, preamble, errorNamed := false, false, false
	for off < len(stream) {
		line, rest, ended := sse.Line(stream[off:])
		if broken {
			broken = false
			off = len(stream) - len(rest)
			continue
		}
		name, value := sse.Field(line)
		switch {
		case len(line) == 0 && ended:
			if data && !preamble && !errorNamed {
				return off + 1, true
			}
			data, preamble, errorNamed = false, false, false
		case sse.IsData(line):
			data = true
		case string(name) == "event":
			v := string(value)
			preamble = v == createdEvent || v == inProgressEvent || v == queuedEvent
			errorNamed = v == sse.ErrorEvent
		}
		off = len(stream) - len(rest)
	}
	return -1, data && !preamble && !errorNamed
}

// Following a stream allocates nothing.
func TestFirstEventAllocs(t *testing.T) {
	p := []byte(strings.Repeat("event: response.in_progress\ndata: {}\n\n", 3) + "data: x\n\n")
	allocs := testing.AllocsPerRun(100, func() {
		var e firstEvent
		if !e.Feed(p) {
			t.Fatal("no first event")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations", allocs)
	}
}
