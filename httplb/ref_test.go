package httplb

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// This file holds the body parser as it was written with encoding/json, the
// reference the in-place parser must agree with on every body without
// repeated keys or keys that differ from a field name only in case (where
// encoding/json matches case-insensitively and merges repeated arrays).

// refBody is the part of an OpenAI-compatible request body the parser reads.
// Fields whose JSON type varies are kept raw.
type refBody struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []refMessage    `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	User                string          `json:"user"`
	ReasoningEffort     string          `json:"reasoning_effort"`
	Reasoning           refEffort       `json:"reasoning"`
	OutputConfig        refEffort       `json:"output_config"`
	Thinking            refThinking     `json:"thinking"`
	System              json.RawMessage `json:"system"`
	Instructions        string          `json:"instructions"`
	Input               json.RawMessage `json:"input"`
}

type refEffort struct {
	Effort string `json:"effort"`
}

type refThinking struct {
	Type         string          `json:"type"`
	BudgetTokens json.RawMessage `json:"budget_tokens"`
}

type refMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

type refPart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ImageURL json.RawMessage `json:"image_url"`
}

// parseBody fills req from body as far as body allows.
func refParseBody(p *Parser, body []byte, req *llmlb.Request) (user string) {
	var w refBody
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return "" // not JSON: route without body information
		}
		// A field of an unexpected type was skipped; the rest is usable.
	}
	first, second := w.MaxTokens, w.MaxCompletionTokens
	if w.Messages != nil {
		first, second = second, first
	}
	req.MaxTokens = refCount(first)
	if req.MaxTokens == 0 {
		req.MaxTokens = refCount(second)
	}
	req.Feature = refFeature(&w)
	salt := prefix.Salt{Model: w.Model, Tenant: req.Tenant}
	var (
		items     []refMessage
		inputText string
	)
	_ = json.Unmarshal(w.Input, &items)
	inputIsText := json.Unmarshal(w.Input, &inputText) == nil
	instructions, _ := json.Marshal(w.Instructions)
	switch {
	case len(w.Messages) > 0:
		refFillText(p, req, salt, refSystem(w.System)+refChatText(w.Messages))
	case len(items) > 0:
		refFillText(p, req, salt, refSystem(instructions)+refChatText(items))
	case inputIsText:
		refFillText(p, req, salt, refSystem(instructions)+"user\n"+inputText+"\n")
	case len(w.Prompt) > 0:
		refFillPrompt(p, req, salt, w.Prompt)
	}
	return w.User
}

// refFeature returns the Feature of a body without a feature header.
func refFeature(w *refBody) string {
	known := func(e string) bool {
		switch e {
		case "none", "minimal", "low", "medium", "high", "xhigh", "max":
			return true
		}
		return false
	}
	f := w.Model
	for _, e := range []string{w.ReasoningEffort, w.Reasoning.Effort, w.OutputConfig.Effort} {
		if known(e) {
			f += "|effort=" + e
			break
		}
	}
	switch {
	case w.Thinking.Type == "disabled":
	case w.Thinking.Type == "adaptive":
		f += "|thinking=adaptive"
	case refCount(w.Thinking.BudgetTokens) > 0:
		b := 1
		for b < refCount(w.Thinking.BudgetTokens) {
			b *= 2
		}
		f += "|thinking<=" + strconv.Itoa(b)
	}
	return f
}

// count reads a token count: a JSON number that is a positive integer within
// range, else 0.
func refCount(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f <= 0 || f > maxCount {
		return 0
	}
	return int(f)
}

func refFillText(p *Parser, req *llmlb.Request, salt prefix.Salt, text string) {
	if text == "" {
		return
	}
	req.Prefix = p.hasher.HashString(salt, text)
	req.PromptTokens = refTokens(p, text)
}

func refTokens(p *Parser, text string) int {
	var n int
	if p.countTokens != nil {
		n = p.countTokens(text)
	} else {
		n = (len(text) + BytesPerToken - 1) / BytesPerToken
	}
	return min(max(n, 0), maxCount)
}

// fillPrompt handles the prompt of /v1/completions: a string, an array of
// strings (a batch: tokens are summed, the prefix is the first prompt's), an
// array of token IDs, or an array of arrays of token IDs.
func refFillPrompt(p *Parser, req *llmlb.Request, salt prefix.Salt, raw json.RawMessage) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		refFillText(p, req, salt, s)
		return
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		refFillText(p, req, salt, ss[0])
		total := req.PromptTokens
		for _, s := range ss[1:] {
			total = min(total+refTokens(p, s), maxCount)
		}
		req.PromptTokens = total
		return
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		refFillTokens(p, req, salt, ids)
		return
	}
	var batch [][]int64
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		refFillTokens(p, req, salt, batch[0])
		total := req.PromptTokens
		for _, b := range batch[1:] {
			total = min(total+len(b), maxCount)
		}
		req.PromptTokens = total
	}
}

func refFillTokens(p *Parser, req *llmlb.Request, salt prefix.Salt, ids []int64) {
	req.PromptTokens = min(len(ids), maxCount)
	toks := make([]uint32, 0, min(len(ids), p.hasher.MaxBlocks()*p.hasher.BlockTokens()))
	for _, id := range ids {
		if id < 0 || id > math.MaxUint32 {
			return // not token IDs: no prefix
		}
		if len(toks) == cap(toks) {
			break // beyond the hashed head
		}
		toks = append(toks, uint32(id))
	}
	req.Prefix = p.hasher.HashTokens(salt, toks)
}

// chatText renders messages as the prompt text whose prefixes identify the
// conversation: each message's role, then its content, each followed by a
// newline. Appending a turn extends the text, so the hashes of the earlier
// turns are a prefix of the new ones.
// refSystem returns the text of a system prompt, as a system message, or
// "" if there is none.
func refSystem(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" || string(raw) == `""` {
		return ""
	}
	var b strings.Builder
	b.WriteString("system\n")
	refWriteContent(&b, raw)
	b.WriteByte('\n')
	return b.String()
}

func refChatText(msgs []refMessage) string {
	var b strings.Builder
	for i := range msgs {
		m := &msgs[i]
		b.WriteString(m.Role)
		b.WriteByte('\n')
		refWriteContent(&b, m.Content)
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			b.Write(m.ToolCalls)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// writeContent writes a message content: a string, or an array of parts
// whose text (or, for images, the raw image reference) is written in order.
func refWriteContent(b *strings.Builder, raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b.WriteString(s)
		return
	}
	var parts []refPart
	if json.Unmarshal(raw, &parts) != nil {
		return
	}
	for i := range parts {
		if parts[i].Text != "" {
			b.WriteString(parts[i].Text)
		} else if len(parts[i].ImageURL) > 0 {
			b.Write(parts[i].ImageURL)
		}
	}
}
