package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/model"
)

// ServeHTTP implements [http.Handler]: the completions API, /metrics,
// /health and /v1/models. Requests are queued for the batching loop of
// [Engine.Run]; without it they wait.
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
	deadline := e.boundBody(w, r)
	switch r.URL.Path {
	case "/v1/completions":
		e.complete(w, r, false, deadline)
	case "/v1/chat/completions":
		e.complete(w, r, true, deadline)
	case "/metrics":
		e.metrics(w)
	case "/health":
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
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"llmlb"}]}`+"\n", e.model)
	default:
		writeError(w, http.StatusNotFound, "not found")
	}
}

// Serve runs the batching loop and an HTTP server on l until ctx is done, then
// closes the listener and every connection at once (streams in progress
// break, as when a server is killed), waits for its handlers and returns
// ctx's error, or the error that stopped the server. Serve calls Run: use one
// or the other, once; an engine that has run already is not served (l is
// closed) and Serve returns an error wrapping [ErrRunning].
func (e *Engine) Serve(ctx context.Context, l net.Listener) error {
	if !e.ran.CompareAndSwap(false, true) {
		_ = l.Close()
		return fmt.Errorf("%w: Serve called after Run or Serve", ErrRunning)
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	runCtx, cancel := context.WithCancel(ctx)
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
		cancel()
		_ = srv.Close()
		<-served
	case err = <-served:
		cancel()
		_ = srv.Close()
	}
	<-ran
	e.waitHandlers()
	return err
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
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "POST only")
		return
	}
	body, code, msg := e.readBody(w, r, deadline)
	if code != 0 {
		writeError(w, code, msg)
		return
	}
	s, q, code, msg := e.parse(body, chat)
	switch code {
	case 0:
	case http.StatusNotFound: // parse's only 404: a model the engine does not serve
		writeErrorInfo(w, code, "NotFoundError", "model", msg)
		return
	default:
		writeError(w, code, msg)
		return
	}
	if e.rpm > 0 {
		ok, remaining, reset, retryAfter := e.rateLimit(time.Now())
		h := w.Header()
		h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(e.rpm))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(remaining))
		h.Set("X-Ratelimit-Reset-Requests", reset.Round(time.Millisecond).String())
		if !ok {
			h.Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
			writeError(w, http.StatusTooManyRequests, "rate limit reached for requests")
			return
		}
	}
	switch err := e.submit(s); {
	case errors.Is(err, errQueueFull):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "too many requests waiting")
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	model := jsonString(e.model) // named in every answer, quoted once
	if q.Stream {
		e.stream(w, r, s, chat, model, q.usage)
	} else {
		e.answer(w, r, s, chat, model)
	}
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

// parse reads a completions body (of the chat endpoint if chat is set) into
// a request ready to submit, or returns the status and message refusing it:
// 404 only for a model the engine does not serve (see serves).
func (e *Engine) parse(body []byte, chat bool) (s *seq, q request, code int, msg string) {
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, q, http.StatusBadRequest, jsonRefusal(err)
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
		return nil, q, http.StatusBadRequest, refusal
	}
	// Then, as vLLM's handler, the model, before the prompt is rendered
	// and the sampling parameters are read.
	if model, ok := exactModel(body); !ok {
		return nil, q, http.StatusBadRequest, "model: a string is required"
	} else if q.Model = model; !e.serves(model) {
		return nil, q, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model)
	}
	text, refusal := q.promptText(chat)
	switch {
	case refusal != "":
	case text == "":
		refusal = "the prompt is empty"
	case q.N != nil && *q.N != 1:
		refusal = "n: this emulator answers one choice a request; send each choice as a request of its own"
	}
	if refusal != "" {
		return nil, q, http.StatusBadRequest, refusal
	}
	// As vLLM's chat endpoint, the newer max_completion_tokens wins over
	// max_tokens; a completions request reads max_tokens first.
	limits := []struct {
		name string
		v    *float64
	}{{"max_tokens", q.MaxTokens}, {"max_completion_tokens", q.MaxCompletionTokens}}
	if chat {
		limits[0], limits[1] = limits[1], limits[0]
	}
	maxOut, asked := e.defMax, false
	for _, l := range limits {
		if l.v != nil {
			if *l.v < 1 || *l.v > math.MaxInt32 || *l.v != math.Trunc(*l.v) {
				return nil, q, http.StatusBadRequest, fmt.Sprintf("%s must be an integer from 1 to %d", l.name, math.MaxInt32)
			}
			maxOut, asked = int(min(*l.v, float64(e.maxCap))), true
			break
		}
	}
	prompt := (len(text) + BytesPerToken - 1) / BytesPerToken
	switch {
	case asked && prompt+maxOut > e.maxLen:
		return nil, q, http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			e.maxLen, prompt+maxOut, prompt, maxOut)
	case prompt >= e.maxLen:
		return nil, q, http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the messages, Please reduce the length of the messages.",
			e.maxLen, prompt)
	case !asked:
		// As vLLM, a request that sets no output length gets the
		// default as far as its context has room, not a refusal.
		maxOut = min(maxOut, e.maxLen-prompt)
	}
	s = &seq{Sequence: model.Sequence{
		PromptTokens: prompt,
		OutputTokens: maxOut,
		Prefix:       e.hasher.AppendString(nil, e.root, text),
		BlockTokens:  e.blockSize,
	}}
	if e.kvEvents != nil {
		s.prompt = text
	}
	return s, q, 0, ""
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

func (e *Engine) answer(w http.ResponseWriter, r *http.Request, s *seq, chat bool, model string) {
	created := time.Now().Unix()
	for {
		gen, done, failed, gone := e.wait(r, s)
		switch {
		case gone:
			return
		case failed:
			writeError(w, http.StatusServiceUnavailable, ErrStopped.Error())
			return
		case !done:
			continue
		}
		text := strings.Repeat(" tok", gen)
		usage := usageJSON(s.PromptTokens, gen)
		w.Header().Set("Content-Type", "application/json")
		if chat {
			fmt.Fprintf(w, `{"id":"chatcmpl-%d","object":"chat.completion","created":%d,"model":%s,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"length"}],%s}`+"\n",
				s.ID, created, model, text, usage)
		} else {
			fmt.Fprintf(w, `{"id":"cmpl-%d","object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":%q,"finish_reason":"length"}],%s}`+"\n",
				s.ID, created, model, text, usage)
		}
		return
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(msg)
	fmt.Fprintf(w, `{"error":{"message":%s,"type":"invalid_request_error","code":%d}}`+"\n", b, code)
}

// writeErrorInfo answers code with an error as vLLM writes one: its
// message, type (such as "NotFoundError"), the request's field at fault,
// and the status again as the code.
func writeErrorInfo(w http.ResponseWriter, code int, typ, param, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"error":{"message":%s,"type":%s,"param":%s,"code":%d}}`+"\n", jsonString(msg), jsonString(typ), jsonString(param), code)
}

// metrics writes the vLLM-named metrics in the Prometheus text format.
func (e *Engine) metrics(w http.ResponseWriter) {
	st := e.Stats()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	m := fmt.Sprintf(`model_name=%q`, e.model)
	fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{%s} %d\n", m, st.Running)
	fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{%s} %d\n", m, st.Waiting)
	fmt.Fprintf(w, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{%s} %g\n", m, st.KVUsage)
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1\n", e.blockSize, e.kvBlocks)
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.\n# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{%s} %d\n", m, st.PrefixQueries)
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{%s} %d\n", m, st.PrefixHits)
	fmt.Fprintf(w, "# HELP vllm:num_preemptions_total Cumulative number of preemptions.\n# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{%s} %d\n", m, st.Preemptions)
	fmt.Fprintf(w, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter\nvllm:request_success_total{%s,finished_reason=\"length\"} %d\n", m, st.Finished)
}
