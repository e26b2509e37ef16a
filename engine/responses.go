package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// The Responses API (POST /v1/responses) as vLLM serves it without a
// reasoning or tool parser, vLLM main as of 2026: OpenAIServingResponses
// with a SimpleContext in vllm/entrypoints/openai/responses/serving.py
// (commit 0001948bc76939369ca855c90b36d81256477e85), the request and
// response models of responses/protocol.py (010a69cea9ac), the prompt's
// messages of construct_input_messages in responses/utils.py
// (01ca842df5b1), the text events of responses/streaming_events.py
// (01e4fce07423), and the route, which writes each event as "event: TYPE"
// and "data: JSON", of responses/api_router.py (f6e93254b870).

// responsesRequest is the part of a Responses API body the engine decodes;
// parseResponses reads the rest with members.
type responsesRequest struct {
	Instructions    *string  `json:"instructions"`
	MaxOutputTokens *float64 `json:"max_output_tokens"`
	Stream          bool     `json:"stream"`
	Temperature     *float64 `json:"temperature"`
	TopP            *float64 `json:"top_p"`
	User            *string  `json:"user"`
}

// responsesFields are the members of a Responses API body that
// parseResponses reads raw.
var responsesFields = []string{
	"input", "background", "store", "previous_response_id", "prompt",
	"request_id", "metadata", "tools", "tool_choice", "parallel_tool_calls",
}

// typeInvalidRequest is the type of the refusals vLLM's Responses handler
// writes itself (create_error_response with err_type
// "invalid_request_error").
const typeInvalidRequest = "invalid_request_error"

// response is what every rendering of a Responses API answer repeats: its
// JSON members other than the output, status and usage, each a JSON
// literal; and what storing it takes.
type response struct {
	id, created, instructions, metadata, model string
	temperature, topP, toolChoice, tools       string
	parallelToolCalls, maxOutput, user, prevID string
	msgID                                      string // the id of its output message

	key   string // the id, unquoted: the key it is stored under
	store bool   // it is stored once complete
	turns []turn // the messages of its prompt
}

// respond answers a Responses API request, whose body must arrive by
// deadline (zero: none, see boundBody).
func (e *Engine) respond(w http.ResponseWriter, r *http.Request, deadline time.Time) {
	var (
		a      response
		stream bool
	)
	s := e.accept(w, r, deadline, func(body []byte) (*seq, errorAnswer) {
		s, parsed, st, ref := e.parseResponses(body)
		a, stream = parsed, st
		return s, ref
	})
	if s == nil {
		return
	}
	a.created = fmt.Sprint(time.Now().Unix())
	if stream {
		e.streamResponse(w, r, s, &a)
	} else {
		e.answerResponse(w, r, s, &a)
	}
}

// keep stores a's complete response, whose JSON object is answer and
// whose output text is text, if its request asked for it to be stored.
func (e *Engine) keep(a *response, answer, text string) {
	if !a.store {
		return
	}
	turns := a.turns
	if text != "" {
		turns = append(turns[:len(turns):len(turns)], turn{role: "assistant", content: text, hasContent: true})
	}
	e.stored.put(&stored{id: a.key, answer: answer, turns: turns})
}

// parseResponses reads a Responses API body into a sequence ready to
// submit and the members of its answer, and whether it asks for a stream,
// or returns the refusal. As vLLM, it refuses with 400 what vLLM's request
// model does not validate, then a model it does not serve (404), background
// mode (400: not emulated, see below), a previous_response_id that names
// no stored response (404), and a context too long, as a chat request (see
// [Engine.newSeq]). A request continuing a stored response has its
// conversation before its input (see [stored.history]).
func (e *Engine) parseResponses(body []byte) (s *seq, a response, stream bool, r errorAnswer) {
	var q responsesRequest
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, a, false, invalid(jsonRefusal(err))
	}
	f, _ := members(body, responsesFields...)
	// The input is validated before anything else, as vLLM's request
	// model validates it; the conversation it continues is known later.
	if _, refusal := responsesTurns(q.Instructions, nil, f["input"]); refusal != "" {
		return nil, a, false, invalid(refusal)
	}
	background, ok := laxBool(f["background"])
	if !ok {
		return nil, a, false, invalid("background: a boolean is required")
	}
	// As vLLM's validate_background, store is true only when absent: a
	// null store is None, which is false.
	store := true
	if v, ok := f["store"]; ok {
		if store, ok = laxBool(v); !ok {
			return nil, a, false, invalid("store: a boolean is required")
		}
	}
	a.parallelToolCalls = "true"
	if v, ok := f["parallel_tool_calls"]; ok {
		switch parallel, ok := laxBool(v); {
		case !ok:
			return nil, a, false, invalid("parallel_tool_calls: a boolean is required")
		case string(v) == "null":
			a.parallelToolCalls = "null"
		default:
			a.parallelToolCalls = fmt.Sprint(parallel)
		}
	}
	switch {
	case background && !store:
		return nil, a, false, invalid("background can only be used when `store` is true")
	case present(f["prompt"]):
		return nil, a, false, errorAnswer{http.StatusBadRequest, typeInvalid, "prompt", "prompt template is not supported"}
	case present(f["metadata"]) && !isObject(f["metadata"]):
		return nil, a, false, invalid("metadata: an object is required")
	case present(f["tools"]) && f["tools"][0] != '[':
		return nil, a, false, invalid("tools: a list is required")
	case present(f["tool_choice"]) && !isObject(f["tool_choice"]) && f["tool_choice"][0] != '"':
		return nil, a, false, invalid("tool_choice: a string or an object is required")
	}
	prev, hasPrev := jsonText(f["previous_response_id"])
	if !hasPrev && present(f["previous_response_id"]) {
		return nil, a, false, invalid("previous_response_id: a string is required")
	}
	a.key, ok = jsonText(f["request_id"])
	switch {
	case ok:
	case present(f["request_id"]):
		return nil, a, false, invalid("request_id: a string is required")
	default:
		a.key = randomID("resp_")
	}
	a.id = jsonString(a.key)
	// Then, as vLLM's handler: the model, the request's options, the
	// response it continues, and last the prompt against the context.
	if model, ok := exactModel(body); !ok {
		return nil, a, false, invalid("model: a string is required")
	} else if !e.serves(model) {
		return nil, a, false, errorAnswer{http.StatusNotFound, typeNotFound, "model", fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	if background {
		// Background mode is not emulated: refused as by vLLM without a
		// response store.
		return nil, a, false, errorAnswer{http.StatusBadRequest, typeInvalidRequest, "background",
			"This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."}
	}
	var history []turn
	a.prevID = "null"
	if hasPrev {
		p, ok := e.stored.get(prev)
		if !ok {
			return nil, a, false, notFound(prev)
		}
		history, a.prevID = p.history(), jsonString(prev)
	}
	turns, _ := responsesTurns(q.Instructions, history, f["input"])
	text := renderTurns(turns)
	if text == "" {
		return nil, a, false, badRequest("", "the prompt is empty")
	}
	out := outputLimit{n: e.defMax, message: "'max_output_tokens'", param: "max_output_tokens"}
	if v := q.MaxOutputTokens; v != nil {
		if !outputInt(*v) {
			return nil, a, false, badRequest("max_output_tokens", fmt.Sprintf("max_output_tokens must be an integer from 1 to %d", math.MaxInt32))
		}
		out.n, out.asked = int(*v), true
	}
	if s, r = e.newSeq(text, out); r.code != 0 {
		return nil, a, false, r
	}
	a.model = jsonString(e.model)
	a.instructions = optString(q.Instructions)
	a.user = optString(q.User)
	a.metadata = rawOr(f["metadata"], "null")
	a.tools = rawOr(f["tools"], "[]")
	a.toolChoice = rawOr(f["tool_choice"], `"auto"`)
	a.temperature = optFloat(q.Temperature)
	a.topP = optFloat(q.TopP)
	a.maxOutput = fmt.Sprint(s.OutputTokens)
	a.msgID = jsonString(randomID("msg_"))
	a.store, a.turns = store, turns
	return s, a, q.Stream, errorAnswer{}
}

// present reports whether the raw JSON value v is there and not null.
func present(v json.RawMessage) bool { return len(v) > 0 && string(v) != "null" }

// rawOr returns the raw JSON value v, or def if v is absent or null.
func rawOr(v json.RawMessage, def string) string {
	if !present(v) {
		return def
	}
	return string(v)
}

// optString returns the JSON literal of *p, or null.
func optString(p *string) string {
	if p == nil {
		return "null"
	}
	return jsonString(*p)
}

// optFloat returns *p as Python writes a float, or "1.0", the temperature
// and top_p vLLM samples with when a request sets none.
func optFloat(p *float64) string {
	if p == nil {
		return "1.0"
	}
	return pyRepr(*p)
}

// randomID returns prefix and a random UUID in hex, as vLLM's random_uuid
// makes its ids.
func randomID(prefix string) string {
	return fmt.Sprintf("%s%016x%016x", prefix, rand.Uint64(), rand.Uint64())
}

// turn is one chat message of a Responses API request's prompt.
type turn struct {
	role, content string
	hasContent    bool // content was set, even empty
	reasoning     bool // a reasoning item was merged into it
}

// responsesTurns returns the messages of the prompt of a Responses API
// request (whose text renderTurns returns, see chatText) with the given
// instructions, history (the conversation it continues) and raw input, or
// the message refusing them. As vLLM's construct_input_messages
// (vllm/entrypoints/openai/responses/utils.py), the prompt is the chat
// request of these messages: the instructions, unless empty, as a system
// message; the history; then a string input as a user message, or each
// item of a list:
//
//   - a message (type "message", or no type and a role) of role "user",
//     "assistant", "system" or "developer", whose content, a string or a
//     list of content parts, counts as a chat message's (see writeContent);
//     an assistant message fills the content of an assistant message just
//     made of a function call or reasoning item;
//   - a function_call (string call_id, name and arguments) adds to the
//     assistant message before it, or is an assistant message without
//     content;
//   - a function_call_output (string call_id; output a string or a list of
//     content parts) is a tool message whose content is the output;
//   - a reasoning item, whose text, as a chat message's reasoning, counts
//     nothing, adds to the assistant message before it or is an assistant
//     message without content; one with encrypted_content is refused, as
//     vLLM refuses it.
//
// Anything else is refused: an input that is neither a string nor a list,
// an item that is not an object, of another type, or with fields missing
// or of the wrong type.
func responsesTurns(instructions *string, history []turn, input json.RawMessage) ([]turn, string) {
	var turns []turn
	if instructions != nil && *instructions != "" {
		turns = append(turns, turn{role: "system", content: *instructions, hasContent: true})
	}
	turns = append(turns, history...)
	if s, ok := jsonText(input); ok {
		turns = append(turns, turn{role: "user", content: s, hasContent: true})
		return turns, ""
	}
	var items []json.RawMessage
	if len(input) == 0 || input[0] != '[' || json.Unmarshal(input, &items) != nil {
		return nil, "input: a string or a list of items is required"
	}
	for i, raw := range items {
		if !isObject(raw) {
			return nil, fmt.Sprintf("input[%d]: an item must be an object", i)
		}
		m, _ := members(raw, "type", "role", "content", "call_id", "name", "arguments", "output", "encrypted_content")
		typ, typed := jsonText(m["type"])
		if !typed {
			if present(m["type"]) {
				return nil, fmt.Sprintf(`input[%d].type: a string is required`, i)
			}
			if _, ok := m["role"]; !ok {
				return nil, fmt.Sprintf(`input[%d]: an item needs a "type" or a "role"`, i)
			}
			typ = "message"
		}
		var last *turn
		if n := len(turns); n > 0 && turns[n-1].role == "assistant" {
			last = &turns[n-1]
		}
		switch typ {
		case "message":
			role, _ := jsonText(m["role"])
			switch role {
			case "user", "assistant", "system", "developer":
			default:
				return nil, fmt.Sprintf(`input[%d].role: "user", "assistant", "system" or "developer" is required`, i)
			}
			if !present(m["content"]) {
				return nil, fmt.Sprintf("input[%d].content: a string or a list of content parts is required", i)
			}
			var b strings.Builder
			if refusal := writeContent(&b, m, role, "input", i); refusal != "" {
				return nil, refusal
			}
			if role == "assistant" && last != nil && !last.hasContent {
				last.content, last.hasContent = b.String(), true
				continue
			}
			turns = append(turns, turn{role: role, content: b.String(), hasContent: true})
		case "function_call":
			for _, name := range []string{"call_id", "name", "arguments"} {
				if _, ok := jsonText(m[name]); !ok {
					return nil, fmt.Sprintf("input[%d].%s: a string is required", i, name)
				}
			}
			if last == nil {
				turns = append(turns, turn{role: "assistant"})
			}
		case "function_call_output":
			if _, ok := jsonText(m["call_id"]); !ok {
				return nil, fmt.Sprintf("input[%d].call_id: a string is required", i)
			}
			if !present(m["output"]) {
				return nil, fmt.Sprintf("input[%d].output: a string or a list of content parts is required", i)
			}
			var b strings.Builder
			if refusal := writeContent(&b, map[string]json.RawMessage{"content": m["output"]}, "tool", "input", i); refusal != "" {
				return nil, strings.Replace(refusal, ".content", ".output", 1)
			}
			turns = append(turns, turn{role: "tool", content: b.String(), hasContent: true})
		case "reasoning":
			if present(m["encrypted_content"]) {
				return nil, fmt.Sprintf("input[%d]: encrypted reasoning content is not supported", i)
			}
			if last != nil && !last.reasoning {
				last.reasoning = true
				continue
			}
			turns = append(turns, turn{role: "assistant", reasoning: true})
		default:
			return nil, fmt.Sprintf("input[%d].type: unsupported item type %q", i, typ)
		}
	}
	return turns, ""
}

// renderTurns returns the prompt text of turns as chatText renders the
// chat messages they are: each role and content, newline-terminated.
func renderTurns(turns []turn) string {
	var b strings.Builder
	for _, t := range turns {
		b.WriteString(t.role)
		b.WriteByte('\n')
		b.WriteString(t.content)
		b.WriteByte('\n')
	}
	return b.String()
}

// write writes a's response object with the given status, output items
// (JSON, without brackets) and usage ("null" for none). As vLLM's
// ResponsesResponse.from_request, a response "incomplete" has
// incomplete_details {"reason": "max_output_tokens"}, and every member is
// written, null where vLLM's is None.
func (a *response) write(w io.Writer, status, output, usage string) {
	incomplete := "null"
	if status == "incomplete" {
		incomplete = `{"reason":"max_output_tokens"}`
	}
	fmt.Fprintf(w, `{"id":%s,"created_at":%s,"incomplete_details":%s,"instructions":%s,"metadata":%s,"model":%s,"object":"response","output":[%s],"parallel_tool_calls":%s,"temperature":%s,"tool_choice":%s,"tools":%s,"top_p":%s,"background":false,"max_output_tokens":%s,"max_tool_calls":null,"previous_response_id":%s,"prompt":null,"reasoning":null,"service_tier":"auto","status":%q,"text":null,"top_logprobs":null,"truncation":"disabled","usage":%s,"user":%s,"input_messages":null,"output_messages":null}`,
		a.id, a.created, incomplete, a.instructions, a.metadata, a.model, output, a.parallelToolCalls, a.temperature, a.toolChoice, a.tools, a.topP, a.maxOutput, a.prevID, status, usage, a.user)
}

// message returns the output message of text, completed, as JSON;
// logprobs is its text part's (null in an answer, [] in a stream's done
// events, as vLLM writes them).
func (a *response) message(text, logprobs string) string {
	return fmt.Sprintf(`{"id":%s,"content":[{"annotations":[],"text":%s,"type":"output_text","logprobs":%s}],"role":"assistant","status":"completed","type":"message"}`,
		a.msgID, jsonString(text), logprobs)
}

// responseUsage returns the usage of a response of prompt tokens, cached
// of them served from the prefix cache, and output tokens. As vLLM's
// SimpleContext, it has no per-turn counts.
func responseUsage(prompt, cached, output int) string {
	return fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":%d}`,
		prompt, cached, output, prompt+output)
}

// cached returns the prompt tokens of s served from the prefix cache.
func (e *Engine) cached(s *seq) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.Cached()
}

// answerResponse answers s in one response object, once it is done. As
// every request here ends at its output limit, as a vLLM request ends with
// finish_reason "length", its status is "incomplete".
func (e *Engine) answerResponse(w http.ResponseWriter, r *http.Request, s *seq, a *response) {
	gen, ok := e.waitDone(w, r, s)
	if !ok {
		return
	}
	output, text := "", strings.Repeat(" tok", gen)
	if gen > 0 {
		output = a.message(text, "null")
	}
	var answer strings.Builder
	a.write(&answer, "incomplete", output, responseUsage(s.PromptTokens, e.cached(s), gen))
	e.keep(a, answer.String(), text)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintln(w, answer.String())
}

// streamResponse answers s as vLLM streams a response: each event as
// "event: TYPE" and "data: JSON" lines, numbered from 0 by its
// sequence_number: response.created and response.in_progress with the
// response in progress, then with the first token response.output_item.added
// and response.content_part.added, a response.output_text.delta a token,
// response.output_text.done, response.content_part.done and
// response.output_item.done, and last response.completed with the response
// and its usage (of status "incomplete", see answerResponse). The stream
// has no "data: [DONE]", as vLLM's has none.
func (e *Engine) streamResponse(w http.ResponseWriter, r *http.Request, s *seq, a *response) {
	w.Header().Set("Content-Type", eventStreamType) // and no other header, see eventStreamType
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	bw := bufio.NewWriter(w)
	ev := eventWriter{w: bw}
	var initial strings.Builder
	a.write(&initial, "in_progress", "", "null")
	ev.write("response.created", `"response":`+initial.String())
	ev.write("response.in_progress", `"response":`+initial.String())
	if bw.Flush() != nil {
		e.cancel(s)
		return
	}
	if fl != nil {
		fl.Flush()
	}
	item := fmt.Sprintf(`"item_id":%s,"output_index":0,"content_index":0`, a.msgID)
	sent := 0
	for {
		gen, done, failed, gone := e.wait(r, s)
		if gone {
			return
		}
		if failed {
			// Break the connection, as vLLM's does: unlike its chat and
			// completions streams, its responses_stream_generator
			// catches only a GenerationError, so that the engine's
			// EngineDeadError escapes the StreamingResponse after the
			// 200, which breaks the connection
			// (vllm/entrypoints/openai/responses/serving.py, vLLM main
			// as of 2026). The client sees an error, not a stream that
			// merely ends.
			panic(http.ErrAbortHandler)
		}
		for ; sent < gen; sent++ {
			if sent == 0 {
				ev.write("response.output_item.added", fmt.Sprintf(`"output_index":0,"item":{"id":%s,"content":[],"role":"assistant","status":"in_progress","type":"message"}`, a.msgID))
				ev.write("response.content_part.added", item+`,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]}`)
			}
			ev.write("response.output_text.delta", item+`,"delta":" tok","logprobs":[]`)
		}
		if done {
			output := ""
			if gen > 0 {
				text := jsonString(strings.Repeat(" tok", gen))
				ev.write("response.output_text.done", item+`,"text":`+text+`,"logprobs":[]`)
				ev.write("response.content_part.done", item+`,"part":{"annotations":[],"text":`+text+`,"type":"output_text","logprobs":null}`)
				output = a.message(strings.Repeat(" tok", gen), "null")
				ev.write("response.output_item.done", `"output_index":0,"item":`+output)
			}
			var final strings.Builder
			a.write(&final, "incomplete", output, responseUsage(s.PromptTokens, e.cached(s), gen))
			ev.write("response.completed", `"response":`+final.String())
			// Stored once complete, as vLLM's stream generator stores
			// the final response it sends.
			e.keep(a, final.String(), strings.Repeat(" tok", gen))
		}
		if bw.Flush() != nil {
			e.cancel(s)
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if done {
			return
		}
	}
}

// eventWriter writes the events of a response stream, numbering them.
type eventWriter struct {
	w   *bufio.Writer
	seq int // the next event's sequence_number
}

// write writes the event of type typ whose other members are fields (JSON
// members, without braces).
func (ev *eventWriter) write(typ, fields string) {
	fmt.Fprintf(ev.w, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, ev.seq, fields)
	ev.seq++
}
