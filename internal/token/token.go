// Package token checks HTTP tokens (RFC 9110 section 5.6.2), the syntax of
// header names: the settings naming a header that a request never carries
// are refused rather than left to do nothing.
package token

import "strings"

// Valid reports whether s is a token: one or more letters, digits and
// !#$%&'*+-.^_`|~. Go's HTTP server refuses a request with a header whose
// name is not one.
func Valid(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
