// Package sse reads the framing of server-sent event streams (the
// text/event-stream format) as their bytes pass, in pieces of any size,
// without keeping them: where the first event begins, and the byte-order
// mark a stream may start with. Packages httplb and extproc use it to see a
// streamed response's first token.
package sse

// DataField starts a line that carries an event's data.
const DataField = "data:"

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
