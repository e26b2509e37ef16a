// Package apierror reads what an upstream's error body may tell a client:
// the type and code of an OpenAI-style error, when they are plain tokens
// that name nothing (OpenAI's "insufficient_quota", a status number), as
// opposed to its message, which may name the operator's organisation, part
// of a key, a path or an address. [StripAccount] drops the headers of any
// answer that are the operator's rather than the client's, and
// [StripUpstream] those and the upstream's own (its software, its load
// report, its origin's policies); [RetryAfter] turns the wait a rate-limit
// reset asks for into a Retry-After for the client before those headers
// go, and [Replaced] marks a body put in place of an upstream's error
// body, which was logged.
package apierror

import "encoding/json"

// maxTokenLen bounds a type or code Fields keeps.
const maxTokenLen = 64

// Fields returns the type and code of an error body, if each is a plain
// token (a number, for a code): of its "error" object ({"error": {"type",
// "code"}}, as OpenAI's, Anthropic's and vLLM's are), or else of the body
// itself (vLLM's older {"object": "error", "type", "code"}). It returns ""
// and nil for what it cannot read.
func Fields(body []byte) (typ string, code any) {
	var v struct {
		Error json.RawMessage `json:"error"`
		Type  json.RawMessage `json:"type"`
		Code  json.RawMessage `json:"code"`
	}
	if json.Unmarshal(body, &v) != nil {
		return "", nil
	}
	var inner struct {
		Type json.RawMessage `json:"type"`
		Code json.RawMessage `json:"code"`
	}
	if len(v.Error) > 0 && v.Error[0] == '{' && json.Unmarshal(v.Error, &inner) == nil {
		v.Type, v.Code = inner.Type, inner.Code
	}
	if json.Unmarshal(v.Type, &typ) != nil || !IsToken(typ) {
		typ = ""
	}
	var s string
	var n int64
	switch {
	case string(v.Code) == "null": // no code, which is not code 0
	case json.Unmarshal(v.Code, &s) == nil && IsToken(s):
		code = s
	case json.Unmarshal(v.Code, &n) == nil:
		code = n
	}
	return typ, code
}

// IsToken reports whether s is a short plain token: at most 64 of
// Plain's characters.
func IsToken(s string) bool { return s != "" && len(s) <= maxTokenLen && Plain(s) }

// Plain reports whether s is made only of letters, digits, '-', '_', '.'
// and ':', the characters of a plain token and of a request id that httplb
// sends on.
func Plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}
