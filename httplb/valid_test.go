package httplb

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// valid reports whether b is one valid JSON value, as the parser decides.
func valid(b []byte) bool {
	var v validator
	i, ok := v.value(b, skipSpaceAt(b, 0), 0)
	return ok && skipSpaceAt(b, i) == len(b)
}

// validCases are JSON texts and near misses, each with what json.Valid
// says of it.
var validCases = []struct {
	in   string
	want bool
}{
	{``, false},
	{` `, false},
	{`null`, true},
	{` true `, true},
	{"\t\r\n false \n", true},
	{`nul`, false},
	{`nulll`, false},
	{`True`, false},
	{`0`, true},
	{`-0`, true},
	{`01`, false},
	{`-`, false},
	{`-a`, false},
	{`1.`, false},
	{`.5`, false},
	{`1.5e`, false},
	{`1.5e+`, false},
	{`1.5E-07`, true},
	{`1e400`, true},
	{`+1`, false},
	{`0x10`, false},
	{`""`, true},
	{`"abc`, false},
	{`"a\"b"`, true},
	{`"a\\"b"`, false},
	{`"a\\\"b"`, true},
	{`"\/\b\f\n\r\t"`, true},
	{`"\a"`, false},
	{`"\u00e9\uD83D\uDE00"`, true},
	{`"\ud800"`, true},
	{`"\u00g0"`, false},
	{`"\u00"`, false},
	{`"\`, false},
	{"\"\x00\"", false},
	{"\"\x1f\"", false},
	{"\"\x7f\"", true},
	{"\"\xff\xfe\"", true},
	{"\"" + strings.Repeat("abcdefgh", 9) + "\x01\"", false},
	{"\"" + strings.Repeat("abcdefgh", 9) + "\\q\"", false},
	{`[]`, true},
	{`[ ]`, true},
	{`[1,]`, false},
	{`[,1]`, false},
	{`[1 2]`, false},
	{`[1,2`, false},
	{`[1}`, false},
	{`{}`, true},
	{`{"a":1,}`, false},
	{`{"a" 1}`, false},
	{`{"a":}`, false},
	{`{a:1}`, false},
	{`{1:1}`, false},
	{`{"a":1]`, false},
	{`{"a":[{"b":null}],"c":{"d":[true,false]}}`, true},
	{`{"a":1}{}`, false},
	{`{"a":1} x`, false},
	{`[1] [2]`, false},
	{strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), true},
	{strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), false},
	{strings.Repeat(`{"a":`, maxDepth) + "1" + strings.Repeat("}", maxDepth), true},
	{strings.Repeat(`{"a":`, maxDepth+1) + "1" + strings.Repeat("}", maxDepth+1), false},
	{`{"prompt":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`, true},
	{`{"prompt":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, false},
	{strings.Repeat("[", 1<<20), false},
	{`{"messages":` + strings.Repeat("[", 1<<20), false},
}

// The validator accepts what json.Valid accepts, in particular nesting up
// to encoding/json's depth limit; deeper input costs no stack (there is no
// recursion) and is refused.
func TestValid(t *testing.T) {
	for _, c := range validCases {
		name := c.in
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		require.Equal(t, c.want, json.Valid([]byte(c.in)), "json.Valid(%q), the case is wrong", name)
		assert.Equal(t, c.want, valid([]byte(c.in)), "valid(%q)", name)
		_, ok := readFields([]byte(c.in))
		assert.Equal(t, c.want, ok, "readFields(%q)", name)
	}
}

// FuzzValid checks that the validator, alone and as readFields runs it on
// a body's members, accepts exactly what json.Valid accepts.
func FuzzValid(f *testing.F) {
	for _, c := range validCases {
		if len(c.in) < 1<<10 {
			f.Add([]byte(c.in))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := json.Valid(b)
		if got := valid(b); got != want {
			t.Fatalf("valid(%q) = %t, json.Valid %t", b, got, want)
		}
		if _, got := readFields(b); got != want {
			t.Fatalf("readFields(%q) ok = %t, json.Valid %t", b, got, want)
		}
		member := append(append([]byte(`{"model":"m", "prompt" :`), b...), '}')
		if _, got := readFields(member); got != want {
			t.Fatalf("readFields(%q) ok = %t, json.Valid of the value %t", member, got, want)
		}
	})
}

// refFields is what encoding/json decodes of the fields readFields finds.
type refFields struct {
	Model               string          `json:"model"`
	User                string          `json:"user"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
}

// FuzzFields checks readFields against encoding/json on every body without
// repeated or case-variant keys: it accepts the same bodies and finds the
// same values.
func FuzzFields(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":16,"stream":true}`,
		`{"model":"m\u00e9","user":"u","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`,
		` { "prompt" : [1, 2] , "max_tokens" : 1e2 } `,
		`{"m\u006fdel":"x","user":5,"prompt":null}`,
		`{"model":["m"],"prompt":{"a":"b"}}`,
		`[{"prompt":"x"}]`,
		`"x"`,
		`{}`,
		`{"prompt":"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !plainJSON(body) {
			return
		}
		got, ok := readFields(body)
		var want refFields
		err := json.Unmarshal(body, &want)
		var syntax *json.SyntaxError
		if isSyntax := err != nil && errors.As(err, &syntax); ok == isSyntax {
			t.Fatalf("%q: readFields ok = %t, encoding/json: %v", body, ok, err)
		}
		if !ok {
			return
		}
		assert.Equal(t, want.Model, decodeString(got.model), "model")
		assert.Equal(t, want.User, decodeString(got.user), "user")
		for _, c := range []struct {
			name      string
			got, want []byte
		}{
			{"prompt", got.prompt, want.Prompt},
			{"messages", got.messages, want.Messages},
			{"max_tokens", got.maxTokens, want.MaxTokens},
			{"max_completion_tokens", got.maxCompletionTokens, want.MaxCompletionTokens},
		} {
			if !bytes.Equal(c.got, c.want) {
				t.Fatalf("%q: %s = %q, encoding/json %q", body, c.name, c.got, c.want)
			}
		}
	})
}
