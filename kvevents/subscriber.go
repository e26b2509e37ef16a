package kvevents

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/prefix"
)

// Defaults of [Config].
const (
	// DefaultMaxBlocks is the default bound of the per-endpoint map from
	// engine block hash to router block hash: the default capacity of an
	// index endpoint. Size it from the engine's KV-cache block count.
	DefaultMaxBlocks = prefix.DefaultCapacity
	// DefaultMinBackoff and DefaultMaxBackoff bound the jittered,
	// exponentially growing wait between two connection attempts to an
	// endpoint.
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
	// DefaultReplayTimeout bounds one replay request.
	DefaultReplayTimeout = 2 * time.Second
	// maxMaxBlocks is the largest MaxBlocks accepted.
	maxMaxBlocks = prefix.MaxCapacity
)

// ErrInvalidConfig: a [Config] or [PublisherConfig] field is missing or out
// of range.
var ErrInvalidConfig = errors.New("kvevents: invalid config")

// ErrRunning: Run was called while another call of Run on the same
// Subscriber or Publisher is running.
var ErrRunning = errors.New("kvevents: already running")

// Config configures a [Subscriber], and the indexing of an [Applier]. A
// Subscriber requires Index and Hasher, or Forward instead of them; every
// other zero field selects its documented default.
type Config struct {
	// Index receives the events, under each endpoint's key. An index made
	// for them alone ([prefix.IndexConfig.EventsOnly]) can be passed to
	// llmlb.DefaultConfig.Events.
	Index *prefix.Index
	// Hasher is the router's hasher, in token mode: a stored block is
	// indexed under the hash Hasher.AppendTokens gives its tokens, chained
	// from its parent's (or from the endpoint salt's root), so that a
	// prompt hashed by the router for a request matches it. Its
	// BlockTokens must equal the Index's block size and the engines' block
	// size; events of another block size are counted in
	// [Stats].Mismatched and not indexed.
	Hasher *prefix.Hasher
	// MaxBlocks bounds, per endpoint, the map from engine block hash to
	// router block hash (about 100 bytes an entry), least recently used
	// first. A stored block whose parent is no longer in it is not
	// indexed, and a block that falls out of it is removed from the index,
	// since the engine's BlockRemoved for it could no longer be applied.
	// It also bounds the count of blocks cached more than once that are
	// followed (as many entries again, at most). Size it at least to the
	// engine's KV-cache block count. Zero means
	// [DefaultMaxBlocks].
	MaxBlocks int
	// MinBackoff and MaxBackoff bound the wait before reconnecting to an
	// endpoint: it starts at MinBackoff, doubles after every failed
	// attempt up to MaxBackoff, and is drawn uniformly from its upper half,
	// so that routers restarting together do not reconnect in step. Zero
	// means [DefaultMinBackoff] and [DefaultMaxBackoff].
	MinBackoff, MaxBackoff time.Duration
	// ReplayTimeout bounds one replay request, the connection to the
	// replay socket included. Zero means [DefaultReplayTimeout].
	ReplayTimeout time.Duration
	// Rand is the source of the jitter of reconnections. Nil means a
	// randomly seeded source. The subscriber serializes its calls.
	Rand rand.Source
	// OnError, if set, is called with the endpoint's key for every
	// connection failure, malformed batch and failed replay, from the
	// endpoint's goroutine; it must not block. Nil ignores them (they are
	// counted in [Stats]).
	OnError func(key string, err error)
	// Forward, if set, makes a Subscriber pass each endpoint's batches on
	// instead of indexing them: Index, Hasher and MaxBlocks must then be
	// zero. It is called from each endpoint's goroutine (so concurrently
	// for different endpoints) with every batch the Subscriber would
	// apply, in sequence order (replayed batches included) and already
	// checked to decode; and with seq -1 and a nil
	// payload wherever the Subscriber would drop the endpoint's blocks: a
	// gap replay cannot fill, an engine restart, a malformed batch, an
	// endpoint no longer followed, Run returning. payload is valid only
	// during the call. An [Applier]'s Apply, on this router or, through a
	// relay such as package share's, on others, indexes what it forwards.
	// An Applier does not use Forward.
	Forward func(key string, seq int64, payload []byte)
}

// Endpoint is where one engine publishes its KV events.
type Endpoint struct {
	// PubAddr is the engine's PUB socket, such as "tcp://10.0.0.7:5557".
	PubAddr string
	// ReplayAddr is the engine's replay (ROUTER) socket, such as
	// "tcp://10.0.0.7:5558". Empty means the engine has none: batches
	// missed are then never recovered, and the endpoint's blocks are
	// cleared instead, on every gap and on every new connection (the
	// engine may have restarted meanwhile) unless the topic carries the
	// engine's epoch, as SGLang's does with a snapshot endpoint.
	ReplayAddr string
	// Topic is the topic subscribed to, matched as a prefix of each
	// message's topic as ZMQ does; "" receives every topic.
	Topic string
	// Salt is the salt the router hashes this engine's prompts with: the
	// model, and the tenant if the engine serves a single tenant under
	// tenant isolation. The Adapter and Namespace fields are taken from
	// each event instead: its LoRA adapter and its cache salt ([Event]).
	Salt prefix.Salt
}

// Stats counts what a subscription did.
type Stats struct {
	// Connected reports whether the subscription is connected now.
	Connected bool
	// Seq is the sequence number of the last batch applied, or -1.
	Seq int64
	// Batches counts batches applied, replayed ones included.
	Batches int64
	// Stored and Removed count blocks added to and removed from the index.
	Stored, Removed int64
	// Skipped counts stored blocks not indexed: parent unknown (stored
	// before the subscription began, or evicted from the MaxBlocks map),
	// salted hashes (see [Event].Salted), an event_version newer than
	// this package knows, token IDs that do not fill the blocks, blocks
	// deeper in their chain than the Hasher's MaxBlocks (which no prompt
	// the router hashes reaches, whether stored by one event or by events
	// continuing a chain), or another block size; Mismatched counts
	// those of the last kind alone, a misconfiguration. Blocks of a
	// KV-cache group other than a full-attention one, outside GPU memory
	// or remote are not counted: they are not the engine's prefix cache.
	Skipped, Mismatched int64
	// Gaps counts missed batches detected; Replayed counts batches
	// recovered by replay.
	Gaps, Replayed int64
	// Resets counts the times the endpoint's blocks were cleared: the
	// engine's AllBlocksCleared, an engine restart (its sequence numbers
	// went back, or its epoch changed), a gap replay could not fill, a new
	// connection to an engine without a replay socket or an epoch, or a
	// malformed batch. A restart counts once, even when the replay after
	// it fails too.
	Resets int64
	// Malformed counts messages that could not be decoded.
	Malformed int64
	// Unknown counts events of a class this package does not know (a
	// newer engine's), or of no class, dropped while the rest of their
	// batch was applied, and BlockStored events of an event_version newer
	// than it knows, whose blocks are not indexed. With [Config].Forward
	// they are counted as their batch is forwarded.
	Unknown int64
	// Connects counts successful connections.
	Connects int64
}

// counters are the live counters behind Stats.
type counters struct {
	connected                          atomic.Bool
	seq                                atomic.Int64
	batches, stored, removed           atomic.Int64
	skipped, mismatched                atomic.Int64
	gaps, replayed, cleared, malformed atomic.Int64
	unknown                            atomic.Int64
	connects                           atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Connected: c.connected.Load(), Seq: c.seq.Load(),
		Batches: c.batches.Load(), Stored: c.stored.Load(), Removed: c.removed.Load(),
		Skipped: c.skipped.Load(), Mismatched: c.mismatched.Load(),
		Gaps: c.gaps.Load(), Replayed: c.replayed.Load(), Resets: c.cleared.Load(),
		Malformed: c.malformed.Load(), Unknown: c.unknown.Load(), Connects: c.connects.Load(),
	}
}

// Subscriber subscribes to the KV event streams of a set of engines and
// applies them to a [prefix.Index], one subscription per endpoint.
//
// [Subscriber.SetEndpoints] sets the endpoints, typically whenever the
// balancer's membership changes; [Subscriber.Run] runs the subscriptions
// until its context ends. An endpoint removed from the set, or whose
// Endpoint changes, has its subscription stopped and its blocks dropped from
// the index ([prefix.Index.RemoveEndpoint]), so the index never holds
// blocks no subscription keeps current; for the same reason, every
// endpoint's blocks are dropped when Run returns.
//
// SetEndpoints and Stats are safe for concurrent use, with each other and
// with Run. Creating a Subscriber starts nothing. The zero Subscriber is not
// usable; create one with [NewSubscriber].
type Subscriber struct {
	cfg Config

	rmu sync.Mutex // protects rnd
	rnd *rand.Rand

	changed chan struct{} // SetEndpoints was called; capacity 1
	running atomic.Bool

	mu      sync.Mutex // protects the fields below
	want    map[string]Endpoint
	workers map[string]*worker
}

// NewSubscriber returns a Subscriber for cfg, or an error wrapping
// [ErrInvalidConfig].
func NewSubscriber(cfg Config) (*Subscriber, error) {
	if cfg.Forward != nil {
		if cfg.Index != nil || cfg.Hasher != nil || cfg.MaxBlocks != 0 {
			return nil, fmt.Errorf("%w: Forward with an Index, Hasher or MaxBlocks", ErrInvalidConfig)
		}
	} else if err := checkIndex(&cfg); err != nil {
		return nil, err
	}
	if cfg.MinBackoff < 0 || cfg.MaxBackoff < 0 || cfg.ReplayTimeout < 0 {
		return nil, fmt.Errorf("%w: negative duration", ErrInvalidConfig)
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		return nil, fmt.Errorf("%w: MaxBackoff %v below MinBackoff %v", ErrInvalidConfig, cfg.MaxBackoff, cfg.MinBackoff)
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	src := cfg.Rand
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	rnd := rand.New(src)
	return &Subscriber{
		cfg:     cfg,
		rnd:     rnd,
		changed: make(chan struct{}, 1),
		want:    make(map[string]Endpoint),
		workers: make(map[string]*worker),
	}, nil
}

// SetEndpoints replaces the set of endpoints subscribed to, keyed by the
// endpoint keys the index and the balancer use. Subscriptions whose key
// and Endpoint are unchanged continue undisturbed. It returns an error
// wrapping [ErrInvalidConfig], changing nothing, if a key is empty or an
// Endpoint has no PubAddr, or an address no connection could use: one
// that is not tcp://host:port, ipc://path or inproc://name.
func (s *Subscriber) SetEndpoints(eps map[string]Endpoint) error {
	for k, ep := range eps {
		if k == "" || ep.PubAddr == "" {
			return fmt.Errorf("%w: endpoint %q: empty key or PubAddr", ErrInvalidConfig, k)
		}
		if err := checkAddr(ep.PubAddr); err != nil {
			return fmt.Errorf("%w: endpoint %q: PubAddr %w", ErrInvalidConfig, k, err)
		}
		if ep.ReplayAddr != "" {
			if err := checkAddr(ep.ReplayAddr); err != nil {
				return fmt.Errorf("%w: endpoint %q: ReplayAddr %w", ErrInvalidConfig, k, err)
			}
		}
	}
	s.mu.Lock()
	s.want = maps.Clone(eps)
	if s.want == nil {
		s.want = make(map[string]Endpoint)
	}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// checkAddr refuses a ZMQ address that no connection attempt could use, so
// that a typo fails at once instead of in every retry: the transport must be
// tcp (with a host and a numeric port), ipc or inproc.
func checkAddr(addr string) error {
	transport, rest, ok := strings.Cut(addr, "://")
	switch {
	case !ok || rest == "":
		return fmt.Errorf("%q: want transport://address, such as tcp://10.0.0.7:5557", addr)
	case transport == "ipc" || transport == "inproc":
		return nil
	case transport != "tcp":
		return fmt.Errorf("%q: transport %q: want tcp, ipc or inproc", addr, transport)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return fmt.Errorf("%q: want tcp://host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" || host == "*" {
		return fmt.Errorf("%q: want tcp://host:port, a host to connect to and a port from 1 to 65535", addr)
	}
	return nil
}

// Stats returns the counters of the subscription to endpoint key, and
// false if there is none running. With Forward set, Batches counts the
// batches forwarded and Resets the clears; Stored, Removed, Skipped and
// Mismatched stay zero.
func (s *Subscriber) Stats(key string) (Stats, bool) {
	s.mu.Lock()
	w := s.workers[key]
	s.mu.Unlock()
	if w == nil {
		return Stats{}, false
	}
	return w.stats.snapshot(), true
}

// Run runs one subscription per endpoint, following SetEndpoints, until ctx
// ends; it then stops them, drops their endpoints' blocks from the index,
// and returns ctx's error. Each subscription connects to its endpoint's
// PubAddr, and reconnects after any failure with jittered exponential
// back-off. A Subscriber runs once at a time: a concurrent second call
// returns an error at once.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Subscriber.Run", ErrRunning)
	}
	defer s.running.Store(false)
	defer s.stopAll()
	for {
		s.reconcile(ctx)
		select {
		case <-s.changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// reconcile stops the workers no longer wanted and starts the missing ones.
func (s *Subscriber) reconcile(ctx context.Context) {
	s.mu.Lock()
	var stop []*worker
	for k, w := range s.workers {
		if ep, ok := s.want[k]; !ok || ep != w.ep {
			stop = append(stop, w)
			delete(s.workers, k)
		}
	}
	s.mu.Unlock()
	for _, w := range stop {
		w.stop()
		s.drop(w.key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ep := range s.want {
		if s.workers[k] == nil {
			w := s.newWorker(k, ep)
			s.workers[k] = w
			w.start(ctx)
		}
	}
}

func (s *Subscriber) stopAll() {
	s.mu.Lock()
	ws := make([]*worker, 0, len(s.workers))
	for k, w := range s.workers {
		ws = append(ws, w)
		delete(s.workers, k)
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.cancel()
	}
	for _, w := range ws {
		<-w.done
		s.drop(w.key)
	}
}

// drop removes the blocks of an endpoint no longer followed from the
// index, or forwards a clear.
func (s *Subscriber) drop(key string) {
	if s.cfg.Forward != nil {
		s.cfg.Forward(key, -1, nil)
		return
	}
	s.cfg.Index.RemoveEndpoint(key)
}

// checkIndex checks cfg's Index, Hasher and MaxBlocks, and sets MaxBlocks'
// default.
func checkIndex(cfg *Config) error {
	switch {
	case cfg.Index == nil || cfg.Hasher == nil:
		return fmt.Errorf("%w: Index and Hasher are required", ErrInvalidConfig)
	case cfg.Hasher.BlockTokens() != cfg.Index.BlockSize():
		return fmt.Errorf("%w: Hasher block of %d tokens, Index block size %d", ErrInvalidConfig, cfg.Hasher.BlockTokens(), cfg.Index.BlockSize())
	case cfg.MaxBlocks < 0 || cfg.MaxBlocks > maxMaxBlocks:
		return fmt.Errorf("%w: MaxBlocks %d out of range [0, %d]", ErrInvalidConfig, cfg.MaxBlocks, maxMaxBlocks)
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	return nil
}

// jitter returns a wait drawn uniformly from [d/2, d).
func (s *Subscriber) jitter(d time.Duration) time.Duration {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return d/2 + time.Duration(s.rnd.Int64N(int64(d/2)+1))
}
