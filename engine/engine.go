package engine

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/sim"
)

// Defaults of Config.
const (
	// DefaultModel is the model name served.
	DefaultModel = "emulated"
	// DefaultMaxTokens is the output length of a request without
	// max_tokens.
	DefaultMaxTokens = 128
	// DefaultMaxTokensCap bounds the output length of any request.
	DefaultMaxTokensCap = 4096
	// DefaultMaxBodyBytes caps a request body.
	DefaultMaxBodyBytes = 8 << 20
	// BytesPerToken is the prompt bytes counted as one token.
	BytesPerToken = 4
)

// ErrInvalidConfig: a Config field is out of range.
var ErrInvalidConfig = errors.New("engine: invalid config")

// ErrStopped: the engine's Run has returned; requests in progress fail and
// new ones are refused with 503.
var ErrStopped = errors.New("engine: stopped")

// Config configures an Engine. The zero value is valid: every zero field is a
// documented default.
type Config struct {
	// Engine holds the batching parameters (token budget, batch limit, KV
	// blocks, block size) and the iteration-time model; its zero value is
	// the simulator's default replica.
	Engine sim.Engine
	// Speedup divides every iteration time: 10 runs the model ten times
	// faster than a real GPU would. 0 means 1; it must be positive and
	// finite.
	Speedup float64
	// Model is the model name served and reported. "" means [DefaultModel].
	Model string
	// DefaultMaxTokens is the output length of a request that sets no
	// max_tokens. 0 means [DefaultMaxTokens].
	DefaultMaxTokens int
	// MaxTokensCap bounds every request's output length. 0 means
	// [DefaultMaxTokensCap].
	MaxTokensCap int
	// MaxWaiting, if positive, refuses a request with 429 and Retry-After:
	// 1 when that many requests are already waiting.
	MaxWaiting int
	// MaxBodyBytes caps a request body (413 beyond it). 0 means
	// [DefaultMaxBodyBytes].
	MaxBodyBytes int64
}

// Engine is one emulated inference server. Create one with New; it serves
// HTTP as an [http.Handler] while [Engine.Run] drives its batching loop.
type Engine struct {
	model     string
	defMax    int
	maxCap    int
	maxWait   int
	maxBody   int64
	speedup   float64
	budget    int
	maxRun    int
	blockSize int
	iterTime  sim.IterTimeFunc
	hasher    *prefix.Hasher
	root      uint64

	wake chan struct{} // a request arrived; capacity 1
	ran  atomic.Bool   // Run was called

	hmu      sync.Mutex // protects handlers
	handlers int        // ServeHTTP calls in progress
	hidle    sync.Cond  // signalled when handlers drops to 0

	mu      sync.Mutex // protects everything below
	kv      kvPool
	waiting []*seq
	running []*seq
	nextID  uint64
	stopped bool
	stats   Stats
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
	// were waiting.
	Refused int64
}

// New returns an engine configured by cfg, or an error wrapping
// [ErrInvalidConfig].
func New(cfg Config) (*Engine, error) {
	eng := cfg.Engine
	if eng.TokenBudget == 0 {
		eng.TokenBudget = sim.DefaultTokenBudget
	}
	if eng.MaxRunning == 0 {
		eng.MaxRunning = sim.DefaultMaxRunning
	}
	if eng.KVBlocks == 0 {
		eng.KVBlocks = sim.DefaultKVBlocks
	}
	if eng.BlockSize == 0 {
		eng.BlockSize = sim.DefaultBlockSize
	}
	if eng.IterTime == nil {
		eng.IterTime = sim.MockerIterTime
	}
	speed := cfg.Speedup
	if speed == 0 {
		speed = 1
	}
	switch {
	case eng.TokenBudget < 1 || eng.MaxRunning < 1 || eng.KVBlocks < 1 || eng.BlockSize < 1:
		return nil, fmt.Errorf("%w: token budget, batch limit, KV blocks and block size must be positive", ErrInvalidConfig)
	case eng.BlockSize > 1<<16 || eng.KVBlocks > 1<<26:
		return nil, fmt.Errorf("%w: block size %d or KV blocks %d too large", ErrInvalidConfig, eng.BlockSize, eng.KVBlocks)
	case math.IsNaN(speed) || math.IsInf(speed, 0) || speed <= 0:
		return nil, fmt.Errorf("%w: Speedup %v must be positive and finite", ErrInvalidConfig, cfg.Speedup)
	case cfg.DefaultMaxTokens < 0 || cfg.MaxTokensCap < 0 || cfg.MaxWaiting < 0 || cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: negative DefaultMaxTokens, MaxTokensCap, MaxWaiting or MaxBodyBytes", ErrInvalidConfig)
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
		maxBody:   cfg.MaxBodyBytes,
		speedup:   speed,
		budget:    eng.TokenBudget,
		maxRun:    eng.MaxRunning,
		blockSize: eng.BlockSize,
		iterTime:  eng.IterTime,
		hasher:    h,
		wake:      make(chan struct{}, 1),
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
	e.root = h.Root(prefix.Salt{Model: e.model})
	e.hidle.L = &e.hmu
	e.kv.init(eng.KVBlocks)
	return e, nil
}

// Model returns the model name the engine serves.
func (e *Engine) Model() string { return e.model }

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Running = len(e.running)
	s.Waiting = len(e.waiting)
	s.KVUsage = e.kv.usage()
	return s
}

// seq is one request inside the engine. Its fields are protected by the
// engine's mu, except notify.
type seq struct {
	id        uint64
	prompt    int      // prompt tokens
	blocks    []uint64 // chained hashes of the prompt's full blocks
	maxOut    int      // tokens to generate
	target    int      // tokens to compute before the next token: prompt (+ output after a preemption)
	computed  int      // tokens of target computed
	decoded   int      // tokens decoded since the last prefill
	generated int      // tokens emitted
	private   int      // KV blocks held privately
	held      []*entry // prefix-cache blocks referenced
	chunk     int      // tokens scheduled in the current iteration
	admitted  bool
	cancelled bool
	done      bool
	failed    bool
	notify    chan struct{} // capacity 1: something changed
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
	case e.maxWait > 0 && len(e.waiting) >= e.maxWait:
		e.stats.Refused++
		e.mu.Unlock()
		return errQueueFull
	}
	e.nextID++
	s.id = e.nextID
	s.target = s.prompt
	s.notify = make(chan struct{}, 1)
	e.waiting = append(e.waiting, s)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

var errQueueFull = errors.New("engine: queue full")

// cancel abandons s: a waiting request leaves the queue at once, a running
// one at the end of the current iteration.
func (e *Engine) cancel(s *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.done || s.cancelled || s.failed {
		return
	}
	s.cancelled = true
	e.stats.Cancelled++
	for i, w := range e.waiting {
		if w == s {
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			e.release(s)
			return
		}
	}
}

// Run drives the batching loop until ctx is done, then fails the requests in
// progress, refuses new ones, and returns ctx's error. An engine runs once:
// a second call returns an error at once.
func (e *Engine) Run(ctx context.Context) error {
	if !e.ran.CompareAndSwap(false, true) {
		return errors.New("engine: Run called twice")
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer e.stop()
	for {
		e.mu.Lock()
		b, ok := e.plan()
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
	}
}

func (e *Engine) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	for _, list := range [][]*seq{e.running, e.waiting} {
		for _, s := range list {
			e.release(s)
			s.failed = true
			s.signal()
		}
	}
	e.running, e.waiting = nil, nil
}

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.blockSize - 1) / e.blockSize
}

// plan schedules the next iteration and returns its batch, or false if there
// is nothing to do.
func (e *Engine) plan() (sim.Batch, bool) {
	budget := e.budget
	var b sim.Batch
	preempted := false
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		s.chunk = 0
		if budget == 0 || s.cancelled {
			continue
		}
		n := 1
		if s.computed < s.target {
			n = min(s.target-s.computed, budget)
		}
		need := e.blocksFor(s.computed+s.decoded+n) - s.private - len(s.held)
		victim := false
		for !e.kv.alloc(need) {
			last := len(e.running) - 1
			v := e.running[last]
			e.running = e.running[:last]
			e.preempt(v)
			preempted = true
			if v == s {
				victim = true
				break
			}
		}
		if victim {
			break
		}
		s.private += max(need, 0)
		s.chunk = n
		budget -= n
		if s.computed < s.target {
			b.PrefillTokens += n
		} else {
			b.DecodeSeqs++
		}
	}
	for !preempted && budget > 0 && len(e.waiting) > 0 && len(e.running) < e.maxRun {
		s := e.waiting[0]
		e.match(s)
		n := min(s.target-s.computed, budget)
		need := e.blocksFor(s.computed+n) - len(s.held)
		if !e.kv.alloc(need) {
			e.release(s)
			break
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		if !s.admitted {
			s.admitted = true
			e.stats.PrefixQueries += int64(s.prompt)
			e.stats.PrefixHits += int64(s.computed)
		}
		s.private = need
		s.chunk = n
		e.running = append(e.running, s)
		budget -= n
		b.PrefillTokens += n
	}
	b.KVUsage = e.kv.usage()
	return b, b.PrefillTokens+b.DecodeSeqs > 0
}

// match references the cached head of s's prompt and counts it computed,
// leaving at least one prompt token to compute.
func (e *Engine) match(s *seq) {
	limit := min(len(s.blocks), (s.target-1)/e.blockSize)
	for i := len(s.held); i < limit; i++ {
		en := e.kv.lookup(s.blocks[i])
		if en == nil {
			break
		}
		e.kv.acquire(en)
		s.held = append(s.held, en)
	}
	s.computed = len(s.held) * e.blockSize
}

// release frees every KV block of s and resets its progress.
func (e *Engine) release(s *seq) {
	for i := len(s.held) - 1; i >= 0; i-- {
		e.kv.unref(s.held[i])
		s.held[i] = nil
	}
	s.held = s.held[:0]
	e.kv.free(s.private)
	s.private, s.computed, s.decoded, s.chunk = 0, 0, 0, 0
}

// preempt frees s's blocks and puts it back at the head of the queue; it
// will recompute its prompt and the output generated so far.
func (e *Engine) preempt(s *seq) {
	e.release(s)
	s.target = s.prompt + s.generated
	e.stats.Preemptions++
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = s
}

// finish completes an iteration: prefill chunks advance, finished prefills
// publish their prompt blocks to the prefix cache and emit a token, decoding
// sequences emit a token, and finished or cancelled requests leave.
func (e *Engine) finish() {
	keep := e.running[:0]
	for _, s := range e.running {
		if s.cancelled {
			e.release(s)
			continue
		}
		if s.chunk > 0 {
			if s.computed < s.target {
				s.computed += s.chunk
				if s.computed == s.target {
					e.publish(s)
					e.emit(s)
				}
			} else {
				s.decoded++
				e.emit(s)
			}
			s.chunk = 0
		}
		if !s.done {
			keep = append(keep, s)
		}
	}
	clear(e.running[len(keep):])
	e.running = keep
}

// publish moves the full prompt blocks of s beyond its cached head into the
// prefix cache, sharing an entry another request published meanwhile.
func (e *Engine) publish(s *seq) {
	full := min(len(s.blocks), s.prompt/e.blockSize)
	for i := len(s.held); i < full; i++ {
		h := s.blocks[i]
		en := e.kv.lookup(h)
		if en != nil {
			e.kv.acquire(en)
			e.kv.free(1)
		} else {
			en = e.kv.insert(h)
		}
		s.private--
		s.held = append(s.held, en)
	}
}

func (e *Engine) emit(s *seq) {
	s.generated++
	if s.generated >= s.maxOut {
		e.release(s)
		s.done = true
		e.stats.Finished++
	}
	s.signal()
}

// kvPool counts KV blocks: blocks held privately by sequences plus the
// prefix-cache entries, which stay allocated after their last user leaves
// and are evicted least recently used first when blocks run out.
type kvPool struct {
	total, used int
	entries     map[uint64]*entry
	lru         list.List // entries no sequence references, oldest first
}

type entry struct {
	hash uint64
	refs int
	elem *list.Element // in lru while refs == 0
}

func (p *kvPool) init(total int) {
	p.total = total
	p.entries = make(map[uint64]*entry)
	p.lru.Init()
}

// usage is the fraction of blocks referenced by sequences.
func (p *kvPool) usage() float64 {
	return float64(p.used-p.lru.Len()) / float64(p.total)
}

func (p *kvPool) alloc(n int) bool {
	if n <= 0 {
		return true
	}
	for p.total-p.used < n && p.lru.Len() > 0 {
		en := p.lru.Remove(p.lru.Front()).(*entry)
		delete(p.entries, en.hash)
		p.used--
	}
	if p.total-p.used < n {
		return false
	}
	p.used += n
	return true
}

func (p *kvPool) free(n int) { p.used -= n }

func (p *kvPool) lookup(h uint64) *entry { return p.entries[h] }

func (p *kvPool) acquire(en *entry) {
	if en.refs == 0 && en.elem != nil {
		p.lru.Remove(en.elem)
		en.elem = nil
	}
	en.refs++
}

func (p *kvPool) unref(en *entry) {
	en.refs--
	if en.refs == 0 {
		en.elem = p.lru.PushBack(en)
	}
}

// insert adds a cache entry for a block the caller already holds privately
// (the block moves to the cache; used is unchanged), referenced once.
func (p *kvPool) insert(h uint64) *entry {
	en := &entry{hash: h, refs: 1}
	p.entries[h] = en
	return en
}
