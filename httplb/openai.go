package httplb

import (
	"math"
	"strconv"
	"unsafe"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// This file reads an OpenAI-compatible request body in place (see scan.go),
// with the results encoding/json would give for the fields it reads, but in
// time linear in the body and in memory proportional to the prompt's hashes
// (and to its text when a token counter or tokenizer reads it whole), never
// to the number of messages, parts or prompts. The body is validated and its
// top-level fields found in one pass (valid.go); the prompt text is then
// decoded and hashed in another, without a copy (hashwriter.go). Keys are
// matched exactly (encoding/json ignores case), and when a key repeats, its
// last value is used.

// fields holds the raw values of the top-level fields the parser reads; nil
// when absent.
type fields struct {
	model, user                    []byte // the last string value given
	prompt, messages               []byte
	maxTokens, maxCompletionTokens []byte
	n                              []byte // completions per prompt
	// Anthropic's system prompt (a string or text blocks), and the
	// Responses API's instructions (a string) and input (a string or
	// items).
	system, instructions, input []byte
	// What a reasoning model is asked for (see feature.go).
	reasoningEffort, reasoning, outputConfig, thinking []byte
	// The Responses API's stored response continued (the last string
	// given), and whether to store this one.
	previousResponseID, store []byte
	// vLLM's cache_salt: the request's prefix cache is its own.
	cacheSalt []byte
}

// readFields returns the fields of body, or false if body is not JSON (as
// [json.Valid] decides). A body that is JSON but not an object has no
// fields. It reads body once, validating each member of the top-level
// object as it finds it.
func readFields(body []byte) (f fields, ok bool) {
	var v validator
	i := skipSpaceAt(body, 0)
	if i == len(body) || body[i] != '{' {
		i, ok = v.value(body, i, 0)
		return f, ok && skipSpaceAt(body, i) == len(body)
	}
	i = skipSpaceAt(body, i+1)
	if i < len(body) && body[i] == '}' {
		return f, skipSpaceAt(body, i+1) == len(body)
	}
	var buf [maxKeyLen]byte
	for {
		k, keyEnd, start, ok := member(body, i)
		if !ok {
			return fields{}, false
		}
		if i, ok = v.value(body, start, 1); !ok {
			return fields{}, false
		}
		f.set(keyName(body[k:keyEnd], &buf), body[start:i])
		i = skipSpaceAt(body, i)
		switch {
		case i < len(body) && body[i] == ',':
			i = skipSpaceAt(body, i+1)
		case i < len(body) && body[i] == '}':
			return f, skipSpaceAt(body, i+1) == len(body)
		default:
			return fields{}, false
		}
	}
}

// set records the raw value v of the top-level member named key.
func (f *fields) set(key, v []byte) {
	switch string(key) {
	case "model":
		if isString(v) {
			f.model = v
		}
	case "user":
		if isString(v) {
			f.user = v
		}
	case "prompt":
		f.prompt = v
	case "messages":
		f.messages = v
	case "system":
		f.system = v
	case "instructions":
		if isString(v) {
			f.instructions = v
		}
	case "input":
		f.input = v
	case "max_tokens":
		f.maxTokens = v
	case "max_completion_tokens":
		f.maxCompletionTokens = v
	case "n":
		f.n = v
	case "reasoning_effort":
		f.reasoningEffort = v
	case "reasoning":
		f.reasoning = v
	case "output_config":
		f.outputConfig = v
	case "thinking":
		f.thinking = v
	case "previous_response_id":
		if isString(v) {
			f.previousResponseID = v
		}
	case "store":
		f.store = v
	case "cache_salt":
		if isString(v) {
			f.cacheSalt = v
		}
	}
}

// bodyInfo is what a request body says that an llmlb.Request does not
// hold, for the Transport.
type bodyInfo struct {
	// prevID is the Responses API's previous_response_id, without its
	// quotes, if it is a response id (see responseID); nil otherwise. It
	// is a slice of the body.
	prevID []byte
	// noStore is set when the body asks the Responses API not to store
	// the response ("store": false): no later request can continue it.
	noStore bool
}

// parseBody fills req from body as far as body allows, and returns the body's
// "user". label is the value of the feature header. If info is not nil, it
// is filled too.
func (p *Parser) parseBody(body []byte, req *llmlb.Request, label string, info *bodyInfo) (user string) {
	f, ok := readFields(body)
	if !ok {
		return "" // not JSON: route without body information
	}
	if info != nil {
		info.prevID = responseID(f.previousResponseID)
		info.noStore = string(f.store) == "false"
	}
	// A chat request's max_completion_tokens, the newer name, wins over
	// max_tokens, as in vLLM's and SGLang's ChatCompletionRequest; a
	// completion request has max_tokens only, and either is read if the
	// other is absent or invalid.
	first, second := f.maxTokens, f.maxCompletionTokens
	if f.messages != nil {
		first, second = second, first
	}
	req.MaxTokens = count(first)
	if req.MaxTokens == 0 {
		req.MaxTokens = count(second)
	}
	if f.messages != nil || f.prompt != nil {
		// A chat or completion request's n: that many completions of the
		// one prompt (n of ChatCompletionRequest and CompletionRequest in
		// vllm/entrypoints/openai/protocol.py), each decoded; an invalid
		// n is left for the engine to refuse, and charged as one.
		req.Choices = min(count(f.n), maxChoices)
	}
	model := decodeString(f.model)
	req.Feature = feature(model, &f, label)
	if p.adapter != nil {
		req.Adapter = p.adapter(model)
	}
	// vLLM mixes a request's cache_salt into its first block's hash, so
	// that only requests with the same salt share its cached blocks
	// (cache_salt of ChatCompletionRequest, CompletionRequest and
	// ResponsesRequest in vllm/entrypoints/openai/protocol.py; the salt in
	// generate_block_hash_extra_keys of vllm/v1/core/kv_cache_utils.py):
	// the prompt is hashed under it as its namespace, as package kvevents
	// indexes salted blocks.
	salt := prefix.Salt{Model: model, Tenant: req.Tenant, Namespace: decodeString(f.cacheSalt)}
	switch {
	case hasElems(f.messages):
		// Chat Completions, or Anthropic's Messages with its system prompt.
		p.fillText(req, salt, promptText{raw: f.messages, chat: true, system: f.system})
	case hasElems(f.input):
		// The Responses API's items, after its instructions.
		p.fillText(req, salt, promptText{raw: f.input, chat: true, system: f.instructions})
	case isString(f.input):
		// The Responses API's input text: one user message.
		p.fillText(req, salt, promptText{user: f.input, chat: true, system: f.instructions})
	case len(f.prompt) > 0:
		p.fillPrompt(req, salt, f.prompt)
	}
	return decodeString(f.user)
}

// decodeString returns the raw string v decoded, or "" if v is not a string.
func decodeString(v []byte) string {
	var t text
	t.writeString(v)
	if t.n == 0 {
		return ""
	}
	t.buf = make([]byte, 0, t.n)
	t.writeString(v)
	return t.string()
}

// string returns the text kept in t.buf. It does not copy: t.buf must not be
// written to afterwards.
func (t *text) string() string {
	return unsafe.String(unsafe.SliceData(t.buf), len(t.buf))
}

// hasElems reports whether the raw value v is a non-empty array.
func hasElems(v []byte) bool {
	l, ok := listOf(v, '[')
	if !ok {
		return false
	}
	_, ok = l.next()
	return ok
}

// maxChoices bounds the completions a request is charged for, as
// llmlb.Request.Choices is bounded.
const maxChoices = 1 << 16

// count reads a token count: a JSON number that is a positive integer within
// range, else 0.
func count(v []byte) int {
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f != math.Trunc(f) || f <= 0 || f > maxCount {
		return 0
	}
	return int(f)
}

// A promptText locates a prompt text in the body: a raw string (or null),
// or, for a chat, the raw messages array, after a system prompt (a string
// or content parts) if there is one and then a user message (a string) if
// there is one. A chat is written as its messages would be with the system
// prompt and the user message among them, so that one conversation hashes
// alike through the Chat Completions, Messages and Responses APIs.
type promptText struct {
	raw          []byte
	chat         bool
	system, user []byte
}

// writeTo writes the text to t.
func (s promptText) writeTo(t *text) {
	if !s.chat {
		t.writeString(s.raw)
		return
	}
	if len(s.system) > 0 && !isNull(s.system) && string(s.system) != `""` {
		writeMessage(t, []byte(`"system"`), s.system, nil)
	}
	if len(s.user) > 0 {
		writeMessage(t, []byte(`"user"`), s.user, nil)
	}
	writeChat(t, s.raw)
}

// fillText sets the prefix hashes and the token count of req from the
// prompt text s. Unless the Parser counts or tokenizes the whole text (or
// hashes blocks larger than a hashWriter handles), the text is hashed as it
// is written, in one pass and without a copy.
func (p *Parser) fillText(req *llmlb.Request, salt prefix.Salt, s promptText) {
	if !p.wholeText && p.hasher.BlockBytes() <= partBytes {
		var hw hashWriter
		hw.init(p.hasher, p.hasher.Root(salt), len(s.raw))
		t := text{hw: &hw}
		s.writeTo(&t)
		req.Prefix = hw.hashes
		req.PromptTokens = estimate(t.n)
		return
	}
	t := render(s)
	if t.n == 0 {
		return
	}
	if p.tokenize != nil {
		ids := p.tokenize(t.string())
		req.PromptTokens = min(len(ids), maxCount)
		req.Prefix = p.hasher.HashTokens(salt, ids[:min(len(ids), p.headTokens)])
		return
	}
	req.Prefix = p.hasher.AppendBytes(nil, p.hasher.Root(salt), t.buf)
	req.PromptTokens = p.tokens(t)
}

// render returns the prompt text s, whole: it writes s twice, to measure
// it and then into a buffer of the right size.
func render(s promptText) text {
	var t text
	s.writeTo(&t)
	if t.n == 0 {
		return t
	}
	t = text{buf: make([]byte, 0, t.n)}
	s.writeTo(&t)
	return t
}

// tokens returns the token count of a rendered text.
func (p *Parser) tokens(t text) int {
	if p.countTokens != nil {
		return min(max(p.countTokens(t.string()), 0), maxCount)
	}
	return estimate(t.n)
}

// estimate returns the estimated token count of a text of n bytes.
func estimate(n int) int {
	return min((n+BytesPerToken-1)/BytesPerToken, maxCount)
}

// Kinds of prompt array, in the order encoding/json would try them.
const (
	promptNone  = iota
	promptTexts // strings (a batch), null being ""
	promptIDs   // token IDs, null being 0
	promptBatch // arrays of token IDs (a batch), null being []
)

// fillPrompt handles the prompt of /v1/completions: a string, an array of
// strings (a batch: tokens are summed, the prefix is the first prompt's), an
// array of token IDs, or an array of arrays of token IDs.
func (p *Parser) fillPrompt(req *llmlb.Request, salt prefix.Salt, v []byte) {
	if isString(v) {
		p.fillText(req, salt, promptText{raw: v})
		return
	}
	kind, n := classify(v)
	if kind == promptNone {
		return
	}
	l, _ := listOf(v, '[')
	first, _ := l.next()
	switch kind {
	case promptTexts:
		p.fillText(req, salt, promptText{raw: first})
		total := req.PromptTokens
		for e, ok := l.next(); ok; e, ok = l.next() {
			total = min(total+p.stringTokens(e), maxCount)
		}
		req.PromptTokens = total
	case promptIDs:
		p.fillIDs(req, salt, v, n)
	case promptBatch:
		p.fillIDs(req, salt, first, elems(first))
		total := req.PromptTokens
		for e, ok := l.next(); ok; e, ok = l.next() {
			total = min(total+elems(e), maxCount)
		}
		req.PromptTokens = total
	}
}

// stringTokens returns the token count of the raw string v, which may be
// null.
func (p *Parser) stringTokens(v []byte) int {
	if p.countTokens == nil && p.tokenize == nil {
		var t text
		t.writeString(v)
		return p.tokens(t)
	}
	t := render(promptText{raw: v})
	if p.tokenize != nil {
		return min(len(p.tokenize(t.string())), maxCount)
	}
	return p.tokens(t)
}

// classify returns the kind of the raw prompt array v and its length.
func classify(v []byte) (kind, n int) {
	texts, ids, batch := true, true, true
	l, _ := listOf(v, '[')
	for e, ok := l.next(); ok; e, ok = l.next() {
		n++
		switch {
		case isNull(e):
		case isString(e):
			ids, batch = false, false
		case e[0] == '[':
			texts, ids = false, false
			batch = batch && isIDs(e)
		default:
			texts, batch = false, false
			if ids {
				_, ids = parseInt(e)
			}
		}
		if !texts && !ids && !batch {
			return promptNone, n
		}
	}
	switch {
	case texts && n > 0:
		return promptTexts, n
	case ids:
		return promptIDs, n
	case batch && n > 0:
		return promptBatch, n
	}
	return promptNone, n
}

// isIDs reports whether the raw array v holds only integers and nulls.
func isIDs(v []byte) bool {
	l, _ := listOf(v, '[')
	for e, ok := l.next(); ok; e, ok = l.next() {
		if _, ok := parseInt(e); !ok {
			return false
		}
	}
	return true
}

// elems returns the number of elements of the raw array v; 0 if v is not an
// array.
func elems(v []byte) int {
	n := 0
	l, _ := listOf(v, '[')
	for _, ok := l.next(); ok; _, ok = l.next() {
		n++
	}
	return n
}

// fillIDs handles a prompt of n token IDs, the raw array v (or null), which
// classify accepted. IDs that are not uint32 in the hashed head leave the
// request without prefix.
func (p *Parser) fillIDs(req *llmlb.Request, salt prefix.Salt, v []byte, n int) {
	req.PromptTokens = min(n, maxCount)
	toks := make([]uint32, 0, min(n, p.headTokens))
	l, _ := listOf(v, '[')
	for e, ok := l.next(); ok; e, ok = l.next() {
		id, _ := parseInt(e)
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

// writeChat writes the prompt text of the raw messages array msgs, whose
// prefixes identify the conversation: each message's role, then its content,
// each followed by a newline. Appending a turn extends the text, so the
// hashes of the earlier turns are a prefix of the new ones.
func writeChat(t *text, msgs []byte) {
	var buf [maxKeyLen]byte
	l, _ := listOf(msgs, '[')
	for m, ok := l.next(); ok; m, ok = l.next() {
		var role, content, toolCalls []byte
		ml, _ := listOf(m, '{')
		for k, v, ok := ml.member(); ok; k, v, ok = ml.member() {
			switch string(keyName(k, &buf)) {
			case "role":
				if isString(v) {
					role = v
				}
			case "content":
				content = v
			case "tool_calls":
				toolCalls = v
			}
		}
		writeMessage(t, role, content, toolCalls)
	}
}

// writeMessage writes one message of a chat: its role (a raw string), then
// its content and tool calls, each part followed by a newline.
func writeMessage(t *text, role, content, toolCalls []byte) {
	t.writeString(role)
	t.writeByte('\n')
	writeContent(t, content)
	if len(toolCalls) > 0 && !isNull(toolCalls) {
		t.write(toolCalls)
	}
	t.writeByte('\n')
}

// writeContent writes a message content: a string, or an array of parts
// whose text (or, for images, the raw image reference) is written in order.
// An array with a part that is not an object, or whose type or text is not a
// string, writes nothing.
func writeContent(t *text, v []byte) {
	if isString(v) {
		t.writeString(v)
		return
	}
	if !validParts(v) {
		return
	}
	var buf [maxKeyLen]byte
	l, _ := listOf(v, '[')
	for part, ok := l.next(); ok; part, ok = l.next() {
		var txt, image []byte
		pl, _ := listOf(part, '{')
		for k, pv, ok := pl.member(); ok; k, pv, ok = pl.member() {
			switch string(keyName(k, &buf)) {
			case "text":
				if isString(pv) {
					txt = pv
				}
			case "image_url":
				image = pv
			}
		}
		if len(txt) > len(`""`) {
			t.writeString(txt)
		} else {
			t.write(image)
		}
	}
}

// validParts reports whether the raw value v is an array of content parts:
// objects (or nulls) whose type and text, if present, are strings (or null).
func validParts(v []byte) bool {
	l, ok := listOf(v, '[')
	if !ok {
		return false
	}
	var buf [maxKeyLen]byte
	for part, ok := l.next(); ok; part, ok = l.next() {
		if isNull(part) {
			continue
		}
		pl, ok := listOf(part, '{')
		if !ok {
			return false
		}
		for k, pv, ok := pl.member(); ok; k, pv, ok = pl.member() {
			switch string(keyName(k, &buf)) {
			case "type", "text":
				if !isString(pv) && !isNull(pv) {
					return false
				}
			}
		}
	}
	return true
}
