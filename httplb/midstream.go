package httplb

import (
	"bytes"

	"github.com/llmlb/llmlb/internal/sse"
)

// maxHeldEvent is the most of an event stream that a [scrubber] holds
// back: the lines of an event from its first data line on, and the line
// being read. An error event is a few hundred bytes.
const maxHeldEvent = 64 << 10

// scrubber rewrites the error events of an event stream, after its first
// event, as the stream is read. Each line is held back until its end, and
// the lines of an event from its first data line on until the event's
// end, its blank line, where the event is dispatched: the format sets an
// event's name at each of its "event:" lines, wherever they come before
// the blank line, the last one naming it, and a client acts on an event
// only there. Then the data of an event named "error" (see eventNames),
// whatever it is and wherever the name came, is replaced whole by what
// hide returns for it; so is each
// data value (see nesting) of another event that is an error event by its
// data, and llama.cpp's error lines. Every other byte passes as sent, the
// lines of an event before its first data line as each ends. A stream
// read from its start is read past the byte-order mark it may start
// with, as a client decodes it, the mark passing as sent.
//
// A scrubber holds at most maxHeldEvent bytes. An event that outgrows it
// before its end is let go, as follows. If it is named "error" by then,
// its data held so far is replaced as at its end, and its data lines after
// that are dropped up to its end, even if a later "event:" line names it
// otherwise: an event so named is an error whatever its data, and none of
// it is the client's. Otherwise its lines held pass
// as sent, and so does the rest of it as it comes, even if it is named
// "error" later or is an error event by its data: an event that large is,
// in the streams of every engine and provider known, output (a tool
// call's arguments, a Responses stream's partial image), which replacing
// or dropping would corrupt, while holding it whole would hold any amount
// of memory. The pick still ends as failed (see [OutputCounter.Failed]). A
// line longer than maxHeldEvent alone, likewise, passes as it comes, or,
// in an event whose data is dropped, is dropped.
type scrubber struct {
	// hide returns the value that replaces value, that of an error event
	// standing for status, or nil to keep it.
	hide func(status int, value []byte) []byte
	line []byte // the current line's bytes so far, held back
	// lineFate is what becomes of the rest of the current line, and
	// lineOut, for a line dropped, whether its start went out, so that
	// its line break goes out too.
	lineFate int8
	lineOut  bool
	// val holds back the lines of the current event, each with its line
	// break, from its first data line on, until the event's end; fate
	// says what becomes of the event's lines instead once it outgrew
	// maxHeldEvent.
	val  []byte
	fate int8
	// named is set while the current event is named "error": the last
	// "event:" line of it that has ended is "event: error".
	named bool
	cr    int8   // where the line break of the last line, a CR, went: a LF next is the rest of it
	out   []byte // the buffer feed writes into, reused once read
	// mark follows the byte-order mark that a stream read from its start
	// (the zero value) may start with, and that is no part of its first
	// line: its bytes go out as sent once it is whole, and begin the first
	// line if it is cut short by another byte. sse.MarkPast for a
	// scrubber that starts past the stream's start.
	mark sse.Mark
}

// What becomes of the rest of the current line (scrubber.lineFate).
const (
	lineHeld    = iota // held back to its end
	linePassed         // passes as it comes: too long to hold, or the first event's value cut short
	lineDropped        // is dropped as it comes, and its line break with it unless its start went out
)

// What becomes of the lines of the current event (scrubber.fate).
const (
	eventHeld    = iota // held back from its first data line on
	eventPassed         // each passes as it ends: the event outgrew maxHeldEvent
	eventDropped        // its data lines are dropped, its others pass: its data was replaced
)

// Where the line break of the last line went, if it was a CR (scrubber.cr).
const (
	crNone    = iota // it was no CR
	crOut            // it went out
	crHeld           // it is held in val
	crDropped        // it was dropped
)

// feed appends to out the bytes of p, the stream's next bytes, that are
// ready: every line that p ends, but those of an event that has not
// ended, from its first data line on, which are held back with the rest
// of p, and the error events rewritten. The lines end at a LF, a CR or a
// CR LF, as an event stream's do.
func (s *scrubber) feed(out, p []byte) []byte {
	bulk := true // p's whole events may pass at once: looked for once, as it costs a pass over p
	if s.mark.Skipping() {
		if out, p = s.skipMark(out, p); s.mark.Skipping() {
			return out
		}
	}
	for len(p) > 0 {
		if s.cr != crNone {
			if p[0] == '\n' {
				// The rest of a CR LF.
				switch s.cr {
				case crOut:
					out = append(out, '\n')
				case crHeld:
					s.val = append(s.val, '\n')
				}
				p = p[1:]
			}
			s.cr = crNone
			continue
		}
		if bulk && s.idle() {
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
			return s.partial(out, p)
		}
		brk := p[i]
		switch s.lineFate {
		case linePassed:
			out = append(append(out, p[:i]...), brk)
			s.setCR(brk, crOut)
			s.lineFate = lineHeld
		case lineDropped:
			if s.lineOut {
				out = append(out, brk)
				s.setCR(brk, crOut)
			} else {
				s.setCR(brk, crDropped)
			}
			s.lineFate = lineHeld
		case lineHeld:
			if len(s.line) == 0 {
				out = s.endLine(out, p[:i], brk)
			} else {
				s.line = append(s.line, p[:i]...)
				out = s.endLine(out, s.line, brk)
				s.line = s.line[:0]
			}
		}
		p = p[i+1:]
	}
	return out
}

// skipMark reads the bytes of p, the stream's first bytes, that may be
// its byte-order mark (see scrubber.mark), appends to out the mark if they
// complete it, and returns out and the rest of p.
func (s *scrubber) skipMark(out, p []byte) ([]byte, []byte) {
	held := int(s.mark) // the mark's bytes matched in the pieces before p
	rest, broken := s.mark.Skip(p)
	matched := held + len(p) - len(rest)
	switch {
	case broken:
		// No mark: the bytes taken for one begin the first line, which is
		// no field.
		s.line = append(s.line, sse.ByteOrderMark[:matched]...)
	case !s.mark.Skipping() && matched == len(sse.ByteOrderMark):
		out = append(out, sse.ByteOrderMark...)
	}
	return out, rest
}

// idle reports whether the scrubber holds nothing and is at the start of
// a line, past the stream's byte-order mark, in an event that is held back
// as any is (see feed).
func (s *scrubber) idle() bool {
	return len(s.line) == 0 && len(s.val) == 0 && s.lineFate == lineHeld && s.fate == eventHeld && !s.named &&
		s.cr == crNone && !s.mark.Skipping()
}

// setCR records where brk, the line break of the line that ended, went,
// if it is a CR.
func (s *scrubber) setCR(brk byte, to int8) {
	if brk == '\r' {
		s.cr = to
	}
}

// partial appends to out what p, the next bytes of the current line,
// which p does not end, lets go, and holds back the rest.
func (s *scrubber) partial(out, p []byte) []byte {
	switch s.lineFate {
	case linePassed:
		return append(out, p...)
	case lineDropped:
		return out
	}
	if len(s.val)+len(s.line)+len(p) < maxHeldEvent {
		s.line = append(s.line, p...)
		return out
	}
	// Too much to hold: the event's lines held go first.
	if len(s.val) > 0 {
		out = s.overflow(out)
		if len(s.line)+len(p) < maxHeldEvent {
			s.line = append(s.line, p...)
			return out
		}
	}
	// The line alone is too long to hold.
	if data := startsData(s.line, p); data && s.fate == eventHeld && s.named {
		// The first data line of an event named "error": replaced as far
		// as it goes, and the rest of it dropped, with the event's data
		// lines after it (or passed, with them, if hide keeps it).
		var replaced bool
		out, replaced = s.scrubNamed(out, s.line)
		s.line = s.line[:0]
		if replaced {
			s.lineFate, s.lineOut, s.fate = lineDropped, true, eventDropped
			return out
		}
		s.lineFate, s.fate = linePassed, eventPassed
		return append(out, p...)
	} else if data && s.fate == eventDropped {
		s.line = s.line[:0]
		s.lineFate, s.lineOut = lineDropped, false
		return out
	} else if data && s.fate == eventHeld {
		s.fate = eventPassed
	}
	out = append(append(out, s.line...), p...)
	s.line = s.line[:0]
	s.lineFate = linePassed
	return out
}

// startsData reports whether a line that starts with a and goes on with b
// is a data line (see sse.IsData), as far as they tell.
func startsData(a, b []byte) bool {
	for i := range len(sse.DataField) {
		var c byte
		switch {
		case i < len(a):
			c = a[i]
		case i-len(a) < len(b):
			c = b[i-len(a)]
		default:
			return false
		}
		if c != sse.DataField[i] {
			return false
		}
	}
	return true
}

// endLine appends to out what the end of line, a line of the stream
// without its line break brk, lets go, and follows the event's name.
func (s *scrubber) endLine(out, line []byte, brk byte) []byte {
	if len(line) == 0 {
		// The event's end.
		if len(s.val) > 0 {
			out, _ = s.dispatch(out)
		}
		s.named, s.fate = false, eventHeld
		s.setCR(brk, crOut)
		return append(out, brk)
	}
	if typ, ok := sse.EventType(line); ok {
		s.named = string(typ) == sse.ErrorEvent // the last name counts
	}
	data := sse.IsData(line)
	if s.fate == eventHeld && (len(s.val) > 0 || data) {
		// Room for the line and its line break, a CR LF's LF included.
		if len(s.val)+len(line)+2 <= maxHeldEvent {
			s.val = append(append(s.val, line...), brk)
			s.setCR(brk, crHeld)
			return out
		}
		switch {
		case len(s.val) > 0:
			out = s.overflow(out)
		case s.named:
			// The event's first data line, too long to hold.
			var replaced bool
			out, replaced = s.scrubNamed(out, line)
			s.fate = eventPassed
			if replaced {
				s.fate = eventDropped
			}
			s.setCR(brk, crOut)
			return append(out, brk)
		default:
			s.fate = eventPassed
		}
	}
	if s.fate == eventDropped && data {
		s.setCR(brk, crDropped)
		return out
	}
	// A line before the event's first data line, or of an event let go.
	s.setCR(brk, crOut)
	out, _ = s.scrubErrorLine(out, line)
	return append(out, brk)
}

// overflow lets go of the lines held of the current event, which has
// outgrown maxHeldEvent (see scrubber): the data of an event named
// "error" replaced, its data lines after it to be dropped; those of any
// other passing as sent, and the rest of the event after them.
func (s *scrubber) overflow(out []byte) []byte {
	if !s.named {
		out = append(out, s.val...)
		s.val, s.fate = s.val[:0], eventPassed
		return out
	}
	out, replaced := s.dispatch(out)
	s.fate = eventPassed // an error about the request, which passes as sent
	if replaced {
		s.fate = eventDropped
	}
	return out
}

// flush appends to out what is held back at the stream's end, rewritten
// if it is an error event: a client may read an event whose blank line,
// or whose last line's end, the stream did not send.
func (s *scrubber) flush(out []byte) []byte {
	if s.mark.Skipping() {
		// The stream ended in what may have been its mark.
		out = append(out, sse.ByteOrderMark[:s.mark]...)
		s.mark = sse.MarkPast
	}
	line := s.line
	switch {
	case s.lineFate != lineHeld:
	case s.fate == eventDropped && sse.IsData(line):
	case s.fate == eventHeld && (len(s.val) > 0 || sse.IsData(line)):
		if typ, ok := sse.EventType(line); ok {
			s.named = string(typ) == sse.ErrorEvent // the stream ends in the line that names it
		}
		s.val = append(s.val, line...)
		out, _ = s.dispatch(out)
	default:
		out, _ = s.scrubErrorLine(out, line)
	}
	s.line, s.val = s.line[:0], s.val[:0]
	s.lineFate, s.fate, s.named, s.cr = lineHeld, eventHeld, false, crNone
	return out
}

// passes reports whether p, the stream's next bytes, may pass as they are:
// nothing is held back, p ends an event, and it cannot hold an error event.
func (s *scrubber) passes(p []byte) bool {
	return s.idle() && len(p) > 0 && eventsEnd(p) == len(p) && !mayFail(p)
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

// scrubErrorLine appends line, without its end, to out, with its value
// replaced if it is llama.cpp's error line (see errorField) and hide
// hides it, and reports whether it replaced it.
func (s *scrubber) scrubErrorLine(out, line []byte) ([]byte, bool) {
	if !bytes.HasPrefix(line, []byte(errorField)) {
		return append(out, line...), false
	}
	status := errorFieldCode(line)
	at, end := errorFieldSpan(line)
	if status == 0 || at >= end {
		return append(out, line...), false
	}
	v := s.hide(status, line[at:end])
	if v == nil {
		return append(out, line...), false
	}
	return append(append(append(out, line[:at]...), v...), line[end:]...), true
}

// dispatch appends to out the lines held in s.val, those of an event from
// its first data line on, each with its line break but perhaps the last,
// and empties s.val. If the event is named "error", its data, all of its
// data lines, is replaced by what hide returns for it; otherwise each of
// its data values that is an error event is (see scrubValue), and each
// error line between them (see scrubErrorLine). It reports whether it
// replaced anything.
func (s *scrubber) dispatch(out []byte) ([]byte, bool) {
	held := s.val
	s.val = s.val[:0]
	if s.named {
		return s.scrubNamed(out, held)
	}
	replaced := false
	from := 0   // the offset in held up to which out has it
	start := -1 // the offset of the current value's first data line; -1: none
	end := 0    // that of the end of its last data line so far
	var nest nesting
	for p := held; len(p) > 0; {
		line, rest, _ := sse.Line(p)
		at := len(held) - len(p)
		switch {
		case sse.IsData(line):
			_, v := sse.Field(line)
			if start < 0 {
				start, nest = at, nesting{}
			} else {
				nest.feed(lineFeed)
			}
			nest.feed(v)
			end = at + len(line)
			if !nest.open() {
				var r bool
				out, from, r = s.scrubValue(out, held, from, start, end)
				replaced = replaced || r
				start = -1
			}
		case start < 0 && bytes.HasPrefix(line, []byte(errorField)):
			var r bool
			out, r = s.scrubErrorLine(append(out, held[from:at]...), line)
			replaced = replaced || r
			from = at + len(line)
		}
		p = rest
	}
	if start >= 0 {
		// A value still open at the event's end ends with it.
		var r bool
		out, from, r = s.scrubValue(out, held, from, start, end)
		replaced = replaced || r
	}
	return append(out, held[from:]...), replaced
}

// scrubValue appends to out held[from:] up to the value whose lines are
// held[start:end], from its first data line to the end of its last,
// with the value replaced if it is an error event that hide hides, and
// returns the offset in held up to which out then has it, and whether it
// replaced the value. It appends nothing for a value kept.
func (s *scrubber) scrubValue(out, held []byte, from, start, end int) ([]byte, int, bool) {
	at := valueStart(held, start, end)
	if at >= end || !mayFail(held[at:end]) {
		return out, from, false
	}
	span := held[at:end]
	value := spanValue(span)
	status := valueErrorCode(value)
	if status == 0 {
		return out, from, false
	}
	v := s.hide(status, value)
	if v == nil {
		return out, from, false
	}
	return appendRewritten(append(out, held[from:at]...), span, v), end, true
}

// scrubNamed appends to out held, the lines of an event named "error"
// from its first data line on, with its data replaced by what hide
// returns for it, and reports whether it replaced it.
func (s *scrubber) scrubNamed(out, held []byte) ([]byte, bool) {
	end := 0 // of the event's last data line
	for p := held; len(p) > 0; {
		line, rest, _ := sse.Line(p)
		if sse.IsData(line) {
			end = len(held) - len(p) + len(line)
		}
		p = rest
	}
	at := valueStart(held, 0, end)
	if at >= end {
		return append(out, held...), false // no data but blanks
	}
	span := held[at:end]
	value := spanValue(span)
	v := s.hide(namedErrorCode(value), value)
	if v == nil {
		return append(out, held...), false
	}
	return append(appendRewritten(append(out, held[:at]...), span, v), held[end:]...), true
}
