package httplb

import (
	"bytes"
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
// token or a few per chunk. The "data: [DONE]" line is not
// counted, nor is a line with a usage count ("completion_tokens" in OpenAI
// chat and completions, "output_tokens" in OpenAI responses and Anthropic
// messages): it raises the total to its count instead, if that is higher.
// The usage event that ends an OpenAI stream with
// stream_options.include_usage, vLLM's running usage and Anthropic's
// message_delta thus make the total exact when chunks carry several tokens.
// The few events that carry no token (a role or a finish chunk, Anthropic's
// content_block_start, ping and message_stop) are counted too, as no count
// is ever taken back.
//
// For any other body (a non-streaming JSON response, or a compressed
// stream) it counts nothing until [OutputCounter.End]: then the last usage
// count the body has, if any, else one token per [BytesPerToken] bytes.
//
// Usage keys are matched in the bytes as they pass, without decoding the
// JSON; a key cannot match inside a JSON string, whose quotes are escaped.
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
	// usage is set if a usage count was found: in the current line of an
	// event stream, anywhere in any other body.
	usage bool
	count int64 // the last usage count found

	// The usage count being read: a key, then a colon, then digits.
	comp, out int8  // bytes of completionKey and outputKey matched
	state     int8  // usageKey, usageColon, usageValue or usageDigits
	val       int64 // the digits read so far
}

// NewOutputCounter returns an OutputCounter for a response body with header
// h: one that counts events if h's Content-Type is text/event-stream, with
// no Content-Encoding other than identity; one that counts usage or bytes
// otherwise.
func NewOutputCounter(h http.Header) OutputCounter {
	return OutputCounter{sse: isEventStream(h)}
}

// isEventStream reports whether h announces an uncompressed event stream.
func isEventStream(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	if !strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
		return false
	}
	ce := h.Get("Content-Encoding")
	return ce == "" || ce == "identity"
}

const (
	lineData      = 5 // OutputCounter.field after "data:"
	completionKey = `"completion_tokens"`
	outputKey     = `"output_tokens"`
	doneValue     = "[DONE]"
)

// The states of reading a usage count.
const (
	usageKey    = iota // looking for a key
	usageColon         // after a key, before the colon
	usageValue         // after the colon, before the number
	usageDigits        // in the number
)

// Count consumes the next piece of the body, p, and returns the tokens it
// completes.
func (c *OutputCounter) Count(p []byte) int {
	if !c.sse {
		c.bytes += int64(len(p))
		for i := 0; i < len(p); i++ {
			if c.idle() {
				// Only a quote can start a key.
				j := bytes.IndexByte(p[i:], '"')
				if j < 0 {
					break
				}
				if i += j; cannotStartKey(p, i) {
					continue
				}
			}
			c.scanUsage(p[i])
		}
		return 0
	}
	before := c.total
	if c.mark.Skipping() {
		var broken bool
		if p, broken = c.mark.Skip(p); broken {
			c.field = -1
		}
	}
	for i := 0; i < len(p); i++ {
		if c.field == lineData && c.done < 0 && c.idle() {
			// Only a quote or a line break changes anything.
			if i += plainRun(p[i:]); i == len(p) {
				break
			}
			if cannotStartKey(p, i) {
				continue
			}
		}
		switch b := p[i]; {
		case b == '\n' || b == '\r':
			c.endLine()
		case c.field == lineData:
			c.matchDone(b)
			c.scanUsage(b)
		case c.field < 0:
		case b == sse.DataField[c.field]:
			c.field++
		default:
			c.field = -1
		}
	}
	return int(c.total - before)
}

// idle reports whether c is not in the middle of a usage key or count.
func (c *OutputCounter) idle() bool {
	return c.state == usageKey && c.comp == 0 && c.out == 0
}

// cannotStartKey reports whether p[i] is a quote that cannot start a usage
// key, as the byte after it is in p and starts neither key: reading it from
// an idle state leaves the state idle.
func cannotStartKey(p []byte, i int) bool {
	if p[i] != '"' || i+1 == len(p) {
		return false
	}
	next := p[i+1]
	return next != completionKey[1] && next != outputKey[1]
}

// plainRun returns the length of the run of bytes at the start of p that
// are neither quotes nor line breaks.
func plainRun(p []byte) int {
	for i, b := range p {
		if b == '"' || b == '\n' || b == '\r' {
			return i
		}
	}
	return len(p)
}

// End returns the tokens the end of the body completes: those of an event
// stream's last line if it has no line break, or, for a body that is not an
// event stream, all of its tokens. Calls after the first return 0.
func (c *OutputCounter) End() int {
	before := c.total
	if c.sse {
		c.endLine()
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

// endLine counts the event stream line that ends and starts the next one.
func (c *OutputCounter) endLine() {
	if c.field == lineData {
		c.endNumber()
		switch {
		case c.usage:
			c.total = max(c.total, c.count)
		case c.done != int8(len(doneValue)):
			c.total = min(c.total+1, maxCount)
		}
	}
	*c = OutputCounter{sse: true, total: c.total, mark: sse.MarkPast}
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

// scanUsage reads b, the next byte of JSON text, looking for a
// "completion_tokens" or "output_tokens" key and the count that follows it.
func (c *OutputCounter) scanUsage(b byte) {
	switch c.state {
	case usageColon:
		switch {
		case b == ':':
			c.state = usageValue
		case !isSpace(b):
			c.state = usageKey
		}
		return
	case usageValue:
		switch {
		case isDigit(b):
			c.state, c.val = usageDigits, int64(b-'0')
		case !isSpace(b):
			c.state = usageKey
		}
		return
	case usageDigits:
		if isDigit(b) {
			c.val = min(c.val*10+int64(b-'0'), maxCount)
			return
		}
		c.endNumber()
	}
	c.comp = matchKey(completionKey, c.comp, b)
	c.out = matchKey(outputKey, c.out, b)
	if int(c.comp) == len(completionKey) || int(c.out) == len(outputKey) {
		c.comp, c.out, c.state = 0, 0, usageColon
	}
}

// endNumber records the usage count being read, if any.
func (c *OutputCounter) endNumber() {
	if c.state == usageDigits {
		c.usage, c.count = true, c.val
	}
	c.state = usageKey
}

// matchKey returns the bytes of key matched after b, given i matched before
// it. A key has quotes only at its ends, so a mismatch restarts the match at
// the start of the key, or just after its opening quote if b is a quote.
func matchKey(key string, i int8, b byte) int8 {
	switch {
	case b == key[i]:
		return i + 1
	case b == '"':
		return 1
	}
	return 0
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

// end counts the end of the body.
func (m *outputMeter) end() {
	m.mu.Lock()
	n := m.c.End()
	m.mu.Unlock()
	m.report(n)
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
