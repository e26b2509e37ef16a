package extproc

import "github.com/llmlb/llmlb/internal/sse"

// The names of the OpenAI Responses events that a stream may start with
// before generation: vLLM and SGLang send response.created and
// response.in_progress as soon as they accept a request, before the
// prompt is prefilled, and OpenAI response.queued while a background
// response waits. None is a first token. Each is sent with its name in an
// "event:" line before its data.
const (
	createdEvent    = "response.created"
	inProgressEvent = "response.in_progress"
	queuedEvent     = "response.queued"
	maxPreambleName = len(inProgressEvent) // the longest name skipped, sse.ErrorEvent's included
)

// eventField starts a line that names the event it is part of.
const eventField = "event:"

// firstEvent finds the first event of a server-sent event stream that is
// not a preamble event nor an error event named so: the end of the first
// event (its blank line, where a client dispatches it) that has a data
// field (a line that begins with "data:", after a leading byte-order
// mark, or that is exactly "data") and whose name, which its last
// "event:" line before the blank line gives (see [sse.EventType]), is none
// of response.created, response.in_progress, response.queued and
// [sse.ErrorEvent]. Package httplb, which holds the first event back to
// its end, reads the same preamble types from their data, and takes an
// event named "error" for an error event whatever its data: the attempt
// fails rather than commit, and its time is no time to a first token. An
// error event by its data alone is a first event here; the pick ends as
// failed all the same (see [httplb.OutputCounter.Failed]). It keeps no
// more than its position in the current line and the current event's
// name. Its zero value is at the start of a stream.
type firstEvent struct {
	mark  sse.Mark
	found bool
	// The current line.
	field byte // the field the line starts as: 'd' (data), 'e' (event); 0: not known yet
	n     int8 // bytes of the field's name and colon matched; -1: the line is no field read here
	blank bool // nothing in the line so far
	cr    bool // the last byte was a carriage return: a line feed after it is part of the line break
	// The value of an "event:" line, while it is read.
	inName  bool
	spaced  bool // the value's first byte was read (a space there is not part of it)
	nameLen int8 // bytes of the name; -1: too long to be one skipped
	name    [maxPreambleName]byte
	// The current event: data is set once it has a data field; preamble
	// while its name, its last "event:" line's so far, is a preamble
	// event's, and errorNamed while it is "error". Either way it is no
	// first event.
	data, preamble, errorNamed bool
}

// Feed scans the next piece of the stream and reports whether the first
// event that is neither a preamble event nor named "error" has ended in it
// or before.
func (e *firstEvent) Feed(p []byte) bool {
	if e.found {
		return true
	}
	if e.mark.Skipping() {
		if e.mark == 0 {
			e.blank = true // the stream's first line begins
		}
		var broken bool
		if p, broken = e.mark.Skip(p); broken {
			e.n, e.blank = -1, false
		}
	}
	for _, c := range p {
		if c == '\n' && e.cr {
			e.cr = false
			continue
		}
		e.cr = c == '\r'
		if c == '\n' || c == '\r' {
			if e.endLine() {
				e.found = true
				return true
			}
			continue
		}
		e.blank = false
		if e.inName {
			e.readName(c)
			continue
		}
		if e.n < 0 {
			continue
		}
		if e.n == 0 {
			switch c {
			case sse.DataField[0], eventField[0]:
				e.field = c
			default:
				e.n = -1
				continue
			}
		}
		field := sse.DataField
		if e.field == eventField[0] {
			field = eventField
		}
		if c != field[e.n] {
			e.n = -1
			continue
		}
		e.n++
		if int(e.n) < len(field) {
			continue
		}
		if e.field == eventField[0] {
			e.inName, e.spaced, e.nameLen = true, false, 0
			continue
		}
		e.data, e.n = true, -1 // the rest of a data line changes nothing
	}
	return false
}

// End reports whether the stream, which ends, had its first event that is
// neither a preamble event nor named "error": one that has ended, or the
// event that the stream's end cuts short, its last line included, which a
// client may read as one.
func (e *firstEvent) End() bool {
	if !e.found && !e.blank {
		e.endLine()
	}
	e.found = e.found || e.data && !e.preamble && !e.errorNamed
	return e.found
}

// readName reads c, the next byte of an "event:" line's value.
func (e *firstEvent) readName(c byte) {
	if !e.spaced {
		e.spaced = true
		if c == ' ' {
			return
		}
	}
	switch {
	case e.nameLen < 0:
	case int(e.nameLen) == len(e.name):
		e.nameLen = -1
	default:
		e.name[e.nameLen] = c
		e.nameLen++
	}
}

// endLine ends the current line and reports whether it was the blank line
// that ends an event with data that is none skipped. An "event:" line
// names the event, an "event" line without a colon leaves it the default
// name, and a blank line ends it, and so its name.
func (e *firstEvent) endLine() bool {
	found := false
	switch {
	case e.blank:
		found = e.data && !e.preamble && !e.errorNamed
		e.data, e.preamble, e.errorNamed = false, false, false
	case e.inName:
		name := e.name[:max(e.nameLen, 0)]
		e.preamble = string(name) == createdEvent || string(name) == inProgressEvent || string(name) == queuedEvent
		e.errorNamed = string(name) == sse.ErrorEvent
	case e.field == eventField[0] && int(e.n) == len(eventField)-1:
		e.preamble, e.errorNamed = false, false // "event" without a colon: an empty name
	case e.field == sse.DataField[0] && int(e.n) == len(sse.DataField)-1:
		e.data = true // "data" without a colon: an empty line of data
	}
	e.field, e.n, e.blank, e.inName = 0, 0, true, false
	return found
}
