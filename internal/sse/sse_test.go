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

// Lines end at a CR LF, a LF or a CR, and fields split at their first
// colon, less one leading space of the value.
func TestLineField(t *testing.T) {
	lines := []struct {
		in, line, rest string
		ok             bool
	}{
		{"a\r\nb", "a", "b", true},
		{"a\nb", "a", "b", true},
		{"a\rb", "a", "b", true},
		{"a\r", "a", "", true},
		{"\n\r\n", "", "\r\n", true},
		{"\r\r\n", "", "\r\n", true},
		{"a", "a", "", false},
		{"", "", "", false},
	}
	for _, c := range lines {
		line, rest, ok := Line([]byte(c.in))
		if string(line) != c.line || string(rest) != c.rest || ok != c.ok {
			t.Errorf("Line(%q) = %q, %q, %v", c.in, line, rest, ok)
		}
	}
	fields := []struct{ in, name, value string }{
		{"data: x", "data", "x"},
		{"data:x", "data", "x"},
		{"data:  x ", "data", " x "},
		{"data", "data", ""},
		{"data:", "data", ""},
		{": ping", "", "ping"},
		{"id: a:b", "id", "a:b"},
		{"", "", ""},
	}
	for _, c := range fields {
		name, value := Field([]byte(c.in))
		if string(name) != c.name || string(value) != c.value {
			t.Errorf("Field(%q) = %q, %q", c.in, name, value)
		}
		if want := c.name == "data"; IsData([]byte(c.in)) != want {
			t.Errorf("IsData(%q) = %v", c.in, !want)
		}
	}
}

// An event field names its event with its value, matched exactly, with
// or without one space after the colon.
func TestIsEvent(t *testing.T) {
	cases := []struct {
		line, name string
		want       bool
	}{
		{"event: error", "error", true},
		{"event:error", "error", true},
		{"event:  error", "error", false},
		{"event: error ", "error", false},
		{"event: errors", "error", false},
		{"event: erro", "error", false},
		{"Event: error", "error", false},
		{"events: error", "error", false},
		{"event error", "error", false},
		{": event: error", "error", false},
		{"data: error", "error", false},
		{"event: response.created", "response.created", true},
		{"event", "", true},
		{"event:", "", true},
		{"event: ", "", true},
		{"event", "error", false},
	}
	for _, c := range cases {
		if got := IsEvent([]byte(c.line), c.name); got != c.want {
			t.Errorf("IsEvent(%q, %q) = %v", c.line, c.name, got)
		}
	}
}

// EventType returns the value of an event field as the format's
// interpretation reads it: one leading space stripped, a line without a
// colon a field name with an empty value.
func TestEventType(t *testing.T) {
	cases := []struct {
		line, typ string
		ok        bool
	}{
		{"event: error", "error", true},
		{"event:error", "error", true},
		{"event:  error", " error", true},
		{"event: error ", "error ", true},
		{"event: a:b", "a:b", true},
		{"event", "", true},
		{"event:", "", true},
		{"event: ", "", true},
		{"Event: error", "", false},
		{"events: error", "", false},
		{"event error", "", false},
		{"eventx", "", false},
		{": event: error", "", false},
		{"data: error", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		typ, ok := EventType([]byte(c.line))
		if string(typ) != c.typ || ok != c.ok {
			t.Errorf("EventType(%q) = %q, %v; want %q, %v", c.line, typ, ok, c.typ, c.ok)
		}
	}
}

// The data of an event is its data fields' values joined with LFs, as the
// examples of the event-stream format's interpretation have it.
func TestAppendData(t *testing.T) {
	cases := []struct{ event, data string }{
		{"data: YHOO\ndata: +2\ndata: 10\n", "YHOO\n+2\n10"},
		{": test stream\n", ""},
		{"data: first event\nid: 1\n", "first event"},
		{"data:second event\nid\n", "second event"},
		{"data:  third event\n", " third event"},
		{"data\n", ""},
		{"data\ndata\n", "\n"},
		{"data:\r\n: x\r\nevent: e\r\ndata: {\"a\":\rdata:1}", "\n{\"a\":\n1}"},
	}
	for _, c := range cases {
		if got := string(AppendData([]byte("x"), []byte(c.event))); got != "x"+c.data {
			t.Errorf("AppendData(%q) = %q, want %q", c.event, got[1:], c.data)
		}
	}
}

// FuzzAppendData checks AppendData against a direct reading of the
// format's rules: lines split at CR LF, LF or CR, the data fields' values
// (after the first colon and one space) joined with LFs; and IsEvent
// against the same reading of its lines' fields.
func FuzzAppendData(f *testing.F) {
	f.Add([]byte("data: a\r\ndata:b\rdata\n: c\ndata:  d\r"))
	f.Add([]byte("datax: a\ndata:: b\r\r\n"))
	f.Add([]byte("event:error\r\nevent: error \nevent\ndata: x\n"))
	f.Fuzz(func(t *testing.T, event []byte) {
		norm := strings.ReplaceAll(strings.ReplaceAll(string(event), "\r\n", "\n"), "\r", "\n")
		norm = strings.TrimSuffix(norm, "\n")
		var values []string
		for _, line := range strings.Split(norm, "\n") {
			name, value, colon := strings.Cut(line, ":")
			if colon {
				value = strings.TrimPrefix(value, " ")
			}
			// An event field's value names the event.
			if got, want := IsEvent([]byte(line), "error"), name == "event" && value == "error"; got != want {
				t.Fatalf("IsEvent(%q, \"error\") = %v, want %v", line, got, want)
			}
			if name != "data" {
				continue
			}
			values = append(values, value)
		}
		if got, want := string(AppendData(nil, event)), strings.Join(values, "\n"); got != want {
			t.Fatalf("AppendData(%q) = %q, want %q", event, got, want)
		}
	})
}
