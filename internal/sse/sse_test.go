package sse

import (
	"bytes"
	"strings"
	"testing"
)

func TestFirstEvent(t *testing.T) {
	cases := []struct {
		in   []string
		want bool
	}{
		{[]string{"data: x"}, true},
		{[]string{"da", "ta:"}, true},
		{[]string{": comment\n", "data:"}, true},
		{[]string{"event: a\r\ndata"}, false},
		{[]string{"event: a\r\ndata:"}, true},
		{[]string{"xdata:"}, false},
		{[]string{"retry: 10\n"}, false},
		// A leading byte-order mark is not part of the first line.
		{[]string{"\xef\xbb\xbfdata: x"}, true},
		{[]string{"\xef", "\xbb", "\xbf", "data:"}, true},
		{[]string{"\xef\xbb\xbf\n", "data:"}, true},
		{[]string{"\xef\xbbdata: x"}, false},
		{[]string{"\xef\xbbdata: x\n", "data:"}, true},
		{[]string{"x\xef\xbb\xbfdata:"}, false},
		{[]string{"\n\xef\xbb\xbfdata:"}, false},
		// A line that is exactly "data" is a data field without a value:
		// an empty line of data, once the line has ended, however it ends.
		{[]string{"data\n"}, true},
		{[]string{"data\r"}, true},
		{[]string{": ping\r\n", "data", "\r\n"}, true},
		{[]string{"\xef\xbb\xbfdat", "a\n"}, true},
		{[]string{"event: a\ndata"}, false},
		{[]string{"datax\n", "dat\n"}, false},
		{[]string{"\xef\xbbdata\n"}, false},
	}
	for _, c := range cases {
		var e FirstEvent
		got := false
		for _, p := range c.in {
			if e.Feed([]byte(p)) {
				got = true
				break
			}
		}
		if got != c.want {
			t.Errorf("%q: %v, want %v", c.in, got, c.want)
		}
	}
	var e FirstEvent
	if !e.Feed([]byte("data:")) || !e.Feed([]byte("\nxyz")) {
		t.Error("a stream whose first event began stopped reporting it")
	}
}

// FuzzFirstEvent checks the incremental scanner against a direct reading
// of the whole stream, however it is split into reads.
func FuzzFirstEvent(f *testing.F) {
	f.Add([]byte("data: x\n"), uint8(3))
	f.Add([]byte(": ping\r\nevent: e\ndata:"), uint8(1))
	f.Add([]byte("xdata:\ndat"), uint8(7))
	f.Add([]byte("\xef\xbb\xbfdata:"), uint8(1))
	f.Add([]byte("\xef\xbb\ndata:"), uint8(2))
	f.Add([]byte("data\r\n"), uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, split uint8) {
		// A line begins an event if it starts with "data:", or if it is
		// exactly "data" and has ended.
		want := false
		rest := string(bytes.TrimPrefix(stream, []byte(ByteOrderMark)))
		for rest != "" && !want {
			line, after, ended := rest, "", false
			if i := strings.IndexAny(rest, "\r\n"); i >= 0 {
				line, after, ended = rest[:i], rest[i+1:], true
			}
			want = strings.HasPrefix(line, DataField) || ended && line == "data"
			rest = after
		}
		var e FirstEvent
		got := false
		step := int(split%16) + 1
		for i := 0; i < len(stream) && !got; i += step {
			got = e.Feed(stream[i:min(i+step, len(stream))])
		}
		if got != want {
			t.Fatalf("Feed(%q) = %v, want %v", stream, got, want)
		}
	})
}
