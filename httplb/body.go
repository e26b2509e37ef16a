package httplb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/llmlb/llmlb/internal/sse"
)

// errClosedEarly is what a pick's Done is told when the caller closed a
// response body before its end, typically because the client went away.
var errClosedEarly = fmt.Errorf("httplb: response body closed before its end: %w", context.Canceled)

// body is a response body that passes reads straight through, first
// returning the bytes held back while waiting for the first event, and calls
// finish exactly once: at EOF, on a read error, or on Close. Read and Close
// may be called at once; a Read after Close fails.
type body struct {
	rc     io.ReadCloser
	buf    []byte // held-back bytes not yet returned
	finish func(err error)
	done   atomic.Bool
	closed atomic.Bool // Close was called: Read fails
	// out, if metered, counts the output in every byte returned by Read,
	// in order, and its end before finish is called.
	out     outputMeter
	metered bool
	// unwatch stops watching the request's context (see watch), if set.
	unwatch atomic.Pointer[func() bool]
	// firstErr, if not 0, is the status that the stream's first event, an
	// error event held back in buf, stands for, and buf[errAt:errEnd] is
	// that event's value (see peekAs): not yet read, it may be replaced
	// (see handleFirstError).
	firstErr      int
	errAt, errEnd int
	// stream is set for an event stream that peek read to its first
	// event. buf[:scanned] is what peek judged of it: the lines up to the
	// end of the first event's value (the value of its first data line, or
	// all its data if it is named "error"), or up to the end of its
	// cut-short data if cut is set.
	stream  bool
	scanned int
	cut     bool
	// named is set if the event the scrubber goes on in (see
	// scrubEvents) is named "error" as far as the lines before it go: the
	// event that buf[:scanned] ends in, if it has not ended, or, with
	// holdValue, the first event, at buf[valueAt].
	named bool
	// holdValue is set if buf[valueAt:scanned] is the first value, from
	// the start of its first data line, and peek judged it no error
	// event: the scrubber holds it back to its event's end, where, if the
	// peek limit cut the event short, its last "event:" line may yet name
	// it "error" (see scrubEvents).
	holdValue bool
	valueAt   int
	// scrub, if set, rewrites the error events read after buf[:scanned]
	// (see scrubEvents); srcErr is the error that ended the reads of rc,
	// returned once buf is read.
	scrub  *scrubber
	srcErr error
}

// watch finishes the body, as failed with ctx's cause, when ctx is done
// before the body has ended, whether or not anyone reads or closes it: a
// handler that panics while it relays the response (in a ModifyResponse,
// or a ResponseWriter of a middleware) never closes it, and its pick and
// admission would be held for good. It neither closes the body nor fails
// its reads: the base transport does that when the context is done.
func (b *body) watch(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		b.end(fmt.Errorf("httplb: request ended before its response body: %w", context.Cause(ctx)))
	})
	b.unwatch.Store(&stop)
	if b.done.Load() {
		// Ended meanwhile, perhaps before the store: end may not have
		// seen it.
		stop()
	}
}

// Read implements io.Reader.
func (b *body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.scrub != nil {
		return b.readScrubbed(p)
	}
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		if b.metered {
			b.out.observe(p[:n])
		}
		if _, eof := b.rc.(eofReader); eof && len(b.buf) == 0 {
			// The body ended with these bytes: say so now, as net/http
			// does, for a caller that stops reading at the end of what
			// it decodes and then closes the body.
			b.end(nil)
			return n, io.EOF
		}
		return n, nil
	}
	n, err := b.rc.Read(p)
	if n > 0 && b.metered {
		b.out.observe(p[:n])
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			b.end(nil)
		} else {
			b.end(err)
		}
	}
	return n, err
}

// readScrubbed is Read through b.scrub: the bytes of rc pass through it,
// and are returned once it has let them go, after those in buf.
func (b *body) readScrubbed(p []byte) (int, error) {
	s := b.scrub
	if len(p) == 0 {
		return 0, nil
	}
	for len(b.buf) == 0 && b.srcErr == nil {
		n, err := b.rc.Read(p)
		if err == nil && s.passes(p[:n]) {
			if b.metered {
				b.out.observe(p[:n])
			}
			return n, nil
		}
		b.buf = s.feed(s.out[:0], p[:n])
		if err != nil {
			b.buf = s.flush(b.buf)
			b.srcErr = err
		}
		s.out = b.buf
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	if b.metered {
		b.out.observe(p[:n])
	}
	if _, eof := b.rc.(eofReader); eof && b.srcErr == nil && len(b.buf) == 0 && len(s.line) == 0 && len(s.val) == 0 {
		// As Read: the body ended with these bytes.
		b.srcErr = io.EOF
	}
	if len(b.buf) > 0 || b.srcErr == nil {
		return n, nil
	}
	err := b.srcErr
	if errors.Is(err, io.EOF) {
		b.end(nil)
	} else {
		b.end(err)
	}
	return n, err
}

// scrubEvents makes the body rewrite, as it is read, each error event
// after the first value that hide hides (see scrubber): those held back
// after buf[:scanned] now, and those read later; and the first value,
// peek's verdict on which was no error event, if its event, cut short by
// the peek limit, turns out to be named "error" after it. hidden reports
// whether the first value, if peek left it in an event named "error" that
// has not ended (see body.named), was replaced. It does nothing to a body that is not an
// event stream read to its first event.
func (b *body) scrubEvents(hide func(status int, value []byte) []byte, hidden bool) {
	if !b.stream || b.scrub != nil || b.scanned > len(b.buf) {
		return
	}
	s := &scrubber{hide: hide, named: b.named}
	from := b.scanned
	switch {
	case b.holdValue && b.valueAt <= b.scanned:
		// The first value is no error event as far as peek read:
		// held back from its first data line, the value passes, or is
		// replaced, with the event.
		from = b.valueAt
	case b.named && hidden:
		// The rest of the line at buf[scanned] is more of the value
		// replaced, cut short, or the line break after it: it is
		// dropped but for its line break, and so is the event's data
		// after it, up to the event's end.
		s.lineFate, s.lineOut, s.fate = lineDropped, true, eventDropped
	case b.named:
		// An error about the request, kept: the event's rest passes.
		s.lineFate, s.fate = linePassed, eventPassed
	case b.cut:
		// The rest of the value cut short passes.
		s.lineFate = linePassed
	}
	if from > 0 {
		s.mark = sse.MarkPast // past the stream's byte-order mark, if any
	}
	out := append(make([]byte, 0, len(b.buf)), b.buf[:from]...)
	b.buf = s.feed(out, b.buf[from:])
	b.scrub = s
}

// Close implements io.Closer. Closing before the end finishes the request as
// cancelled.
func (b *body) Close() error {
	b.closed.Store(true)
	err := b.rc.Close()
	b.end(errClosedEarly)
	return err
}

func (b *body) end(err error) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	if b.metered && b.out.end() && err == nil {
		err = ErrErrorEvent
	}
	if b.finish != nil {
		b.finish(err)
	}
	if stop := b.unwatch.Load(); stop != nil {
		(*stop)()
	}
}

// peek reads the start of resp's body until its first event is known: for
// a text/event-stream, to the end of the first event (its blank line) that
// has a data field and is not a preamble event (see preambleEvent), all
// its lines, where a client dispatches it and its name, which its last
// "event:" line gives, is known; for anything else (or a compressed
// stream), the first byte. The preamble events before it are held back
// with it. It gives up waiting after limit bytes, or at the body's end. An
// EOF ends the wait without error; another read error is returned, and the
// attempt is then retryable. If the first event is an error event (see
// [OutputCounter]), code is the status it stands for (see errorEventCode);
// otherwise code is 0.
func (b *body) peek(resp *http.Response, limit int) (code int, err error) {
	return b.peekAs(isEventStream(resp.Header), 512, limit)
}

// peekAs is peek, waiting for the first event of an event stream if stream
// is set, else for the first byte, with the bytes held back in a buffer of
// capacity size at first (see peekSize).
func (b *body) peekAs(stream bool, size, limit int) (code int, err error) {
	ev := eventPeek{at: -1}
	buf := make([]byte, 0, max(1, min(size, limit)))
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := b.rc.Read(buf[len(buf):min(cap(buf), limit)])
		from := len(buf)
		buf = buf[:from+n]
		eof := errors.Is(err, io.EOF)
		if eof {
			// A complete short body: nothing more will come. Keep it
			// readable, with its EOF.
			b.rc = eofReader{b.rc}
		}
		if n > 0 {
			if !stream || ev.feed(buf) {
				break
			}
		}
		if eof {
			if stream {
				ev.endStream(buf)
			}
			break
		}
		if err != nil {
			return 0, err
		}
	}
	b.buf = buf
	b.stream = stream
	if !stream {
		return 0, nil
	}
	if ev.at < 0 {
		ev.cutData(buf)
	}
	if ev.at < 0 {
		// No data line, but the stream may have ended after an error
		// line, or an event named "error" without data.
		code = errorFieldCode(buf)
		if code != 0 {
			b.firstErr = code
			b.errAt, b.errEnd = errorFieldSpan(buf)
			b.scanned = b.errEnd
		} else if ev.names.named || ev.names.current {
			// Nothing to rewrite: the scrubber reads the stream from its
			// start.
			code = http.StatusInternalServerError
			b.firstErr = code
		}
		return code, nil
	}
	head := buf[:ev.at]
	named := ev.names.current // the first event's name, as far as its lines have come
	at, end, cut := ev.span(buf, named)
	value := ev.value(buf, at, end)
	b.scanned, b.cut, b.named = end, cut, named && !ev.ended
	code = errorEventCode(head, ev.names.named, named, value)
	if code == 0 {
		// The scrubber holds the first event back from its first data
		// line, in an event named as far as the lines before it go.
		b.holdValue, b.valueAt, b.named = true, ev.at, ev.atNamed
		return 0, nil
	}
	b.firstErr = code
	switch {
	case errorFieldCode(head) != 0:
		b.errAt, b.errEnd = errorFieldSpan(head)
	case named || valueErrorCode(value) != 0:
		b.errAt, b.errEnd = at, end
	}
	// Otherwise the error is an event named "error" before this one,
	// without data: nothing to rewrite.
	return code, nil
}

// eventPeek follows an event stream held back by peek, across reads, line
// by line as each line ends, to the end of its first event that has a
// data field and is not a preamble event: its blank line, where a client
// dispatches it. It follows the event's name (see eventNames), its first
// value, the value of its first data field, which goes on in the event's
// next data lines while it is open at the end of one (see nesting), past
// the lines of other fields, to the end of the data line where it is
// complete or to the event's end, and the end of the event's last data
// line, which ends the data of an event named "error".
type eventPeek struct {
	// at is the offset in the held-back bytes of the event's first data
	// line (after the stream's byte-order mark); -1: none yet. atNamed is
	// whether the event was named "error" by the lines before it.
	at      int
	atNamed bool
	// next is the offset of the next line, the first not read; cr is set
	// if the line before it ended with a CR, whose LF, if next, is part
	// of its break. seen is the offset up to which the line at next,
	// which has not ended, has been looked at for its end.
	next int
	cr   bool
	seen int
	// valueEnd is the offset of the end of the first value's last data
	// line, once the value has ended there; -1: it has not. dataEnd is
	// that of the end of the event's last data line read.
	valueEnd, dataEnd int
	// firstEnd is the offset of the end of the event's first data line,
	// and lead that of the first byte of its value that is not
	// whitespace; -1: it has not ended, or has no such byte.
	firstEnd, lead int
	nest           nesting // the first value's JSON, as far as it has come
	ended          bool    // the event has ended: its blank line was read
	names          eventNames
}

// feed reads the lines of buf, the bytes of the stream read so far, that
// have ended since the last feed, and reports whether the wait is over: the
// first event that is no preamble event has ended.
func (e *eventPeek) feed(buf []byte) bool {
	for {
		if e.cr && e.next < len(buf) {
			e.cr = false
			if buf[e.next] == '\n' {
				e.next++
			}
		}
		// Only the bytes not looked at yet are, so that a line read in
		// many pieces costs its length once.
		from := max(e.next, e.seen)
		i := bytes.IndexAny(buf[from:], "\r\n")
		if i < 0 {
			e.seen = len(buf)
			return false
		}
		start, end := e.next, from+i
		e.next, e.cr = end+1, buf[end] == '\r'
		if e.line(buf, start, end) {
			return true
		}
	}
}

// endStream reads the last line of buf, the whole stream, if its end did
// not end it with a line break: a client reads the lines that a stream's
// end ends.
func (e *eventPeek) endStream(buf []byte) {
	if e.cr && e.next < len(buf) && buf[e.next] == '\n' {
		e.next++
	}
	if e.next < len(buf) {
		start := e.next
		e.next = len(buf)
		e.line(buf, start, len(buf))
	}
}

// line reads buf[start:end], a line of the stream without its line break,
// and reports whether it ends the first event that is no preamble event.
func (e *eventPeek) line(buf []byte, start, end int) bool {
	if start == 0 && bytes.HasPrefix(buf[:end], []byte(sse.ByteOrderMark)) {
		start = len(sse.ByteOrderMark) // not part of the stream's first line
	}
	line := buf[start:end]
	switch {
	case len(line) == 0:
		if e.at < 0 {
			break
		}
		// The end of an event with data: the first event, unless it is a
		// preamble event, named otherwise than "error".
		if e.names.current || !e.preamble(buf) {
			e.ended = true
			return true
		}
		e.at = -1
	case sse.IsData(line):
		_, v := sse.Field(line)
		if e.at < 0 {
			e.at, e.atNamed, e.valueEnd, e.nest = start, e.names.current, -1, nesting{}
			e.firstEnd, e.lead = end, -1
			if i := indexNonSpace(v); i >= 0 {
				e.lead = end - len(v) + i
			}
		} else if e.valueEnd < 0 {
			e.nest.feed(lineFeed)
		}
		if e.valueEnd < 0 {
			e.nest.feed(v)
			if !e.nest.open() {
				e.valueEnd = end
			}
		}
		e.dataEnd = end
		return false
	}
	e.names.line(line)
	return false
}

// lineFeed is the LF that the event-stream format joins an event's data
// lines with.
var lineFeed = []byte{'\n'}

// preamble reports whether the first value of the event that has just
// ended is a preamble event's (see preambleEvent).
func (e *eventPeek) preamble(buf []byte) bool {
	end := e.valueEnd
	if end < 0 {
		end = e.dataEnd // a value still open ends with its event
	}
	return preambleEvent(e.value(buf, e.start(buf, end), end))
}

// cutData takes, when the wait ended before any data line of buf, the
// bytes held back, ended, the line that has not ended for the event's
// first data line if it is one: a value that the limit cuts short.
func (e *eventPeek) cutData(buf []byte) {
	rest := buf[e.next:]
	if e.cr && len(rest) > 0 && rest[0] == '\n' {
		rest = rest[1:]
	}
	start := len(buf) - len(rest)
	if start == 0 && bytes.HasPrefix(rest, []byte(sse.ByteOrderMark)) {
		start, rest = len(sse.ByteOrderMark), rest[len(sse.ByteOrderMark):]
	}
	if len(rest) > 0 && bytes.HasPrefix(rest, []byte(sse.DataField)) {
		e.at, e.atNamed, e.valueEnd, e.dataEnd = start, e.names.current, -1, -1
		e.firstEnd, e.lead = -1, -1
	}
}

// span returns the bounds in buf of the data read so far of the first
// event, from its first byte that is not whitespace (or its end, if it has
// none) to the end of its last data line, and whether that line is cut
// short: a data line of the event that has not ended ends it. Of an event
// named "error" the data is all of its data lines; of another, its first
// value's.
func (e *eventPeek) span(buf []byte, named bool) (at, end int, cut bool) {
	end = e.dataEnd
	if !named && e.valueEnd >= 0 {
		end = e.valueEnd
	} else if !e.ended {
		rest := buf[e.next:]
		if e.cr && len(rest) > 0 && rest[0] == '\n' {
			rest = rest[1:]
		}
		if len(rest) > 0 && bytes.HasPrefix(rest, []byte(sse.DataField)) || e.dataEnd < e.at {
			end, cut = len(buf), true
		}
	}
	return e.start(buf, end), end, cut
}

// start returns the offset in buf of the first byte that is not whitespace
// of the event's data up to end, or end if it has none (see valueStart):
// without a look at the data lines again if the first one has such a byte.
func (e *eventPeek) start(buf []byte, end int) int {
	if e.lead >= 0 && e.lead <= end {
		return e.lead
	}
	return valueStart(buf, e.at, end)
}

// value returns the data of the event in buf[at:end], from the first byte
// of its data that is not whitespace to the end of a data line (see
// spanValue): without a look at its lines again if it is the first data
// line's alone.
func (e *eventPeek) value(buf []byte, at, end int) []byte {
	if end <= e.firstEnd {
		return buf[at:end]
	}
	return spanValue(buf[at:end])
}

// valueStart returns the offset in buf of the first byte that is not
// whitespace of the data of buf[from:end], the lines of an event from its
// value's first data line on, or end if it has none.
func valueStart(buf []byte, from, end int) int {
	for p := buf[from:end]; len(p) > 0; {
		line, rest, _ := sse.Line(p)
		if sse.IsData(line) {
			_, v := sse.Field(line)
			if i := indexNonSpace(v); i >= 0 {
				return end - len(p) + (len(line) - len(v)) + i
			}
		}
		p = rest
	}
	return end
}

// spanValue returns the data of an event's value in span, which runs from
// the value's first byte in its first data line to the end of its last
// (see eventPeek.span): the rest of its first line, joined with LFs to the
// values of the data lines after it, as the event-stream format joins
// them. It allocates only if the value has more than one line.
func spanValue(span []byte) []byte {
	first, rest, ok := sse.Line(span)
	if !ok {
		return span
	}
	return sse.AppendData(append(append([]byte(nil), first...), '\n'), rest)
}

// appendRewritten appends to dst the lines of span (see spanValue) with
// the value replaced by v: v, then the lines among them of other fields
// than data, each after the line break before it, so that the event keeps
// its other fields.
func appendRewritten(dst, span, v []byte) []byte {
	dst = append(dst, v...)
	first, rest, _ := sse.Line(span)
	for brk := len(span) - len(rest) - len(first); len(rest) > 0; {
		line, after, _ := sse.Line(rest)
		if !sse.IsData(line) {
			dst = append(append(dst, span[len(span)-len(rest)-brk:len(span)-len(rest)]...), line...)
		}
		brk = len(rest) - len(after) - len(line)
		rest = after
	}
	return dst
}

// preambleEvent reports whether value, the data of an event stream's value
// (see spanValue), is that of a preamble event: an OpenAI Responses event
// that vLLM and SGLang send before the engine has produced anything, as soon as they
// accept the request (response.created and response.in_progress), or that
// OpenAI sends while a background response waits (response.queued): a
// JSON object whose top-level "type" is one of those, without an error
// (see [OutputCounter.Failed]). A stream is committed at its first event
// that is none, so that a failure during the prefill is retried and the
// time to it is the time to the first token. Anthropic's message_start is
// no preamble: vLLM sends it with its first output. It does not allocate.
func preambleEvent(value []byte) bool {
	if i := indexNonSpace(value); i < 0 || value[i] != '{' ||
		!bytes.Contains(value, []byte(`"`+responsePrefix)) && !hasNameEscape(value) {
		return false
	}
	c := OutputCounter{sse: true, mark: sse.MarkPast, field: lineData, done: -1}
	c.scanData(value)
	return c.preamble && !c.failed
}

// hasNameEscape reports whether p may have a JSON string that has, in its
// decoded form, a lowercase letter, a '.' or a '_' escaped: a \u escape of
// one (\u0065 is "e"), or the start of a \u escape at the end of p. Every
// key and type that OutputCounter reads is such bytes, and a
// string that JSON decodes to one may escape any of them; a JSON encoder
// escapes none of them, so that an event without such an escape is
// judged by its unescaped text. It does not allocate.
func hasNameEscape(p []byte) bool {
	for {
		i := bytes.IndexByte(p, '\\')
		if i < 0 {
			return false
		}
		if i+6 > len(p) {
			return string(p[i+1:]) == "u00"[:min(len(p)-i-1, 3)]
		}
		if string(p[i+1:i+4]) == "u00" {
			if c, ok := hexByte(p[i+4], p[i+5]); ok && ('a' <= c && c <= 'z' || c == '.' || c == '_') {
				return true
			}
		}
		p = p[i+1:]
	}
}

// hexByte returns the byte that the hex digits hi and lo write, and whether
// they are hex digits.
func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexDigit(hi)
	l, ok2 := hexDigit(lo)
	return h<<4 | l, ok1 && ok2
}

func hexDigit(b byte) (byte, bool) {
	switch {
	case '0' <= b && b <= '9':
		return b - '0', true
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10, true
	case 'A' <= b && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}

// indexNonSpace returns the index of the first byte of p that is not JSON
// whitespace, or -1.
func indexNonSpace(p []byte) int {
	for i, c := range p {
		if !isSpace(c) {
			return i
		}
	}
	return -1
}

// errorEventCode returns the status that the first event of a stream stands
// for, given the stream's bytes before the event's first data line (head),
// whether an event before it was named "error" (prior; see eventNames),
// whether it is (named), and its data (see spanValue): of an event named
// "error", all of it; of another, its first value's. It is 0 if the event
// is not an error event (see [OutputCounter.Failed]); else that of
// llama.cpp's error line among head (see errorFieldCode); else, for an
// event named "error", what its data says (see namedErrorCode); else that
// of the value (see valueErrorCode); else, if an event named "error"
// without data came before it, 500. It allocates only for an error event.
func errorEventCode(head []byte, prior, named bool, value []byte) int {
	if code := errorFieldCode(head); code != 0 {
		return code
	}
	if named {
		return namedErrorCode(value)
	}
	if code := valueErrorCode(value); code != 0 || !prior {
		return code
	}
	return http.StatusInternalServerError
}

// eventNames follows whether the events of an event stream are named
// "error", line by line. The format sets an event's type at each of its
// "event:" lines (see [sse.EventType]), so that the last one before the
// blank line that ends the event names it: "event: error" and then
// "event: message" name a "message" event, and an "event" line without a
// value names none, leaving the default type, "message".
type eventNames struct {
	named   bool // an event that has ended was named "error"
	current bool // the current event is so named, as far as its lines have come
}

// line reads the next line of the stream, without its line break.
func (n *eventNames) line(line []byte) {
	if len(line) == 0 {
		// The event's end: it keeps the name it has.
		n.named = n.named || n.current
		n.current = false
		return
	}
	if typ, ok := sse.EventType(line); ok {
		n.current = string(typ) == sse.ErrorEvent
	}
}

// namedErrorCode returns the status that an event named "error" stands
// for, given its data: that of its value if it is an error event by its
// data too (see valueErrorCode); else that of its top-level "code" (see
// codeStatus), or of an Anthropic error type as its top-level "type" (see
// anthropicErrors); else 500, for data of any other shape, or none.
func namedErrorCode(value []byte) int {
	if code := valueErrorCode(value); code != 0 {
		return code
	}
	if n, ok := codeStatus(rawMember(value, "code")); ok {
		return n
	}
	if n, ok := anthropicErrors[jsonString(rawMember(value, typeKey))]; ok {
		return n
	}
	return http.StatusInternalServerError
}

// valueErrorCode returns the status that value, the data of an event's
// value, stands for: 0 if it is not an error event by its data (see
// [OutputCounter.Failed]); else the status of the error's "code" (see
// codeStatus).
// The code is that of the event's "error" object, else, in an OpenAI
// Responses "error" event, the event's own, else, in a "response.failed"
// event, that of its response's error. Without a code that names a
// status, the error object's type does, among Anthropic's types (which
// OpenAI's "invalid_request_error" shares): OpenAI's word codes, such as
// "context_length_exceeded", name none. An "error" string, as
// text-generation-inference sends, stands for the status of its
// "error_type" (see tgiErrors). It allocates only for an error event.
func valueErrorCode(value []byte) int {
	if i := indexNonSpace(value); i < 0 || value[i] != '{' ||
		!bytes.Contains(value, []byte(`"`+errorKey+`"`)) && !bytes.Contains(value, []byte(`"`+failedType+`"`)) &&
			!hasNameEscape(value) {
		return 0 // not an object with the key or type "error" or the type "response.failed"
	}
	c := OutputCounter{sse: true, mark: sse.MarkPast, field: lineData, done: -1}
	c.scanData(value)
	if !c.Failed() {
		return 0
	}
	code := rawMember(rawMember(value, errorKey), "code")
	if code == nil && jsonString(rawMember(value, typeKey)) == errorType {
		code = rawMember(value, "code")
	}
	if code == nil {
		code = rawMember(rawMember(rawMember(value, "response"), errorKey), "code")
	}
	if n, ok := codeStatus(code); ok {
		return n
	}
	e := rawMember(value, errorKey)
	if len(e) > 0 && e[0] == '"' {
		if n, ok := tgiErrors[jsonString(rawMember(value, "error_type"))]; ok {
			return n
		}
		return http.StatusInternalServerError
	}
	if status := rawMember(e, "http_status_code"); status != nil {
		return tgiOpenAIStatus(rawMember(e, "message"), status)
	}
	// Anthropic's error events name a type, not a code, and OpenAI's codes
	// are often words ("context_length_exceeded") beside a type that says
	// more ("invalid_request_error").
	if n, ok := anthropicErrors[jsonString(rawMember(rawMember(value, errorKey), typeKey))]; ok {
		return n
	}
	return http.StatusInternalServerError
}

// errorFieldCode returns the status that an error line (see errorField)
// among head, the lines of a stream before its first event, stands for,
// or 0 if there is none: its value's "code" (or that of an "error" object
// in it) as codeStatus reads it. llama.cpp's server sends such a line, not
// a data line, when it fails a streamed request, with a "code" that is an
// HTTP status. It does not allocate for a stream without one.
func errorFieldCode(head []byte) int {
	head = bytes.TrimPrefix(head, []byte(sse.ByteOrderMark))
	for len(head) > 0 {
		line := head
		if i := bytes.IndexAny(head, "\r\n"); i >= 0 {
			line, head = head[:i], head[i+1:]
		} else {
			head = nil
		}
		v, ok := bytes.CutPrefix(line, []byte(errorField))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		code := rawMember(v, "code")
		if code == nil {
			code = rawMember(rawMember(v, errorKey), "code")
		}
		n, _ := codeStatus(code)
		return n
	}
	return 0
}

// errorFieldSpan returns the bounds in head of the value of the first
// error line (see errorFieldCode), or 0, 0 if there is none.
func errorFieldSpan(head []byte) (start, end int) {
	off := 0
	if bytes.HasPrefix(head, []byte(sse.ByteOrderMark)) {
		off = len(sse.ByteOrderMark)
	}
	for off < len(head) {
		line := head[off:]
		next := len(head)
		if i := bytes.IndexAny(line, "\r\n"); i >= 0 {
			line, next = line[:i], off+i+1
		}
		if bytes.HasPrefix(line, []byte(errorField)) {
			start = off + len(errorField)
			if start < off+len(line) && head[start] == ' ' {
				start++
			}
			return start, off + len(line)
		}
		off = next
	}
	return 0, 0
}

// anthropicErrors are the statuses of the error types of Anthropic's
// Messages API (its "errors" reference); its overloaded
// answer's 529, which no HTTP client retries, stands for 503, as overloaded
// as it.
var anthropicErrors = map[string]int{
	"invalid_request_error": http.StatusBadRequest,
	"authentication_error":  http.StatusUnauthorized,
	"permission_error":      http.StatusForbidden,
	"not_found_error":       http.StatusNotFound,
	"request_too_large":     http.StatusRequestEntityTooLarge,
	"rate_limit_error":      http.StatusTooManyRequests,
	"api_error":             http.StatusInternalServerError,
	"timeout_error":         http.StatusGatewayTimeout,
	"overloaded_error":      http.StatusServiceUnavailable,
}

// tgiErrors are the statuses that Hugging Face text-generation-inference
// answers with for the "error_type" of its ErrorResponse, {"error": "...",
// "error_type": "..."}. Its streams send the same
// ErrorResponse as an event after their 200 when they fail, before the
// first token (a prompt beyond the context, or a full queue) or later
// (router/src/server.rs: impl From<InferError> for (StatusCode,
// Json<ErrorResponse>), the statuses, and impl From<InferError> for Event,
// the event; router/src/infer/mod.rs: InferError::error_type; v3.3.7).
// A generation error's 424 is not retried by default, as TGI's answer
// to a request that does not stream would not be.
var tgiErrors = map[string]int{
	"validation":                   http.StatusUnprocessableEntity,
	"template_error":               http.StatusUnprocessableEntity,
	"missing_template_variable":    http.StatusUnprocessableEntity,
	"tool_error":                   http.StatusUnprocessableEntity,
	"overloaded":                   http.StatusTooManyRequests,
	"generation":                   http.StatusFailedDependency,
	"incomplete_generation":        http.StatusInternalServerError,
	"incomplete_generation_stream": http.StatusInternalServerError,
	"stream_serialization_error":   http.StatusInternalServerError,
}

// tgiOpenAIStatus returns the status that the error event of
// text-generation-inference's OpenAI-compatible routes (/v1/chat/completions
// and /v1/completions) stands for, given its message and http_status_code
// as JSON: {"error": {"message": "...", "http_status_code": 422}}, which
// InferError::into_openai_event writes for every error with 422 and no
// error_type, an overloaded replica's included (router/src/infer/mod.rs and
// router/src/server.rs, v3.3.7). The message is the InferError's Display,
// whose start names the error, so the status is the one TGI answers with
// for that error when the request does not stream (impl From<InferError>
// for (StatusCode, Json<ErrorResponse>)): 429 for "Model is overloaded", to
// be retried, 422 for a validation, template or tool error, to be handed
// to the client, 424 for a generation error, 500 for an incomplete
// generation. A message of no error TGI names stands for the
// http_status_code, if that is a status, else for 500.
func tgiOpenAIStatus(message, status json.RawMessage) int {
	var msg string
	if json.Unmarshal(message, &msg) == nil {
		for _, m := range tgiMessages {
			if strings.HasPrefix(msg, m.prefix) {
				return m.status
			}
		}
	}
	n, _ := codeStatus(status)
	return n
}

// tgiMessages are the starts of the Display of text-generation-inference's
// InferError variants (#[error(...)] in router/src/infer/mod.rs, v3.3.7; the
// misspelt "vatiable" is TGI's), with the status TGI answers each with.
var tgiMessages = []struct {
	prefix string
	status int
}{
	{"Request failed during generation: ", http.StatusFailedDependency},
	{"Model is overloaded", http.StatusTooManyRequests},
	{"Input validation error: ", http.StatusUnprocessableEntity},
	{"Incomplete generation", http.StatusInternalServerError}, // and "Incomplete generation stream"
	{"Template error: ", http.StatusUnprocessableEntity},
	{"Missing template vatiable: ", http.StatusUnprocessableEntity},
	{"Tool error: ", http.StatusUnprocessableEntity},
	{"Stream event serialization error", http.StatusInternalServerError},
}

// codeStatus returns the status an error event's "code" stands for, and
// whether it stands for one: the code if it is a number from 100 to 599, as
// vLLM and SGLang give one; 429 for OpenAI's "rate_limit_exceeded" and
// "insufficient_quota", the codes of its 429 answers. Otherwise it returns
// 500, as for OpenAI's "server_error", and false.
func codeStatus(code json.RawMessage) (int, bool) {
	if len(code) > 0 && code[0] == '"' {
		switch jsonString(code) {
		case "rate_limit_exceeded", "insufficient_quota":
			return http.StatusTooManyRequests, true
		}
	}
	n, err := strconv.Atoi(string(code))
	if err != nil || n < 100 || n > 599 {
		return http.StatusInternalServerError, false
	}
	return n, true
}

// rawMember returns the raw value of key in the JSON object v, or nil if v is
// not an object or has no such key.
func rawMember(v []byte, key string) json.RawMessage {
	var m map[string]json.RawMessage
	if v == nil || json.Unmarshal(v, &m) != nil {
		return nil
	}
	return m[key]
}

// jsonString returns the string that raw, a JSON value, is, decoded, or ""
// if it is no string.
func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// eofReader reports EOF at once but still closes the underlying body.
type eofReader struct{ io.Closer }

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
