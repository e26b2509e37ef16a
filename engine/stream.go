package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// eventStreamType is the Content-Type of every stream the engine sends, as
// vLLM's: FastAPI's StreamingResponse of media type text/event-stream, to
// which Starlette's Response.init_headers (starlette/responses.py) adds
// the charset of every text/ type. vLLM sets no other header on a stream,
// no Cache-Control either: its routes return StreamingResponse(content=
// generator, media_type="text/event-stream") (create_completion in
// vllm/entrypoints/openai/completion/api_router.py, and the chat and
// responses routes alike, vLLM main as of 2026).
const eventStreamType = "text/event-stream; charset=utf-8"

// streamUsage is what a request's stream_options ask of its stream.
type streamUsage struct {
	// final: a last chunk, with no choices, carries the request's usage.
	final bool
	// continuous: every chunk carries the usage so far too.
	continuous bool
}

// parseStreamOptions reads a request's raw stream_options as vLLM does, or
// returns the message refusing them. Absent or null options ask nothing.
// Options must be an object, and an object that is not empty only comes with
// "stream": true. include_usage asks for a final usage chunk, and is true
// if absent, as in vLLM, so that options of {} ask for it;
// continuous_usage_stats, with include_usage, for the usage in every chunk.
// Each is a boolean, or null for false, read as pydantic reads one: 0 and 1
// and strings such as "true" and "no" count too. Other fields are ignored.
func parseStreamOptions(raw json.RawMessage, stream bool) (streamUsage, string) {
	if len(raw) == 0 || string(raw) == "null" {
		return streamUsage{}, ""
	}
	if !isObject(raw) {
		return streamUsage{}, "stream_options: an object is required"
	}
	opts, n := members(raw, "include_usage", "continuous_usage_stats")
	if n > 0 && !stream {
		return streamUsage{}, "Stream options can only be defined when `stream=True`."
	}
	var u streamUsage
	// The defaults are vLLM's StreamOptions'
	// (vllm/entrypoints/openai/engine/protocol.py, vLLM main as of 2026),
	// which its handlers read from any options a request has
	// (should_include_usage in vllm/entrypoints/utils.py).
	for _, f := range []struct {
		name string
		to   *bool
		def  bool // the value if absent
	}{
		{"include_usage", &u.final, true},
		{"continuous_usage_stats", &u.continuous, false},
	} {
		raw, set := opts[f.name]
		v, ok := laxBool(raw)
		if !set {
			v = f.def
		}
		if !ok {
			return streamUsage{}, fmt.Sprintf("stream_options.%s: a boolean is required", f.name)
		}
		*f.to = v
	}
	u.continuous = u.continuous && u.final
	return u, ""
}

// laxBool reads the raw JSON value v as pydantic's lax mode reads a bool:
// true, false, null or absent (false), 0 or 1, or one of the strings of
// pydantic's list, in any case. It reports whether v is one of them.
func laxBool(v json.RawMessage) (bool, bool) {
	switch string(v) {
	case "", "null", "false":
		return false, true
	case "true":
		return true, true
	}
	if s, ok := jsonText(v); ok {
		switch strings.ToLower(s) {
		case "1", "on", "t", "true", "y", "yes":
			return true, true
		case "0", "off", "f", "false", "n", "no":
			return false, true
		}
		return false, false
	}
	var f float64
	if json.Unmarshal(v, &f) == nil && (f == 0 || f == 1) {
		return f == 1, true
	}
	return false, false
}

// usageJSON returns the "usage" member of an answer or chunk.
func usageJSON(prompt, completion int) string {
	return fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, completion, prompt+completion)
}

// stream answers s as server-sent events, one chunk a token (a chat
// stream's first token preceded by the role chunk), then the usage chunk if
// u asks for it, then "data: [DONE]"; or, if the engine stops first, the
// chunks so far, engineDeadEvent and "data: [DONE]". id and model are JSON
// string literals.
func (e *Engine) stream(w http.ResponseWriter, r *http.Request, s *seq, chat bool, id, model string, u streamUsage) {
	// As vLLM's StreamingResponse, of media type text/event-stream and no
	// other header: no Cache-Control (see eventStreamType).
	w.Header().Set("Content-Type", eventStreamType)
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	bw := bufio.NewWriter(w)
	c := chunk{chat: chat, id: id, created: time.Now().Unix(), model: model}
	sent := 0
	for {
		gen, done, failed, gone := e.wait(r, s)
		if gone {
			return
		}
		if failed {
			// As vLLM's stream generators, which catch the dead engine's
			// error, send it as an event and end the stream (see
			// engineDeadEvent).
			fmt.Fprint(bw, engineDeadEvent)
			fmt.Fprint(bw, "data: [DONE]\n\n")
			if bw.Flush() == nil && fl != nil {
				fl.Flush()
			}
			return
		}
		for ; sent < gen; sent++ {
			if sent == 0 && chat {
				// As vLLM, the role goes out with the first token, in
				// the same write: it does not move the first token.
				usage := ""
				if u.continuous {
					usage = usageJSON(s.PromptTokens, 0)
				}
				c.writeRole(bw, usage)
			}
			usage := ""
			if u.continuous {
				usage = usageJSON(s.PromptTokens, sent+1)
			}
			c.write(bw, done && sent == gen-1, usage)
		}
		if done && u.final {
			c.writeUsage(bw, usageJSON(s.PromptTokens, gen))
		}
		if done {
			fmt.Fprint(bw, "data: [DONE]\n\n")
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

// engineDeadEvent is the event that ends a chat or completions stream whose
// request failed because the engine stopped, before "data: [DONE]", as
// vLLM ends one whose engine died: its chat_completion_stream_generator and
// completion_stream_generator catch the EngineDeadError
// (vllm/v1/engine/exceptions.py), send "data: " and
// create_streaming_error_response(e), json.dumps of the ErrorResponse that
// create_error_response makes of it (an exception of no type it knows: type
// "InternalServerError", code 500, param null; members in ErrorInfo's
// order, with json.dumps's spaces), then "data: [DONE]"
// (vllm/entrypoints/openai/chat_completion/serving.py,
// completion/serving.py and engine/serving.py, vLLM main as of 2026).
const engineDeadEvent = `data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"

// chunk is what every event of a stream repeats; id and model are JSON
// string literals.
type chunk struct {
	chat    bool
	id      string
	created int64
	model   string
}

// The members of a choice that vLLM writes besides its index and its text,
// message or delta, for a request that asks for no logprobs and no token
// IDs: a chunk's choice (ChatCompletionResponseStreamChoice,
// CompletionResponseStreamChoice) has the members the handler sets, as
// vLLM dumps a chunk with exclude_unset, and a non-streaming answer's
// choice (ChatCompletionResponseChoice, CompletionResponseChoice) and
// message (ChatMessage, whose tool_calls are dropped when empty) every
// member of their model, as vLLM dumps the whole answer. A chat chunk sets
// stop_reason only in the chunk that finishes, and token_ids in every
// chunk but the role chunk (vllm/entrypoints/openai/chat_completion/
// protocol.py and serving.py, completion/protocol.py and serving.py, vLLM
// main as of 2026).
const (
	chatChunkNulls       = `"logprobs":null,"finish_reason":null,"token_ids":null`
	chatLastChunkNulls   = `"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null`
	textChunkNulls       = `"stop_reason":null,"prompt_token_ids":null,"token_ids":null`
	chatChoiceNulls      = `"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null`
	textChoiceNulls      = `"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null`
	chatMessageNulls     = `"refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null`
	roleChunkChoiceDelta = `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null`
)

// writeRole writes the event that opens a chat stream, as vLLM's
// chat_completion_stream_generator sends it with the first output, just
// before the first token's: the role, empty content, and no finish reason;
// usage, if set, is a "usage" member (with no completion tokens yet).
func (c chunk) writeRole(w *bufio.Writer, usage string) {
	if usage != "" {
		usage = "," + usage
	}
	fmt.Fprintf(w, `data: {"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,%s}]%s}`+"\n\n",
		c.id, c.created, c.model, roleChunkChoiceDelta, usage)
}

// write writes one token's event; usage, if set, is a "usage" member.
func (c chunk) write(w *bufio.Writer, last bool, usage string) {
	if usage != "" {
		usage = "," + usage
	}
	if c.chat {
		rest := chatChunkNulls
		if last {
			rest = chatLastChunkNulls
		}
		fmt.Fprintf(w, `data: {"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,"delta":{"content":" tok"},%s}]%s}`+"\n\n",
			c.id, c.created, c.model, rest, usage)
		return
	}
	finish := "null"
	if last {
		finish = `"length"`
	}
	fmt.Fprintf(w, `data: {"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":%s,%s}]%s}`+"\n\n",
		c.id, c.created, c.model, finish, textChunkNulls, usage)
}

// writeUsage writes the event that ends a stream asked to include usage: no
// choices, and usage, a "usage" member.
func (c chunk) writeUsage(w *bufio.Writer, usage string) {
	if c.chat {
		fmt.Fprintf(w, `data: {"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,"choices":[],%s}`+"\n\n",
			c.id, c.created, c.model, usage)
		return
	}
	fmt.Fprintf(w, `data: {"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":[],%s}`+"\n\n",
		c.id, c.created, c.model, usage)
}
