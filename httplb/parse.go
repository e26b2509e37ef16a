package httplb

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/token"
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
	// BytesPerToken is the ratio used to estimate prompt tokens from prompt
	// bytes when no token counter is configured: about 4 bytes a token for
	// English text with the common BPE tokenizers. Byte-mode prefix blocks
	// (64 bytes by default) then cover about one 16-token KV block.
	BytesPerToken = 4
)

// maxCount bounds every token count put into an llmlb.Request.
const maxCount = 1<<31 - 1

// ParserConfig configures a Parser. The zero value is valid and selects every
// default; it reads no tenant, so that every request has the empty tenant.
type ParserConfig struct {
	// MaxBodyBytes caps the request body read for parsing; a larger body is
	// refused with [ErrBodyTooLarge]. 0 means [DefaultMaxBodyBytes]; it
	// must not be negative.
	MaxBodyBytes int64
	// SessionHeader names the header whose value is the session key; when
	// it is absent the body's "user" field is used. The session key, scoped
	// by the tenant, becomes Request.AffinityKey and keys the per-session
	// admission cap. "" means [DefaultSessionHeader].
	SessionHeader string
	// Tenant, if set, returns the tenant of a request as established by the
	// caller's authentication, for example from the request's context or
	// from a credential it verifies. The tenant becomes Request.Tenant, salts
	// the prefix hashes, so that tenants never share cache affinity, and
	// scopes the session key, so that equal session keys of different
	// tenants are different sessions. An error refuses the request: Parse
	// closes the body and returns the error wrapped in [ErrUnauthenticated]
	// (a 401 from the proxy's error handler). It is called once per
	// request, before the body is read, and may be called concurrently.
	Tenant func(r *http.Request) (string, error)
	// TrustTenantHeader, if not "", names a request header whose value is
	// taken as the tenant, as Tenant would return it. Anyone who can set
	// this header chooses their tenant, and with it whose prefix affinity
	// they share and whose cached prompts their time to first token reveals,
	// so set it only when every request passes through a component that
	// sets the header (or removes it) before the Parser sees it. "" reads
	// no header. At most one of Tenant and TrustTenantHeader may be set.
	TrustTenantHeader string
	// FeatureHeader, if not "", names a request header whose value labels
	// the kind of request, such as its route, prompt template or agent
	// step, for output-length prediction: it is appended to the
	// Request.Feature the body gives (see [Parser.Parse]), after a "|".
	// Like the body's model and effort, it is the client's word unless a
	// component in front of the Parser sets or removes it; it only changes
	// the output length its requests are charged, learned per tenant and
	// Feature. "" reads no header.
	FeatureHeader string
	// Adapter, if set, returns the LoRA adapter that the body's model name
	// names, or "" for a base model; it becomes Request.Adapter, which
	// llmlb.AdapterAffinity routes on. vLLM serves each adapter under its
	// own model name (--lora-modules name=path), so the usual function
	// returns the model unless it is the base model's name. It is called
	// once per request with a body, and may be called concurrently. nil
	// leaves Request.Adapter empty.
	Adapter func(model string) string
	// Hasher hashes the prompt text into Request.Prefix (byte mode; token
	// mode for prompts given as token IDs). Its block size in tokens must be
	// that of the policy's prefix index. nil means a Hasher with the
	// defaults of package prefix.
	Hasher *prefix.Hasher
	// CountTokens returns the number of tokens of a prompt text, for callers
	// with a tokenizer. nil estimates len(text)/[BytesPerToken], rounded up.
	CountTokens func(text string) int
	// Tokenize, if set, returns the token IDs of a prompt text as the
	// engines see them. The prompt is then hashed in token mode, so that
	// its blocks are those the engines report in their KV events (package
	// kvevents), and its length is its token count. For chat requests it is
	// given the router's rendering of the messages (each message's role and
	// content, each followed by a newline), not the model's chat template:
	// to match the engines' blocks on chat requests it must render the
	// template itself. At most one of Tokenize and CountTokens may be set.
	Tokenize func(text string) []uint32
}

// Parser reads OpenAI-compatible request bodies (/v1/completions,
// /v1/chat/completions, the Responses API's /v1/responses and Anthropic's
// /v1/messages) into an llmlb.Request. It is immutable and safe for
// concurrent use.
type Parser struct {
	maxBody     int64
	session     string
	tenant      func(*http.Request) (string, error) // nil: none
	tenantHdr   string                              // "": none
	scoped      bool                                // a tenant is read: scope session keys
	featureHdr  string                              // "": none
	adapter     func(string) string                 // nil: none
	hasher      *prefix.Hasher
	countTokens func(string) int
	tokenize    func(string) []uint32
	wholeText   bool // a prompt's whole text is needed: CountTokens or Tokenize is set
	headTokens  int  // prompt tokens the hasher reads
}

// NewParser returns a Parser configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func NewParser(cfg ParserConfig) (*Parser, error) {
	p := &Parser{
		maxBody:     cfg.MaxBodyBytes,
		session:     cfg.SessionHeader,
		tenant:      cfg.Tenant,
		tenantHdr:   http.CanonicalHeaderKey(cfg.TrustTenantHeader),
		scoped:      cfg.Tenant != nil || cfg.TrustTenantHeader != "",
		featureHdr:  http.CanonicalHeaderKey(cfg.FeatureHeader),
		adapter:     cfg.Adapter,
		hasher:      cfg.Hasher,
		countTokens: cfg.CountTokens,
		tokenize:    cfg.Tokenize,
		wholeText:   cfg.CountTokens != nil || cfg.Tokenize != nil,
	}
	switch {
	case p.maxBody < 0:
		return nil, configErrorf("MaxBodyBytes %d is negative", p.maxBody)
	case p.maxBody == 0:
		p.maxBody = DefaultMaxBodyBytes
	}
	if p.tenant != nil && p.tenantHdr != "" {
		return nil, configErrorf("both Tenant and TrustTenantHeader are set")
	}
	for _, h := range []struct{ field, name string }{
		{"SessionHeader", cfg.SessionHeader}, {"TrustTenantHeader", cfg.TrustTenantHeader}, {"FeatureHeader", cfg.FeatureHeader},
	} {
		if h.name != "" && !token.Valid(h.name) {
			return nil, configErrorf("%s %q is not a header name", h.field, h.name)
		}
	}
	if p.tokenize != nil && p.countTokens != nil {
		return nil, configErrorf("both Tokenize and CountTokens are set")
	}
	if p.session == "" {
		p.session = DefaultSessionHeader
	}
	if p.hasher == nil {
		h, err := prefix.NewHasher(prefix.HasherConfig{})
		if err != nil {
			return nil, configErrorf("hasher: %v", err)
		}
		p.hasher = h
	}
	blocks := int64(p.hasher.MaxBlocks())
	p.headTokens = int(min(blocks*int64(p.hasher.BlockTokens()), math.MaxInt32))
	return p, nil
}

// Parse reads the body of r and returns what it says about the request:
// prompt tokens (estimated from bytes unless a token counter is configured),
// the output limit (a chat request's max_completion_tokens, else its
// max_tokens; a completion's max_tokens), prefix hashes of the prompt salted
// with the model and tenant, the tenant (see [ParserConfig.Tenant]; none by
// default), the affinity key (the session header, else the body's "user",
// scoped by the tenant when a tenant is read) and the Feature.
//
// The Feature, the kind of request whose output length a balancer with
// llmlb.WithOutputPrediction learns, is the model, then the reasoning
// effort asked for, as "|effort=" and one of none, minimal, low, medium,
// high, xhigh or max (from reasoning_effort, else reasoning.effort, else
// Anthropic's output_config.effort; another value is left out), then
// Anthropic's extended thinking, as "|thinking<=" and its budget_tokens
// rounded up to a power of two, or "|thinking=adaptive", then "|" and the
// value of [ParserConfig.FeatureHeader], if any: for example
// "gpt-oss-120b|effort=high" or "claude-sonnet-4-5|thinking<=16384".
//
// The body is read up to the configured cap and then restored: r.Body reads
// the same bytes again, r.GetBody returns fresh copies of it (for retries),
// and r.ContentLength is set. A body over the cap returns an error wrapping
// [ErrBodyTooLarge]; r.Body is then partly consumed and the request should be
// refused. Any other body, including malformed JSON, an unknown shape or no
// body at all, is not an error: the request is returned with only what the
// headers say, to be routed without prefix or token information. An error
// reading the body is returned as is; an error of [ParserConfig.Tenant] is
// returned wrapped in [ErrUnauthenticated].
//
// For chat requests the prompt text is the concatenation, in order, of each
// message's role and content, so the turns of one conversation share a
// prefix. A system prompt given apart from the messages (Anthropic's
// "system", the Responses API's "instructions") counts as a first system
// message, and the Responses API's "input" as the messages (or, a string, as
// one user message), so that one conversation hashes alike through the three
// APIs.
//
// Parsing takes time linear in the body and memory proportional to the
// prefix hashes and to the prompt text a token counter reads, never to the
// number of messages or prompts. Field names are matched exactly, and the
// last of repeated fields is used.
func (p *Parser) Parse(r *http.Request) (llmlb.Request, error) {
	return p.parse(r, nil)
}

// parse is Parse, also filling info, if not nil, from the body.
func (p *Parser) parse(r *http.Request, info *bodyInfo) (llmlb.Request, error) {
	req, h, err := p.headers(r)
	if err != nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return req, err
	}
	if r.Body == nil || r.Body == http.NoBody {
		return req, nil
	}
	if r.ContentLength > p.maxBody {
		_ = r.Body.Close()
		return req, errBodyTooLarge(p.maxBody)
	}
	body, err := readBody(r, p.maxBody)
	_ = r.Body.Close()
	if err != nil {
		return req, fmt.Errorf("%w: %w", ErrBodyRead, err)
	}
	if err := p.fill(&req, h, body, info); err != nil {
		return req, err
	}
	setBody(r, body)
	return req, nil
}

// headers returns the request as r's headers and [ParserConfig.Tenant]
// describe it, and the values of the session and feature headers, for Parse
// and ParseBody. An error of Tenant is returned wrapped in [ErrUnauthenticated].
func (p *Parser) headers(r *http.Request) (req llmlb.Request, h headerInfo, err error) {
	switch {
	case p.tenant != nil:
		t, err := p.tenant(r)
		if err != nil {
			return req, h, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		req.Tenant = t
	case p.tenantHdr != "":
		req.Tenant = r.Header.Get(p.tenantHdr)
	}
	h.session = r.Header.Get(p.session)
	req.AffinityKey = p.affinityKey(req.Tenant, h.session)
	if p.featureHdr != "" {
		h.label = r.Header.Get(p.featureHdr)
		req.Feature = feature("", nil, h.label)
	}
	return req, h, nil
}

// headerInfo is what the headers of a request say besides what headers puts
// in its llmlb.Request.
type headerInfo struct {
	session string // the session header's value
	label   string // the feature header's value
}

// fill completes req, as headers returned it with h, from body: it refuses a
// body over the cap, and takes the affinity key from the body's "user" when
// no session header gave one. If info is not nil, it is filled too.
func (p *Parser) fill(req *llmlb.Request, h headerInfo, body []byte, info *bodyInfo) error {
	if int64(len(body)) > p.maxBody {
		return errBodyTooLarge(p.maxBody)
	}
	if len(body) == 0 {
		return nil
	}
	user := p.parseBody(body, req, h.label, info)
	if h.session == "" {
		req.AffinityKey = p.affinityKey(req.Tenant, user)
	}
	return nil
}

// affinityKey returns the affinity key of a request of tenant with session
// key key: key itself when the Parser reads no tenant, else key scoped by
// tenant.
func (p *Parser) affinityKey(tenant, key string) string {
	if !p.scoped {
		return key
	}
	return scopeKey(tenant, key)
}

// scopeKey returns key prefixed with tenant, length first, so that distinct
// (tenant, key) pairs never give the same string; "" for no key.
func scopeKey(tenant, key string) string {
	if key == "" {
		return ""
	}
	return strconv.Itoa(len(tenant)) + ":" + tenant + key
}

// admissionKey returns the session of lr for admission caps: its affinity
// key scoped by its tenant, so that one tenant's sessions never count
// against another's. The Parser already scopes the affinity keys it reads
// when it reads a tenant; scoping again here also covers a tenant or key set
// by [Config.Adjust].
func admissionKey(lr *llmlb.Request) string {
	return scopeKey(lr.Tenant, lr.AffinityKey)
}

// readBody reads r.Body up to limit+1 bytes. Its memory follows the bytes
// received, not the length announced: a buffer of r.ContentLength+1 bytes
// when that is at most firstBodyBuffer, else one that grows as the body
// arrives, so that a client announcing a large body and sending little
// makes the server reserve little.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	size := int64(firstBodyBuffer)
	if r.ContentLength > 0 {
		size = min(size, r.ContentLength+1) // +1 reads the EOF without growing
	}
	buf := make([]byte, 0, min(size, limit+1))
	lr := io.LimitReader(r.Body, limit+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grow
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// firstBodyBuffer is the largest buffer readBody allocates before the bytes
// to fill it arrive.
const firstBodyBuffer = 64 << 10

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
