package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/model"
)

// ServeHTTP implements [http.Handler]: the completions and responses APIs
// (POST, and the retrieve and cancel of a stored response), /metrics, and
// GET /health and /v1/models. Requests are queued for
// the batching loop of [Engine.Run]; without it they wait.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.hmu.Lock()
	e.handlers++
	e.hmu.Unlock()
	defer func() {
		e.hmu.Lock()
		e.handlers--
		if e.handlers == 0 {
			e.hidle.Broadcast()
		}
		e.hmu.Unlock()
	}()
	if e.draining.Load() && r.URL.Path != "/metrics" {
		refuseDraining(w, r)
		return
	}
	deadline := e.boundBody(w, r)
	switch r.URL.Path {
	case "/v1/completions":
		e.complete(w, r, false, deadline)
	case "/v1/chat/completions":
		e.complete(w, r, true, deadline)
	case "/v1/responses":
		e.respond(w, r, deadline)
	case "/metrics":
		e.metrics(w)
	case "/health":
		if !getOnly(w, r) {
			return
		}
		// As vLLM's, 503 once the engine is dead: its Run has returned.
		e.mu.Lock()
		stopped := e.stopped
		e.mu.Unlock()
		if stopped {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case "/v1/models":
		if !getOnly(w, r) {
			return
		}
		// As vLLM's ModelCard (vllm/entrypoints/openai/engine/protocol.py,
		// vLLM main as of 2026), with the context length a router may
		// read to keep long prompts off the engine.
		w.Header().Set("Content-Type", "application/json")
		model := jsonString(e.model)
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%s,"object":"model","created":%d,"owned_by":"vllm","root":%s,"parent":null,"max_model_len":%d}]}`+"\n",
			model, time.Now().Unix(), model, e.maxLen)
	default:
		if strings.HasPrefix(r.URL.Path, responsesPath) {
			e.serveStored(w, r)
			return
		}
		writeHTTPError(w, http.StatusNotFound)
	}
}

// getOnly reports whether r is a GET, and otherwise answers 405 with Allow:
// GET, as vLLM does for /health and /v1/models: FastAPI routes them for GET
// alone, not even HEAD (@router.get in vLLM's api_server.py and
// vllm/entrypoints/openai/models/api_router.py, vLLM main as of 2026).
func getOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet {
		return true
	}
	w.Header().Set("Allow", http.MethodGet)
	writeHTTPError(w, http.StatusMethodNotAllowed)
	return false
}

// Serve runs the batching loop and an HTTP server on l until ctx is done, then
// closes the listener and every connection (streams in progress break, as
// when a server is killed), waits for its handlers and returns ctx's error,
// or the error that stopped the server. It closes them at once, or, with a
// [Config].ShutdownTimeout, once the requests in progress have finished or
// the timeout is over, refusing new ones meanwhile. Serve calls Run: use one
// or the other, once; an engine that has run already is not served (l is
// closed) and Serve returns an error wrapping [ErrRunning]. The server
// closes a keep-alive connection idle for [Config].IdleTimeout.
func (e *Engine) Serve(ctx context.Context, l net.Listener) error {
	if !e.ran.CompareAndSwap(false, true) {
		_ = l.Close()
		return fmt.Errorf("%w: Serve called after Run or Serve", ErrRunning)
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: e.idleTime}
	// The batching loop stops only once the server has closed every
	// connection: stopping it first would end the streams in progress
	// with the event of a dead engine (see engineDeadEvent), not break
	// them as a killed server does.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = e.run(runCtx)
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	var err error
	select {
	case <-ctx.Done():
		err = ctx.Err()
		e.drain(srv)
		_ = srv.Close()
		cancel()
		<-served
	case err = <-served:
		_ = srv.Close()
		cancel()
	}
	<-ran
	e.waitHandlers()
	return err
}

// drain, given a ShutdownTimeout, refuses new requests, closes each of
// srv's connections after its answer, and waits until no request is in
// progress and every answer is sent, or the timeout is over, whichever
// comes first.
func (e *Engine) drain(srv *http.Server) {
	if e.drainTime <= 0 {
		return
	}
	e.draining.Store(true)
	srv.SetKeepAlivesEnabled(false) // also closes the idle connections
	idle := make(chan struct{})
	go func() {
		e.waitHandlers()
		close(idle)
	}()
	deadline := time.Now().Add(e.drainTime)
	timer := time.NewTimer(e.drainTime)
	defer timer.Stop()
	select {
	case <-idle:
		// A handler that has returned has not yet sent all of its
		// answer: the server ends the response (a chunked stream's last
		// chunk) after it. Shutdown waits for that, within what is left
		// of the timeout, before the connections are closed.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		_ = srv.Shutdown(ctx)
	case <-timer.C:
	}
}

// refuseDraining answers a request that comes while Serve drains: 503,
// without a body for GET /health, else with the error of a server shutting
// down.
func refuseDraining(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	writeError(w, statusError(http.StatusServiceUnavailable, "The server is shutting down."))
}

// waitHandlers waits for the ServeHTTP calls in progress to return.
func (e *Engine) waitHandlers() {
	e.hmu.Lock()
	for e.handlers > 0 {
		e.hidle.Wait()
	}
	e.hmu.Unlock()
}

// request is the part of an OpenAI-compatible body the engine reads.
type request struct {
	Model               string            `json:"model"`
	Prompt              json.RawMessage   `json:"prompt"`
	Messages            []json.RawMessage `json:"messages"`
	MaxTokens           *float64          `json:"max_tokens"`
	MaxCompletionTokens *float64          `json:"max_completion_tokens"`
	N                   *float64          `json:"n"`
	Stream              bool              `json:"stream"`
	StreamOptions       json.RawMessage   `json:"stream_options"`

	usage streamUsage // what StreamOptions asks, once parsed
}

// promptText returns the prompt text of a chat request (see chatText) or of
// a completions request (the prompt string, or a batch of one), or the
// message refusing the request. As vLLM, each endpoint reads only its own
// field: a completions request's messages, or a chat request's prompt,
// count for nothing.
func (q *request) promptText(chat bool) (string, string) {
	if chat {
		return chatText(q.Messages)
	}
	if len(q.Prompt) == 0 || string(q.Prompt) == "null" {
		return "", "prompt: a string is required"
	}
	var s string
	if json.Unmarshal(q.Prompt, &s) == nil {
		return s, ""
	}
	var ss []string
	if json.Unmarshal(q.Prompt, &ss) == nil {
		if len(ss) == 1 {
			return ss[0], ""
		}
		return "", "prompt: this emulator answers one prompt a request; send each prompt of a batch as a request of its own"
	}
	return "", "prompt: a string is required (this emulator does not take token IDs)"
}

// complete answers a completions request, whose body must arrive by
// deadline (zero: none, see boundBody).
func (e *Engine) complete(w http.ResponseWriter, r *http.Request, chat bool, deadline time.Time) {
	var q request
	s := e.accept(w, r, deadline, func(body []byte) (*seq, errorAnswer) {
		s, parsed, ref := e.parseRequest(body, chat)
		q = parsed
		return s, ref
	})
	if s == nil {
		return
	}
	model := jsonString(e.model) // named in every answer, quoted once
	id := answerID(r, chat)
	if q.Stream {
		e.stream(w, r, s, chat, id, model, q.usage)
	} else {
		e.answer(w, r, s, chat, id, model)
	}
}

// accept reads a POST request's body, which must arrive by deadline (zero:
// none, see boundBody), has parse turn it into a sequence, and submits the
// sequence within the engine's rate limit and queue bound. It returns the
// sequence submitted, or nil once it has answered the request's refusal.
func (e *Engine) accept(w http.ResponseWriter, r *http.Request, deadline time.Time, parse func([]byte) (*seq, errorAnswer)) *seq {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeHTTPError(w, http.StatusMethodNotAllowed)
		return nil
	}
	body, code, msg := e.readBody(w, r, deadline)
	if code != 0 {
		writeError(w, statusError(code, msg))
		return nil
	}
	s, ref := parse(body)
	if ref.code != 0 {
		writeError(w, ref)
		return nil
	}
	if e.rpm > 0 {
		ok, remaining, reset, retryAfter := e.rateLimit(time.Now())
		h := w.Header()
		h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(e.rpm))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(remaining))
		h.Set("X-Ratelimit-Reset-Requests", reset.Round(time.Millisecond).String())
		if !ok {
			h.Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
			writeError(w, statusError(http.StatusTooManyRequests, "rate limit reached for requests"))
			return nil
		}
	}
	switch err := e.submit(s); {
	case errors.Is(err, errQueueFull):
		w.Header().Set("Retry-After", "1")
		writeError(w, statusError(http.StatusTooManyRequests, "too many requests waiting"))
		return nil
	case errors.Is(err, ErrStopped):
		writeError(w, engineDead)
		return nil
	case err != nil:
		writeError(w, statusError(http.StatusServiceUnavailable, err.Error()))
		return nil
	}
	return s
}

// maxRequestIDBytes bounds the X-Request-Id an answer's id takes: every
// chunk of a stream repeats the id, so that a header of the server's
// largest (1 MB) would make a stream of the longest output 4 GB.
const maxRequestIDBytes = 1 << 10

// answerID returns the id of r's answer, as a JSON string literal: as
// vLLM's, "cmpl-" (for a chat request "chatcmpl-") and the request's
// X-Request-Id header, even empty, or else a random UUID in hex
// (OpenAIServing._base_request_id in
// vllm/entrypoints/openai/engine/serving.py, vLLM main as of 2026). Unlike
// vLLM, the engine does not read a request_id field of the body, and an
// X-Request-Id longer than maxRequestIDBytes is not used either.
func answerID(r *http.Request, chat bool) string {
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	if v, ok := r.Header["X-Request-Id"]; ok && len(v) > 0 && len(v[0]) <= maxRequestIDBytes {
		return jsonString(prefix + v[0])
	}
	return jsonString(fmt.Sprintf("%s%016x%016x", prefix, rand.Uint64(), rand.Uint64()))
}

// boundBody sets the read deadline of r's connection (of its stream, over
// HTTP/2) to the engine's read timeout from now, and returns it, so that
// every body has that long to arrive: the completions endpoints read theirs
// (see readBody), and net/http discards any other after the handler
// returns, before it sends the answer, then closes the connection if the
// body has not come by the deadline. It returns the zero time, and sets
// nothing, for a request without a body (over HTTP/1 the server is then
// already reading the connection, to see the client leave) or a
// ResponseWriter without read deadlines (a recorder in tests).
func (e *Engine) boundBody(w http.ResponseWriter, r *http.Request) time.Time {
	if r.Body == nil || r.Body == http.NoBody {
		return time.Time{}
	}
	deadline := time.Now().Add(e.readTime)
	if http.NewResponseController(w).SetReadDeadline(deadline) != nil {
		return time.Time{}
	}
	return deadline
}

// readBody reads r's body, which must arrive by deadline (see boundBody),
// or returns the status and message refusing it. The deadline is lifted
// once the body is read, so that it never cuts the answer, however long a
// stream lasts; a body refused keeps it, so that the server does not wait
// for the rest of the body either.
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request, deadline time.Time) ([]byte, int, string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, min(e.maxBody, math.MaxInt64-1)+1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Over HTTP/1 the rest of the body may still come: the connection
		// cannot carry another request. Over HTTP/2 the server resets this
		// request's stream once it has answered; Connection: close would
		// make it send GOAWAY and retire the connection every other
		// request shares.
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		return nil, http.StatusRequestTimeout, fmt.Sprintf("reading body: not received within %v", e.readTime)
	case err != nil:
		return nil, http.StatusBadRequest, "reading body: " + err.Error()
	case int64(len(body)) > e.maxBody:
		return nil, http.StatusRequestEntityTooLarge, "body too large"
	}
	if !deadline.IsZero() {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
	return body, 0, ""
}

// parse is parseRequest with the refusal's status and message only.
func (e *Engine) parse(body []byte, chat bool) (s *seq, q request, code int, msg string) {
	s, q, r := e.parseRequest(body, chat)
	return s, q, r.code, r.msg
}

// parseRequest reads a completions body (of the chat endpoint if chat is
// set) into a request ready to submit, or returns the refusal: 400, or 404
// only for a model the engine does not serve (see serves).
func (e *Engine) parseRequest(body []byte, chat bool) (s *seq, q request, r errorAnswer) {
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, q, invalid(jsonRefusal(err))
	}
	// First what vLLM's request models refuse, before its handler runs: a
	// missing prompt or messages field, stream options without a stream.
	var refusal string
	switch {
	case chat && q.Messages == nil:
		refusal = "messages: a non-empty list is required"
	case !chat && (len(q.Prompt) == 0 || string(q.Prompt) == "null"):
		refusal = "prompt: a string is required"
	default:
		q.usage, refusal = parseStreamOptions(q.StreamOptions, q.Stream)
	}
	if refusal != "" {
		return nil, q, invalid(refusal)
	}
	// Then, as vLLM's handler, the model, before the prompt is rendered
	// and the sampling parameters are read.
	if model, ok := exactModel(body); !ok {
		return nil, q, invalid("model: a string is required")
	} else if q.Model = model; !e.serves(model) {
		return nil, q, errorAnswer{http.StatusNotFound, typeNotFound, "model", fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	text, refusal := q.promptText(chat)
	switch {
	case refusal != "":
		return nil, q, invalid(refusal)
	case text == "":
		return nil, q, badRequest("", "the prompt is empty")
	case q.N != nil && *q.N != 1:
		return nil, q, badRequest("n", "n: this emulator answers one choice a request; send each choice as a request of its own")
	}
	// out is the output asked for, checked against the context as vLLM
	// checks it; the emulator's own cap applies after.
	out := outputLimit{n: e.defMax, message: "'max_tokens' or 'max_completion_tokens'", param: "max_tokens"}
	// As vLLM's chat endpoint, the newer max_completion_tokens wins over
	// max_tokens. A completions request has max_tokens only, and as
	// vLLM's CompletionRequest (vllm/entrypoints/openai/completion/
	// protocol.py, vLLM main as of 2026) one without it asks for 16
	// tokens, checked against the context as if asked; one whose
	// max_tokens is null gets the default, as a chat request does.
	limits := []struct {
		name string
		v    *float64
	}{{"max_completion_tokens", q.MaxCompletionTokens}, {"max_tokens", q.MaxTokens}}
	if !chat {
		limits = limits[1:]
		if fields, _ := members(body, "max_tokens"); fields["max_tokens"] == nil {
			limits = nil
			out.n, out.asked = completionMaxTokens, true
		}
	}
	for _, l := range limits {
		if l.v != nil {
			if !outputInt(*l.v) {
				return nil, q, badRequest(l.name, fmt.Sprintf("%s must be an integer from 1 to %d", l.name, math.MaxInt32))
			}
			out.n, out.asked = int(*l.v), true
			break
		}
	}
	s, r = e.newSeq(text, out)
	return s, q, r
}

// completionMaxTokens is the output length of a completions request
// without max_tokens: the default of vLLM's CompletionRequest.max_tokens.
const completionMaxTokens = 16

// outputInt reports whether v, a request's output length, is an integer
// the engine reads: at most 2^31-1, and not below -2^53, so that it is
// exact. One below 1 is refused later, as vLLM refuses it (see newSeq).
func outputInt(v float64) bool {
	return v == math.Trunc(v) && v <= math.MaxInt32 && v >= -(1<<53)
}

// outputLimit is the output length a request asks for.
type outputLimit struct {
	n     int  // the tokens asked for, or the default
	asked bool // n is the request's, not the default
	// message names the request's fields in the refusal of an n too
	// large for the context, param the field at fault.
	message, param string
}

// newSeq returns the sequence of a request of prompt text (not empty) and
// output out, or the refusal of a request its context has no room for.
func (e *Engine) newSeq(text string, out outputLimit) (*seq, errorAnswer) {
	// As vLLM's OpenAIServing._validate_input
	// (vllm/entrypoints/openai/engine/serving.py, vLLM main as of 2026):
	// first a prompt that fills the context, then one that leaves no room
	// for max_tokens, each a VLLMValidationError whose message ends with
	// its parameter and value.
	maxOut := out.n
	prompt := (len(text) + BytesPerToken - 1) / BytesPerToken
	switch {
	case prompt >= e.maxLen:
		return nil, badRequest("input_tokens", fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=%d)",
			e.maxLen, prompt, prompt))
	case out.asked && prompt+maxOut > e.maxLen:
		return nil, badRequest(out.param, fmt.Sprintf("%s is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d). (parameter=%s, value=%d)",
			out.message, maxOut, e.maxLen, prompt, maxOut, e.maxLen, prompt, out.param, maxOut))
	case out.asked && maxOut < 1:
		// Then, as vLLM's SamplingParams._verify_args
		// (vllm/sampling_params.py, vLLM main as of 2026), an output
		// length below 1, whichever field asked for it, a
		// VLLMValidationError of parameter max_tokens.
		return nil, badRequest("max_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d. (parameter=max_tokens, value=%d)", maxOut, maxOut))
	case !out.asked:
		// As vLLM, a request that sets no output length gets the
		// default as far as its context has room, not a refusal.
		maxOut = min(maxOut, e.maxLen-prompt)
	}
	maxOut = min(maxOut, e.maxCap)
	s := &seq{Sequence: model.Sequence{
		PromptTokens: prompt,
		OutputTokens: maxOut,
		Prefix:       e.hasher.AppendString(nil, e.root, text),
		BlockTokens:  e.blockSize,
	}}
	if e.kvEvents != nil {
		s.prompt = text
	}
	return s, errorAnswer{}
}

// serves reports whether a request naming model is for this engine: as
// vLLM's, one naming the served model or none ("", null or no field; the
// answer then names the served model). The engine serves no LoRA adapters,
// so any other name is refused, as vLLM refuses a name that is neither its
// served model nor one of its adapters.
func (e *Engine) serves(model string) bool {
	return model == "" || model == e.model
}

// exactModel returns the body's "model" field as vLLM reads it, the key
// matched exactly ("" if absent or null), or false if it is not a string.
// encoding/json matches keys without regard to case, so the field decoded
// into request.Model may be another key's, such as "Model", which vLLM
// ignores.
func exactModel(body []byte) (string, bool) {
	fields, _ := members(body, "model")
	raw, ok := fields["model"]
	if !ok || string(raw) == "null" {
		return "", true
	}
	var model string
	if json.Unmarshal(raw, &model) != nil {
		return "", false
	}
	return model, true
}

// jsonRefusal returns the message refusing a body that err did not let
// decode: the decoder's own words for a syntax error, and for a value of the
// wrong type the field's name, not the Go type it was to fill.
func jsonRefusal(err error) string {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return "malformed JSON: " + err.Error()
	}
	if te.Field == "" {
		return "malformed JSON: the body must be a JSON object"
	}
	return fmt.Sprintf("malformed JSON: %s must not be a JSON %s", te.Field, te.Value)
}

// wait blocks until s changes or r's client goes away (then s is
// cancelled); it returns the tokens emitted and whether s is done or failed.
func (e *Engine) wait(r *http.Request, s *seq) (generated int, done, failed, gone bool) {
	select {
	case <-s.notify:
	case <-r.Context().Done():
		e.cancel(s)
		return 0, false, false, true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.Generated(), s.Done(), s.failed, false
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// answer answers s in one JSON body, once it is done; id and model are JSON
// string literals.
func (e *Engine) answer(w http.ResponseWriter, r *http.Request, s *seq, chat bool, id, model string) {
	created := time.Now().Unix()
	gen, ok := e.waitDone(w, r, s)
	if !ok {
		return
	}
	text := strings.Repeat(" tok", gen)
	usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null}`,
		s.PromptTokens, s.PromptTokens+gen, gen)
	w.Header().Set("Content-Type", "application/json")
	// The answer and each choice have every member of vLLM's models, as
	// vLLM dumps the whole answer (see chatChoiceNulls and
	// chatAnswerNulls).
	if chat {
		fmt.Fprintf(w, `{"id":%s,"object":"chat.completion","created":%d,"model":%s,"choices":[{"index":0,"message":{"role":"assistant","content":%s,%s},%s}],%s,%s,%s}`+"\n",
			id, created, model, jsonString(text), chatMessageNulls, chatChoiceNulls, answerNulls, usage, chatAnswerNulls)
	} else {
		fmt.Fprintf(w, `{"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":%s,%s}],%s,%s,%s}`+"\n",
			id, created, model, jsonString(text), textChoiceNulls, answerNulls, usage, textAnswerNulls)
	}
}

// The members of a non-streaming answer, besides its id, object, created,
// model, choices and usage, that vLLM writes null for a request without
// logprobs, token IDs or KV transfer: every member of its
// ChatCompletionResponse or CompletionResponse, which vLLM dumps whole
// (model_dump, in create_chat_completion and create_completion of
// vllm/entrypoints/openai/chat_completion/api_router.py and
// completion/api_router.py, and the models in chat_completion/protocol.py
// and completion/protocol.py, vLLM main as of 2026), in their order:
// service_tier and system_fingerprint before usage, the rest after it.
// system_fingerprint is null as from vLLM run with --fingerprint-mode
// none; by default vLLM fills it with its version and a hash of its
// configuration (vllm/entrypoints/openai/fingerprint.py). usage has
// prompt_tokens_details null, as UsageInfo dumped whole.
const (
	answerNulls     = `"service_tier":null,"system_fingerprint":null`
	chatAnswerNulls = `"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"metrics":null`
	textAnswerNulls = `"kv_transfer_params":null,"metrics":null`
)

// waitDone waits until s is done and returns its output tokens, for an
// answer in one body; or, if the engine stopped first, answers as vLLM
// answers when its engine dies (see engineDead), or if the client has gone,
// gives up, and then reports false.
func (e *Engine) waitDone(w http.ResponseWriter, r *http.Request, s *seq) (int, bool) {
	for {
		gen, done, failed, gone := e.wait(r, s)
		switch {
		case gone:
			return 0, false
		case failed:
			writeError(w, engineDead)
			return 0, false
		case done:
			return gen, true
		}
	}
}

// Error types of vLLM's OpenAI-compatible server (vLLM main as of 2026).
const (
	// typeInvalid is the type of a body its request model does not
	// validate (malformed JSON, a field missing or of the wrong type):
	// HTTPStatus.BAD_REQUEST.phrase, from validation_exception_handler
	// in vllm/entrypoints/openai/api_server.py.
	typeInvalid = "Bad Request"
	// typeBadRequest is the type of a request the handler refuses, such
	// as one beyond the context length: create_error_response's default
	// in vllm/entrypoints/openai/engine/serving.py.
	typeBadRequest = "BadRequestError"
	// typeNotFound is the type of a request for a model not served
	// (OpenAIServing._check_model, with param "model").
	typeNotFound = "NotFoundError"
)

// engineDead answers a request that the engine's stop failed, or that came
// after it, as vLLM answers one whose engine died: 500, with the message of
// its EngineDeadError (vllm/v1/engine/exceptions.py) and the type
// create_error_response gives an exception of no type it knows,
// "InternalServerError" (vllm/entrypoints/openai/engine/serving.py). A
// request to a dead engine raises it at once (render_completion_request and
// render_chat_request: "If the engine is dead, raise the engine's
// DEAD_ERROR", streaming or not), and a request in progress when it dies
// raises it from its result generator, which the non-streaming paths of
// create_completion and create_chat_completion do not catch (they catch
// CancelledError, GenerationError and ValueError); the routes
// create_completion and create_chat_completion answer it with
// create_error_response(e), of code 500 (completion/api_router.py and
// chat_completion/api_router.py; earlier versions raised an HTTPException
// of 500 with its message), and launcher.py's runtime_exception_handler
// answers 500 to an EngineDeadError that escapes a route (all in
// vllm/entrypoints/ and vllm/entrypoints/openai/, vLLM main as of 2026).
// Not 503: that is only /health's answer for a dead engine.
var engineDead = errorAnswer{code: http.StatusInternalServerError, typ: "InternalServerError",
	msg: "EngineCore encountered an issue. See stack trace (above) for the root cause."}

// errorAnswer is an error answer: its status, and vLLM's error type, the
// request's field at fault ("" for none) and message.
type errorAnswer struct {
	code       int
	typ, param string
	msg        string
}

// invalid refuses a body that vLLM's request models would not validate.
func invalid(msg string) errorAnswer {
	return errorAnswer{http.StatusBadRequest, typeInvalid, "", msg}
}

// badRequest refuses a request as vLLM's handler does, param naming the
// field at fault ("" for none).
func badRequest(param, msg string) errorAnswer {
	return errorAnswer{http.StatusBadRequest, typeBadRequest, param, msg}
}

// statusError answers code with msg, typed as vLLM's
// http_exception_handler (vllm/entrypoints/openai/api_server.py) types
// the statuses it raises as HTTPException: the status's reason phrase.
func statusError(code int, msg string) errorAnswer {
	return errorAnswer{code: code, typ: http.StatusText(code), msg: msg}
}

// writeHTTPError answers code as vLLM does for a path it does not serve
// (404) or a method it does not take (405): Starlette's HTTPException,
// whose message is the reason phrase too.
func writeHTTPError(w http.ResponseWriter, code int) {
	writeError(w, statusError(code, http.StatusText(code)))
}

// writeError answers r as vLLM's ErrorResponse: {"error": {"message",
// "type", "param" (null for none), "code" (the status)}}.
func writeError(w http.ResponseWriter, r errorAnswer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(r.code)
	param := "null"
	if r.param != "" {
		param = jsonString(r.param)
	}
	fmt.Fprintf(w, `{"error":{"message":%s,"type":%s,"param":%s,"code":%d}}`+"\n", jsonString(r.msg), jsonString(r.typ), param, r.code)
}

// metrics writes the vLLM-named metrics in the Prometheus text format, as
// vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py, vLLM main as of
// 2026) has prometheus_client write them: every series labelled with
// model_name and engine, the index of the engine core ("0" for the only
// one), cache_config_info with engine among its labels; a counter's HELP and
// TYPE named without its _total suffix, which only its sample carries; and
// every value a float as prometheus_client writes one ("3.0", not "3"; see
// promFloat).
func (e *Engine) metrics(w http.ResponseWriter) {
	st := e.Stats()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	labels := fmt.Sprintf(`model_name=%q,engine="0"`, e.model)
	gauge := func(name, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s{%s} %s\n", name, help, name, name, labels, promFloat(v))
	}
	counter := func(name, help, extra string, v int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s_total{%s%s} %s\n", name, help, name, name, labels, extra, promFloat(float64(v)))
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(st.Running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(st.Waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.KVUsage)
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\",engine=\"0\"} 1.0\n", e.blockSize, e.kvBlocks)
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", "", st.PrefixQueries)
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", "", st.PrefixHits)
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "", st.Preemptions)
	counter("vllm:request_success", "Count of successfully processed requests.", `,finished_reason="length"`, st.Finished)
}

// promFloat formats v as Python's prometheus_client writes a sample's value
// (floatToGoString in prometheus_client/utils.py): Python's repr of the
// float ("3.0", "0.25", "1e-05", "1e+16"), except that a positive number
// with more than six digits before the point is written with an exponent
// ("1.234567e+06"), as Go writes one; +Inf, -Inf and NaN as Prometheus
// spells them.
func promFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	s := pyRepr(v)
	dot := strings.IndexByte(s, '.')
	if v > 0 && dot > 6 {
		mantissa := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return fmt.Sprintf("%se+0%d", mantissa, dot-1)
	}
	return s
}

// pyRepr returns Python's repr of the finite float v: the shortest digits
// that read back as v, in positional notation with at least one digit after
// the point when the decimal exponent is from -4 to 15, else in scientific
// notation with a signed exponent of at least two digits.
func pyRepr(v float64) string {
	sci := strconv.FormatFloat(v, 'e', -1, 64)
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return sci
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
