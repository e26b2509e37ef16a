package httplb

import (
	"bytes"
)

// maxHeldLine is the most of an event stream's line that a [scrubber]
// holds back to read it whole: a line whose end has not come by then
// passes as sent. An error event is a few hundred bytes.
const maxHeldLine = 64 << 10

// scrubber rewrites the error events of an event stream, after its first
// event, as the stream is read: each line is held back until its end, and
// a data line (or llama.cpp's error line) that is an error event is
// replaced by what hide returns for it. Every other byte passes as sent.
type scrubber struct {
	// hide returns the value that replaces value, that of an error event
	// standing for status, or nil to keep it.
	hide func(status int, value []byte) []byte
	line []byte // the current line's bytes so far, held back
	skip bool   // the current line passes as it comes: too long, or the first event's
	out  []byte // the buffer feed writes into, reused once read
}

// feed appends to out the bytes of p, the stream's next bytes, that are
// ready: every line that p ends, rewritten if it is an error event. The
// rest of p is held back as the start of the next line. The lines end at
// "\n" or "\r", as an event stream's do (a "\r\n" ends one line and an
// empty one, which changes nothing here).
func (s *scrubber) feed(out, p []byte) []byte {
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			switch {
			case s.skip:
				out = append(out, p...)
			case len(s.line)+len(p) > maxHeldLine:
				out = append(append(out, s.line...), p...)
				s.line, s.skip = s.line[:0], true
			default:
				s.line = append(s.line, p...)
			}
			return out
		}
		switch {
		case s.skip:
			out = append(out, p[:i]...)
			s.skip = false
		case len(s.line) == 0:
			out = s.scrub(out, p[:i])
		default:
			s.line = append(s.line, p[:i]...)
			out = s.scrub(out, s.line)
			s.line = s.line[:0]
		}
		out = append(out, p[i])
		p = p[i+1:]
	}
	return out
}

// flush appends to out the line held back at the stream's end, rewritten
// if it is an error event: a client may read an event whose line the
// stream did not end.
func (s *scrubber) flush(out []byte) []byte {
	if len(s.line) > 0 {
		out = s.scrub(out, s.line)
		s.line = s.line[:0]
	}
	s.skip = false
	return out
}

// passes reports whether p, the stream's next bytes, may pass as they are:
// nothing is held back, p ends a line, and it cannot hold an error event.
func (s *scrubber) passes(p []byte) bool {
	return len(s.line) == 0 && !s.skip && len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') &&
		!mayFail(p)
}

// mayFail reports whether p may hold an error event: every error event
// has "error" or "failed" in it, or writes a letter of its key or type
// with an escape (see hasNameEscape).
func mayFail(p []byte) bool {
	return bytes.Contains(p, []byte(errorKey)) || bytes.Contains(p, []byte("failed")) || hasNameEscape(p)
}

// scrub appends line, without its end, to out, with its value replaced if
// it is an error event that hide hides.
func (s *scrubber) scrub(out, line []byte) []byte {
	if !mayFail(line) {
		return append(out, line...)
	}
	var status, at, end int
	if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
		head := len(line) - len(v)
		if status = errorEventCode(line[:head], v); status != 0 {
			at, end = head+max(indexNonSpace(v), 0), len(line)
		}
	} else if bytes.HasPrefix(line, []byte(errorField)) {
		if status = errorFieldCode(line); status != 0 {
			at, end = errorFieldSpan(line)
		}
	}
	if status == 0 || at >= end {
		return append(out, line...)
	}
	v := s.hide(status, line[at:end])
	if v == nil {
		return append(out, line...)
	}
	return append(append(append(out, line[:at]...), v...), line[end:]...)
}
