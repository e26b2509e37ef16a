package engine

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChatMessages: the engine takes the chat messages vLLM takes and
// refuses with 400 those vLLM refuses, instead of reading them as empty
// text. The accepted prompts' text is each message's role and the text of
// its content, newline-terminated; the texts of a list of parts are joined
// by newlines, as vLLM joins them.
func TestChatMessages(t *testing.T) {
	e := newEngine(t, Config{})
	cases := []struct {
		name     string
		messages string
		text     string // the prompt text; "" if refused
		msg      string // a part of the refusal
	}{
		{"string", `[{"role":"user","content":"hi"}]`, "user\nhi\n", ""},
		{"text parts", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`, "user\na\nb\n", ""},
		{"string parts", `[{"role":"wizard","content":["a","b"]}]`, "wizard\na\nb\n", ""},
		{"refusal and thinking parts", `[{"role":"assistant","content":[{"type":"refusal","refusal":"no"},{"type":"thinking","thinking":"hm"}]}]`, "assistant\nno\nhm\n", ""},
		{"text parts around a media part", `[{"role":"user","content":["a",{"type":"image_url","image_url":{"url":"u"}},"",{"type":"text","text":"b"}]}]`, "user\na\n\nb\n", ""},
		{"media part", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}},{"type":"text","text":"what is it"}]}]`, "user\nwhat is it\n", ""},
		{"media part without a type", `[{"role":"user","content":[{"image_url":"http://x/y.png"},{"type":"text","text":"and this"}]}]`, "user\nand this\n", ""},
		{"no content", `[{"role":"user"}]`, "user\n\n", ""},
		{"empty parts", `[{"role":"user","content":[]}]`, "user\n\n", ""},
		{"null assistant content", `[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[]}]`, "user\nhi\nassistant\n\n", ""},
		{"null function content", `[{"role":"function","name":"f","content":null}]`, "function\n\n", ""},
		{"empty role", `[{"role":"","content":"hi"}]`, "\nhi\n", ""},
		{"extra fields", `[{"role":"user","content":"hi","name":"ann","x":1}]`, "user\nhi\n", ""},

		{"no role", `[{"content":"hi"}]`, "", "messages[0].role: a string is required"},
		{"null role", `[{"role":null,"content":"hi"}]`, "", "messages[0].role: a string is required"},
		{"number role", `[{"role":1,"content":"hi"}]`, "", "messages[0].role: a string is required"},
		{"role in another case", `[{"ROLE":"user","content":"hi"}]`, "", "messages[0].role: a string is required"},
		{"string message", `["hi"]`, "", "messages[0]: a message must be an object"},
		{"null message", `[{"role":"user","content":"hi"},null]`, "", "messages[1]: a message must be an object"},
		{"number content", `[{"role":"user","content":5}]`, "", "messages[0].content: a string or a list of content parts is required"},
		{"boolean content", `[{"role":"user","content":true}]`, "", "messages[0].content: a string or a list"},
		{"object content", `[{"role":"user","content":{"type":"text","text":"hi"}}]`, "", "messages[0].content: a string or a list"},
		{"null user content", `[{"role":"user","content":null}]`, "", "messages[0].content: null only in an assistant message"},
		{"null system content", `[{"role":"system","content":null}]`, "", "messages[0].content: null only in an assistant message"},
		{"null function content without a name", `[{"role":"function","content":null}]`, "", "messages[0].content: null only"},
		{"number part", `[{"role":"user","content":[5]}]`, "", "messages[0].content[0]: a content part must be a string or an object"},
		{"null part", `[{"role":"user","content":[{"type":"text","text":"a"},null]}]`, "", "messages[0].content[1]: a content part must be"},
		{"list part", `[{"role":"user","content":[["a"]]}]`, "", "messages[0].content[0]: a content part must be"},
		{"untyped part", `[{"role":"user","content":[{"text":"hi"}]}]`, "", `messages[0].content[0]: a content part needs a "type"`},
		{"empty part", `[{"role":"user","content":[{}]}]`, "", `a content part needs a "type"`},
		{"number type", `[{"role":"user","content":[{"type":5,"text":"hi"}]}]`, "", `the "type" of a content part must be a string`},
		{"unknown type", `[{"role":"user","content":[{"type":"bogus","text":"hi"}]}]`, "", `unsupported content part type "bogus"`},
		{"file part", `[{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}]`, "", `unsupported content part type "file"`},
		{"text part without text", `[{"role":"user","content":[{"type":"text"}]}]`, "", `a "text" part needs a string "text"`},
		{"text part with a number", `[{"role":"user","content":[{"type":"text","text":5}]}]`, "", `a "text" part needs a string "text"`},
		{"refusal part without refusal", `[{"role":"assistant","content":[{"type":"refusal","text":"no"}]}]`, "", `a "refusal" part needs a string "refusal"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, _, code, msg := e.parse([]byte(`{"max_tokens":1,"messages":`+c.messages+`}`), true)
			if c.text == "" {
				assert.Equal(t, http.StatusBadRequest, code)
				assert.Contains(t, msg, c.msg)
				return
			}
			require.Zero(t, code, msg)
			assert.Equal(t, (len(c.text)+BytesPerToken-1)/BytesPerToken, s.PromptTokens)
			assert.Equal(t, e.hasher.AppendString(nil, e.root, c.text), s.Prefix, "the prompt text %q", c.text)
		})
	}
}

// A refused message gets 400 with vLLM's error for a body its request model
// does not validate.
func TestChatMessageRefusedOverHTTP(t *testing.T) {
	e := newEngine(t, Config{})
	url, _ := serve(t, e)
	resp := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":{"text":"hi"}}],"stream":true}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &out), "%s", b)
	assert.Equal(t, "messages[0].content: a string or a list of content parts is required", out.Error.Message)
	assert.Equal(t, "Bad Request", out.Error.Type)
	assert.Equal(t, http.StatusBadRequest, out.Error.Code)
	assert.Zero(t, e.Stats().Waiting+e.Stats().Running+int(e.Stats().Finished), "nothing was queued")
}
