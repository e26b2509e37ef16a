package httplb

import (
	"bytes"
	"math"
	"net/http"
	"strings"
	"sync"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/internal/sse"
)

// OutputCounter counts the output tokens of a response body as it passes, in
// pieces of any size, without keeping the body: the counts to report with
// [llmlb.Pick.Generated] (and to charge a fair queue's ticket), as a
// [Transport] does. It is for callers that relay response bodies themselves,
// such as package extproc.
//
// For a server-sent event stream it counts one token per event, a "data:"
// line (after the byte-order mark a stream may start with), when the line
// ends: one per chunk of the OpenAI-compatible servers, which stream a
// token or a few per chunk. The format joins the data lines of an event
// with a LF, so that a JSON value may spread over several: one whose
// object, array or string is still open at the end of its line (or that
// has not begun) goes on in the event's next data line, past the lines of
// other fields, and ends at the end of the data line where it is complete,
// or with its event, at a blank line; it counts one token, and is read as
// one value. Lines end at a LF, a CR or a CR LF. The "data: [DONE]" line is not
// counted, nor is a line with a usage count ("completion_tokens" in OpenAI
// chat and completions, "output_tokens" in OpenAI responses and Anthropic
// messages): it raises the total to its count instead, if that is higher.
// The usage event that ends an OpenAI stream with
// stream_options.include_usage, vLLM's running usage and Anthropic's
// message_delta thus make the total exact when chunks carry several tokens.
// The few events that carry no token (a role or a finish chunk, Anthropic's
// content_block_start, ping and message_stop) are counted too, as no count
// is ever taken back. In an OpenAI Responses stream, whose events name
// their type in a top-level "type", only the deltas (a "type" that starts
// with "response." and ends in ".delta", such as
// "response.output_text.delta") are counted: its other events
// (response.created, response.output_item.added, ...) carry no token, and
// its response.completed or response.incomplete has the usage. An error
// event (see [OutputCounter.Failed]) counts none, nor does the data of an
// event named "error", from its name on.
//
// For any other body (a non-streaming JSON response, or a compressed
// stream) it counts nothing until [OutputCounter.End]: then the last usage
// count the body has, if any, else one token per [BytesPerToken] bytes.
//
// A usage count is read from a usage object: the value of a "usage" key of
// the JSON's top-level object or of an object directly inside it (where
// OpenAI chat, completions and responses, Anthropic messages and their
// streaming events put it), not from one nested deeper, where a response
// may echo what its client sent (a tool's JSON schema, say): a client
// cannot raise the count reported for its own request. The JSON is read as
// it passes, without decoding it whole: keys are only ever matched outside
// strings, and the keys and the "type" values that it reads are matched as
// JSON decodes them, escapes and all ("\u0065rror" is "error"), in
// constant memory.
//
// The zero value counts a body that is not an event stream. An
// OutputCounter is not safe for concurrent use; it does not allocate.
type OutputCounter struct {
	sse   bool
	mark  sse.Mark // an event stream's leading byte-order mark
	total int64    // tokens counted so far
	bytes int64    // body bytes, for a body that is not an event stream

	// The current line of an event stream.
	field int8 // bytes of "data:" matched at the start of the line; lineData after it; -1: not a data line
	done  int8 // bytes of "[DONE]" matched at the start of the value; -1: the value is something else
	space bool // the value's leading space was skipped
	cr    bool // the last line ended with a CR: a LF now is the rest of its line break
	// cont is set while the current value, open at the end of its data
	// line, goes on in the event's next data line; begun once it has a
	// byte other than whitespace.
	cont, begun bool
	// errField is the bytes of "error:" matched at the start of the line
	// (see errorField); -1: the line is none.
	errField int8
	// evName is the bytes of eventErrorLine matched at the start of the
	// line, the space after its colon counted whether it came or not;
	// -1: the line is no event field; evOther: it is one with another
	// value (see matchEventName).
	evName int8
	// errEvent is set while the current event is named "error": the last
	// "event:" line of it that has ended is "event: error". Its values
	// then count no token; held is how many they would have counted, which
	// count if a later "event:" line names the event otherwise.
	errEvent bool
	held     int64
	// usage is set if a usage count was found: in the current line of an
	// event stream, anywhere in any other body.
	usage bool
	count int64 // the last usage count found
	// failed is set once an event of the stream was an error (see
	// Failed); errLine if the current line is that event's.
	failed, errLine bool
	// errStr is set while the next byte is the first of the string
	// value of an event's top-level "error" key (see Failed).
	errStr bool
	// noToken is set if the current line is an OpenAI Responses event
	// that carries no token: its "type" starts with "response." and does
	// not end in ".delta".
	noToken bool
	// preamble is set if the current line is an OpenAI Responses event
	// sent before generation: its last top-level "type" is one of the
	// preamble types.
	preamble bool

	// The value of the "type" key of an event's top-level object, while
	// it is read: its head is in key.
	typeVal bool   // the current string is that value
	typeLen int32  // its length so far
	typeEnd uint64 // its last (up to) 8 bytes

	// The JSON being read: an event's data, or a body that is not an
	// event stream.
	inStr   bool                 // in a string
	esc     bool                 // in a string, the next byte is escaped
	hex     int8                 // in a string read (see keyLen), the hex digits of a \u escape still to come
	uni     rune                 // the code point of that escape so far
	keyLen  int8                 // bytes of the current string in key, as decoded; -1: it is none of the keys read
	key     [maxUsageKeyLen]byte // the start of the current string
	expect  int8                 // what the last key calls for: one of the expect constants
	depth   int32                // objects and arrays open
	usageAt int32                // the depth of the usage object being read; 0: none
	val     int64                // the digits of a count read so far
}

// NewOutputCounter returns an OutputCounter for a response body with header
// h: one that counts events if h's Content-Type is text/event-stream, with
// no Content-Encoding other than identity (in any case); one that counts
// usage or bytes otherwise.
func NewOutputCounter(h http.Header) OutputCounter {
	return OutputCounter{sse: isEventStream(h)}
}

// isEventStream reports whether h announces an uncompressed event stream:
// without a Content-Encoding, or with identity, a content coding's name
// being case-insensitive.
func isEventStream(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	if !strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
		return false
	}
	ce := strings.TrimSpace(h.Get("Content-Encoding"))
	return ce == "" || strings.EqualFold(ce, "identity")
}

const (
	lineData  = 5 // OutputCounter.field after "data:"
	doneValue = "[DONE]"
	// errorField starts the line with which llama.cpp's server reports a
	// streamed request it fails: "error: " and the error object (with its
	// "code", "message" and "type"), not a "data:" line, then the stream's
	// "data: [DONE]" (server_sent_event(sink, "error", error_data) in
	// handle_completions_impl, tools/server/server.cpp, and
	// server_sent_event in tools/server/utils.hpp, ggml-org/llama.cpp at
	// c63cb1581f9f). Event-stream parsers ignore the field; its clients
	// and this package do not.
	errorField = "error:"
	// eventErrorLine names an event "error": Anthropic's Messages API
	// sends its error events so, and the OpenAI Responses API its "error"
	// events, and their SDKs raise the event's data as an error on the
	// name alone (Anthropic's) or when it has an "error" (OpenAI's). The
	// space after the colon is optional, as for every field.
	eventErrorLine = sse.EventField + " " + sse.ErrorEvent
	// evOther is OutputCounter.evName for an event field whose value is
	// not "error": the line names the event otherwise, or, without a
	// value, leaves it the default type, "message".
	evOther = -2

	usageKey       = "usage"
	errorKey       = "error"
	typeKey        = "type"
	completionKey  = "completion_tokens"
	outputKey      = "output_tokens"
	maxUsageKeyLen = len(completionKey)
	// maxUsageDepth is the deepest a "usage" key is read at: in the
	// top-level object (depth 1) or an object directly inside it.
	maxUsageDepth = 2
)

// What the last key read calls for next.
const (
	expectNothing     = iota
	expectCountColon  // a count key: its colon
	expectCount       // after the colon: a number
	expectDigits      // in the number
	expectUsageColon  // a "usage" key: its colon
	expectUsageObject // after the colon: an object
	expectErrorColon  // an "error" key of an event's top-level object: its colon
	expectErrorValue  // after the colon: an object, or a string (text-generation-inference's)
	expectTypeColon   // a "type" key of an event's top-level object: its colon
	expectTypeValue   // after the colon: a string
)

// The values of an event's top-level "type" that the counter reads: those
// of the OpenAI Responses API's error events, and the prefix and suffix of
// its events' types.
const (
	errorType      = "error"           // an error event (also Anthropic's, whose "error" object is read too)
	failedType     = "response.failed" // the response failed; its "response" has the "error"
	responsePrefix = "response."
	deltaSuffix    = ".delta"
	// deltaEnd is deltaSuffix in the low bytes of OutputCounter.typeEnd.
	deltaEnd = uint64('.')<<40 | uint64('d')<<32 | uint64('e')<<24 | uint64('l')<<16 | uint64('t')<<8 | uint64('a')
)

// The types of the OpenAI Responses events that a stream may start with
// before generation: vLLM and SGLang send response.created and
// response.in_progress as soon as the request is accepted, before the
// prompt is prefilled, and OpenAI a response.queued while a background
// response waits. None carries anything the engine produced. The longest
// is longer than OutputCounter.key: its head is in key and the rest of it,
// inProgressTail, in the low bytes of OutputCounter.typeEnd.
const (
	createdType    = "response.created"
	inProgressType = "response.in_progress"
	queuedType     = "response.queued"
	inProgressTail = uint64('e')<<16 | uint64('s')<<8 | uint64('s') // inProgressType[maxUsageKeyLen:]
)

// Count consumes the next piece of the body, p, and returns the tokens it
// completes.
func (c *OutputCounter) Count(p []byte) int {
	if !c.sse {
		c.bytes += int64(len(p))
		for i := 0; i < len(p); i++ {
			switch {
			case c.inStr && !c.esc && c.keyLen < 0:
				// Only the string's closing quote matters.
				j := c.skipString(p[i:])
				if j < 0 {
					return 0
				}
				i += j
			case !c.inStr && c.expect == expectNothing:
				for !structural[p[i]] {
					if i++; i == len(p) {
						return 0
					}
				}
			}
			c.scan(p[i])
		}
		return 0
	}
	before := c.total
	if c.mark.Skipping() {
		var broken bool
		if p, broken = c.mark.Skip(p); broken {
			c.field, c.errField, c.evName = -1, -1, -1
		}
	}
	for i := 0; i < len(p); i++ {
		if c.field == lineData && c.done < 0 {
			// The rest of a data line is JSON, or something else.
			if i += c.scanLine(p[i:]); i == len(p) {
				break
			}
		}
		switch b := p[i]; {
		case b == '\n' || b == '\r':
			if b == '\n' && c.cr && c.field == 0 {
				// The LF of a CR LF: the line ended at the CR.
				c.cr = false
				continue
			}
			c.endLine()
			c.cr = b == '\r'
		case c.field == lineData:
			c.matchDone(b)
			if !isSpace(b) {
				c.begun = true
			}
			c.scan(b)
		default:
			c.matchErrorField(b)
			c.matchEventName(b)
			switch {
			case c.field < 0:
			case b == sse.DataField[c.field]:
				c.field++
			default:
				c.field = -1
			}
		}
	}
	return int(c.total - before)
}

// skipString returns the index in p of the quote that closes the current
// string, whose next byte, p[0], is not escaped; or -1 if p ends first,
// leaving c.esc set if p ends with an escaping backslash.
func (c *OutputCounter) skipString(p []byte) int {
	j, esc := closingQuote(p, 0)
	c.esc = esc
	return j
}

// closingQuote returns the index in p of the first quote at or after from
// that no backslash escapes, where p[from] is not escaped; or -1 if p ends
// first, and then esc reports whether p ends with an escaping backslash.
func closingQuote(p []byte, from int) (j int, esc bool) {
	for {
		k := bytes.IndexByte(p[from:], '"')
		if k < 0 {
			return -1, backslashesBefore(p, len(p), from)%2 == 1
		}
		k += from
		if backslashesBefore(p, k, from)%2 == 0 {
			return k, false
		}
		from = k + 1
	}
}

// backslashesBefore returns the number of backslashes that precede p[j],
// back to p[from].
func backslashesBefore(p []byte, j, from int) int {
	n := 0
	for j > from && p[j-1] == '\\' {
		j--
		n++
	}
	return n
}

// scanLine reads the bytes of an event's data at the start of p, up to a
// line break, and returns how many it read.
func (c *OutputCounter) scanLine(p []byte) int {
	if !c.begun {
		// Whitespace before the value changes nothing.
		i := 0
		for i < len(p) && (p[i] == ' ' || p[i] == '\t') {
			i++
		}
		if i == len(p) || p[i] == '\n' || p[i] == '\r' {
			return i
		}
		c.begun = true
		return i + c.scanLine(p[i:])
	}
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch {
		case c.inStr && !c.esc && c.keyLen < 0:
			// Only a quote, a backslash or a line break changes anything.
			for b != '"' && b != '\\' && b != '\n' && b != '\r' {
				if i++; i == len(p) {
					return i
				}
				b = p[i]
			}
		case !c.inStr && c.expect == expectNothing:
			// Only a string, an object, an array or a line break does.
			for !structural[b] {
				if i++; i == len(p) {
					return i
				}
				b = p[i]
			}
		}
		if b == '\n' || b == '\r' {
			return i
		}
		c.scan(b)
	}
	return len(p)
}

// scanData reads p, the data of an event stream's value (its data lines'
// values joined with LFs), as the JSON text of one value.
func (c *OutputCounter) scanData(p []byte) {
	for i := 0; i < len(p); {
		if i += c.scanLine(p[i:]); i < len(p) {
			c.scan(p[i]) // a LF: whitespace, or in a string
			i++
		}
	}
}

// scan reads b, the next byte of JSON text, following its strings, its
// nesting and the usage counts in it.
func (c *OutputCounter) scan(b byte) {
	if c.inStr {
		if c.errStr {
			// Any string but "" as the error is one.
			c.errStr, c.keyLen = false, -1
			if b != '"' {
				c.failed, c.errLine = true, true
			}
		}
		switch {
		case c.esc:
			c.esc = false
			if c.keyLen >= 0 {
				c.unescape(b)
			}
		case c.hex > 0:
			c.unhex(b)
		case b == '\\':
			c.esc = true
		case b == '"':
			c.inStr = false
			c.endString()
		case c.typeVal:
			c.strByte(b)
		case c.keyLen < 0:
		case int(c.keyLen) == maxUsageKeyLen || c.keyLen == 0 && !c.startsKey(b):
			c.keyLen = -1 // too long, or starts as no key read here does
		default:
			c.key[c.keyLen] = b
			c.keyLen++
		}
		return
	}
	if c.expect == expectDigits {
		if isDigit(b) {
			c.val = min(c.val*10+int64(b-'0'), maxCount)
			return
		}
		c.endNumber()
	}
	if isSpace(b) {
		return
	}
	switch b {
	case '"':
		// Only a usage object's counts, the keys where a usage object may
		// be or of an event's top level, and the value of its "type" are
		// read; any other string is skipped.
		c.inStr, c.keyLen = true, -1
		if c.expect == expectTypeValue {
			c.keyLen, c.typeVal, c.typeLen, c.typeEnd = 0, true, 0, 0
		} else if c.expect == expectErrorValue {
			// Its first byte is read (keyLen is not -1), to tell "".
			c.keyLen, c.errStr = 0, true
		} else if c.usageAt != 0 && c.depth == c.usageAt || c.usageAt == 0 && c.depth <= maxUsageDepth {
			c.keyLen = 0
		}
	case ':':
		switch c.expect {
		case expectCountColon:
			c.expect = expectCount
			return
		case expectUsageColon:
			c.expect = expectUsageObject
			return
		case expectErrorColon:
			c.expect = expectErrorValue
			return
		case expectTypeColon:
			c.expect = expectTypeValue
			return
		}
	case '{', '[':
		if c.depth < math.MaxInt32 {
			c.depth++
		}
		if b == '{' && c.expect == expectUsageObject {
			c.usageAt = c.depth
		}
		if b == '{' && c.expect == expectErrorValue {
			c.failed, c.errLine = true, true
		}
	case '}', ']':
		if c.depth == c.usageAt {
			c.usageAt = 0
		}
		if c.depth > 0 {
			c.depth--
		}
	default:
		if c.expect == expectCount && isDigit(b) {
			c.expect, c.val = expectDigits, int64(b-'0')
			return
		}
	}
	c.expect = expectNothing
}

// strByte reads b, the next byte of the current string as decoded, into
// the key or type value being read, if it is one.
func (c *OutputCounter) strByte(b byte) {
	switch {
	case c.typeVal:
		if int(c.keyLen) < len(c.key) {
			c.key[c.keyLen] = b
			c.keyLen++
		}
		c.typeLen = min(c.typeLen+1, math.MaxInt32)
		c.typeEnd = c.typeEnd<<8 | uint64(b)
	case c.keyLen < 0:
	case int(c.keyLen) == maxUsageKeyLen || c.keyLen == 0 && !c.startsKey(b):
		c.keyLen = -1 // too long, or starts as no key read here does
	default:
		c.key[c.keyLen] = b
		c.keyLen++
	}
}

// unescape reads b, the byte after a backslash in a string being read (a
// key or a type value), as JSON decodes it: a key written "\u0065rror" is
// "error". A string with an escape JSON has not is read no further.
func (c *OutputCounter) unescape(b byte) {
	switch b {
	case 'u':
		c.hex, c.uni = 4, 0
	case '"', '\\', '/':
		c.strByte(b)
	case 'b':
		c.strByte('\b')
	case 'f':
		c.strByte('\f')
	case 'n':
		c.strByte('\n')
	case 'r':
		c.strByte('\r')
	case 't':
		c.strByte('\t')
	default:
		c.keyLen, c.typeVal = -1, false
	}
}

// unhex reads b, where a hex digit of a \u escape is due (see unescape).
// With the last, the escape's character is read: an ASCII one as itself,
// any other as a byte that is in no key or type read (0x80), as they are
// all ASCII. A string whose escape is cut short is read no further, and b
// is then the string's next byte.
func (c *OutputCounter) unhex(b byte) {
	d, ok := hexDigit(b)
	if !ok {
		c.hex, c.keyLen, c.typeVal = 0, -1, false
		switch b {
		case '\\':
			c.esc = true
		case '"':
			c.inStr = false
			c.endString()
		}
		return
	}
	c.uni = c.uni<<4 | rune(d)
	if c.hex--; c.hex == 0 {
		if c.uni < 0x80 {
			c.strByte(byte(c.uni))
		} else {
			c.strByte(0x80)
		}
	}
}

// structural marks the bytes that matter in JSON text outside a string
// when no key calls for anything: those that start or end a string, an
// object or an array, and line breaks.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true, '\n': true, '\r': true}

// startsKey reports whether b starts a key read where the string is: a
// count key in a usage object, else "usage".
func (c *OutputCounter) startsKey(b byte) bool {
	if c.usageAt != 0 {
		return b == completionKey[0] || b == outputKey[0]
	}
	return b == usageKey[0] || c.sse && c.depth == 1 && (b == errorKey[0] || b == typeKey[0])
}

// endString reads the string that ended: a "usage" key where a usage
// object may be, a count key directly inside one, an "error" or "type" key
// of an event's top-level object, or the value of that "type".
func (c *OutputCounter) endString() {
	c.expect = expectNothing
	if c.typeVal {
		c.typeVal = false
		c.endType()
		return
	}
	if c.keyLen < 0 {
		return
	}
	switch k := c.key[:c.keyLen]; {
	case c.usageAt == 0 && c.depth <= maxUsageDepth && string(k) == usageKey:
		c.expect = expectUsageColon
	case c.usageAt != 0 && c.depth == c.usageAt && (string(k) == completionKey || string(k) == outputKey):
		c.expect = expectCountColon
	case c.sse && c.usageAt == 0 && c.depth == 1 && string(k) == errorKey:
		c.expect = expectErrorColon
	case c.sse && c.usageAt == 0 && c.depth == 1 && string(k) == typeKey:
		c.expect = expectTypeColon
	}
}

// endType reads the value of an event's top-level "type", whose head is in
// c.key: an OpenAI Responses error event ("error" or "response.failed")
// fails the stream; another Responses event carries no token unless it is
// a delta.
func (c *OutputCounter) endType() {
	head := c.key[:c.keyLen]
	// The last "type" of the object is its type, as JSON decoders read it.
	c.preamble = int(c.typeLen) == len(createdType) && string(head) == createdType ||
		int(c.typeLen) == len(queuedType) && string(head) == queuedType ||
		int(c.typeLen) == len(inProgressType) && string(head) == inProgressType[:maxUsageKeyLen] &&
			c.typeEnd&(1<<(8*(len(inProgressType)-maxUsageKeyLen))-1) == inProgressTail
	switch {
	case int(c.typeLen) == len(errorType) && string(head) == errorType,
		int(c.typeLen) == len(failedType) && string(head) == failedType:
		c.failed, c.errLine = true, true
	case int(c.typeLen) > len(responsePrefix) && string(head[:len(responsePrefix)]) == responsePrefix &&
		!(int(c.typeLen) >= len(deltaSuffix) && c.typeEnd&(1<<(8*len(deltaSuffix))-1) == deltaEnd):
		c.noToken = true
	}
}

// End returns the tokens the end of the body completes: those of an event
// stream's last value if the body ends before it does, or, for a body that
// is not an event stream, all of its tokens. Calls after the first return
// 0.
func (c *OutputCounter) End() int {
	before := c.total
	if c.sse {
		c.endName() // the body may end in the line that names its last event
		if c.field == lineData || c.cont {
			c.endValue()
		}
		c.endEvent()
		*c = OutputCounter{sse: true, total: c.total, mark: sse.MarkPast, failed: c.failed}
		return int(c.total - before)
	}
	c.endNumber()
	n := c.bytes / BytesPerToken
	if c.usage {
		n = c.count
	}
	c.total = max(c.total, min(n, maxCount))
	return int(c.total - before)
}

// endLine ends the event stream line that ends, and starts the next one. A
// data line ends its value, and counts it, unless the value is open at its
// end (see nesting): the format joins the data lines of an event with a
// LF, and the value goes on in the event's next data line, past the lines
// of other fields. A blank line ends the event, and its value with it; an
// event named "error" there fails the stream (see Failed).
func (c *OutputCounter) endLine() {
	c.endName()
	switch {
	case c.field == lineData && (!c.begun || c.inStr || c.depth > 0):
		c.scan('\n')
		c.field, c.errField, c.evName, c.done, c.cont = 0, 0, 0, -1, true
		return
	case c.field == lineData, c.cont && c.field == 0:
		c.endValue()
	case c.cont:
		c.field, c.errField, c.evName = 0, 0, 0
		return
	}
	if c.field == 0 {
		// A blank line (no byte matched "data:") ends the event and its
		// name.
		c.endEvent()
	}
	*c = OutputCounter{sse: true, total: c.total, mark: sse.MarkPast, failed: c.failed, errEvent: c.errEvent, held: c.held}
}

// endName reads the name of the event field that the line that ends is,
// if it is one: the format sets the event's type at each, and the last
// one before the blank line names the event.
func (c *OutputCounter) endName() {
	switch {
	case int(c.evName) == len(eventErrorLine):
		c.errEvent = true
	case c.evName == evOther || int(c.evName) >= len(sse.EventField)-1:
		c.errEvent = false // named otherwise, or "event" without a value
	}
}

// endEvent ends the current event: an event named "error" fails the
// stream; the tokens of another that were held while it was so named
// count.
func (c *OutputCounter) endEvent() {
	if c.errEvent {
		c.failed = true
	} else {
		c.total = min(c.total+c.held, maxCount)
	}
	c.errEvent, c.held = false, 0
}

// endValue counts the value of an event stream that ends.
func (c *OutputCounter) endValue() {
	c.endNumber()
	switch {
	case c.errLine: // no token
	case c.errEvent:
		if !c.usage && !c.noToken && c.done != int8(len(doneValue)) {
			c.held = min(c.held+1, maxCount) // counted if the event is named otherwise after all
		}
	case c.usage:
		c.total = max(c.total, c.count)
	case c.noToken:
	case c.done != int8(len(doneValue)):
		c.total = min(c.total+1, maxCount)
	}
}

// matchDone matches b, the next byte of a data line's value, against
// "[DONE]", after an optional space.
func (c *OutputCounter) matchDone(b byte) {
	switch {
	case c.done < 0:
	case c.done == 0 && b == ' ' && !c.space:
		c.space = true
	case int(c.done) < len(doneValue) && b == doneValue[c.done]:
		c.done++
	default:
		c.done = -1
	}
}

// matchErrorField matches b, the next byte of a line that is no data line
// (yet), against the "error:" that starts an error line (see errorField),
// and marks the stream failed once it has.
func (c *OutputCounter) matchErrorField(b byte) {
	switch {
	case c.errField < 0 || int(c.errField) == len(errorField):
	case b == errorField[c.errField]:
		if c.errField++; int(c.errField) == len(errorField) {
			c.failed = true
		}
	default:
		c.errField = -1
	}
}

// matchEventName matches b, the next byte of a line that is no data line
// (yet), against eventErrorLine, with or without its space: the line names
// the event "error" if it has matched all of it when it ends, and names it
// otherwise if it is an event field with another value, or none.
func (c *OutputCounter) matchEventName(b byte) {
	const colon = len(sse.EventField) // the offset of the space
	switch {
	case c.evName < 0:
	case int(c.evName) == len(eventErrorLine):
		c.evName = evOther // the name goes on: another
	case b == eventErrorLine[c.evName]:
		c.evName++
	case int(c.evName) == colon && b == eventErrorLine[colon+1]:
		c.evName += 2 // "event:error"
	case int(c.evName) >= colon:
		c.evName = evOther // the field is "event", its value another
	default:
		c.evName = -1
	}
}

// Failed reports whether an event of an event stream counted so far was an
// error event, its data an object with, at its top level, either an "error"
// object, as vLLM and SGLang send when generation fails after the 200 (and
// OpenAI and Anthropic too), or an "error" string other than "", as
// Hugging Face text-generation-inference sends ({"error": "...",
// "error_type": "validation"}, say), or a "type" of "error" or
// "response.failed", the OpenAI Responses API's error events, their keys
// and types as JSON decodes them. An "error" or a type deeper in the object,
// or in a string, is none. A line with the field name "error" (see errorField), which
// llama.cpp's server sends instead of a data line when it fails a streamed
// request, is an error event too, whatever its value; and so is an event
// named "error", as Anthropic's Messages API and the OpenAI Responses API
// name their error events, whatever its data, or without any: Anthropic's
// SDKs raise such an event as an error on its name alone. An event is named
// by its last "event:" line before the blank line that ends it (or before
// the body's end), as the event-stream format has it: "event: error" (or
// "event:error") names it "error", and a later "event: message", or
// "event" without a value, names it otherwise again. Its data, from an
// "event: error" line on, counts no token unless a later line names it
// otherwise. A caller relaying the body then ends the request's pick with an
// error, such as [ErrErrorEvent]. It is false for a body that is not an
// event stream, whose status tells.
func (c *OutputCounter) Failed() bool { return c.failed }

// endNumber records the usage count being read, if any.
func (c *OutputCounter) endNumber() {
	if c.expect == expectDigits {
		c.usage, c.count = true, c.val
		c.expect = expectNothing
	}
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// outputMeter reports the output of a committed response's body, counted by
// an OutputCounter as the caller reads it, to the attempt's pick with
// Generated and, if the request was admitted by a fair queue, to its ticket.
// It is called from the goroutine reading the body, and from Close.
type outputMeter struct {
	mu   sync.Mutex // protects c, which Read and Close may use at once
	c    OutputCounter
	pick llmlb.Pick
	tk   *fair.Ticket // nil: no fair queue
}

// observe counts p, the next bytes of the body.
func (m *outputMeter) observe(p []byte) {
	m.mu.Lock()
	n := m.c.Count(p)
	m.mu.Unlock()
	m.report(n)
}

// end counts the end of the body and reports whether an event of it was
// an error.
func (m *outputMeter) end() (failed bool) {
	m.mu.Lock()
	n := m.c.End()
	failed = m.c.Failed()
	m.mu.Unlock()
	m.report(n)
	return failed
}

func (m *outputMeter) report(n int) {
	if n <= 0 {
		return
	}
	m.pick.Generated(n)
	if m.tk != nil {
		m.tk.Charge(n)
	}
}
