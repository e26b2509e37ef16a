package httplb

import (
	"bytes"

	"github.com/llmlb/llmlb/internal/sse"
)

// maxHeldLine is the most of an event stream that a [scrubber] holds back
// to read it whole: a line, or the lines of a value that goes on past its
// data line, whose end has not come by then passes as sent. An error event
// is a few hundred bytes.
const maxHeldLine = 64 << 10

// scrubber rewrites the error events of an event stream, after its first
// event, as the stream is read: each line is held back until its end, and
// the lines of a data value that goes on past its line (see nesting) until
// the value's end, and the data lines of an event named "error" (see
// errorNamed) until the event's end; a data value (or llama.cpp's error
// line) that is an error event, and the data of an event named "error",
// whatever it is, are replaced by what hide returns for them. Every other
// byte passes as sent. An event's name counts for the data lines after
// it: the data of an event whose name comes after it has passed.
type scrubber struct {
	// hide returns the value that replaces value, that of an error event
	// standing for status, or nil to keep it.
	hide func(status int, value []byte) []byte
	line []byte // the current line's bytes so far, held back
	skip bool   // the current line passes as it comes: too long, or the first event's
	// val holds back the lines of an event, each with its line break,
	// from the first data line of a value still open at the end of it
	// until the value ends; nest follows the value's JSON. pass is set
	// while the rest of such a value, grown beyond maxHeldLine, passes as
	// it comes, up to its event's end.
	val  []byte
	nest nesting
	pass bool
	// named is set while the current event is named "error": an "event:
	// error" line of it has ended. Its data lines are held back in val
	// to the event's end, and replaced whole.
	named bool
	cr    bool   // the last line ended with a CR: a LF next is the rest of its line break
	out   []byte // the buffer feed writes into, reused once read
}

// feed appends to out the bytes of p, the stream's next bytes, that are
// ready: every line that p ends, rewritten if it is an error event, but
// those of a value that goes on. The rest of p is held back. The lines end
// at a LF, a CR or a CR LF, as an event stream's do.
func (s *scrubber) feed(out, p []byte) []byte {
	bulk := true // p's whole events may pass at once: looked for once, as it costs a pass over p
	for len(p) > 0 {
		if s.cr {
			s.cr = false
			if p[0] == '\n' {
				// The rest of a CR LF.
				if len(s.val) > 0 {
					s.val = append(s.val, '\n')
				} else {
					out = append(out, '\n')
				}
				p = p[1:]
				continue
			}
		}
		if bulk && len(s.line) == 0 && len(s.val) == 0 && !s.skip && !s.pass && !s.named {
			// Whole events that cannot be error events pass at once.
			bulk = false
			if e := eventsEnd(p); e > 0 && !mayFail(p[:e]) {
				out = append(out, p[:e]...)
				p = p[e:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			switch {
			case s.skip:
				out = append(out, p...)
			case len(s.val)+len(s.line)+len(p) > maxHeldLine:
				out = append(append(append(out, s.val...), s.line...), p...)
				s.pass = s.pass || len(s.val) > 0
				s.val, s.line, s.skip = s.val[:0], s.line[:0], true
			default:
				s.line = append(s.line, p...)
			}
			return out
		}
		switch {
		case s.skip:
			out = append(append(out, p[:i]...), p[i])
			s.skip, s.cr = false, p[i] == '\r'
		case len(s.line) == 0:
			out = s.endLine(out, p[:i], p[i])
		default:
			s.line = append(s.line, p[:i]...)
			out = s.endLine(out, s.line, p[i])
			s.line = s.line[:0]
		}
		p = p[i+1:]
	}
	return out
}

// endLine appends to out what the end of line, a line of the stream
// without its line break brk, lets go, and follows the event's name.
func (s *scrubber) endLine(out, line []byte, brk byte) []byte {
	out = s.letGo(out, line, brk)
	switch {
	case len(line) == 0:
		s.named = false // the event's end
	case sse.IsEvent(line, errorName):
		s.named = true
	}
	return out
}

// letGo appends to out what the end of line, a line of the stream without
// its line break brk, lets go.
func (s *scrubber) letGo(out, line []byte, brk byte) []byte {
	s.cr = brk == '\r'
	switch {
	case s.pass:
		s.pass = len(line) > 0 // to the event's end
		return append(append(out, line...), brk)
	case len(s.val) > 0:
		if len(line) > 0 && len(s.val)+len(line) >= maxHeldLine {
			// Too long to hold: the value passes as sent, to its event's
			// end.
			out = append(append(append(out, s.val...), line...), brk)
			s.val, s.pass = s.val[:0], true
			return out
		}
		s.val = append(append(s.val, line...), brk)
		switch {
		case len(line) == 0:
			return s.scrubHeld(out) // the event's end, and the value's
		case s.named: // to the event's end
		case sse.IsData(line):
			_, v := sse.Field(line)
			s.nest.feed(lineFeed)
			if s.nest.feed(v); !s.nest.open() {
				return s.scrubHeld(out)
			}
		}
		return out
	case sse.IsData(line):
		_, v := sse.Field(line)
		s.nest = nesting{}
		if s.nest.feed(v); s.named || s.nest.open() {
			if len(line) >= maxHeldLine {
				s.pass = true
				return append(append(out, line...), brk)
			}
			s.val = append(append(s.val, line...), brk)
			return out
		}
	}
	return append(s.scrub(out, line), brk)
}

// flush appends to out what is held back at the stream's end, rewritten
// if it is an error event: a client may read an event whose line the
// stream did not end.
func (s *scrubber) flush(out []byte) []byte {
	if len(s.val) > 0 || s.named && !s.pass && sse.IsData(s.line) {
		// The stream ends in the value, or in the data of an event
		// named "error", and the value with it.
		s.val = append(s.val, s.line...)
		s.line = s.line[:0]
		out = s.scrubHeld(out)
	}
	if len(s.line) > 0 {
		if s.pass {
			out = append(out, s.line...)
		} else {
			out = s.scrub(out, s.line)
		}
		s.line = s.line[:0]
	}
	s.skip, s.pass, s.named = false, false, false
	return out
}

// passes reports whether p, the stream's next bytes, may pass as they are:
// nothing is held back, p ends an event, and it cannot hold an error event.
func (s *scrubber) passes(p []byte) bool {
	return len(s.line) == 0 && len(s.val) == 0 && !s.skip && !s.pass && !s.named && !s.cr && len(p) > 0 &&
		eventsEnd(p) == len(p) && !mayFail(p)
}

// eventsEnd returns the offset in p, which starts a line, past its last
// blank line (an event's end), or 0 if it has none.
func eventsEnd(p []byte) int {
	for j := len(p); j > 0; {
		k := bytes.LastIndexAny(p[:j], "\r\n")
		if k < 0 {
			return 0
		}
		brk := k // where the line break that p[k] ends starts
		if p[k] == '\n' && k > 0 && p[k-1] == '\r' {
			brk = k - 1
		}
		if brk == 0 || p[brk-1] == '\n' || p[brk-1] == '\r' {
			return k + 1
		}
		j = brk
	}
	return 0
}

// mayFail reports whether p may hold an error event: every error event
// has "error" or "failed" in it (an event named "error", its name), or
// writes a letter of its key or type with an escape (see hasNameEscape).
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
		if status = valueErrorCode(v); status != 0 {
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

// scrubHeld appends to out the lines held in s.val, with their value
// replaced if it is an error event that hide hides, or the data of an
// event named "error", and empties s.val.
func (s *scrubber) scrubHeld(out []byte) []byte {
	held := s.val
	s.val = s.val[:0]
	end := 0 // of the value's last data line
	for p := held; len(p) > 0; {
		line, rest, _ := sse.Line(p)
		if sse.IsData(line) {
			end = len(held) - len(p) + len(line)
		}
		p = rest
	}
	at := valueStart(held, 0, end)
	if at >= end || !s.named && !mayFail(held[at:end]) {
		return append(out, held...)
	}
	span := held[at:end]
	value := spanValue(span)
	var status int
	if s.named {
		status = namedErrorCode(value)
	} else {
		status = valueErrorCode(value)
	}
	if status == 0 {
		return append(out, held...)
	}
	v := s.hide(status, value)
	if v == nil {
		return append(out, held...)
	}
	return append(appendRewritten(append(out, held[:at]...), span, v), held[end:]...)
}
