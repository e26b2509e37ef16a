package engine

import "encoding/json"

// members returns the raw values of the members of obj named names, and the
// number of members obj has, or nil and 0 if obj is not an object. obj must
// be valid JSON: a value that encoding/json has decoded already. A repeated name yields its
// last value, as encoding/json and Python's json read one; a name matches
// a key exactly once the key's escapes are read (names are ASCII). Unlike
// decoding obj into a map, it copies nothing and allocates only the map
// of the names found, so that an object of a million members costs no
// more memory than one of three.
func members(obj []byte, names ...string) (map[string]json.RawMessage, int) {
	i := skipSpace(obj, 0)
	if i == len(obj) || obj[i] != '{' {
		return nil, 0
	}
	found := make(map[string]json.RawMessage, len(names))
	n := 0
	i++
	for {
		i = skipSpace(obj, i)
		switch obj[i] {
		case '}':
			return found, n
		case ',':
			i = skipSpace(obj, i+1)
		}
		end := stringEnd(obj, i)
		key := obj[i+1 : end-1]
		i = skipSpace(obj, skipSpace(obj, end)+1) // past ':'
		vend := valueEnd(obj, i)
		for _, name := range names {
			if keyIs(key, name) {
				found[name] = obj[i:vend:vend]
				break
			}
		}
		n++
		i = vend
	}
}

// skipSpace returns the index of the first byte of b from i on that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string that starts at b[i].
func stringEnd(b []byte, i int) int {
	for i++; ; i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// valueEnd returns the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	// A number, true, false or null.
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// keyIs reports whether key, the raw text of a JSON string between its
// quotes, reads as name, which is ASCII.
func keyIs(key []byte, name string) bool {
	j := 0
	for i := 0; i < len(key); j++ {
		if j == len(name) {
			return false
		}
		c := key[i]
		i++
		if c == '\\' {
			c = key[i]
			i++
			switch c {
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'u':
				r := 0
				for _, h := range key[i : i+4] {
					r <<= 4
					switch {
					case '0' <= h && h <= '9':
						r |= int(h - '0')
					case 'a' <= h && h <= 'f':
						r |= int(h - 'a' + 10)
					default: // 'A' to 'F': the JSON is valid
						r |= int(h - 'A' + 10)
					}
				}
				i += 4
				if r >= 0x80 {
					return false // not ASCII, so not in name
				}
				c = byte(r)
			}
			// '"', '\\' and '/' stand for themselves.
		}
		if c != name[j] {
			return false
		}
	}
	return j == len(name)
}
