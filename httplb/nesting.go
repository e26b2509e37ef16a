package httplb

import "math"

// nesting follows JSON text across pieces, as far as needed to tell whether
// a value has ended: the objects and arrays open, whether a string is, and
// whether the value has begun. An event stream may spread an event's data
// over several data lines, which the format joins with a LF: a value still
// open at the end of its line goes on in the event's next data line. It is
// lax, as OutputCounter is: a closing bracket of nothing open is skipped,
// and text that is not JSON only ends where it is not in a string or
// brackets. The zero value is before a value.
type nesting struct {
	depth int32 // objects and arrays open
	inStr bool  // in a string
	esc   bool  // in a string, the next byte is escaped
	begun bool  // a byte other than whitespace has come
}

// open reports whether the value goes on past the text fed so far: it has
// not begun, or a string, object or array of it is open.
func (n *nesting) open() bool { return !n.begun || n.inStr || n.depth > 0 }

// feed reads p, the next piece of the text. It does not allocate.
func (n *nesting) feed(p []byte) {
	i := 0
	if !n.begun {
		for i < len(p) && isSpace(p[i]) {
			i++
		}
		if i == len(p) {
			return
		}
		n.begun = true
	}
	for i < len(p) {
		if n.inStr {
			j := n.skipString(p[i:])
			if j < 0 {
				return
			}
			i += j + 1
			n.inStr = false
			continue
		}
		switch p[i] {
		case '"':
			n.inStr = true
		case '{', '[':
			if n.depth < math.MaxInt32 {
				n.depth++
			}
		case '}', ']':
			if n.depth > 0 {
				n.depth--
			}
		}
		i++
	}
}

// skipString returns the index in p of the quote that closes the current
// string, or -1 if p ends first, leaving esc set if p ends with an escaping
// backslash.
func (n *nesting) skipString(p []byte) int {
	from := 0
	if n.esc {
		n.esc = false
		if len(p) == 0 {
			n.esc = true
			return -1
		}
		from = 1
	}
	j, esc := closingQuote(p, from)
	n.esc = esc
	return j
}
