package httplb

import (
	"bytes"
	"encoding/binary"
)

// This file validates JSON as it reads it, accepting exactly what
// [json.Valid] accepts, so that the parser reads a body once to check it and
// find its fields (see readFields). Strings, nearly all of a request body,
// are scanned with [bytes.IndexByte] and eight bytes at a time. Nesting is
// tracked in a bit stack, not by recursion, and is bounded as in
// encoding/json: deep input costs neither stack nor memory.

// maxDepth is the deepest nesting of arrays and objects that [json.Valid]
// accepts.
const maxDepth = 10000

// Bytes repeated in every byte of a word, for the word-at-a-time scans.
const (
	lsbs = 0x0101010101010101
	msbs = 0x8080808080808080
)

// A validator checks JSON values. Its zero value is ready to use; it is
// large (its bit stack), so it is kept in one place per body and passed by
// pointer.
type validator struct {
	// objects has bit d set when the container open at depth d is an
	// object, clear when it is an array.
	objects [maxDepth/64 + 1]uint64
}

// value returns the end of the JSON value that starts at b[i], and whether
// it is valid JSON nested depth containers deep; leading white space is not
// skipped.
func (v *validator) value(b []byte, i, depth int) (int, bool) {
	base := depth
	for {
		// At the start of a value.
		if i >= len(b) {
			return i, false
		}
		var ok bool
		switch c := b[i]; c {
		case '{', '[':
			if depth++; depth > maxDepth {
				return i, false
			}
			obj := uint64(0)
			if c == '{' {
				obj = 1
			}
			w, s := depth/64, uint(depth%64)
			v.objects[w] = v.objects[w]&^(1<<s) | obj<<s
			i = skipSpaceAt(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']': empty
				i++
				depth--
				ok = true
				break
			}
			if c == '{' {
				if _, _, i, ok = member(b, i); !ok {
					return i, false
				}
			}
			continue
		case '"':
			i, ok = stringEnd(b, i)
		case 't':
			i, ok = literal(b, i, "true")
		case 'f':
			i, ok = literal(b, i, "false")
		case 'n':
			i, ok = literal(b, i, "null")
		default:
			i, ok = numberEnd(b, i)
		}
		if !ok {
			return i, false
		}
		// After a value: close containers until one has a next element.
		for {
			if depth == base {
				return i, true
			}
			i = skipSpaceAt(b, i)
			if i >= len(b) {
				return i, false
			}
			obj := v.objects[depth/64]>>(uint(depth%64))&1 == 1
			if b[i] == ',' {
				i = skipSpaceAt(b, i+1)
				if obj {
					if _, _, i, ok = member(b, i); !ok {
						return i, false
					}
				}
				break
			}
			if (obj && b[i] == '}') || (!obj && b[i] == ']') {
				i++
				depth--
				continue
			}
			return i, false
		}
	}
}

// member reads the key of an object member at b[i] and the colon after it,
// and returns the raw key, b[i:keyEnd], and where the value starts.
func member(b []byte, i int) (key, keyEnd, val int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return i, i, i, false
	}
	keyEnd, ok = stringEnd(b, i)
	if !ok {
		return i, keyEnd, keyEnd, false
	}
	j := skipSpaceAt(b, keyEnd)
	if j >= len(b) || b[j] != ':' {
		return i, keyEnd, j, false
	}
	return i, keyEnd, skipSpaceAt(b, j+1), true
}

// skipSpaceAt returns the index of the first byte of b at or after i that
// is not JSON white space.
func skipSpaceAt(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the end of the JSON string that starts at b[i] (a
// quote), and whether it is valid: no control characters, and only the
// escapes JSON defines. Bytes of invalid UTF-8 are valid, as in
// encoding/json. Each byte is looked at once by each of the searches for
// quotes, for backslashes and for control characters.
func stringEnd(b []byte, i int) (int, bool) {
	i++
	q := -1 // the first quote at or after i, once found
	for {
		if q < i {
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				return len(b), false
			}
			q = i + j
		}
		e := q
		if j := bytes.IndexByte(b[i:q], '\\'); j >= 0 {
			e = i + j
		}
		if hasControl(b[i:e]) {
			return i, false
		}
		if i = e; i == q {
			return q + 1, true
		}
		switch b[i+1] { // b[i] is a backslash before the quote at q
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if hex4(b[i:]) < 0 {
				return i, false
			}
			i += 6
		default:
			return i, false
		}
	}
}

// hasControl reports whether s holds a control character (below 0x20),
// looking at eight bytes at a time.
func hasControl(s []byte) bool {
	const k = lsbs * 0x20
	var acc uint64 // a byte x below 0x20 sets the high bit of (x - 0x20) &^ x
	for len(s) >= 32 {
		x0 := binary.LittleEndian.Uint64(s)
		x1 := binary.LittleEndian.Uint64(s[8:])
		x2 := binary.LittleEndian.Uint64(s[16:])
		x3 := binary.LittleEndian.Uint64(s[24:])
		acc |= (x0-k)&^x0 | (x1-k)&^x1 | (x2-k)&^x2 | (x3-k)&^x3
		s = s[32:]
	}
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		acc |= (x - k) &^ x
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return acc&msbs != 0
}

// literal returns the end of the literal lit (true, false or null) at b[i].
func literal(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// numberEnd returns the end of the JSON number at b[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func numberEnd(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b) || !isDigit(b[i]):
		return i, false
	case b[i] == '0':
		i++
	default:
		i = digitsEnd(b, i)
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || !isDigit(b[i]) {
			return i, false
		}
		i = digitsEnd(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, false
		}
		i = digitsEnd(b, i)
	}
	return i, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// digitsEnd returns the index of the first byte at or after i that is not a
// digit.
func digitsEnd(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}
