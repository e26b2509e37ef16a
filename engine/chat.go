package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// chatText returns the prompt text of a chat request's messages (each
// message's role and the text of its content, newline-terminated, in order),
// or the message refusing them. It accepts the messages vLLM's request
// validation and chat parsing accept, and refuses, as vLLM does with 400,
//
//   - a message that is not an object, or has no role or one that is not a
//     string;
//   - content that is not a string, a list of content parts or, in an
//     assistant message or a function message with a name, null;
//   - a content part that is neither a string nor an object; an object
//     without a type (and without any of the media fields vLLM takes a
//     part's type from) or with a type vLLM does not know; a text, refusal
//     or thinking part whose text is not a string.
//
// A message without content counts as empty, as vLLM's. The text of string,
// text, refusal and thinking parts counts, joined by newlines as vLLM joins
// them; media parts count nothing.
func chatText(msgs []json.RawMessage) (string, string) {
	if len(msgs) == 0 {
		return "", "messages: a non-empty list is required"
	}
	var b strings.Builder
	for i, raw := range msgs {
		if !isObject(raw) {
			return "", fmt.Sprintf("messages[%d]: a message must be an object with a role", i)
		}
		m, _ := members(raw, "role", "content", "name")
		role, ok := jsonText(m["role"])
		if !ok {
			return "", fmt.Sprintf("messages[%d].role: a string is required", i)
		}
		b.WriteString(role)
		b.WriteByte('\n')
		if refusal := writeContent(&b, m, role, "messages", i); refusal != "" {
			return "", refusal
		}
		b.WriteByte('\n')
	}
	return b.String(), ""
}

// writeContent writes the text of the content of message m, of the given
// role, to b, or returns the message refusing it, which names the message
// as item i of the request's list ("messages" or "input").
func writeContent(b *strings.Builder, m map[string]json.RawMessage, role, list string, i int) string {
	content, ok := m["content"]
	switch {
	case !ok:
		return ""
	case string(content) == "null":
		// OpenAI's assistant message may omit its text (a tool call), and
		// its deprecated function message needs only a name.
		if _, named := jsonText(m["name"]); role == "assistant" || role == "function" && named {
			return ""
		}
		return fmt.Sprintf("%s[%d].content: null only in an assistant message; a string or a list of content parts is required", list, i)
	}
	if s, ok := jsonText(content); ok {
		b.WriteString(s)
		return ""
	}
	var parts []json.RawMessage
	if content[0] != '[' || json.Unmarshal(content, &parts) != nil {
		return fmt.Sprintf("%s[%d].content: a string or a list of content parts is required", list, i)
	}
	texts := 0 // parts with text so far, joined by newlines as vLLM joins them
	for j, raw := range parts {
		text, isText := jsonText(raw)
		if !isText {
			if !isObject(raw) {
				return fmt.Sprintf("%s[%d].content[%d]: a content part must be a string or an object", list, i, j)
			}
			p, _ := members(raw, partFields...)
			var refusal string
			if text, isText, refusal = partText(p); refusal != "" {
				return fmt.Sprintf("%s[%d].content[%d]: %s", list, i, j, refusal)
			}
		}
		if isText {
			if texts > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(text)
			texts++
		}
	}
	return ""
}

// textFields maps the types of vLLM's text content parts to the field that
// holds their text.
var textFields = map[string]string{
	"text":        "text",
	"input_text":  "text",
	"output_text": "text",
	"refusal":     "refusal",
	"thinking":    "thinking",
}

// mediaTypes are the types of vLLM's media content parts, which are also
// the fields that make a part without a type one of them. A media part
// counts no text.
var mediaTypes = []string{
	"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds",
	"audio_url", "video_url", "tool_reference", "input_audio", "input_image",
}

// partFields are the members of a content part that partText reads.
var partFields = func() []string {
	names := []string{"type"}
	for _, f := range textFields {
		if !slices.Contains(names, f) {
			names = append(names, f)
		}
	}
	return append(names, mediaTypes...)
}()

// partText returns the text of content part p, an object, and whether it is
// a part with text (not a media part), or the reason it is refused.
func partText(p map[string]json.RawMessage) (text string, isText bool, refusal string) {
	rawType, typed := p["type"]
	if !typed || string(rawType) == "null" {
		for _, f := range mediaTypes {
			if v, ok := p[f]; ok && (f != "input_audio" || string(v) != "null") {
				return "", false, ""
			}
		}
		return "", false, `a content part needs a "type"`
	}
	typ, ok := jsonText(rawType)
	if !ok {
		return "", false, `the "type" of a content part must be a string`
	}
	if field, ok := textFields[typ]; ok {
		text, ok := jsonText(p[field])
		if !ok {
			return "", false, fmt.Sprintf("a %q part needs a string %q", typ, field)
		}
		return text, true, ""
	}
	for _, t := range mediaTypes {
		if typ == t {
			return "", false, ""
		}
	}
	return "", false, fmt.Sprintf("unsupported content part type %q", typ)
}

// jsonText returns the string the raw JSON value v holds, and whether it is
// a string (not null, not absent).
func jsonText(v json.RawMessage) (string, bool) {
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// isObject reports whether the raw JSON value v is an object.
func isObject(v json.RawMessage) bool { return len(v) > 0 && v[0] == '{' }
