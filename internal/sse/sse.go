// Package sse reads the framing of server-sent event streams (the
// text/event-stream format) as their bytes pass, in pieces of any size,
// without keeping them: where the first event begins, and the byte-order
// mark a stream may start with. Packages httplb and extproc use it to see a
// streamed response's first token. [Line], [Field], [IsData], [IsEvent],
// [EventType] and [AppendData] read the lines of an event held whole, as
// the format's interpretation does (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).
package sse

import "bytes"

// DataField starts a line that carries an event's data.
const DataField = "data:"

// EventField starts a line that names the event it is part of.
const EventField = "event:"

// ErrorEvent is the name of an error event: an event whose type is so
// named is one whatever its data, or without any. An event's type is set
// by each of its "event:" lines, so that the last one before the blank
// line that ends the event names it (see [EventType]). Anthropic's
// Messages API sends its error events so named, and its SDKs raise such
// an event as an error on its name alone; the OpenAI Responses API names
// its "error" events so too.
const ErrorEvent = "error"

// ByteOrderMark is U+FEFF in UTF-8. A stream may start with one, which is
// not part of its first line.
const ByteOrderMark = "\xef\xbb\xbf"

// Mark follows the byte-order mark a stream may start with, across reads:
// the bytes of it matched so far, or [MarkPast] once the stream is past its
// start. The zero value is a stream's start.
type Mark int8

// MarkPast is the Mark of a stream past its start.
const MarkPast Mark = -1

// Skipping reports whether the stream is still at its start, where a mark
// may be.
func (m Mark) Skipping() bool { return m >= 0 }

// Skip consumes the bytes of a byte-order mark at the start of p and
// returns the rest. broken reports a stream that starts with part of a mark
// and then something else: its first line is not a field.
func (m *Mark) Skip(p []byte) (rest []byte, broken bool) {
	i := 0
	for ; i < len(p) && int(*m) < len(ByteOrderMark); i++ {
		if p[i] != ByteOrderMark[*m] {
			broken = *m > 0
			*m = MarkPast
			return p[i:], broken
		}
		*m++
	}
	if int(*m) == len(ByteOrderMark) {
		*m = MarkPast
	}
	return p[i:], false
}

// FirstEvent finds the first event of a stream: the start of a line that
// begins with "data:" (after a leading byte-order mark), or the end of a
// line that is exactly "data", a data field without a value, which the
// event-stream format reads as an empty line of data. A comment or
// keep-alive (": ping"), an event name line or a field such as "datax" is
// not one. It keeps no more than its position in the current line. Its
// zero value is at the start of a stream.
type FirstEvent struct {
	n    int  // bytes of "data:" matched at the start of the current line; -1: the line cannot match
	mark Mark // the stream's leading byte-order mark
}

// Feed scans the next piece of the stream and reports whether a data line
// has started in it or before.
func (e *FirstEvent) Feed(p []byte) bool {
	if e.n == len(DataField) {
		return true
	}
	if e.mark.Skipping() {
		var broken bool
		if p, broken = e.mark.Skip(p); broken {
			e.n = -1
		}
	}
	for _, c := range p {
		switch {
		case c == '\n' || c == '\r':
			if e.n == len(DataField)-1 {
				// "data" and the end of the line: the field's name
				// without a colon, and so an empty value.
				e.n = len(DataField)
				return true
			}
			e.n = 0
		case e.n < 0:
		case c == DataField[e.n]:
			e.n++
			if e.n == len(DataField) {
				return true
			}
		default:
			e.n = -1
		}
	}
	return false
}

// Line returns the first line of p, without its line break, and the rest of
// p after the break: a line ends at a CR LF pair, a LF or a CR. If p has no
// line break, line is p, rest is empty and ok is false. A CR that is the
// last byte of p ends its line; if the stream's next byte is a LF, it is
// part of that line's break, and ends no line of its own.
func Line(p []byte) (line, rest []byte, ok bool) {
	i := bytes.IndexAny(p, "\r\n")
	if i < 0 {
		return p, p[len(p):], false
	}
	if p[i] == '\r' && i+1 < len(p) && p[i+1] == '\n' {
		return p[:i], p[i+2:], true
	}
	return p[:i], p[i+1:], true
}

// Field returns the name and the value of the field that line, without its
// line break, is: the name is the line up to its first colon and the value
// the rest after that colon, less one leading space; a line without a
// colon is a name with an empty value. A comment, a line that starts with
// a colon, has an empty name, and so has a blank line.
func Field(line []byte) (name, value []byte) {
	i := bytes.IndexByte(line, ':')
	if i < 0 {
		return line, line[len(line):]
	}
	value = line[i+1:]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return line[:i], value
}

// IsData reports whether line, without its line break, is a data field:
// one that starts with "data:", or that is "data", a data field whose value
// is empty.
func IsData(line []byte) bool {
	return bytes.HasPrefix(line, []byte(DataField)) || string(line) == DataField[:len(DataField)-1]
}

// IsEvent reports whether line, without its line break, is an event field
// whose value is name, as [Field] splits it: "event:" and name, with or
// without one space between. The value is matched exactly: "event: errors",
// "event:  error" and "Event: error" do not name an event "error". A later
// event field of the same event names it again (see [EventType]).
func IsEvent(line []byte, name string) bool {
	if !bytes.HasPrefix(line, []byte(EventField[:len(EventField)-1])) {
		return false
	}
	n, v := Field(line)
	return string(n) == EventField[:len(EventField)-1] && string(v) == name
}

// EventType reports whether line, without its line break, is an event
// field, and returns its value, as [Field] splits it: the type the line
// gives its event. The format sets the event type buffer at each event
// field, so that the last one before the blank line that dispatches the
// event names it; an empty value ("event", "event:" or "event: ") leaves
// the event the default type, "message". The name is matched exactly:
// "Event: error" is no event field, and "event:  error" gives the type
// " error".
func EventType(line []byte) (typ []byte, ok bool) {
	name := EventField[:len(EventField)-1]
	if !bytes.HasPrefix(line, []byte(name)) {
		return nil, false
	}
	n, v := Field(line)
	if string(n) != name {
		return nil, false
	}
	return v, true
}

// AppendData appends to dst the data of the event whose lines are lines
// (the last one with or without its line break): the values of its data
// fields joined with a LF, as the format's event dispatch has the data
// buffer, without its last LF. Its other lines (comments, other fields,
// blank lines) add nothing.
func AppendData(dst, lines []byte) []byte {
	first := true
	for len(lines) > 0 {
		line, rest, _ := Line(lines)
		if IsData(line) {
			if !first {
				dst = append(dst, '\n')
			}
			_, v := Field(line)
			dst, first = append(dst, v...), false
		}
		lines = rest
	}
	return dst
}
