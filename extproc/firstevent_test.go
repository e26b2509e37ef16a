package extproc

import (
	"bytes"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/sse"
)

// The first event that is not a preamble event, however the stream is cut:
// the first data line, unless its event is named response.created,
// response.in_progress or response.queued by its last "event:" line, or
// named error by any; an event's name lasts until the empty line that
// ends it.
func TestFirstEvent(t *testing.T) {
	const (
		created    = "event: response.created\ndata: {\"type\":\"response.created\"}\n\n"
		inProgress = "event: response.in_progress\r\ndata: {\"type\":\"response.in_progress\"}\r\n\r\n"
		queued     = "event:response.queued\rdata: {}\r\r"
		output     = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\"}\n\n"
	)
	cases := []struct {
		name, stream string
		at           int // the offset in stream where the first event is known; -1: none
	}{
		{"chat", "data: {\"i\":0}\n\n", len("data:")},
		{"comment first", ": ping\n\ndata: x", len(": ping\n\ndata:")},
		{"responses", created + inProgress + output, len(created + inProgress + "event: response.output_item.added\ndata:")},
		{"queued", queued + created + output, len(queued + created + "event: response.output_item.added\ndata:")},
		{"preamble only", created + inProgress, -1},
		{"error after the preamble", created + "event: error\ndata: {\"type\":\"error\"}\n\n" + output,
			len(created + "event: error\ndata: {\"type\":\"error\"}\n\nevent: response.output_item.added\ndata:")},
		{"error only", "event: error\ndata: {\"message\":\"overloaded\"}\n\n", -1},
		{"error, no space, CR", "event:error\rdata: x\rdata\r\rdata: y", len("event:error\rdata: x\rdata\r\rdata:")},
		{"error named after data", "data: x\nevent: error\n\n", len("data:")},
		{"error, then another name", "event: error\nevent: message\ndata: x\n\ndata: y", len("event: error\nevent: message\ndata: x\n\ndata:")},
		{"errors", "event: errors\ndata: x", len("event: errors\ndata:")},
		{"unnamed event after the preamble", created + "data: {}\n\n", len(created + "data:")},
		{"empty data line after the preamble", created + "data\n\n", len(created + "data\n")},
		{"empty data line of the preamble", "event: response.created\ndata\n\ndata: x", len("event: response.created\ndata\n\ndata:")},
		{"byte-order mark", "\xef\xbb\xbf" + created + output, len("\xef\xbb\xbf" + created + "event: response.output_item.added\ndata:")},
		{"broken byte-order mark", "\xef\xbbdata: x\ndata: y", len("\xef\xbbdata: x\ndata:")},
		{"data before the name", "data: {}\nevent: response.created\n\n", len("data:")},
		{"name after data", "event: response.created\ndata: a\nevent: x\ndata: b\n\n", len("event: response.created\ndata: a\nevent: x\ndata:")},
		{"name without a space", "event:response.in_progress\ndata: a\n\ndata: b", len("event:response.in_progress\ndata: a\n\ndata:")},
		{"two spaces", "event:  response.created\ndata: a", len("event:  response.created\ndata:")},
		{"similar names", "event: response.created2\ndata: a", len("event: response.created2\ndata:")},
		{"long name", "event: response.in_progress.long\ndata: a", len("event: response.in_progress.long\ndata:")},
		{"prefix of a name", "event: response.create\ndata: a", len("event: response.create\ndata:")},
		{"event without a colon", "event: response.created\nevent\ndata: a", len("event: response.created\nevent\ndata:")},
		{"eventx field", "event: response.created\neventx: y\ndata: a\n\ndata: b", len("event: response.created\neventx: y\ndata: a\n\ndata:")},
		{"CRLF is one line break", "event: response.created\r\ndata: a\r\n\r\ndata: b", len("event: response.created\r\ndata: a\r\n\r\ndata:")},
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
				}
			}
		})
	}
	var e firstEvent
	if !e.Feed([]byte("data: x")) || !e.Feed([]byte("\n")) {
		t.Error("a stream whose first event began stopped reporting it")
	}
}

// firstEvent finds the first event where firstEventAt does, and, in a
// stream without preamble or error events, what sse.FirstEvent does,
// however the stream is cut.
func FuzzFirstEvent(f *testing.F) {
	f.Add([]byte("event: x\ndata: y\n"), uint8(3))
	f.Add([]byte("\xef\xbb\xbfdata"), uint8(1))
	f.Add([]byte(": c\r\ndata\r\n"), uint8(2))
	f.Add([]byte("event: error\ndata: x\n\nevent:error\revent: y\rdata\r\rdata: z"), uint8(4))
	f.Add([]byte("data: x\nevent: error\n\n"), uint8(5))
	f.Add([]byte("event: response.created\nevent: error\nevent: response.queued\ndata: a\r\n\r\nevent\ndata: b"), uint8(6))
	f.Add([]byte("\xef\xbbevent: error\ndata: x"), uint8(7))
	f.Fuzz(func(t *testing.T, stream []byte, split uint8) {
		step := int(split%16) + 1
		at := firstEventAt(stream)
		var e firstEvent
		var plain sse.FirstEvent
		compare := !bytes.Contains(stream, []byte("response.")) && !bytes.Contains(stream, []byte(sse.ErrorEvent))
		found := false
		for i := 0; i < len(stream) && !found; i += step {
			p := stream[i:min(i+step, len(stream))]
			got := e.Feed(p)
			if w := plain.Feed(p); compare && got != w {
				t.Fatalf("%q, piece at %d: %v, want sse.FirstEvent's %v", stream, i, got, w)
			}
			if got && !(i < at && at <= i+len(p)) {
				t.Fatalf("%q: found in the piece at [%d, %d), want at %d", stream, i, i+len(p), at)
			}
			found = got
		}
		if !found && at >= 0 {
			t.Fatalf("%q: not found, want at %d", stream, at)
		}
	})
}

// firstEventAt returns the offset in stream where its first event that
// firstEvent finds is known, read line by line as the event-stream format
// reads them: past the "data:" of a data line, or past the line break's
// first byte of a "data" line; -1 if there is none. The event of the line
// is skipped if its last "event:" line names a preamble event, or any
// names it "error".
func firstEventAt(stream []byte) int {
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
	preamble, errorNamed := false, false
	for off < len(stream) {
		line, rest, ended := sse.Line(stream[off:])
		if broken {
			broken = false
			off = len(stream) - len(rest)
			if len(line) == 0 && ended {
				preamble, errorNamed = false, false
			}
			continue
		}
		name, value := sse.Field(line)
		switch {
		case len(line) == 0 && ended:
			preamble, errorNamed = false, false
		case bytes.HasPrefix(line, []byte(sse.DataField)):
			if !preamble && !errorNamed {
				return off + len(sse.DataField)
			}
		case string(line) == "data" && ended:
			if !preamble && !errorNamed {
				return off + len(line) + 1
			}
		case string(name) == "event" && ended:
			v := string(value)
			preamble = v == createdEvent || v == inProgressEvent || v == queuedEvent
			errorNamed = errorNamed || v == sse.ErrorEvent
		}
		off = len(stream) - len(rest)
	}
	return -1
}

// Following a stream allocates nothing.
func TestFirstEventAllocs(t *testing.T) {
	p := []byte(strings.Repeat("event: response.in_progress\ndata: {}\n\n", 3) + "data: x")
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
