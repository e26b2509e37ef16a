package httplb

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// This file reads JSON in place, without decoding it into Go values: the
// parser needs a few fields of a body that may be megabytes of messages, and
// must not allocate per element. Every function here expects JSON that
// readFields has validated (valid.go), and reads a value as the slice of the
// body that holds it (a raw value). On other input they return wrong
// results, but never panic or loop.

// skipSpace returns b without its leading JSON white space.
func skipSpace(b []byte) []byte {
	for len(b) > 0 {
		switch b[0] {
		case ' ', '\t', '\n', '\r':
			b = b[1:]
		default:
			return b
		}
	}
	return b
}

// valueLen returns the length of the JSON value at the start of b.
func valueLen(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	switch b[0] {
	case '"':
		return stringLen(b)
	case '{', '[':
		depth := 0
		for i := 0; i < len(b); {
			switch b[i] {
			case '"':
				i += stringLen(b[i:])
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	default: // a number, true, false or null
		i := 0
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}

// stringLen returns the length of the JSON string at the start of b, quotes
// included.
func stringLen(b []byte) int {
	for i := 1; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			break
		}
		i += j
		// The quote ends the string unless an odd number of backslashes
		// precede it. Each backslash is counted once, for the next quote.
		k := i
		for k > 1 && b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 {
			return i + 1
		}
	}
	return len(b)
}

// isString reports whether the raw value v is a string.
func isString(v []byte) bool { return len(v) > 0 && v[0] == '"' }

// isNull reports whether the raw value v is null.
func isNull(v []byte) bool { return string(v) == "null" }

// A list iterates over the members of a raw object or the elements of a raw
// array.
type list struct {
	rest []byte // what follows the last member or element read
}

// listOf returns a list over the raw value v, and whether v is an object
// (open '{') or an array (open '[').
func listOf(v []byte, open byte) (list, bool) {
	if len(v) == 0 || v[0] != open {
		return list{}, false
	}
	return list{rest: v[1:]}, true
}

// next returns the next value of an array (or key of an object), or false at
// the end.
func (l *list) next() ([]byte, bool) {
	b := skipSpace(l.rest)
	if len(b) > 0 && b[0] == ',' {
		b = skipSpace(b[1:])
	}
	if len(b) == 0 || b[0] == ']' || b[0] == '}' {
		l.rest = nil
		return nil, false
	}
	n := valueLen(b)
	l.rest = b[n:]
	return b[:n], true
}

// member returns the raw key and value of the next member of an object, or
// false at the end.
func (l *list) member() (key, val []byte, ok bool) {
	key, ok = l.next()
	if !ok {
		return nil, nil, false
	}
	b := skipSpace(l.rest)
	if len(b) > 0 && b[0] == ':' {
		b = skipSpace(b[1:])
	}
	n := valueLen(b)
	l.rest = b[n:]
	return key, b[:n], true
}

// maxKeyLen bounds the keys [keyName] decodes: the longest key the parser
// reads ("max_completion_tokens") is shorter.
const maxKeyLen = 32

// keyName returns the decoded raw key k, or nil if it is longer than
// maxKeyLen bytes, decoded into buf if it has escapes.
func keyName(k []byte, buf *[maxKeyLen]byte) []byte {
	if len(k) < 2 {
		return nil
	}
	s := k[1 : len(k)-1]
	plain := true
	for _, c := range s {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	t := text{buf: buf[:0]}
	t.writeString(k)
	if t.n > len(t.buf) {
		return nil
	}
	return t.buf
}

// text accumulates a prompt text: its length, and either as much of its
// head as fits in buf's capacity (buf is never reallocated) or, if hw is
// set, its prefix hashes.
type text struct {
	buf []byte
	n   int         // the length of the whole text
	hw  *hashWriter // if set, hashes the text; buf is unused
}

// The writes copy into t.buf rather than append to it, so that a buffer on
// the caller's stack stays there.

func (t *text) write(p []byte) {
	if t.hw != nil {
		t.hw.write(p)
	} else {
		n := copy(t.buf[len(t.buf):cap(t.buf)], p)
		t.buf = t.buf[:len(t.buf)+n]
	}
	t.n += len(p)
}

func (t *text) writeByte(c byte) {
	if t.hw != nil {
		t.hw.writeByte(c)
	} else if n := len(t.buf); n < cap(t.buf) {
		t.buf = t.buf[:n+1]
		t.buf[n] = c
	}
	t.n++
}

func (t *text) writeRune(r rune) {
	var b [utf8.UTFMax]byte
	t.write(utf8.AppendRune(b[:0], r))
}

// writeString writes the decoded raw string v, exactly as encoding/json
// decodes it: escapes resolved, a lone or unpaired UTF-16 surrogate and
// each byte of invalid UTF-8 replaced by U+FFFD. A value other than a string
// (null) writes nothing.
func (t *text) writeString(v []byte) {
	if len(v) < 2 || v[0] != '"' {
		return
	}
	s := v[1 : len(v)-1]
	e := -1 // the index in s of the next backslash (len(s) if none), once found
	for len(s) > 0 {
		// Copy the longest run of bytes that need no decoding: valid UTF-8
		// without backslashes.
		if e < 0 {
			if e = bytes.IndexByte(s, '\\'); e < 0 {
				e = len(s)
			}
		}
		i := e
		if !utf8.Valid(s[:i]) {
			i = validPrefix(s[:i])
		}
		t.write(s[:i])
		s, e = s[i:], e-i
		if len(s) == 0 {
			return
		}
		if e > 0 { // a byte of invalid UTF-8
			t.writeRune(utf8.RuneError)
			s, e = s[1:], e-1
			continue
		}
		e = -1 // past this escape
		if len(s) < 2 {
			return
		}
		switch s[1] {
		case 'b':
			t.writeByte('\b')
		case 'f':
			t.writeByte('\f')
		case 'n':
			t.writeByte('\n')
		case 'r':
			t.writeByte('\r')
		case 't':
			t.writeByte('\t')
		case 'u':
			r := hex4(s)
			if r < 0 {
				return
			}
			s = s[6:]
			if utf16.IsSurrogate(r) {
				if dec := utf16.DecodeRune(r, hex4(s)); dec != utf8.RuneError {
					t.writeRune(dec)
					s = s[6:]
					continue
				}
				r = utf8.RuneError
			}
			t.writeRune(r)
			continue
		default: // '"', '\\', '/'
			t.writeByte(s[1])
		}
		s = s[2:]
	}
}

// validPrefix returns the length of the longest prefix of s that is valid
// UTF-8.
func validPrefix(s []byte) int {
	i := 0
	for i < len(s) {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return i
}

// hex4 returns the code unit of the \uXXXX escape at the start of s, or -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// parseInt returns the raw value v as an int64 if it is a JSON number
// without fraction or exponent within range, as encoding/json decodes into
// an int64; null is 0.
func parseInt(v []byte) (int64, bool) {
	if isNull(v) {
		return 0, true
	}
	neg := len(v) > 0 && v[0] == '-'
	if neg {
		v = v[1:]
	}
	if len(v) == 0 {
		return 0, false
	}
	limit := uint64(1<<63 - 1)
	if neg {
		limit++
	}
	var u uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if u > (limit-d)/10 {
			return 0, false
		}
		u = u*10 + d
	}
	if neg {
		return -int64(u), true // wraps to math.MinInt64 for u = 1<<63
	}
	return int64(u), true
}
