package extproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/llmlb/llmlb"
)

// The request headers that rename the model a request is sent to, from
// pkg/epp/metadata/consts.go of llm-d/llm-d-router v0.10.0
// (ModelNameRewriteKey, and OldModelNameRewriteKey, its deprecated alias,
// read only when the first is absent: GetLowerCaseHeaderValue).
const (
	// ModelRewriteHeader names the model that a request's body is sent
	// upstream with, and routed as, in place of the body's "model", as
	// llm-d's picker does (pkg/epp/requestcontrol/director.go
	// modelRewriteIfNeeded): an empty value rewrites nothing. A client
	// that sets it gains nothing it could not get by writing the body's
	// "model" itself.
	ModelRewriteHeader = "x-llm-d-model-name-rewrite"
	// OldModelRewriteHeader is the deprecated alias of
	// [ModelRewriteHeader], read only when that is absent.
	OldModelRewriteHeader = "x-gateway-model-name-rewrite"
)

// maxRewriteModel bounds the value of [ModelRewriteHeader]: a longer one
// refuses the request as invalid.
const maxRewriteModel = 1024

// errRewriteTooLong: the model rewrite header's value is over maxRewriteModel.
var errRewriteTooLong = fmt.Errorf("%w: extproc: model rewrite header over %d bytes", llmlb.ErrInvalidRequest, maxRewriteModel)

// rewriteModel returns the model the request's headers rename its body's
// to, "" for none.
func (st *stream) rewriteModel() string {
	for _, k := range [...]string{ModelRewriteHeader, OldModelRewriteHeader} {
		// The last value wins, as in llm-d's header map.
		if v := st.hdr[http.CanonicalHeaderKey(k)]; len(v) > 0 {
			return v[len(v)-1]
		}
	}
	return ""
}

// maxModelMembers bounds the "model" members of a body that is rewritten:
// a body with more is refused as invalid, so that the edit stays small.
const maxModelMembers = 16

// errModelMembers: the body to rewrite has over maxModelMembers "model"
// members.
var errModelMembers = fmt.Errorf("%w: extproc: over %d \"model\" members to rewrite", llmlb.ErrInvalidRequest, maxModelMembers)

// modelEdit is how a body's model is set: the value of each "model" member
// of its top-level object replaced by val, or, with no such member, a
// "model" member put first, after the '{' at open (llm-d sets the member
// whatever the body had).
type modelEdit struct {
	spans [][2]int // the values replaced
	open  int
	val   []byte // the new model as a JSON string
	comma bool   // the member put first needs a comma after it
	size  int    // the length of the edited body
}

// planModel returns the edit that sets body's model to model, every other
// byte unchanged. ok is false if there is none to make: body is not a JSON
// object (the parser then refuses it), or already names model exactly.
func planModel(body []byte, model string) (e modelEdit, ok bool, err error) {
	spans, open, isObject := modelSpans(body)
	if !isObject {
		return modelEdit{}, false, nil
	}
	if len(spans) > maxModelMembers {
		return modelEdit{}, false, errModelMembers
	}
	e = modelEdit{spans: spans, open: open, val: jsonString(model), size: len(body)}
	if len(spans) == 0 {
		i := skipSpace(body, open+1)
		e.comma = i < len(body) && body[i] != '}'
		e.size += len(`"model":`) + len(e.val)
		if e.comma {
			e.size++
		}
		return e, true, nil
	}
	same := true
	for _, sp := range spans {
		e.size += len(e.val) - (sp[1] - sp[0])
		same = same && bytes.Equal(body[sp[0]:sp[1]], e.val)
	}
	return e, !same, nil
}

// apply returns body edited, in a new slice of e.size bytes.
func (e modelEdit) apply(body []byte) []byte {
	out := make([]byte, 0, e.size)
	if len(e.spans) == 0 {
		out = append(out, body[:e.open+1]...)
		out = append(out, `"model":`...)
		out = append(out, e.val...)
		if e.comma {
			out = append(out, ',')
		}
		return append(out, body[e.open+1:]...)
	}
	last := 0
	for _, sp := range e.spans {
		out = append(out, body[last:sp[0]]...)
		out = append(out, e.val...)
		last = sp[1]
	}
	return append(out, body[last:]...)
}

// jsonString is s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 replaced by U+FFFD, HTML characters
// left as they are.
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// modelSpans scans body as one JSON object and returns the byte ranges of
// the values of its "model" members (it stops at maxModelMembers+1), and
// the offset of its '{'. ok is false if body is not a JSON object; the scan
// checks the structure (strings, nesting, separators), not every literal,
// in time linear in len(body).
func modelSpans(body []byte) (spans [][2]int, open int, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, 0, false
	}
	open = i
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return nil, open, skipSpace(body, i+1) == len(body)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return nil, 0, false
		}
		keyEnd := skipString(body, i)
		if keyEnd < 0 {
			return nil, 0, false
		}
		isModel := isModelKey(body[i:keyEnd])
		i = skipSpace(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return nil, 0, false
		}
		i = skipSpace(body, i+1)
		end := skipValue(body, i)
		if end < 0 {
			return nil, 0, false
		}
		if isModel {
			if spans = append(spans, [2]int{i, end}); len(spans) > maxModelMembers {
				return spans, open, true // too many to rewrite: the caller refuses
			}
		}
		i = skipSpace(body, end)
		if i >= len(body) {
			return nil, 0, false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return spans, open, skipSpace(body, i+1) == len(body)
		default:
			return nil, 0, false
		}
	}
}

// isModelKey reports whether the JSON string key (quotes included) is
// "model", however escaped.
func isModelKey(key []byte) bool {
	if bytes.Equal(key, []byte(`"model"`)) {
		return true
	}
	if len(key) > 64 || bytes.IndexByte(key, '\\') < 0 {
		return false // "model" escaped is at most 32 bytes
	}
	var s string
	return json.Unmarshal(key, &s) == nil && s == "model"
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the offset after the JSON string starting at b[i]
// ('"'), or -1 if it does not end.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the offset after the JSON value starting at b[i], or -1
// if there is none or it does not end. Objects and arrays are skipped by
// counting their brackets outside strings.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				i-- // the loop's i++ moves past the string
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	case ',', '}', ']', ':':
		return -1
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	if i == start {
		return -1
	}
	return i
}

// modelRestore gives the response the model name the client asked for,
// after the request's was rewritten: as llm-d's picker does
// (pkg/epp/handlers/server.go rewriteModelName, llm-d/llm-d-router
// v0.10.0), every `"model":` member of the response whose value is the
// name the request was sent with (the target), with or without one space
// after the colon, gets the name the client's body had (the incoming)
// instead. Unlike upstream, which replaces within each streamed chunk, a
// member cut across two chunks is renamed too: a chunk's tail that may
// begin one is held back and sent with the next chunk, or at the end of the
// body. The names are compared as they are written in JSON (the target
// encoded as the request body's was, the incoming as the client wrote it).
type modelRestore struct {
	target   []byte // the name the request was sent with, a JSON string
	incoming []byte // the client's name, a JSON string
	carry    []byte // a tail held back: the start of a member, perhaps
}

// modelKey begins each member renamed.
var modelKey = []byte(`"model":`)

// newModelRestore returns the restore of the request body's model value
// incoming (its JSON bytes) after it was renamed to target, nil if there is
// none to make: incoming is not a JSON string, or is target.
func newModelRestore(incoming, target []byte) *modelRestore {
	if len(incoming) == 0 || incoming[0] != '"' || bytes.Equal(incoming, target) {
		return nil
	}
	return &modelRestore{target: target, incoming: bytes.Clone(incoming)}
}

// feed returns the next piece of the response body renamed, given its next
// chunk p; eos ends the body, and the tail held back is then returned too.
// It does not retain p.
func (r *modelRestore) feed(p []byte, eos bool) []byte {
	data := p
	if len(r.carry) > 0 {
		data = append(r.carry, p...)
		r.carry = nil
	}
	var out []byte // nil: nothing renamed yet
	last := 0      // data[:last] is in out
	for i := 0; ; {
		j := bytes.Index(data[i:], modelKey)
		if j < 0 {
			break
		}
		v := i + j + len(modelKey)
		if v < len(data) && data[v] == ' ' {
			v++
		}
		if !bytes.HasPrefix(data[v:], r.target) {
			i += j + 1
			continue
		}
		out = append(out, data[last:v]...)
		out = append(out, r.incoming...)
		last = v + len(r.target)
		i = last
	}
	end := len(data)
	if !eos {
		end -= r.pending(data[last:])
		r.carry = append([]byte(nil), data[end:]...)
	}
	if out == nil && end == len(data) && len(data) == len(p) {
		return p
	}
	return append(out, data[last:end]...)
}

// pending returns the length of the longest tail of tail that may begin a
// member to rename, which the rest of the body decides: a proper prefix of
// `"model":` followed by the target, with or without a space between.
func (r *modelRestore) pending(tail []byte) int {
	limit := len(modelKey) + 1 + len(r.target) - 1 // the longest proper prefix
	for i := max(0, len(tail)-limit); i < len(tail); i++ {
		if tail[i] != '"' {
			continue
		}
		s := tail[i:]
		if r.couldBegin(s) {
			return len(s)
		}
	}
	return 0
}

// couldBegin reports whether s, shorter than a member to rename, is the
// start of one.
func (r *modelRestore) couldBegin(s []byte) bool {
	n := min(len(s), len(modelKey))
	if !bytes.Equal(s[:n], modelKey[:n]) {
		return false
	}
	s = s[n:]
	if len(s) > 0 && s[0] == ' ' {
		s = s[1:]
	}
	return bytes.HasPrefix(r.target, s)
}
