package share

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/llmlb/llmlb"
)

// DefaultRelaySubject is the NATS subject of a [Relay] and of each
// [Follower] of it when their configs name none.
const DefaultRelaySubject = "llmlb.kvevents"

// The headers of a relayed message. Its data is the engine's payload, as
// the engine published it.
const (
	// headerEndpoint is the endpoint key, as it is, or in base64 (standard
	// encoding, padded) when headerEndpointEncoding says "base64": a key
	// that nats.go would not carry unchanged (see headerSafe) is sent so.
	headerEndpoint         = "Llmlb-Endpoint"
	headerEndpointEncoding = "Llmlb-Endpoint-Encoding"
	endpointBase64         = "base64"
	// headerSeq is the engine's sequence number of the batch, or "clear":
	// what the followers hold of the endpoint is unknown, and is dropped.
	headerSeq = "Llmlb-Seq"
	clearSeq  = "clear"
	// aliveSeq marks a heartbeat of a running Relay (see Relay.Run), which
	// names its period in headerInterval (nanoseconds).
	aliveSeq       = "alive"
	headerInterval = "Llmlb-Interval"
	// headerRelay is the ID of the Relay that published the message.
	headerRelay = "Llmlb-Relay"
	// headerRelayMsg numbers the messages of one Relay process: its
	// instance, a random number in base 36 drawn when the Relay is made,
	// a "-", and the number of the message, from 1, in decimal. A
	// Follower that misses a number has lost a message of that Relay.
	// Relays before it send no such header.
	headerRelayMsg = "Llmlb-Relay-Msg"
	// relayMsgBytes bounds the bytes headerRelayMsg adds to a message.
	relayMsgBytes = len(headerRelayMsg) + len(": ") + 13 + len("-") + 20 + len("\r\n")
)

// DefaultRelayInterval is the period of a running Relay's heartbeats when
// its config names none.
const DefaultRelayInterval = time.Second

// Bounds on what a Follower tracks of the Relays it hears, whatever is
// published on the subject.
const (
	maxRelays        = 1024 // Relay processes followed
	maxRelayIDBytes  = 128  // as RelayConfig.ID
	maxRelayInterval = time.Minute
)

// RelayConfig configures a [Relay].
type RelayConfig struct {
	// Conn is the NATS connection the batches are published on; the
	// caller owns it. Connect with nats.MaxReconnects(-1). Required.
	Conn *nats.Conn
	// Subject is where the batches of every endpoint are published. ""
	// means [DefaultRelaySubject].
	Subject string
	// ID names the Relay in its messages, so that Followers know which
	// endpoints it relays. "" means a random ID. Two Relays that run at
	// once, one beside the other or during a rolling update, should have
	// distinct IDs, as the random ones are.
	ID string
	// Interval is the period of the heartbeats [Relay.Run] publishes. 0
	// means [DefaultRelayInterval]; at most a minute.
	Interval time.Duration
}

// Relay publishes engines' KV event batches on NATS, so that one
// subscription per engine serves every router replica, as in NVIDIA
// Dynamo's event plane. Its [Relay.Forward] is the Forward function of a
// kvevents.Subscriber that follows the engines over ZMQ (filling gaps from
// their replay sockets and detecting restarts); each router replica runs a
// [Follower] that hands the batches to its own kvevents.Applier, which
// indexes them with the replica's hasher:
//
//	relay, err := share.NewRelay(share.RelayConfig{Conn: nc})
//	sub, err := kvevents.NewSubscriber(kvevents.Config{Forward: relay.Forward})
//	err = sub.SetEndpoints(engines)
//	go sub.Run(ctx) // when it returns, every endpoint's clear has been published
//
// Each message carries one batch of one endpoint, with the endpoint key and
// the engine's sequence number, or a clear wherever the Subscriber would
// drop the endpoint's blocks. A batch larger than the connection's maximum
// payload is published as a clear. Messages sit in the connection's buffer
// until nats.go flushes it; Flush or Drain the connection before closing it
// to send the last ones.
//
// A Relay that dies without publishing its clears (its process killed, its
// connection cut) would leave the Followers holding blocks the engines may
// since have evicted. [Relay.Run] publishes a heartbeat every Interval; a
// Follower that has heard one drops the blocks of that Relay's endpoints
// when it hears nothing from it for three Intervals.
//
// Several Relays may follow the same engines, for high availability or
// during a rolling update of the Relay: each Follower hands on each batch
// once, whichever Relay brought it first (see [Follower]).
//
// A Relay is safe for concurrent use and starts no goroutine but Run's.
type Relay struct {
	conn     *nats.Conn
	subject  string
	id       string
	instance string // random, in base 36: this process in headerRelayMsg
	interval time.Duration
	running  atomic.Bool

	mu   sync.Mutex // serializes the publishing, so that msgs go out in order
	msgs uint64     // messages the connection took; guarded by mu

	published, failed atomic.Int64
}

// NewRelay returns a Relay for cfg, or an error wrapping
// [ErrInvalidConfig].
func NewRelay(cfg RelayConfig) (*Relay, error) {
	switch {
	case cfg.Conn == nil:
		return nil, fmt.Errorf("%w: Relay needs a Conn", ErrInvalidConfig)
	case cfg.Interval < 0 || cfg.Interval > maxRelayInterval:
		return nil, fmt.Errorf("%w: Relay Interval %v out of range [0, %v]", ErrInvalidConfig, cfg.Interval, maxRelayInterval)
	case len(cfg.ID) > maxRelayIDBytes:
		return nil, fmt.Errorf("%w: Relay ID is %d bytes, at most %d", ErrInvalidConfig, len(cfg.ID), maxRelayIDBytes)
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultRelaySubject
	}
	if cfg.ID == "" {
		cfg.ID = "relay-" + strconv.FormatUint(rand.Uint64(), 36)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultRelayInterval
	}
	return &Relay{conn: cfg.Conn, subject: cfg.Subject, id: cfg.ID, interval: cfg.Interval,
		instance: strconv.FormatUint(rand.Uint64(), 36)}, nil
}

// Run publishes a heartbeat every Interval until ctx ends, and returns
// ctx's error; a concurrent second call returns an error wrapping
// [ErrRunning] at once. Once the connection is closed for good (closed by
// the program, or out of reconnection attempts) it returns an error
// wrapping [nats.ErrConnectionClosed] at its next Interval. Run it beside
// the Subscriber whose Forward the Relay is, for as long as it runs.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Relay.Run", ErrRunning)
	}
	defer r.running.Store(false)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		if r.conn.IsClosed() {
			return fmt.Errorf("share: the Relay stops: %w", nats.ErrConnectionClosed)
		}
		r.publish(r.heartbeat())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// heartbeat returns the message of a heartbeat.
func (r *Relay) heartbeat() *nats.Msg {
	m := nats.NewMsg(r.subject)
	m.Header.Set(headerRelay, r.id)
	m.Header.Set(headerSeq, aliveSeq)
	m.Header.Set(headerInterval, strconv.FormatInt(int64(r.interval), 10))
	return m
}

// publish numbers m (headerRelayMsg) and publishes it. A message the
// connection refuses takes no number: the Followers see it as a gap at
// its endpoint's next batch.
func (r *Relay) publish(m *nats.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m.Header.Set(headerRelayMsg, r.instance+"-"+strconv.FormatUint(r.msgs+1, 10))
	if err := r.conn.PublishMsg(m); err != nil {
		r.failed.Add(1)
		return
	}
	r.msgs++
	r.published.Add(1)
}

// relayMsg parses the value of headerRelayMsg: the Relay's instance and
// the message's number, and false if v is not one.
func relayMsg(v string) (instance string, n uint64, ok bool) {
	i := strings.IndexByte(v, '-')
	if i < 1 || i > 13 || len(v)-i-1 > 20 {
		return "", 0, false
	}
	for _, c := range v[:i] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return "", 0, false
		}
	}
	n, err := strconv.ParseUint(v[i+1:], 10, 64)
	if err != nil || n == 0 {
		return "", 0, false
	}
	return v[:i], n, true
}

// Forward publishes batch seq of endpoint key, or, for a nil payload, a
// clear of the endpoint: the signature of kvevents.Config.Forward. It does
// not keep payload, and does not wait for the network. A key a Follower
// would refuse (longer than 1024 bytes) is not published and counts as
// failed; any other key reaches the Followers exactly as given.
func (r *Relay) Forward(key string, seq int64, payload []byte) {
	if len(key) > maxKeyBytes {
		r.failed.Add(1)
		return
	}
	r.publish(relayMessage(r.subject, r.id, key, seq, payload, r.conn.MaxPayload()))
}

// relayMessage returns the message of Relay id ("" for none) carrying
// batch seq of endpoint key, or a clear for a nil payload, a negative seq
// or a batch whose message, headers included (and the headerRelayMsg that
// publish adds), would exceed maxPayload bytes.
func relayMessage(subject, id, key string, seq int64, payload []byte, maxPayload int64) *nats.Msg {
	m := nats.NewMsg(subject)
	if headerSafe(key) {
		m.Header.Set(headerEndpoint, key)
	} else {
		m.Header.Set(headerEndpoint, base64.StdEncoding.EncodeToString([]byte(key)))
		m.Header.Set(headerEndpointEncoding, endpointBase64)
	}
	if id != "" {
		m.Header.Set(headerRelay, id)
	}
	m.Header.Set(headerSeq, strconv.FormatInt(seq, 10))
	if payload == nil || seq < 0 || int64(len(payload)+headerBytes(m.Header)+relayMsgBytes) > maxPayload {
		m.Header.Set(headerSeq, clearSeq)
	} else {
		m.Data = payload
	}
	return m
}

// headerSafe reports whether nats.go carries v as a header value
// unchanged. nats.go v1.55.0 (nats.go: writeHeaderValue) trims a value's
// leading and trailing spaces, tabs, CRs and LFs (textproto.TrimString)
// and turns the line breaks within it into spaces, and its decoder
// (readMIMEHeader) drops the spaces and tabs after the colon; nats-server
// passes the header block of a core NATS message on as it came.
func headerSafe(v string) bool {
	if strings.ContainsAny(v, "\r\n") {
		return false
	}
	if v == "" {
		return true
	}
	switch v[0] {
	case ' ', '\t':
		return false
	}
	switch v[len(v)-1] {
	case ' ', '\t':
		return false
	}
	return true
}

// endpointKey returns the endpoint key of a relayed message, and false if
// its encoding is unknown or its base64 malformed.
func endpointKey(h nats.Header) (string, bool) {
	v := h.Get(headerEndpoint)
	switch h.Get(headerEndpointEncoding) {
	case "":
		return v, true
	case endpointBase64:
		if len(v) > base64.StdEncoding.EncodedLen(maxKeyBytes) {
			return "", false
		}
		b, err := base64.StdEncoding.Strict().DecodeString(v)
		if err != nil {
			return "", false
		}
		return string(b), true
	}
	return "", false
}

// headerBytes returns the size of h on the wire, at most: nats.go writes a
// status line ("NATS/1.0\r\n"), "key: value\r\n" per value, and an empty
// line.
func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// Published returns the messages published, heartbeats included, and those
// the connection refused (it was closed, or its reconnect buffer was full);
// the followers see a refused batch as a gap.
func (r *Relay) Published() (ok, failed int64) { return r.published.Load(), r.failed.Load() }

// Sink receives the batches a [Follower] receives. A kvevents.Applier is
// one. A Follower calls it only while [Follower.Run] runs, one call at a
// time, and never after Run returns; a Sink shared with other goroutines
// must be safe for concurrent use, as an Applier is.
type Sink interface {
	// Apply receives batch seq of endpoint key, as the engine encoded it,
	// or, with a nil payload, a clear of the endpoint. It must not keep
	// payload.
	Apply(key string, seq int64, payload []byte)
	// Clear drops what is known of every endpoint.
	Clear()
}

// FollowerConfig configures a [Follower].
type FollowerConfig struct {
	// Conn is the NATS connection the Relay publishes to; the caller owns
	// it. Connect with nats.MaxReconnects(-1). Required.
	Conn *nats.Conn
	// Subject is the Relay's subject. "" means [DefaultRelaySubject].
	Subject string
	// Sink receives the batches, usually a kvevents.Applier. Required.
	Sink Sink
	// Buffer bounds the messages received and not yet applied; beyond it
	// NATS drops messages, which the Follower sees as a loss of messages
	// of their Relays (see [Follower]). 0 means 4096.
	Buffer int
	// BufferBytes bounds the bytes of the messages received and not yet
	// applied (their payloads and headers); beyond it NATS drops messages,
	// as beyond Buffer. A message larger than BufferBytes is always
	// dropped. 0 means [DefaultFollowerBufferBytes].
	BufferBytes int
	// OnError, if set, is told of every message that is not a relayed
	// batch, of every endpoint of a Relay fallen silent (the endpoint's
	// blocks are then dropped), and, with an empty key, of the messages
	// of a Relay lost on the way and of those dropped beyond Buffer or
	// BufferBytes; it must not block.
	OnError func(key string, err error)
	// Clock tells the time a Relay was last heard. Nil means the system
	// clock.
	Clock llmlb.Clock
}

// Follower receives the batches a [Relay] publishes and hands them, per
// endpoint in the order published, to its [Sink]. NATS delivers at most
// once and cannot replay: the Sink sees a batch lost in transit as a gap in
// the endpoint's sequence numbers, and a kvevents.Applier then drops the
// endpoint's blocks rather than guess. Blocks stored before a Follower
// starts are not known until the engine stores them again.
//
// A Relay numbers its messages, so a Follower knows at the next message of
// a Relay, or its next heartbeat, that messages of it were lost (dropped
// beyond Buffer or BufferBytes, by a NATS server whose client was too slow,
// or while the connection was down), though not of which endpoints: every
// endpoint that Relay relayed is then taken as having a gap, and its blocks
// are dropped, unless another Relay relays it too (below).
//
// Several Relays may relay the same engine, for high availability or
// during a rolling update. The Follower hands each batch on once, from
// whichever Relay brings it first, and drops its repeats: a batch it
// already handed on, recognised by its number and its payload (a Relay
// passes on the engine's payload as the engine published it, and two
// batches of an engine are alike only by chance), or one of a Relay whose
// batches it has not yet seen to be the same. An engine that restarts
// numbers its batches from 0 again (vLLM's ZmqEventPublisher,
// vllm/distributed/kv_events.py at commit 0181ea3, draws them from
// itertools.count() in each process and sends nothing else that names the
// process), and each Relay's Subscriber then
// sends a clear before the new batches: a clear, like a sequence that goes
// back, is handed on once no other Relay is known to carry the batches
// handed on, so an engine restart still clears the endpoint at the Sink,
// while a Relay that stops, or has a gap of its own, costs nothing while
// another carries the endpoint. A Relay that alone brings batches of an
// endpoint ahead of the others takes it over if they relay nothing of it
// for 3 seconds. Each endpoint remembers the last 16 batches handed on and
// 4 Relays; at most 4096 endpoints are followed so, and forgotten after 3
// minutes without a batch; the batches of other endpoints, and of Relays
// without an ID (not this package's) or beyond the 1024 followed, are
// handed on as they come.
//
// A Follower that has heard a heartbeat of a Relay ([Relay.Run]) and then
// hears nothing from it for three of its Intervals drops the blocks of the
// endpoints that Relay relayed, unless another Relay relays them too: a
// Relay that died unseen leaves no guessed blocks behind. It follows at
// most 1024 Relays, and forgets a Relay that never sent a heartbeat (keeping
// its endpoints' blocks) once it has been silent for three minutes. A
// message that names a Relay ID longer than 128 bytes, or an endpoint key
// longer than 1024 bytes or in an encoding it does not know, is not from a
// Relay: it is dropped and reported to OnError.
//
// Run is the only method; a Follower starts no goroutine until it is
// called.
type Follower struct {
	conn        *nats.Conn
	subject     string
	sink        Sink
	buffer      int
	bufferBytes int
	onError     func(string, error)
	clock       llmlb.Clock
	running     atomic.Bool

	mu sync.Mutex // protects the fields below, and serializes the calls of sink
	// stopped is set when Run returns, so that a message still being
	// delivered is not applied.
	stopped bool
	// relays is what Run knows of each Relay process heard, by its ID and,
	// if its messages are numbered, its instance (see relayIdentity).
	relays map[string]*relayLife
	// streams is what Run knows of each endpoint's batches (stream.go).
	streams map[string]*stream
	// swept is when streams were last rid of the idle ones.
	swept time.Time
}

// DefaultFollowerBufferBytes is the bytes of relayed messages a [Follower]
// holds before applying them when its config names no bound.
const DefaultFollowerBufferBytes = 64 << 20

// relayLife is a Follower's view of one Relay process.
type relayLife struct {
	id   string        // its ID
	seen time.Time     // when a message of it last arrived
	ttl  time.Duration // three heartbeat periods; 0 before a heartbeat
	msgs uint64        // the number of its last message (headerRelayMsg); 0 if none
}

// NewFollower returns a Follower for cfg, or an error wrapping
// [ErrInvalidConfig].
func NewFollower(cfg FollowerConfig) (*Follower, error) {
	switch {
	case cfg.Conn == nil || cfg.Sink == nil:
		return nil, fmt.Errorf("%w: Follower needs a Conn and a Sink", ErrInvalidConfig)
	case cfg.Buffer < 0:
		return nil, fmt.Errorf("%w: Buffer %d is negative", ErrInvalidConfig, cfg.Buffer)
	case cfg.BufferBytes < 0:
		return nil, fmt.Errorf("%w: BufferBytes %d is negative", ErrInvalidConfig, cfg.BufferBytes)
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultRelaySubject
	}
	if cfg.Buffer == 0 {
		cfg.Buffer = 4096
	}
	if cfg.BufferBytes == 0 {
		cfg.BufferBytes = DefaultFollowerBufferBytes
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	return &Follower{conn: cfg.Conn, subject: cfg.Subject, sink: cfg.Sink, buffer: cfg.Buffer, bufferBytes: cfg.BufferBytes,
		onError: cfg.OnError, clock: cfg.Clock, relays: make(map[string]*relayLife), streams: make(map[string]*stream)}, nil
}

// livenessTick is how often a running Follower looks for silent Relays.
const livenessTick = 100 * time.Millisecond

// Run receives the Relay's batches and hands them to the Sink until ctx
// ends; it then clears the Sink, since nothing keeps what it holds current
// any more, and returns ctx's error. A Follower runs once at a time: a
// concurrent second call returns an error wrapping [ErrRunning] at once.
// The connection reconnects by itself and the subscription resumes; the
// batches missed meanwhile are gaps. Once the connection is closed for
// good (closed by the program, or out of reconnection attempts) Run drops
// the relayed blocks, which nothing would correct any more, and returns an
// error wrapping [nats.ErrConnectionClosed] (it looks every 100 ms).
func (f *Follower) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Follower.Run", ErrRunning)
	}
	defer f.running.Store(false)
	f.mu.Lock()
	f.stopped = false
	f.mu.Unlock()
	// The subscription's own goroutine applies the messages; those waiting
	// for it are bounded in count and bytes, and NATS drops the excess.
	sub, err := f.conn.Subscribe(f.subject, func(m *nats.Msg) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.stopped {
			f.receive(m)
		}
	})
	if err != nil {
		return fmt.Errorf("share: subscribe to %q: %w", f.subject, err)
	}
	defer func() {
		_ = sub.Unsubscribe()
		f.mu.Lock()
		defer f.mu.Unlock()
		f.stopped = true
		f.sink.Clear()
		clear(f.relays)
		clear(f.streams)
	}()
	if err := sub.SetPendingLimits(f.buffer, f.bufferBytes); err != nil {
		return fmt.Errorf("share: subscribe to %q: %w", f.subject, err)
	}
	tick := time.NewTicker(livenessTick)
	defer tick.Stop()
	dropped := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if f.conn.IsClosed() {
				return fmt.Errorf("share: the Follower stops: %w", nats.ErrConnectionClosed)
			}
			f.mu.Lock()
			f.expire()
			if n, err := sub.Dropped(); err == nil && n > dropped {
				if f.onError != nil {
					f.onError("", fmt.Errorf("share: %d relayed messages dropped: more than Buffer messages or BufferBytes bytes waited to be applied", n-dropped))
				}
				dropped = n
			}
			f.mu.Unlock()
		}
	}
}

// relayIdentity returns the name a Follower knows a Relay process by: its
// ID and, if its messages are numbered, its instance, so that two
// processes under one ID (a Relay restarted, or two configured alike)
// are told apart.
func relayIdentity(id, instance string) string {
	if instance == "" {
		return id
	}
	return id + "\x00" + instance
}

// heard notes a message of Relay id numbered msg (the value of
// headerRelayMsg) and returns the Relay's state, or nil if the Follower
// follows too many Relays. A number skipped means that messages of the
// Relay were lost: its endpoints are then taken to have a gap (see lost).
func (f *Follower) heard(id, msg string) *relayLife {
	instance, n, numbered := relayMsg(msg)
	ident := relayIdentity(id, instance)
	r := f.relays[ident]
	if r == nil {
		if len(f.relays) >= maxRelays {
			return nil
		}
		r = &relayLife{id: id}
		f.relays[ident] = r
	}
	r.seen = f.clock.Now()
	if numbered && n > r.msgs {
		if r.msgs > 0 && n > r.msgs+1 {
			f.lost(r, n-r.msgs-1)
		}
		r.msgs = n
	}
	return r
}

// lost handles the loss of n messages of Relay r: which endpoints they
// were of is unknown, so every endpoint r relays has a gap, as if r had
// cleared it.
func (f *Follower) lost(r *relayLife, n uint64) {
	dropped := 0
	for key, s := range f.streams {
		if i := s.index(r); i >= 0 && f.release(key, s, i) {
			dropped++
		}
	}
	if f.onError != nil {
		f.onError("", fmt.Errorf("share: %d messages of relay %q lost on the way: the blocks of %d endpoints it relayed are dropped",
			n, truncate(r.id, 32), dropped))
	}
}

// forget stops following Relay process ident, whose state is r. With
// drop, the endpoints it relayed that no other Relay carries are cleared
// at the Sink, each reported to OnError with why; without, they keep their
// blocks.
func (f *Follower) forget(ident string, r *relayLife, drop bool, why func() error) {
	delete(f.relays, ident)
	for key, s := range f.streams {
		i := s.index(r)
		if i < 0 {
			continue
		}
		if !drop {
			s.remove(i)
			if len(s.from) == 0 {
				delete(f.streams, key)
			}
			continue
		}
		if f.release(key, s, i) && f.onError != nil {
			f.onError(key, why())
		}
	}
}

// expire drops the endpoints relayed by a Relay not heard from within its
// TTL, and forgets the Relays that never sent a heartbeat once they are
// silent for longer than any TTL, keeping their endpoints: they promised no
// liveness, and Relays come and gone must not fill the table. It also
// forgets, once a minute, the endpoints that had no batch for longer than
// streamIdle.
func (f *Follower) expire() {
	now := f.clock.Now()
	for ident, r := range f.relays {
		switch {
		case r.ttl == 0 && now.Sub(r.seen) > 3*maxRelayInterval:
			f.forget(ident, r, false, nil)
		case r.ttl > 0 && now.Sub(r.seen) > r.ttl:
			f.forget(ident, r, true, func() error {
				return fmt.Errorf("share: relay %q silent for %v: the endpoint's blocks are dropped", r.id, now.Sub(r.seen).Round(time.Millisecond))
			})
		}
	}
	if now.Sub(f.swept) >= time.Minute || now.Before(f.swept) {
		f.swept = now
		for key, s := range f.streams {
			if now.Sub(s.heard) > streamIdle {
				delete(f.streams, key)
			}
		}
	}
}

// receive hands one message of the Relay to the Sink.
func (f *Follower) receive(m *nats.Msg) {
	key, ok := endpointKey(m.Header)
	s := m.Header.Get(headerSeq)
	id := m.Header.Get(headerRelay)
	if !ok {
		// Which endpoint it names is unknown: there is nothing to clear.
		if f.onError != nil {
			f.onError("", fmt.Errorf("%w: relayed message with an endpoint key of unknown encoding %q or malformed",
				ErrMalformed, truncate(m.Header.Get(headerEndpointEncoding), 32)))
		}
		return
	}
	if len(id) > maxRelayIDBytes || len(key) > maxKeyBytes {
		// Not from a Relay: those keeping them would hold their bytes.
		if f.onError != nil {
			f.onError("", fmt.Errorf("%w: relayed message with a relay ID of %d bytes (at most %d) and an endpoint key of %d bytes (at most %d)",
				ErrMalformed, len(id), maxRelayIDBytes, len(key), maxKeyBytes))
		}
		return
	}
	var r *relayLife
	if id != "" {
		r = f.heard(id, m.Header.Get(headerRelayMsg))
		if s == aliveSeq {
			if r != nil {
				if d, err := strconv.ParseInt(m.Header.Get(headerInterval), 10, 64); err == nil && d > 0 {
					r.ttl = 3 * min(time.Duration(d), maxRelayInterval)
				}
			}
			return
		}
	}
	if s == clearSeq {
		f.clear(key, r)
		return
	}
	seq, err := strconv.ParseInt(s, 10, 64)
	if err != nil || seq < 0 || m.Data == nil {
		f.clear(key, r)
		if f.onError != nil {
			f.onError(key, fmt.Errorf("%w: relayed message with sequence %q and %d bytes", ErrMalformed, truncate(s, 32), len(m.Data)))
		}
		return
	}
	f.batch(key, seq, m.Data, r)
}

// truncate returns s cut to n bytes, marked with "..." if it was cut.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
