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
// not a preamble event nor an error event named so: the start of a line
// that begins with "data:" (after a leading byte-order mark), or the end
// of a line that is exactly "data", as [sse.FirstEvent] finds it, unless
// the last "event:" line before it in its event names it
// response.created, response.in_progress or response.queued, or one names
// it [sse.ErrorEvent]. Package httplb, which holds these events back,
// reads the same preamble types from their data, and takes an event named
// "error" for an error event whatever its data: the attempt fails rather
// than commit, and its time is no time to a first token. An error event by
// its data alone, or named "error" only after its data, is a first event
// here, its data having begun before it can be told; the pick ends as
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
	// preamble is set while the current event's name, its last "event:"
	// line's, is a preamble event's; errorNamed once an "event:" line of
	// it has named it "error", which it stays, as package httplb takes
	// it. Either way it is no first event.
	preamble, errorNamed bool
}

// Feed scans the next piece of the stream and reports whether the first
// event that is neither a preamble event nor named "error" has started in
// it or before.
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
		if !e.preamble && !e.errorNamed {
			e.found = true
			return true
		}
		e.n = -1 // a preamble or error event's data
	}
	return false
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

// endLine ends the current line and reports whether it was a "data" line
// without a colon (an empty line of data) of an event that is none skipped.
// An empty line ends the event, and so its name; an "event:" line names it.
func (e *firstEvent) endLine() bool {
	data := false
	switch {
	case e.blank:
		e.preamble, e.errorNamed = false, false
	case e.inName:
		name := e.name[:max(e.nameLen, 0)]
		e.preamble = string(name) == createdEvent || string(name) == inProgressEvent || string(name) == queuedEvent
		e.errorNamed = e.errorNamed || string(name) == sse.ErrorEvent
	case e.field == eventField[0] && int(e.n) == len(eventField)-1:
		e.preamble = false // "event" without a colon: an empty name
	case e.field == sse.DataField[0] && int(e.n) == len(sse.DataField)-1:
		data = !e.preamble && !e.errorNamed
	}
	e.field, e.n, e.blank, e.inName = 0, 0, true, false
	return data
}
