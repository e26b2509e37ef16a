package httplb

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An event's name counts wherever its "event:" line comes before the
// blank line that ends it: the data of an event named "error" after its
// data lines is replaced as that of one named before them, whatever the
// line breaks and however the stream is cut into reads. The data of an
// event named otherwise passes as sent.
func TestScrubberNameAfterData(t *testing.T) {
	cases := []struct {
		name, stream, want string
	}{
		{"after its data", "data: {\"message\": \"" + secret + "\"}\nevent: error\n\n",
			"data: {\"hidden\":500}\nevent: error\n\n"},
		{"after its data, a code", "data: {\"code\": 503, \"message\": \"" + secret + "\"}\r\nevent:error\r\n\r\n",
			"data: {\"hidden\":503}\r\nevent:error\r\n\r\n"},
		{"between its data lines", "data: " + secret + "\revent: error\rid: 7\rdata: engine dead\r\r",
			"data: {\"hidden\":500}\revent: error\rid: 7\r\r"},
		{"after a value over lines", "data: {\"a\":\n: ping\ndata: \"" + secret + "\"}\nevent: error\n\n",
			"data: {\"hidden\":500}\n: ping\nevent: error\n\n"},
		{"after two values", "data: {\"a\":1}\ndata: {\"b\":\"" + secret + "\"}\nevent: error\n\n",
			"data: {\"hidden\":500}\nevent: error\n\n"},
		{"after an error line and a comment", "data: " + secret + "\n: x\nevent: error\n\n",
			"data: {\"hidden\":500}\n: x\nevent: error\n\n"},
		{"at the stream's end", "data: " + secret + "\nevent: error",
			"data: {\"hidden\":500}\nevent: error"},
		{"named otherwise", "data: {\"message\": \"" + secret + "\"}\nevent: errors\n\n",
			"data: {\"message\": \"" + secret + "\"}\nevent: errors\n\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream := tokenEvents + c.stream
			if strings.HasSuffix(c.stream, "\n") || strings.HasSuffix(c.stream, "\r") {
				stream += tokenEvents
			}
			want := strings.Replace(stream, c.stream, c.want, 1)
			assert.Equal(t, want, scrubAll(stream, nil, hideAll))
			r := rand.New(rand.NewPCG(3, 4))
			for range 200 {
				cuts := make([]int, r.IntN(8))
				for i := range cuts {
					cuts[i] = r.IntN(len(stream))
				}
				slices.Sort(cuts)
				require.Equal(t, want, scrubAll(stream, cuts, hideAll), "cuts %v", cuts)
			}
		})
	}
}

// The data lines of an event reach the client with the event's blank line,
// which ends it, and not before: only there does the client dispatch the
// event, and only there is its name known. The lines before its first data
// line go as each ends, and whole events in a read at once.
func TestScrubberHoldsDataToEventEnd(t *testing.T) {
	s := &scrubber{hide: hideAll}
	steps := []struct{ in, out string }{
		{"id: 1\n", "id: 1\n"},
		{"data: {\"i\":0}\n", ""},
		{": ping\n", ""},
		{"\n", "data: {\"i\":0}\n: ping\n\n"},
		{tokenEvents, tokenEvents},
		{"data: {\"i\":1}\r\n", ""},
		{"\r", "data: {\"i\":1}\r\n\r"},
		{"\n", "\n"},
	}
	for _, st := range steps {
		assert.Equal(t, st.out, string(s.feed(nil, []byte(st.in))), "after %q", st.in)
	}
	assert.Empty(t, s.flush(nil))
}

// An event that outgrows what the scrubber holds is let go: one named
// "error" by then has the data held replaced and the rest of its data
// dropped, up to its end, unless hide keeps it; any other passes as sent,
// even if named "error" after that. The scrubber never holds more than
// maxHeldEvent, and the events after it are read as ever.
func TestScrubberEventBound(t *testing.T) {
	lines := strings.Repeat("data: "+secret+"\n", 2*maxHeldEvent/len(secret))
	huge := "data: " + strings.Repeat("x", 2*maxHeldEvent) + secret + "\n"
	after := "event: error\ndata: {\"code\":502}\n\n" + tokenEvents
	hiddenAfter := "event: error\ndata: {\"hidden\":502}\n\n" + tokenEvents
	cases := []struct {
		name, event, want string
		keep              bool // hide keeps every value
	}{
		{"named, then many lines", "event: error\n: c\n" + lines + "id: 1\n\n", "event: error\n: c\ndata: {\"hidden\":500}\nid: 1\n\n", false},
		{"named, then one long line", "event: error\n" + huge + "id: 1\n\n", "event: error\ndata: {\"hidden\":500}\nid: 1\n\n", false},
		{"named, then one long line after another", "event: error\ndata: a\n" + huge + "\n", "event: error\ndata: {\"hidden\":500}\n\n", false},
		{"named, CR LF", "event: error\r\n" + strings.ReplaceAll(lines, "\n", "\r\n") + "\r\n", "event: error\r\ndata: {\"hidden\":500}\r\n\r\n", false},
		{"named, kept", "event: error\n" + lines + "\n", "event: error\n" + lines + "\n", true},
		{"named after many lines", lines + "event: error\n\n", lines + "event: error\n\n", false},
		{"named after a long line", huge + "event: error\n\n", huge + "event: error\n\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hide := hideAll
			if c.keep {
				hide = func(int, []byte) []byte { return nil }
			}
			stream := tokenEvents + c.event + after
			want := tokenEvents + c.want + hiddenAfter
			if c.keep {
				want = stream
			}
			for _, size := range []int{1 << 20, 4096, 61} {
				require.Equal(t, want, feedScrubber(t, stream, size, hide), "reads of %d", size)
			}
		})
	}
}
