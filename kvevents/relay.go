package kvevents

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/llmlb/llmlb/prefix"
)

// DefaultRelaySubject is the NATS subject of a [Relay] and its [Follower]s
// when their configs name none.
const DefaultRelaySubject = "llmlb.kvevents"

// The headers of a relayed message. Its data is the engine's payload, as
// the engine published it.
const (
	// headerEndpoint is the endpoint key.
	headerEndpoint = "Llmlb-Endpoint"
	// headerSeq is the engine's sequence number of the batch, or "clear":
	// what the followers hold of the endpoint is unknown, and is dropped.
	headerSeq = "Llmlb-Seq"
	clearSeq  = "clear"
)

// RelayConfig configures a [Relay].
type RelayConfig struct {
	// Config configures the subscriptions to the engines as for a
	// [Subscriber]: back-off, replay timeout, OnError. Its Index, Hasher
	// and MaxBlocks are not used: a Relay forwards the engines' batches as
	// they are, and each Follower translates them with its own hasher.
	Config
	// Conn is the NATS connection the batches are published on; the
	// caller owns it. Connect with nats.MaxReconnects(-1).
	Conn *nats.Conn
	// Subject is where the batches of every endpoint are published. ""
	// means [DefaultRelaySubject].
	Subject string
}

// Relay follows the KV event streams of a set of engines over ZMQ, as a
// [Subscriber] does, and publishes them on NATS, so that one subscription
// per engine serves every router: each router runs a [Follower] instead of
// its own Subscriber, as in NVIDIA Dynamo's event plane. The Relay fills
// gaps from the engines' replay sockets and detects their restarts as a
// Subscriber does, and publishes, per endpoint, each batch it would apply,
// in order, with the endpoint key and the engine's sequence number; where a
// Subscriber would clear the endpoint's blocks (a gap that replay cannot
// fill, a restart, a malformed batch, an endpoint no longer followed, the
// Relay stopping), it publishes a clear instead. A batch larger than the
// connection's maximum payload is published as a clear.
//
// SetEndpoints, Stats and Published are safe for concurrent use with each
// other and with Run. Creating a Relay starts nothing.
type Relay struct {
	sub     *Subscriber
	conn    *nats.Conn
	subject string

	published, failed atomic.Int64
}

// NewRelay returns a Relay for cfg, or an error wrapping
// [ErrInvalidConfig].
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: Relay needs a Conn", ErrInvalidConfig)
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultRelaySubject
	}
	c := cfg.Config
	c.Index, c.Hasher, c.MaxBlocks = nil, nil, 0
	sub, err := newSubscriber(c)
	if err != nil {
		return nil, err
	}
	r := &Relay{sub: sub, conn: cfg.Conn, subject: cfg.Subject}
	sub.sink = r.publish
	return r, nil
}

// SetEndpoints replaces the engines followed, as [Subscriber.SetEndpoints]
// does; the keys are those the routers' balancers use, and each Endpoint's
// Salt is not used (each Follower has its own).
func (r *Relay) SetEndpoints(eps map[string]Endpoint) error { return r.sub.SetEndpoints(eps) }

// Run follows the engines and publishes their batches until ctx ends, as
// [Subscriber.Run] does; when it returns, a clear has been published for
// every endpoint.
func (r *Relay) Run(ctx context.Context) error {
	err := r.sub.Run(ctx)
	_ = r.conn.Flush()
	return err
}

// Stats returns the counters of the subscription to endpoint key, and false
// if there is none running. Stored, Removed and Skipped stay zero: a Relay
// indexes nothing.
func (r *Relay) Stats(key string) (Stats, bool) { return r.sub.Stats(key) }

// Published returns the messages published, and those the connection
// refused (it was closed, or its reconnect buffer was full); the followers
// see a refused batch as a gap.
func (r *Relay) Published() (ok, failed int64) { return r.published.Load(), r.failed.Load() }

// publish sends one batch, or a clear for a nil payload.
func (r *Relay) publish(key string, seq int64, payload []byte) {
	m := nats.NewMsg(r.subject)
	m.Header.Set(headerEndpoint, key)
	if payload == nil || int64(len(payload)+len(key)+64) > r.conn.MaxPayload() {
		m.Header.Set(headerSeq, clearSeq)
	} else {
		m.Header.Set(headerSeq, strconv.FormatInt(seq, 10))
		m.Data = payload
	}
	if err := r.conn.PublishMsg(m); err != nil {
		r.failed.Add(1)
		return
	}
	r.published.Add(1)
}

// FollowerConfig configures a [Follower].
type FollowerConfig struct {
	// Config configures the translation into the index as for a
	// [Subscriber]: Index and Hasher are required, MaxBlocks and OnError
	// are used; the connection settings are not.
	Config
	// Conn is the NATS connection the Relay publishes to; the caller owns
	// it. Connect with nats.MaxReconnects(-1).
	Conn *nats.Conn
	// Subject is the Relay's subject. "" means [DefaultRelaySubject].
	Subject string
	// Buffer bounds the messages received and not yet applied; beyond it
	// NATS drops messages, which the Follower sees as gaps. 0 means 4096.
	Buffer int
}

// Follower applies the batches a [Relay] publishes on NATS to a
// [prefix.Index], as a [Subscriber] applies them from the engines: each
// BlockStored translated into the router's hashes with the endpoint's salt,
// each BlockRemoved and AllBlocksCleared applied, per endpoint in sequence
// order. NATS delivers at most once and cannot replay, so a gap in an
// endpoint's sequence numbers, a sequence that goes back (the engine
// restarted), or a clear from the Relay drops the endpoint's blocks: what
// it holds is then unknown, and is never guessed; the blocks stored after
// that are indexed again. Blocks stored before a Follower starts are not
// known to it until the engine stores them again.
//
// Only the endpoints given to SetEndpoints are followed, so memory is
// bounded by them whatever is published. SetEndpoints and Stats are safe
// for concurrent use with each other and with Run. Creating a Follower
// starts nothing.
type Follower struct {
	cfg     Config
	conn    *nats.Conn
	subject string
	buffer  int
	running atomic.Bool

	mu  sync.Mutex // protects eps
	eps map[string]*follow
}

// follow is the state of one endpoint followed.
type follow struct {
	salt  prefix.Salt
	tr    *translator
	stats counters
	last  int64 // last batch applied, -1 if none
	batch Batch
}

// NewFollower returns a Follower for cfg, or an error wrapping
// [ErrInvalidConfig].
func NewFollower(cfg FollowerConfig) (*Follower, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: Follower needs a Conn", ErrInvalidConfig)
	}
	if err := checkIndex(&cfg.Config); err != nil {
		return nil, err
	}
	if cfg.MaxBlocks < 0 || cfg.MaxBlocks > maxMaxBlocks {
		return nil, fmt.Errorf("%w: MaxBlocks %d out of range [0, %d]", ErrInvalidConfig, cfg.MaxBlocks, maxMaxBlocks)
	}
	if cfg.Buffer < 0 {
		return nil, fmt.Errorf("%w: Buffer %d is negative", ErrInvalidConfig, cfg.Buffer)
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultRelaySubject
	}
	if cfg.Buffer == 0 {
		cfg.Buffer = 4096
	}
	return &Follower{cfg: cfg.Config, conn: cfg.Conn, subject: cfg.Subject, buffer: cfg.Buffer, eps: make(map[string]*follow)}, nil
}

// SetEndpoints replaces the endpoints followed, keyed by the endpoint keys
// the Relay publishes under (the balancer's), each with the salt the router
// hashes that engine's prompts with (see [Endpoint].Salt). An endpoint
// removed, or whose salt changes, has its blocks dropped from the index. It
// returns an error wrapping [ErrInvalidConfig], changing nothing, if a key
// is empty.
func (f *Follower) SetEndpoints(eps map[string]prefix.Salt) error {
	for k := range eps {
		if k == "" {
			return fmt.Errorf("%w: empty endpoint key", ErrInvalidConfig)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, fl := range f.eps {
		if salt, ok := eps[k]; !ok || salt != fl.salt {
			delete(f.eps, k)
			f.cfg.Index.RemoveEndpoint(k)
		}
	}
	for k, salt := range eps {
		if f.eps[k] == nil {
			fl := &follow{salt: salt, last: -1}
			fl.stats.seq.Store(-1)
			fl.tr = newTranslator(k, f.cfg.Index, f.cfg.Hasher, salt, f.cfg.MaxBlocks, &fl.stats)
			f.eps[k] = fl
		}
	}
	return nil
}

// Stats returns the counters of endpoint key, and false if it is not
// followed. Connected is the NATS connection's state; Connects, Replayed
// stay zero.
func (f *Follower) Stats(key string) (Stats, bool) {
	f.mu.Lock()
	fl := f.eps[key]
	f.mu.Unlock()
	if fl == nil {
		return Stats{}, false
	}
	st := fl.stats.snapshot()
	st.Connected = f.conn.IsConnected()
	return st, true
}

// Run receives the Relay's batches and applies them until ctx ends; it then
// drops every followed endpoint's blocks from the index, since nothing keeps
// them current any more, and returns ctx's error. A Follower runs once at a
// time: a concurrent second call returns an error at once. The connection
// reconnects by itself and the subscription resumes; the batches missed
// meanwhile are gaps.
func (f *Follower) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Follower.Run", ErrRunning)
	}
	defer f.running.Store(false)
	ch := make(chan *nats.Msg, f.buffer)
	sub, err := f.conn.ChanSubscribe(f.subject, ch)
	if err != nil {
		return fmt.Errorf("kvevents: subscribe to %q: %w", f.subject, err)
	}
	defer func() {
		_ = sub.Unsubscribe()
		f.mu.Lock()
		for k, fl := range f.eps {
			f.cfg.Index.RemoveEndpoint(k)
			fl.last = -1
		}
		f.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-ch:
			f.receive(m)
		}
	}
}

// receive applies one message of the Relay.
func (f *Follower) receive(m *nats.Msg) {
	key := m.Header.Get(headerEndpoint)
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := f.eps[key]
	if fl == nil {
		return // not followed
	}
	s := m.Header.Get(headerSeq)
	if s == clearSeq {
		fl.tr.clear()
		fl.last = -1
		return
	}
	seq, err := strconv.ParseInt(s, 10, 64)
	if err != nil || seq < 0 {
		f.malformed(key, fl, fmt.Errorf("kvevents: relayed message with sequence %q", s))
		return
	}
	switch {
	case fl.last >= 0 && seq > fl.last+1:
		fl.stats.gaps.Add(1)
		fl.tr.clear()
	case fl.last >= 0 && seq <= fl.last:
		fl.tr.clear() // the engine restarted
	}
	fl.last = seq
	fl.stats.seq.Store(seq)
	if err := DecodeBatch(&fl.batch, m.Data); err != nil {
		f.malformed(key, fl, fmt.Errorf("kvevents: relayed batch %d: %w", seq, err))
		return
	}
	fl.tr.apply(&fl.batch)
}

// malformed drops an endpoint's blocks after a message that cannot be
// applied.
func (f *Follower) malformed(key string, fl *follow, err error) {
	fl.stats.malformed.Add(1)
	fl.tr.clear()
	if fn := f.cfg.OnError; fn != nil {
		fn(key, err)
	}
}
