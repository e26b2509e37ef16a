package engine

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memberNames are the names the tests look up: every name the engine reads,
// and some that escapes or case could be mistaken for.
var memberNames = append([]string{"model", "role", "content", "name", "include_usage", "continuous_usage_stats", "Model", "a/b", "\n", `"`, `\`}, partFields...)

// checkMembers checks members against decoding obj into a map.
func checkMembers(t *testing.T, obj []byte) {
	t.Helper()
	var want map[string]json.RawMessage
	if json.Unmarshal(obj, &want) != nil || want == nil {
		return // not an object
	}
	got, n := members(obj, memberNames...)
	assert.Equal(t, len(want) > 0, n > 0, "%s: members counted", obj)
	for _, name := range memberNames {
		w, ok := want[name]
		g, gok := got[name]
		if assert.Equal(t, ok, gok, "%s: %q found", obj, name) && ok {
			assert.Equal(t, string(w), string(g), "%s: %q", obj, name)
		}
	}
}

var memberCases = []string{
	`{}`,
	` { } `,
	`{"model":"m"}`,
	"{\n\t\"model\" :\r \"m\" , \"role\":1}",
	`{"model":"a","model":"b"}`,
	`{"Model":"a","model":"b","MODEL":"c"}`,
	`{"mod\u0065l":"escaped","role":"user"}`,
	`{"\u006D\u006f\u0064\u0065\u006C":"hex cases"}`,
	`{"mod\u00e9l":"not ascii","model\u0000":"nul"}`,
	`{"a\/b":1,"\n":2,"\"":3,"\\":4,"\u000a":5}`,
	`{"x":{"model":"nested"},"y":[{"model":"in array"}],"model":null}`,
	`{"x":"a \" } ] { [ , : string","model":[1,{"a":"}"}],"role":-1.5e+3}`,
	`{"content":[{"type":"text","text":"hi"},"s"],"name":true,"role":false}`,
	`{"é":"ü","model":"\ud83d\ude00"}`,
	`{"type":"image_url","image_url":{"url":"x"},"input_audio":null}`,
	`{"include_usage":"yes","continuous_usage_stats":0}`,
}

func TestMembers(t *testing.T) {
	for _, c := range memberCases {
		require.True(t, json.Valid([]byte(c)), c)
		checkMembers(t, []byte(c))
	}
	for _, c := range []string{`null`, `[]`, `"s"`, `1`, ``} {
		got, n := members([]byte(c))
		assert.Nil(t, got, c)
		assert.Zero(t, n, c)
	}
}

func FuzzMembers(f *testing.F) {
	for _, c := range memberCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		if json.Valid(obj) {
			checkMembers(t, obj)
		}
	})
}

// A body, a message, a content part or stream_options of many members costs
// memory in proportion to its size, as any body does, not many times that.
func TestManyMembersBounded(t *testing.T) {
	const size = 1 << 20
	many := func() string {
		var b strings.Builder
		for i := 0; b.Len() < size; i++ {
			fmt.Fprintf(&b, `"%x":0,`, i)
		}
		return b.String()
	}()
	e := newEngine(t, Config{MaxBodyBytes: 8 << 20})
	cases := []struct {
		name string
		chat bool
		body string
	}{
		{"body", false, `{` + many + `"prompt":"hi"}`},
		{"message", true, `{"messages":[{` + many + `"role":"user","content":"hi"}]}`},
		{"content part", true, `{"messages":[{"role":"user","content":[{` + many + `"type":"text","text":"hi"}]}]}`},
		{"stream_options", false, `{"prompt":"hi","stream":true,"stream_options":{` + many + `"include_usage":true}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s, _, code, msg := e.parse(body, c.chat)
			runtime.ReadMemStats(&after)
			require.Zero(t, code, msg)
			require.NotNil(t, s)
			allocated := after.TotalAlloc - before.TotalAlloc
			assert.Less(t, allocated, uint64(4*len(body)), "%d bytes allocated for a body of %d", allocated, len(body))
		})
	}
}
