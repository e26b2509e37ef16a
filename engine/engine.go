package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/model"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// Defaults of Config.
const (
	// DefaultModel is the model name served.
	DefaultModel = "emulated"
	// DefaultMaxTokens is the output length of a request that sets no
	// output length (see Config.DefaultMaxTokens).
	DefaultMaxTokens = 128
	// DefaultMaxTokensCap bounds the output length of any request.
	DefaultMaxTokensCap = 4096
	// DefaultMaxBodyBytes caps a request body.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultReadTimeout bounds the time to receive a request's body.
	DefaultReadTimeout = 30 * time.Second
	// DefaultIdleTimeout is how long [Engine.Serve] keeps a keep-alive
	// connection with no request on it when Config.IdleTimeout is 0: two
	// minutes, longer than net/http's DefaultTransport keeps an idle
	// connection (90 seconds), so that a Go client with default settings
	// closes it first and never sends a request on a connection that the
	// engine is closing (see Config.IdleTimeout).
	DefaultIdleTimeout = 2 * time.Minute
	// BytesPerToken is the prompt bytes counted as one token.
	BytesPerToken = 4
	// DefaultTokenBudget is the tokens one iteration processes, prefill
	// chunks and decode tokens together, when Config.TokenBudget is 0.
	DefaultTokenBudget = model.DefaultTokenBudget
	// DefaultMaxRunning is the running batch's size limit when
	// Config.MaxRunning is 0.
	DefaultMaxRunning = model.DefaultMaxRunning
	// DefaultKVBlocks is the KV-cache capacity in blocks when
	// Config.KVBlocks is 0: 8192 blocks of 16 tokens, small enough that
	// eviction of cached prefixes and preemption occur under load.
	DefaultKVBlocks = model.DefaultKVBlocks
	// DefaultBlockSize is the tokens per KV block when Config.BlockSize is
	// 0.
	DefaultBlockSize = model.DefaultBlockSize
)

// minSpeedup bounds Config.Speedup below: at it an iteration may already
// last minutes, and far below it an iteration's time overflows
// time.Duration, so that the engine would not wait at all.
const minSpeedup = 1e-3

// maxModelLen bounds the context length, whatever MaxModelLen and the KV
// cache allow: the model counts a sequence's prompt and output tokens up to
// 2^24 each.
const maxModelLen = 1 << 24

// ErrInvalidConfig: a Config field is out of range.
var ErrInvalidConfig = errors.New("engine: invalid config")

// ErrStopped: the engine's Run has returned; requests in progress fail, new
// ones are refused with 500, as vLLM's are once its engine is dead, and GET
// /health answers 503.
var ErrStopped = errors.New("engine: stopped")

// ErrRunning: Run or Serve was called a second time; an Engine runs once.
var ErrRunning = errors.New("engine: already run")

// Config configures an Engine. The zero value is valid: every zero field is a
// documented default.
type Config struct {
	// TokenBudget is the tokens one iteration processes, prefill chunks
	// and decode tokens together (chunked prefill). 0 means
	// [DefaultTokenBudget].
	TokenBudget int
	// MaxRunning is the maximum number of sequences in the running batch.
	// 0 means [DefaultMaxRunning].
	MaxRunning int
	// KVBlocks is the KV-cache capacity in blocks. 0 means
	// [DefaultKVBlocks].
	KVBlocks int
	// BlockSize is the tokens per KV block, which is also the block size
	// of the KV events. 0 means [DefaultBlockSize].
	BlockSize int
	// Speedup divides every iteration time: 10 runs the model ten times
	// faster than a real GPU would. 0 means 1; it must be finite and at
	// least 0.001 (a thousand times slower than a GPU).
	Speedup float64
	// Model is the model name served and reported; a request naming another
	// gets 404, as from vLLM. "" means [DefaultModel].
	// It must be UTF-8 of printable characters (spaces allowed), which its
	// JSON and Prometheus renderings quote alike.
	Model string
	// DefaultMaxTokens is the output length of a request that sets no
	// output length: a chat request without max_tokens or
	// max_completion_tokens, a responses request without
	// max_output_tokens, or a completions request whose max_tokens is
	// null; or less if its prompt leaves less room in the context (see
	// MaxModelLen). A completions request without max_tokens asks for
	// 16 tokens, as vLLM's does. 0 means [DefaultMaxTokens].
	DefaultMaxTokens int
	// MaxTokensCap bounds every request's output length. 0 means
	// [DefaultMaxTokensCap].
	MaxTokensCap int
	// MaxWaiting, if positive, refuses a request with 429 and Retry-After:
	// 1 when that many requests are already waiting.
	MaxWaiting int
	// RequestsPerMinute, if positive, emulates a managed API's request rate
	// limit: a bucket of RequestsPerMinute requests, refilled continuously
	// at that rate. Every completion answer carries OpenAI's
	// x-ratelimit-limit-requests, x-ratelimit-remaining-requests and
	// x-ratelimit-reset-requests (the time until the bucket is full, as
	// "1.5s"); a request that finds the bucket empty gets 429 with
	// Retry-After, the whole seconds until one request is available.
	RequestsPerMinute int
	// MaxModelLen, if positive, is the model's context length: a request
	// whose prompt and max_tokens exceed it (or exceed the KV cache), or
	// whose prompt alone fills it, gets 400 with vLLM's "maximum context
	// length" message (a completions request without max_tokens asks for
	// 16 tokens); a request that sets no output length generates
	// DefaultMaxTokens, or fewer if that many would not fit, as vLLM
	// generates no more than the context has room for. 0 means the KV
	// cache's size. Either way the context is at most 16,777,216 (2^24)
	// tokens.
	MaxModelLen int
	// MaxBodyBytes caps a request body (413 beyond it). 0 means
	// [DefaultMaxBodyBytes].
	MaxBodyBytes int64
	// ReadTimeout bounds the time to receive a request's body, from the
	// moment its header has been read. A completions or responses request
	// whose body has not all come by then gets 408, and its connection is
	// closed (over HTTP/2, only its stream ends); any other request's body, which
	// the engine does not read, has as long to come before the answer goes
	// out, and the connection is closed after the answer if it has not.
	// It bounds the body only: the header is bounded by [Engine.Serve]'s
	// server (10 seconds), and the answer not at all, so that a stream
	// lasts as long as its tokens take. It takes the read deadlines that
	// net/http's servers give a handler through
	// [net/http.ResponseController]: an Engine served behind a
	// ResponseWriter without them (one that wraps another without an
	// Unwrap method) reads bodies unbounded. 0 means [DefaultReadTimeout].
	ReadTimeout time.Duration
	// IdleTimeout is how long [Engine.Serve]'s server keeps a keep-alive
	// connection open with no request on it; then it closes the
	// connection. vLLM's server closes one after 5 seconds: uvicorn's
	// timeout_keep_alive, which vLLM sets to VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
	// "5" unless set (vllm/envs.py, and serve_http's call in
	// vllm/entrypoints/openai/api_server.py, vLLM main as of 2026);
	// cmd/llmlb-engine serves with that by default. A client that sends a
	// request on a connection just as the server closes it gets an error
	// (EOF or a connection reset) that net/http's Transport retries only
	// for idempotent requests, which completion POSTs are not: a client
	// must keep connections idle for less than this (its
	// [net/http.Transport].IdleConnTimeout) or retry. Setting 5 seconds
	// here shows a client what vLLM will do. 0 means
	// [DefaultIdleTimeout]; it must not be negative.
	IdleTimeout time.Duration
	// ShutdownTimeout is how long [Engine.Serve] drains once its context
	// ends, as vLLM's --shutdown-timeout does on SIGTERM: the engine
	// refuses every new request with 503 (GET /metrics still answers, and
	// GET /health answers 503, as SGLang's does while it drains), closes
	// each connection after its answer, and lets the requests in progress
	// finish for up to ShutdownTimeout; then, or as soon as none is left,
	// it closes every connection and stops. 0 means no drain: Serve closes
	// every connection at once, breaking the streams in progress, as vLLM
	// aborts its requests in progress by default (--shutdown-timeout 0,
	// vllm/v1/engine/core.py, vLLM v0.18.0 and later). It must not be
	// negative.
	ShutdownTimeout time.Duration
	// KVEvents, if set, receives the engine's KV-cache events as vLLM
	// reports them: after every iteration that changed the prefix cache,
	// one batch of BlockStored events (the blocks' hashes, their parent's
	// hash, their token IDs as [Tokens] counts them, the block size,
	// medium "GPU") and BlockRemoved events. Pass a
	// [kvevents.Publisher]'s Publish to publish them over ZMQ as vLLM does.
	// It is called from the goroutine of [Engine.Run], outside the
	// engine's lock, and must not block; it may keep the batch.
	KVEvents func(*kvevents.Batch)
}

// Engine is one emulated inference server. Create one with New; it serves
// HTTP as an [http.Handler] while [Engine.Run] drives its batching loop. It
// is safe for concurrent use.
type Engine struct {
	model     string
	defMax    int
	maxCap    int
	maxWait   int
	rpm       int // RequestsPerMinute
	maxLen    int // MaxModelLen, or the KV cache's size in tokens
	maxBody   int64
	readTime  time.Duration // ReadTimeout
	idleTime  time.Duration // IdleTimeout
	drainTime time.Duration // ShutdownTimeout
	speedup   float64
	blockSize int
	kvBlocks  int
	iterTime  model.IterTimeFunc
	hasher    *prefix.Hasher
	root      uint64
	kvEvents  func(*kvevents.Batch)

	stored responseStore // the Responses API's stored responses; locks itself

	wake     chan struct{} // a request arrived; capacity 1
	ran      atomic.Bool   // Run was called
	draining atomic.Bool   // Serve's context has ended: new requests are refused

	hmu      sync.Mutex // protects handlers
	handlers int        // ServeHTTP calls in progress
	hidle    sync.Cond  // signalled when handlers drops to 0

	mu      sync.Mutex // protects everything below
	rep     *model.Replica
	seqs    map[int]*seq // submitted and not yet finished, cancelled or failed
	nextID  int
	stopped bool
	stats   Stats
	bucket  float64   // requests available under RequestsPerMinute
	filled  time.Time // when bucket was last refilled
	// blocks and pending serve Config.KVEvents: the prompt blocks of
	// requests in progress and of the prefix cache, and the events of the
	// current iteration.
	blocks  map[uint64]*blockInfo
	pending []kvevents.Event
}

// Stats is a snapshot of an engine's state and counters.
type Stats struct {
	// Running and Waiting are the requests in the batch and in the queue.
	Running, Waiting int
	// KVUsage is the fraction of KV blocks held by running requests.
	KVUsage float64
	// PrefixQueries and PrefixHits count prompt tokens looked up in the
	// prefix cache and found there, at each request's first admission.
	PrefixQueries, PrefixHits int64
	// Preemptions counts requests preempted to free KV blocks.
	Preemptions int64
	// Finished counts requests that generated all their tokens; Cancelled
	// those abandoned by their client before that.
	Finished, Cancelled int64
	// Refused counts requests answered 429 because MaxWaiting requests
	// were waiting; RateLimited those answered 429 by RequestsPerMinute.
	Refused, RateLimited int64
}

// New returns an engine configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func New(cfg Config) (*Engine, error) {
	rep, err := model.NewReplica(model.Engine{
		TokenBudget: cfg.TokenBudget,
		MaxRunning:  cfg.MaxRunning,
		KVBlocks:    cfg.KVBlocks,
		BlockSize:   cfg.BlockSize,
	})
	if err != nil {
		// The model's errors carry the simulator's prefix; keep the detail.
		detail := strings.TrimPrefix(err.Error(), model.ErrInvalidConfig.Error()+": ")
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, detail)
	}
	eng := rep.Engine()
	speed := cfg.Speedup
	if speed == 0 {
		speed = 1
	}
	if math.IsNaN(speed) || math.IsInf(speed, 0) || speed < minSpeedup {
		return nil, fmt.Errorf("%w: Speedup %v must be finite and at least %g", ErrInvalidConfig, cfg.Speedup, minSpeedup)
	}
	if !utf8.ValidString(cfg.Model) || strings.IndexFunc(cfg.Model, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return nil, fmt.Errorf("%w: Model %q must be printable UTF-8", ErrInvalidConfig, cfg.Model)
	}
	for _, f := range []struct {
		name  string
		value int64
	}{
		{"DefaultMaxTokens", int64(cfg.DefaultMaxTokens)},
		{"MaxTokensCap", int64(cfg.MaxTokensCap)},
		{"MaxWaiting", int64(cfg.MaxWaiting)},
		{"MaxBodyBytes", cfg.MaxBodyBytes},
		{"RequestsPerMinute", int64(cfg.RequestsPerMinute)},
		{"MaxModelLen", int64(cfg.MaxModelLen)},
	} {
		if f.value < 0 {
			return nil, fmt.Errorf("%w: %s %d is negative", ErrInvalidConfig, f.name, f.value)
		}
	}
	if cfg.ReadTimeout < 0 {
		return nil, fmt.Errorf("%w: ReadTimeout %v is negative", ErrInvalidConfig, cfg.ReadTimeout)
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("%w: IdleTimeout %v is negative", ErrInvalidConfig, cfg.IdleTimeout)
	}
	if cfg.ShutdownTimeout < 0 {
		return nil, fmt.Errorf("%w: ShutdownTimeout %v is negative", ErrInvalidConfig, cfg.ShutdownTimeout)
	}
	h, err := prefix.NewHasher(prefix.HasherConfig{
		BlockTokens: eng.BlockSize,
		BlockBytes:  eng.BlockSize * BytesPerToken,
		MaxTokens:   max(prefix.DefaultMaxTokens, eng.BlockSize),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	e := &Engine{
		model:     cfg.Model,
		defMax:    cfg.DefaultMaxTokens,
		maxCap:    cfg.MaxTokensCap,
		maxWait:   cfg.MaxWaiting,
		rpm:       cfg.RequestsPerMinute,
		bucket:    float64(cfg.RequestsPerMinute),
		maxLen:    cfg.MaxModelLen,
		maxBody:   cfg.MaxBodyBytes,
		readTime:  cfg.ReadTimeout,
		idleTime:  cfg.IdleTimeout,
		drainTime: cfg.ShutdownTimeout,
		speedup:   speed,
		blockSize: eng.BlockSize,
		kvBlocks:  eng.KVBlocks,
		iterTime:  eng.IterTime,
		hasher:    h,
		wake:      make(chan struct{}, 1),
		rep:       rep,
		seqs:      make(map[int]*seq),
		kvEvents:  cfg.KVEvents,
	}
	if e.kvEvents != nil {
		e.blocks = make(map[uint64]*blockInfo)
		rep.SetKVEventHandler(e.onKVEvent)
	}
	if e.model == "" {
		e.model = DefaultModel
	}
	if e.defMax == 0 {
		e.defMax = DefaultMaxTokens
	}
	if e.maxCap == 0 {
		e.maxCap = DefaultMaxTokensCap
	}
	e.defMax = min(e.defMax, e.maxCap)
	if e.maxBody == 0 {
		e.maxBody = DefaultMaxBodyBytes
	}
	if e.readTime == 0 {
		e.readTime = DefaultReadTimeout
	}
	if e.idleTime == 0 {
		e.idleTime = DefaultIdleTimeout
	}
	if kv := eng.KVBlocks * eng.BlockSize; e.maxLen == 0 || e.maxLen > kv {
		e.maxLen = kv
	}
	e.maxLen = min(e.maxLen, maxModelLen)
	e.root = h.Root(prefix.Salt{Model: e.model})
	e.hidle.L = &e.hmu
	return e, nil
}

// Model returns the model name the engine serves.
func (e *Engine) Model() string { return e.model }

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	rs := e.rep.Stats()
	s.Running, s.Waiting = rs.Running, rs.Waiting
	s.KVUsage = float64(rs.KVUsed) / float64(rs.KVTotal)
	s.PrefixQueries, s.PrefixHits = rs.PrefixQueries, rs.PrefixHits
	s.Preemptions = rs.Preemptions
	return s
}

// seq is one request inside the engine: the replica's sequence plus its
// client's state. Its fields are protected by the engine's mu, except notify.
type seq struct {
	model.Sequence
	cancelled bool
	failed    bool
	notify    chan struct{} // capacity 1: something changed
	prompt    string        // the prompt text, until submitted
	tracked   bool          // its blocks are tracked for KV events
}

func (s *seq) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// submit queues a request. It fails with ErrStopped after Run has returned,
// and with errQueueFull when MaxWaiting requests are waiting.
func (e *Engine) submit(s *seq) error {
	e.mu.Lock()
	switch {
	case e.stopped:
		e.mu.Unlock()
		return ErrStopped
	case e.maxWait > 0 && e.rep.Stats().Waiting >= e.maxWait:
		e.stats.Refused++
		e.mu.Unlock()
		return errQueueFull
	}
	e.nextID++
	s.ID = e.nextID
	s.notify = make(chan struct{}, 1)
	if err := e.rep.Submit(&s.Sequence); err != nil {
		e.mu.Unlock()
		return fmt.Errorf("engine: %w", err)
	}
	e.seqs[s.ID] = s
	e.track(s, s.prompt)
	s.prompt = ""
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

var errQueueFull = errors.New("engine: queue full")

// rateLimit takes one request from the RequestsPerMinute bucket at now. It
// reports whether there was one, what remains, the time until the bucket is
// full, and, if there was none, the time until there is one.
func (e *Engine) rateLimit(now time.Time) (ok bool, remaining int, reset, retryAfter time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	perSec := float64(e.rpm) / 60
	if !e.filled.IsZero() {
		e.bucket = min(float64(e.rpm), e.bucket+now.Sub(e.filled).Seconds()*perSec)
	}
	e.filled = now
	if e.bucket >= 1 {
		e.bucket--
		ok = true
	} else {
		e.stats.RateLimited++
		retryAfter = time.Duration((1 - e.bucket) / perSec * float64(time.Second))
	}
	reset = time.Duration((float64(e.rpm) - e.bucket) / perSec * float64(time.Second))
	return ok, int(e.bucket), reset, retryAfter
}

// cancel abandons s: it leaves the queue or the batch at once and frees its
// KV blocks.
func (e *Engine) cancel(s *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.Done() || s.cancelled || s.failed {
		return
	}
	s.cancelled = true
	e.stats.Cancelled++
	e.rep.Cancel(&s.Sequence)
	delete(e.seqs, s.ID)
	e.untrack(s)
}

// Run drives the batching loop until ctx is done, then fails the requests in
// progress, refuses new ones, and returns ctx's error. An engine runs once:
// a second call returns an error at once.
func (e *Engine) Run(ctx context.Context) error {
	if !e.ran.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run called twice", ErrRunning)
	}
	return e.run(ctx)
}

// run is Run once the engine has been claimed.
func (e *Engine) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer e.stop()
	for {
		e.mu.Lock()
		b, ok := e.rep.Plan()
		e.mu.Unlock()
		if !ok {
			select {
			case <-e.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		d := time.Duration(float64(e.iterTime(b)) / e.speedup)
		if d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return ctx.Err()
			}
		}
		e.mu.Lock()
		e.finish()
		e.mu.Unlock()
		e.flushKVEvents()
	}
}

// finish completes an iteration and wakes the requests that emitted a token.
func (e *Engine) finish() {
	for _, q := range e.rep.Finish() {
		s := e.seqs[q.ID]
		if q.Done() {
			e.stats.Finished++
			delete(e.seqs, q.ID)
			e.untrack(s)
		}
		s.signal()
	}
}

// stop fails every request in progress, newest first (so that each leaves
// the end of the queue).
func (e *Engine) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	live := make([]*seq, 0, len(e.seqs))
	for _, s := range e.seqs {
		live = append(live, s)
	}
	slices.SortFunc(live, func(a, b *seq) int { return b.ID - a.ID })
	for _, s := range live {
		e.rep.Cancel(&s.Sequence)
		s.failed = true
		e.untrack(s)
		s.signal()
	}
	clear(e.seqs)
}
