package httplb

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
)

// Defaults of ParserConfig.
const (
	// DefaultMaxBodyBytes caps a request body: 8 MiB, room for a 128k-token
	// prompt in JSON.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultSessionHeader names the header carrying the session (affinity)
	// key.
	DefaultSessionHeader = "X-Session-ID"
	// DefaultTenantHeader names the header carrying the tenant.
	DefaultTenantHeader = "X-Tenant-ID"
	// BytesPerToken is the ratio used to estimate prompt tokens from prompt
	// bytes when no token counter is configured: about 4 bytes a token for
	// English text with the common BPE tokenizers. Byte-mode prefix blocks
	// (64 bytes by default) then cover about one 16-token KV block.
	BytesPerToken = 4
)

// maxCount bounds every token count put into an llmlb.Request.
const maxCount = 1<<31 - 1

// ParserConfig configures a Parser. The zero value is valid and selects every
// default.
type ParserConfig struct {
	// MaxBodyBytes caps the request body read for parsing; a larger body is
	// refused with [ErrBodyTooLarge]. 0 means [DefaultMaxBodyBytes]; it
	// must not be negative.
	MaxBodyBytes int64
	// SessionHeader names the header whose value becomes
	// Request.AffinityKey; when it is absent the body's "user" field is
	// used. "" means [DefaultSessionHeader].
	SessionHeader string
	// TenantHeader names the header whose value becomes Request.Tenant and
	// salts the prefix hashes, so that tenants never share cache affinity.
	// It should be set by the gateway's authentication, not trusted from
	// clients. "" means [DefaultTenantHeader]; "-" reads no tenant.
	TenantHeader string
	// Hasher hashes the prompt text into Request.Prefix (byte mode; token
	// mode for prompts given as token IDs). Its block size in tokens must be
	// that of the policy's prefix index. nil means a Hasher with the
	// defaults of package prefix.
	Hasher *prefix.Hasher
	// CountTokens returns the number of tokens of a prompt text, for callers
	// with a tokenizer. nil estimates len(text)/[BytesPerToken], rounded up.
	CountTokens func(text string) int
}

// Parser reads OpenAI-compatible request bodies (/v1/completions and
// /v1/chat/completions) into an llmlb.Request. It is immutable and safe for
// concurrent use.
type Parser struct {
	maxBody     int64
	session     string
	tenant      string
	hasher      *prefix.Hasher
	countTokens func(string) int
}

// NewParser returns a Parser configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func NewParser(cfg ParserConfig) (*Parser, error) {
	p := &Parser{
		maxBody:     cfg.MaxBodyBytes,
		session:     cfg.SessionHeader,
		tenant:      cfg.TenantHeader,
		hasher:      cfg.Hasher,
		countTokens: cfg.CountTokens,
	}
	switch {
	case p.maxBody < 0:
		return nil, configErrorf("MaxBodyBytes %d is negative", p.maxBody)
	case p.maxBody == 0:
		p.maxBody = DefaultMaxBodyBytes
	}
	if p.session == "" {
		p.session = DefaultSessionHeader
	}
	switch p.tenant {
	case "":
		p.tenant = DefaultTenantHeader
	case "-":
		p.tenant = ""
	}
	if p.hasher == nil {
		h, err := prefix.NewHasher(prefix.HasherConfig{})
		if err != nil {
			return nil, configErrorf("hasher: %v", err)
		}
		p.hasher = h
	}
	return p, nil
}

// Parse reads the body of r and returns what it says about the request:
// prompt tokens (estimated from bytes unless a token counter is configured),
// max_tokens (or max_completion_tokens), prefix hashes of the prompt salted
// with the model and tenant, the affinity key (the session header, else the
// body's "user") and the tenant (the tenant header).
//
// The body is read up to the configured cap and then restored: r.Body reads
// the same bytes again, r.GetBody returns fresh copies of it (for retries),
// and r.ContentLength is set. A body over the cap returns an error wrapping
// [ErrBodyTooLarge]; r.Body is then partly consumed and the request should be
// refused. Any other body, including malformed JSON, an unknown shape or no
// body at all, is not an error: the request is returned with only what the
// headers say, to be routed without prefix or token information. An error
// reading the body is returned as is.
//
// For chat requests the prompt text is the concatenation, in order, of each
// message's role and content, so the turns of one conversation share a prefix.
func (p *Parser) Parse(r *http.Request) (llmlb.Request, error) {
	var req llmlb.Request
	if p.tenant != "" {
		req.Tenant = r.Header.Get(p.tenant)
	}
	req.AffinityKey = r.Header.Get(p.session)
	if r.Body == nil || r.Body == http.NoBody {
		return req, nil
	}
	if r.ContentLength > p.maxBody {
		_ = r.Body.Close()
		return req, errBodyTooLarge(p.maxBody)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, p.maxBody+1))
	_ = r.Body.Close()
	if err != nil {
		return req, err
	}
	if int64(len(body)) > p.maxBody {
		return req, errBodyTooLarge(p.maxBody)
	}
	setBody(r, body)
	p.parseBody(body, &req)
	return req, nil
}

func errBodyTooLarge(limit int64) error {
	return &bodyTooLargeError{limit: limit}
}

type bodyTooLargeError struct{ limit int64 }

func (e *bodyTooLargeError) Error() string {
	return ErrBodyTooLarge.Error() + ": over " + strconv.FormatInt(e.limit, 10) + " bytes"
}

func (e *bodyTooLargeError) Is(target error) bool { return target == ErrBodyTooLarge }

// setBody makes r's body the re-readable body.
func setBody(r *http.Request, body []byte) {
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
		r.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(body)), nil
	}
}

// wireBody is the part of an OpenAI-compatible request body the parser reads.
// Fields whose JSON type varies are kept raw.
type wireBody struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []wireMessage   `json:"messages"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	User                string          `json:"user"`
}

type wireMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

type wirePart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ImageURL json.RawMessage `json:"image_url"`
}

// parseBody fills req from body as far as body allows.
func (p *Parser) parseBody(body []byte, req *llmlb.Request) {
	var w wireBody
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return // not JSON: route without body information
		}
		// A field of an unexpected type was skipped; the rest is usable.
	}
	if req.AffinityKey == "" {
		req.AffinityKey = w.User
	}
	req.MaxTokens = count(w.MaxTokens)
	if req.MaxTokens == 0 {
		req.MaxTokens = count(w.MaxCompletionTokens)
	}
	salt := prefix.Salt{Model: w.Model, Tenant: req.Tenant}
	switch {
	case len(w.Messages) > 0:
		p.fillText(req, salt, chatText(w.Messages))
	case len(w.Prompt) > 0:
		p.fillPrompt(req, salt, w.Prompt)
	}
}

// count reads a token count: a JSON number that is a positive integer within
// range, else 0.
func count(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f <= 0 || f > maxCount {
		return 0
	}
	return int(f)
}

func (p *Parser) fillText(req *llmlb.Request, salt prefix.Salt, text string) {
	if text == "" {
		return
	}
	req.Prefix = p.hasher.HashString(salt, text)
	req.PromptTokens = p.tokens(text)
}

func (p *Parser) tokens(text string) int {
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
func (p *Parser) fillPrompt(req *llmlb.Request, salt prefix.Salt, raw json.RawMessage) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		p.fillText(req, salt, s)
		return
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		p.fillText(req, salt, ss[0])
		total := req.PromptTokens
		for _, s := range ss[1:] {
			total = min(total+p.tokens(s), maxCount)
		}
		req.PromptTokens = total
		return
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		p.fillTokens(req, salt, ids)
		return
	}
	var batch [][]int64
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		p.fillTokens(req, salt, batch[0])
		total := req.PromptTokens
		for _, b := range batch[1:] {
			total = min(total+len(b), maxCount)
		}
		req.PromptTokens = total
	}
}

func (p *Parser) fillTokens(req *llmlb.Request, salt prefix.Salt, ids []int64) {
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
func chatText(msgs []wireMessage) string {
	var b strings.Builder
	for i := range msgs {
		m := &msgs[i]
		b.WriteString(m.Role)
		b.WriteByte('\n')
		writeContent(&b, m.Content)
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			b.Write(m.ToolCalls)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// writeContent writes a message content: a string, or an array of parts
// whose text (or, for images, the raw image reference) is written in order.
func writeContent(b *strings.Builder, raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b.WriteString(s)
		return
	}
	var parts []wirePart
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
