package share

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/internal/timeline"
	"github.com/llmlb/llmlb/prefix"
	"github.com/nats-io/nats.go"
)

// Defaults of [Config].
const (
	// DefaultSubject is the NATS subject the replicas of one gateway
	// publish on and listen to.
	DefaultSubject = "llmlb.share"
	// DefaultInterval is the time between two batches a replica publishes.
	DefaultInterval = 100 * time.Millisecond
	// DefaultMaxPeers is the number of peers tracked at once.
	DefaultMaxPeers = 64
	// DefaultMaxEndpoints is the number of endpoints tracked at once, for
	// this replica's own work and for the prefix blocks it records.
	DefaultMaxEndpoints = 1024
	// DefaultMaxBlocks is the number of prefix blocks a batch carries.
	DefaultMaxBlocks = 8192
)

// Upper bounds of [Config] fields.
const (
	maxPeersLimit   = 1024
	maxEPsLimit     = 1 << 14
	maxBlocksLimit  = 1 << 16
	maxIntervalTime = time.Minute
	// maxSignalAgeTime keeps the pick-time buckets of a batch (MaxSignalAge
	// plus Interval, over at most 256 buckets) within the width every
	// receiver accepts, maxWidth.
	maxSignalAgeTime = 4 * time.Hour
)

// Sentinel errors; errors returned by this package wrap one of them.
var (
	// ErrInvalidConfig: a [Config] field is out of range, or Run was
	// called without a Conn.
	ErrInvalidConfig = errors.New("share: invalid config")
	// ErrMalformed: a batch given to [Group.Receive] could not be decoded.
	ErrMalformed = errors.New("share: malformed message")
	// ErrRefused: [Group.Receive] refused a well-formed batch: it came late
	// or from a peer beyond MaxPeers, or another replica publishes under
	// this Group's ID.
	ErrRefused = errors.New("share: batch refused")
	// ErrRunning: Run was called while another call of Run is running.
	ErrRunning = errors.New("share: already running")
)

// Config configures a [Group]. Every zero field is a documented default.
type Config struct {
	// Conn is the connection to NATS. The caller owns it: the Group neither
	// closes it nor sets its handlers. Connect with nats.MaxReconnects(-1)
	// so that it keeps reconnecting through an outage; the Group's
	// subscription then resumes by itself. Nil means no NATS: [Group.Run]
	// then fails, and the caller carries the batches between the replicas
	// itself, with [Group.AppendBatch] and [Group.Receive].
	Conn *nats.Conn
	// Subject is where the replicas of one gateway publish; replicas of
	// different gateways (different endpoint sets) need different
	// subjects. "" means [DefaultSubject].
	Subject string
	// ID names this replica to its peers, at most 128 bytes, not ending
	// in "/part" and a number (the IDs of the parts of a batch too large
	// for one message). "" means a random name. Two live replicas must not
	// share an ID.
	ID string
	// Signal is the engine signal whose observations the peers' work is
	// added to, such as a signals.Scraper. Nil means none: [Group.Load] then
	// reports this replica's and its peers' requests in flight as an
	// observation taken now.
	Signal llmlb.Signal
	// MaxSignalAge is the age beyond which an observation of Signal is
	// treated as missing; set it to the maximum age given to
	// llmlb.WithSignal. It also sets how far back a replica's batches
	// describe its requests' pick times. 0 means
	// [llmlb.DefaultMaxSignalAge]; at most 4 hours.
	MaxSignalAge time.Duration
	// Index, if not nil, receives the prefix blocks peers routed
	// ([prefix.Index.Record]): the index the policy records its own
	// decisions in. Blocks routed to an endpoint that this replica has not
	// scored or picked lately (among the last MaxEndpoints endpoints it
	// scored, at least) are ignored, so a peer with other endpoints cannot
	// fill the index.
	Index *prefix.Index
	// Interval is the time between two batches (the period of
	// [Group.AppendBatch] when the caller carries them). 0 means
	// [DefaultInterval]; at most a minute.
	Interval time.Duration
	// TTL is how long a peer's batch counts after it arrived, at least: a
	// peer that stops publishing stops counting after TTL, or after three
	// of its own periods between batches if that is longer (at most three
	// minutes), so that replicas configured with different Intervals keep
	// each other's work counted. 0 means three Intervals; it must not be
	// below Interval.
	TTL time.Duration
	// MaxPeers bounds the peers tracked; batches of further peers are
	// rejected until one expires. The parts of a peer's batch too large
	// for one message count as that one peer. 0 means [DefaultMaxPeers].
	MaxPeers int
	// MaxEndpoints bounds the endpoints tracked. A pick at an endpoint
	// beyond them is not shared (it is counted in [Stats].Dropped), and
	// neither are the later picks at that endpoint until each of those in
	// flight is done. 0 means [DefaultMaxEndpoints].
	MaxEndpoints int
	// MaxBlocks bounds the prefix blocks of one batch; a pick's blocks
	// beyond the room left are cut, and a pick that finds no room is
	// dropped (and counted in [Stats].Dropped). 0 means
	// [DefaultMaxBlocks]; a negative value publishes no blocks.
	MaxBlocks int
	// Clock tells the time; it must be the balancer's clock
	// (llmlb.WithClock). Nil means the system clock. Intervals between
	// readings that carry the monotonic clock, as time.Now's do, are
	// measured on it, so that a step of the wall clock changes none.
	Clock llmlb.Clock
	// Logger receives changes of the connection and of the peers, another
	// replica publishing under this ID, and the failures to publish: while the NATS connection is down, [Group.Run]
	// warns at the first batch it cannot publish, whether the connection
	// went down or never came up, then once a minute until it connects.
	// Nil means [slog.Default].
	Logger *slog.Logger
}

// Group is this replica's membership in the group of router replicas that
// publish on one subject. It is an [llmlb.Signal] to give the balancer
// ([llmlb.WithSignal]), and supplies an [llmlb.Observer] to give it too
// ([Group.Observer]). Create one with [New]; [Group.Run] does the network
// work, or, without NATS, the caller with [Group.AppendBatch] and
// [Group.Receive]. Load, Observer's functions, Stats, AppendBatch and
// Receive are safe for concurrent use; Load, Observer's functions and Stats
// never wait for the network.
type Group struct {
	conn     *nats.Conn
	subject  string
	id       string
	inc      uint64
	signal   llmlb.Signal
	maxAge   int64
	index    *prefix.Index
	interval time.Duration
	clock    llmlb.Clock
	line     timeline.Line // places the clock's readings; see now
	log      *slog.Logger
	maxEPs   int
	// recvBuffer bounds the bytes of the peers' batches that Run holds
	// before applying them.
	recvBuffer int

	local local
	peers peers

	// known and knownPrev are the endpoint keys scored or picked here
	// lately: the current generation, and the one before (nil until the
	// first turnover). knownMu serializes the turnovers.
	known, knownPrev atomic.Pointer[keySet]
	knownMu          sync.Mutex

	running atomic.Bool
	seq     atomic.Uint64 // sequence number of the last batch built

	batchMu sync.Mutex
	batch   message // the batch being built (by Run or AppendBatch), reused

	recvMu sync.Mutex
	recv   message // the batch being received, reused
	// recvGrown is the bytes decoding grew recv's memory by since it was
	// last dropped (see keepDecoded).
	recvGrown int
	keys      keyTable // decodeInto's scratch
	impostor  uint64   // incarnation of the last other replica with this ID logged
	// impostorLogged is when it was logged: another is logged at most
	// once a downReportInterval, however many incarnations appear.
	impostorLogged time.Time

	connected atomic.Bool
	failing   bool // the last publish while connected failed; guarded by batchMu
	// parts is the number of parts of the last batch published (see
	// split), and partMsgs their messages, reused; guarded by batchMu.
	parts         int
	partMsgs      []message
	published     atomic.Uint64
	publishFailed atomic.Uint64
	received      atomic.Uint64
	rejected      atomic.Uint64

	// downSince is when publish first found the connection down in the
	// current outage (zero while it is up), downLogged when it last said
	// so, and downSkipped the batches it has not published since; only
	// Run's goroutine touches them.
	downSince, downLogged time.Time
	downSkipped           uint64
}

// New returns a Group for cfg, or an error wrapping [ErrInvalidConfig]. It
// starts no goroutine and sends nothing until [Group.Run].
func New(cfg Config) (*Group, error) {
	if cfg.Subject == "" {
		cfg.Subject = DefaultSubject
	}
	if cfg.ID == "" {
		cfg.ID = "llmlb-" + strconv.FormatUint(rand.Uint64(), 36)
	}
	if cfg.MaxSignalAge == 0 {
		cfg.MaxSignalAge = llmlb.DefaultMaxSignalAge
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.TTL == 0 {
		cfg.TTL = 3 * cfg.Interval
	}
	if cfg.MaxPeers == 0 {
		cfg.MaxPeers = DefaultMaxPeers
	}
	if cfg.MaxEndpoints == 0 {
		cfg.MaxEndpoints = DefaultMaxEndpoints
	}
	switch {
	case cfg.MaxBlocks == 0:
		cfg.MaxBlocks = DefaultMaxBlocks
	case cfg.MaxBlocks < 0:
		cfg.MaxBlocks = 0
	}
	switch {
	case len(cfg.ID) > 128:
		return nil, fmt.Errorf("%w: ID is %d bytes, at most 128", ErrInvalidConfig, len(cfg.ID))
	case baseID(cfg.ID) != cfg.ID:
		return nil, fmt.Errorf("%w: ID %q ends like the ID of a part of a batch (%q and a number)", ErrInvalidConfig, cfg.ID, partSep)
	case cfg.MaxSignalAge < 0 || cfg.MaxSignalAge > maxSignalAgeTime:
		return nil, fmt.Errorf("%w: MaxSignalAge %v out of range [0, %v]", ErrInvalidConfig, cfg.MaxSignalAge, maxSignalAgeTime)
	case cfg.Interval < time.Millisecond || cfg.Interval > maxIntervalTime:
		return nil, fmt.Errorf("%w: Interval %v out of range [1ms, %v]", ErrInvalidConfig, cfg.Interval, maxIntervalTime)
	case cfg.TTL < cfg.Interval:
		return nil, fmt.Errorf("%w: TTL %v is below Interval %v", ErrInvalidConfig, cfg.TTL, cfg.Interval)
	case cfg.MaxPeers < 0 || cfg.MaxPeers > maxPeersLimit:
		return nil, fmt.Errorf("%w: MaxPeers %d out of range [1, %d]", ErrInvalidConfig, cfg.MaxPeers, maxPeersLimit)
	case cfg.MaxEndpoints < 0 || cfg.MaxEndpoints > maxEPsLimit:
		return nil, fmt.Errorf("%w: MaxEndpoints %d out of range [1, %d]", ErrInvalidConfig, cfg.MaxEndpoints, maxEPsLimit)
	case cfg.MaxBlocks > maxBlocksLimit:
		return nil, fmt.Errorf("%w: MaxBlocks %d exceeds %d", ErrInvalidConfig, cfg.MaxBlocks, maxBlocksLimit)
	}
	g := &Group{
		conn:     cfg.Conn,
		subject:  cfg.Subject,
		id:       cfg.ID,
		inc:      rand.Uint64(),
		signal:   cfg.Signal,
		maxAge:   int64(cfg.MaxSignalAge),
		index:    cfg.Index,
		interval: cfg.Interval,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		maxEPs:   cfg.MaxEndpoints,

		recvBuffer: recvBufferBytes,
	}
	if g.clock == nil {
		g.clock = systemClock{}
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.known.Store(new(keySet))
	// The ring of pick-time buckets covers the maximum signal age and an
	// interval more, in at most 256 buckets of at least an interval.
	span := cfg.MaxSignalAge + cfg.Interval
	width := cfg.Interval
	horizon := int((span + width - 1) / width)
	if horizon > 256 {
		horizon = 256
		width = (span + 255) / 256
	}
	g.local.init(int64(width), horizon, cfg.MaxEndpoints, cfg.MaxBlocks)
	g.peers = peers{ttl: int64(cfg.TTL), max: cfg.MaxPeers, maxBytes: maxSenderBytes}
	return g, nil
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// now returns the clock's reading in nanoseconds on the Group's time line,
// which follows the monotonic clock when the readings carry it (as the
// system clock's do): a step of the wall clock then neither keeps a
// vanished peer counted nor moves this replica's picks to other buckets.
func (g *Group) now() int64 { return g.line.UnixNano(g.clock.Now()) }

// ID returns the name this replica publishes under.
func (g *Group) ID() string { return g.id }

// Load implements [llmlb.Signal]. It returns the inner signal's
// observation of key (Config.Signal) corrected for what happened since it
// was taken: plus the requests in flight that peers picked for key at or
// after the observation's time (those streaming count as running, those
// before their first token as waiting, and their tokens as KV usage when
// the observation reports the capacity, capped at 1), and minus the
// requests the peers picked before that time and finished since (the
// engine counted them, and they are gone; they are taken from the running,
// then the waiting). The observation's time is kept, so the balancer
// corrects it for this replica's own requests, as it does without sharing:
// it adds its dispatches since then, and takes off its requests the
// observation counted that have finished since. Load.PeerWaiting and
// PeerPrefillTokens report every request of the peers at key before its
// first token, whenever picked, and the prompt tokens it has still to
// prefill, so that the balancer prices the peers' queue at its true
// prefill rather than at a mean prompt.
//
// When no usable observation exists (no inner signal, none for key, or one
// older than MaxSignalAge) but peers have work at key, Load returns this
// replica's and the peers' requests in flight as an observation taken now;
// the balancer then adds none of its own dispatches to it. Otherwise it
// returns the inner signal's answer unchanged.
func (g *Group) Load(key string) (llmlb.Load, bool) {
	t := g.clock.Now()
	now := g.line.UnixNano(t)
	g.markKnown(key)
	var obs llmlb.Load
	var ok bool
	if g.signal != nil {
		obs, ok = g.signal.Load(key)
	}
	if ok && !obs.At.IsZero() && now-g.line.UnixNano(obs.At) <= g.maxAge {
		at := g.line.UnixNano(obs.At)
		w, found := g.peers.work(key, at, now)
		found = g.extrapolate(key, &w) || found
		// This replica's own requests finished since are not taken off:
		// the balancer takes them off the observation itself (its epoch
		// counts, llmlb's balancer.go doneEpoch), and would count them
		// twice.
		gone := w.finished
		if !found && gone == 0 {
			return obs, true
		}
		// The requests finished since were running or waiting: take them
		// from the running first.
		running := float64(obs.Running) - gone
		waiting := float64(obs.Waiting) + min(running, 0)
		obs.Running = addCount(0, max(running, 0)+w.streaming)
		obs.Waiting = addCount(0, max(waiting, 0)+w.queued)
		if capacity := float64(obs.KVBlocks) * float64(obs.BlockSize); capacity > 0 && obs.KVUsage >= 0 && obs.KVUsage <= 1 {
			obs.KVUsage = min(1, obs.KVUsage+w.tokens/capacity)
		}
		obs.PeerWaiting = addCount(0, w.waiting)
		obs.PeerPrefillTokens = addTokens(w.prefill)
		return obs, true
	}
	w, found := g.peers.work(key, math.MinInt64, now)
	found = g.extrapolate(key, &w) || found
	if !found {
		return obs, ok
	}
	streaming, queued, _ := g.local.totals(key)
	return llmlb.Load{
		At:                t,
		Running:           addCount(int(streaming), w.streaming),
		Waiting:           addCount(int(queued), w.queued),
		KVUsage:           math.NaN(),
		PeerWaiting:       addCount(0, w.waiting),
		PeerPrefillTokens: addTokens(w.prefill),
	}, true
}

// extrapolate adds to w the peers' picks at key since their last batch
// arrived, which no batch describes yet, and reports whether it added any.
// The peers route the same kind of traffic on the same view of the
// endpoints as this replica, so they are taken to have picked like it: its
// own picks at key since that batch, each with its tokens, times the ratio
// of the peers' requests in flight to its own. Behind a load balancer that
// spreads arrivals evenly, that is one pick per peer for each of its own,
// so that the replicas do not each send the endpoint that looks best their
// share of a burst before they hear of one another's. Without peers it
// adds nothing.
func (g *Group) extrapolate(key string, w *work) bool {
	if w.out == 0 {
		return false
	}
	picks, tokens, prefill, own := g.local.recent(key)
	if picks == 0 || own == 0 {
		return false
	}
	r := float64(w.out) / float64(own)
	w.queued += r * float64(picks)
	w.tokens += r * float64(tokens)
	w.waiting += r * float64(picks)
	w.prefill += r * float64(prefill)
	return true
}

// addCount returns n plus f rounded, saturating at the largest int32 so
// that sums in the balancer cannot overflow; f is not negative.
func addCount(n int, f float64) int {
	s := float64(n) + math.Round(f)
	if s > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(s)
}

// addTokens returns f rounded, saturating at the largest int64 token count
// the wire carries; f is not negative.
func addTokens(f float64) int64 {
	return int64(min(math.Round(f), maxTokens))
}

// keySet is one generation of the endpoint keys a Group knows.
type keySet struct {
	m sync.Map     // string -> struct{}
	n atomic.Int64 // entries of m
}

// markKnown remembers that the balancer scores key, so peers' routes to it
// are recorded. It allocates only the first time a key is seen in a
// generation. A generation holds MaxEndpoints keys; when it is full, a new
// one starts and the full one is kept as the previous, so that the keys
// scored since are remembered however many were scored before, and a key
// not scored for a whole generation is forgotten.
func (g *Group) markKnown(key string) {
	if g.index == nil {
		return
	}
	ks := g.known.Load()
	if _, ok := ks.m.Load(key); ok {
		return
	}
	if ks.n.Load() >= int64(g.maxEPs) {
		g.knownMu.Lock()
		if ks == g.known.Load() {
			g.knownPrev.Store(ks)
			g.known.Store(new(keySet))
		}
		ks = g.known.Load()
		g.knownMu.Unlock()
	}
	if _, loaded := ks.m.LoadOrStore(key, struct{}{}); !loaded {
		ks.n.Add(1)
	}
}

// isKnown reports whether the balancer scored key lately (see markKnown).
func (g *Group) isKnown(key string) bool {
	if _, ok := g.known.Load().m.Load(key); ok {
		return true
	}
	if ks := g.knownPrev.Load(); ks != nil {
		_, ok := ks.m.Load(key)
		return ok
	}
	return false
}

// Observer returns the functions that record this replica's picks for its
// peers, followed by next's (nil for none). Give the result to
// llmlb.WithObserver. The functions take one short lock and never touch the
// network; a pick that does not fit the bounded buffers is dropped and
// counted in [Stats].Dropped.
func (g *Group) Observer(next *llmlb.Observer) *llmlb.Observer {
	var n llmlb.Observer
	if next != nil {
		n = *next
	}
	return &llmlb.Observer{
		Pick: func(info llmlb.PickInfo) {
			if info.Err == nil && info.Endpoint != nil {
				g.local.pick(&info, g.now())
				g.markKnown(info.Endpoint.Key())
			}
			if n.Pick != nil {
				n.Pick(info)
			}
		},
		FirstToken: func(info llmlb.FirstTokenInfo) {
			if info.Endpoint != nil {
				g.local.firstToken(info.Endpoint.Key(), g.now()-int64(info.Latency))
			}
			if n.FirstToken != nil {
				n.FirstToken(info)
			}
		},
		Done: func(info llmlb.DoneInfo) {
			if info.Endpoint != nil {
				now := g.now()
				// A request that never reached the engine was in none of
				// its observations: the peers must not take it off them.
				sent := info.Streamed || info.Err == nil || !errors.Is(info.Err, llmlb.ErrNotSent)
				g.local.done(info.Endpoint.Key(), now-int64(info.Latency), now, info.Streamed, sent)
			}
			if n.Done != nil {
				n.Done(info)
			}
		},
	}
}

// Stats describes a Group's sharing.
type Stats struct {
	// Connected reports whether the NATS connection was up at the last
	// batch of [Group.Run]; it is false for a Group without NATS. While it
	// is down, batches are not published and, once the peers' batches
	// expire, the balancer routes on local state alone.
	Connected bool
	// Peers is the number of peers whose batches count now, each counted
	// once however many parts its batches are published in.
	Peers int
	// Published counts batches published, or built by
	// [Group.AppendBatch]; Unpublished those not published because the
	// connection was down or the publish failed.
	Published, Unpublished uint64
	// Received counts peers' batches applied (each part of one); Rejected
	// those refused: malformed, late, from a peer beyond MaxPeers, or
	// parts of a peer's batch beyond 64 MiB or 64 parts, and those
	// [Group.Run] dropped because 256 batches or 32 MiB of them were
	// already waiting to be applied.
	Received, Rejected uint64
	// Dropped counts picks not recorded for the peers: the endpoint table
	// or the batch's block buffer was full, the endpoint key is longer
	// than the 1024 bytes a batch carries, or the batch did not fit what
	// the peers take (see [Group.AppendBatch]; [Group.Run] publishes it in
	// parts, and drops only the prefix blocks of an endpoint whose blocks
	// do not fit one part).
	Dropped uint64
}

// Stats returns the Group's state and counters.
func (g *Group) Stats() Stats {
	return Stats{
		Connected:   g.connected.Load(),
		Peers:       g.peers.live(g.now()),
		Published:   g.published.Load(),
		Unpublished: g.publishFailed.Load(),
		Received:    g.received.Load(),
		Rejected:    g.rejected.Load(),
		Dropped:     g.local.dropped.Load(),
	}
}

// Run subscribes to the subject and, until ctx is done, publishes a batch
// every Interval and applies the peers' batches as they arrive, on the
// subscription's goroutine; while they arrive faster than they are
// applied, it holds at most 256 of them and 32 MiB, drops the others and
// counts them in [Stats].Rejected, and says so in the log. It returns
// ctx.Err(), or an error if the subscription cannot be made. While the
// connection is down Run keeps going: it skips publishing, lets the peers'
// batches expire, and resumes when the connection does. Once the
// connection is closed for good (closed by the program, or out of
// reconnection attempts: connect with nats.MaxReconnects(-1) to retry
// forever) Run returns an error wrapping [nats.ErrConnectionClosed] at its
// next Interval; the balancer goes on with its own work alone, and the
// peers' work stops counting as their batches age. Run may be called again
// after it returns, but not twice at once. Without a Config.Conn, Run
// returns an error at once.
func (g *Group) Run(ctx context.Context) error {
	if g.conn == nil {
		return fmt.Errorf("%w: Group.Run needs a Config.Conn", ErrInvalidConfig)
	}
	if !g.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Group.Run", ErrRunning)
	}
	defer g.running.Store(false)
	// The subscription's own goroutine applies the batches; those waiting
	// for it are bounded in count and bytes, and NATS drops the excess.
	sub, err := g.conn.Subscribe(g.subject, func(msg *nats.Msg) { _ = g.receive(msg.Data) })
	if err != nil {
		return fmt.Errorf("share: subscribe to %q: %w", g.subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(recvBufferMsgs, g.recvBuffer); err != nil {
		return fmt.Errorf("share: subscribe to %q: %w", g.subject, err)
	}
	var drops dropCounter
	defer drops.count(g, sub)
	g.connected.Store(g.conn.IsConnected())
	g.downSince, g.downSkipped = time.Time{}, 0
	tick := time.NewTicker(g.interval)
	defer tick.Stop()
	var buf []byte
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if g.conn.IsClosed() {
				g.connected.Store(false)
				return fmt.Errorf("share: the Group stops: %w", nats.ErrConnectionClosed)
			}
			buf = g.publish(buf[:0])
			g.expire()
			drops.count(g, sub)
		}
	}
}

// Bounds on the peers' batches received by [Group.Run] and not yet
// applied: beyond either, NATS drops the batches that arrive.
const (
	recvBufferMsgs  = 256
	recvBufferBytes = 4 * maxMessageBytes
)

// dropCounter counts in [Stats].Rejected the batches the subscription of
// Run dropped, and says so in the log, at most once a downReportInterval.
type dropCounter struct {
	seen   int // drops counted
	logged time.Time
}

func (d *dropCounter) count(g *Group, sub *nats.Subscription) {
	n, err := sub.Dropped()
	if err != nil || n <= d.seen {
		return
	}
	g.rejected.Add(uint64(n - d.seen))
	if now := g.clock.Now(); d.logged.IsZero() || now.Sub(d.logged) >= downReportInterval {
		d.logged = now
		g.log.Warn("share: peers' batches arrive faster than they are applied; the excess is dropped",
			"self", g.id, "dropped", n-d.seen, "buffer_bytes", g.recvBuffer)
	}
	d.seen = n
}

// AppendBatch appends to buf this replica's batch as of the Group's clock,
// for the caller to deliver to every peer's [Group.Receive], and returns
// the extended buffer. It also forgets the peers not heard from within the
// TTL, and the prefix blocks it carries are not carried again. It is for a
// Group without a Config.Conn, whose caller carries the batches over
// another transport, or on simulated time: call it every Interval, and
// never while [Group.Run] runs. The batch must not be reordered with the
// previous ones of this Group: a peer refuses a batch older than one it
// has. A batch is at most the 8 MiB a peer takes: past it, the endpoints
// that do not fit are left out, their requests in flight and picks counted
// in [Stats].Dropped (and said in the log), where [Group.Run] would publish
// the batch in parts.
func (g *Group) AppendBatch(buf []byte) []byte {
	g.batchMu.Lock()
	defer g.batchMu.Unlock()
	m := &g.batch
	g.local.snapshot(m, g.now())
	m.id, m.inc, m.seq = g.id, g.inc, g.seq.Add(1)
	g.published.Add(1)
	g.expire()
	start := len(buf)
	buf = appendMessage(buf, m)
	if len(buf)-start <= maxMessageBytes {
		return buf
	}
	// Larger than any peer takes: the endpoints that fit are kept, and
	// the work of the others is counted as dropped.
	parts, dropped, _ := split(m, maxMessageBytes, maxSenderBytes, g.partMsgs)
	g.partMsgs = parts
	for _, p := range parts[1:] {
		dropped += len(p.routes)
		for _, e := range p.eps {
			for _, b := range e.buckets {
				dropped += int(b.out)
			}
		}
	}
	g.local.dropped.Add(uint64(dropped))
	g.log.Warn("share: batch larger than peers take; the work at some endpoints is not shared",
		"self", g.id, "bytes", len(buf)-start, "dropped", dropped)
	first := message{id: g.id, inc: g.inc, seq: m.seq, width: m.width, phase: m.phase, horizon: m.horizon}
	if len(parts) > 0 {
		first.eps, first.routes = parts[0].eps, parts[0].routes
	}
	buf = appendMessage(buf[:start], &first)
	for k := range parts {
		parts[k].eps, parts[k].routes = parts[k].eps[:0], parts[k].routes[:0]
	}
	return buf
}

// Receive applies a peer's batch, made by its [Group.AppendBatch], as
// arrived at the Group's clock's time: it counts until TTL after that. It
// returns an error if the batch is refused (malformed, older than one of
// the same peer applied before, from a new peer beyond MaxPeers, a part of
// a peer's batch beyond 64 MiB or 64 parts, or from another replica with
// this Group's ID); refused batches are counted in
// [Stats].Rejected. This Group's own batches are ignored, read no further
// than their sender.
func (g *Group) Receive(data []byte) error {
	return g.receive(data)
}

// expire forgets the peers not heard from within the TTL.
func (g *Group) expire() {
	for _, id := range g.peers.expire(g.now()) {
		g.log.Info("share: peer expired; its work no longer counts", "peer", id, "self", g.id)
	}
}

// downReportInterval is how often a Group repeats, while its NATS
// connection stays down, that it cannot publish.
const downReportInterval = time.Minute

// publish sends one batch and returns the encoding buffer for reuse.
func (g *Group) publish(buf []byte) []byte {
	now := g.clock.Now()
	up := g.conn.IsConnected()
	was := g.connected.Swap(up)
	if up {
		if !was {
			g.log.Info("share: NATS connected; sharing with peers", "self", g.id)
		}
		g.downSince, g.downSkipped = time.Time{}, 0
	} else {
		g.notConnected(now, was)
	}
	g.batchMu.Lock()
	defer g.batchMu.Unlock()
	m := &g.batch
	g.local.snapshot(m, g.line.UnixNano(now))
	if !up {
		g.publishFailed.Add(1)
		return buf
	}
	m.id, m.inc, m.seq = g.id, g.inc, g.seq.Add(1)
	buf = appendMessage(buf, m)
	limit := maxMessageBytes
	if p := g.conn.MaxPayload(); p > 0 && p < int64(limit) {
		limit = int(p)
	}
	var err error
	parts := 1
	if len(buf) <= limit {
		err = g.conn.Publish(g.subject, buf)
	} else {
		buf, parts, err = g.publishParts(buf, m, limit)
	}
	// The parts published last time and not now are published empty, so
	// that their work stops counting at once.
	for k := parts; k < g.parts && err == nil; k++ {
		empty := message{id: partID(g.id, k), inc: g.inc, seq: g.seq.Add(1), width: m.width, phase: m.phase, horizon: m.horizon}
		buf = appendMessage(buf[:0], &empty)
		err = g.conn.Publish(g.subject, buf)
	}
	if err == nil || parts > g.parts {
		g.parts = parts
	}
	if err != nil {
		g.publishFailed.Add(1)
		if !g.failing {
			// Say why once, not every Interval: until a publish succeeds
			// again, peers route without this replica's work.
			g.failing = true
			g.log.Warn("share: cannot publish; peers do not see this replica's work until it can",
				"self", g.id, "bytes", len(buf), "err", err)
		}
		return buf
	}
	if g.failing {
		g.failing = false
		g.log.Info("share: publishing again", "self", g.id)
	}
	g.published.Add(1)
	return buf
}

// publishParts publishes m, whose encoding exceeds limit bytes, in parts
// of at most limit bytes (see split), and returns the encoding buffer, the
// number of parts and the first error. An endpoint that does not fit a
// part alone, or that the receivers would not keep (beyond maxParts parts
// or maxSenderBytes), is left out, with an error wrapping
// nats.ErrMaxPayload, after the others are published.
func (g *Group) publishParts(buf []byte, m *message, limit int) ([]byte, int, error) {
	parts, dropped, tooLarge := split(m, limit, maxSenderBytes, g.partMsgs)
	g.partMsgs = parts
	if dropped > 0 {
		g.local.dropped.Add(uint64(dropped))
	}
	var err error
	for k := range parts {
		p := &parts[k]
		p.id, p.inc, p.seq = partID(g.id, k), g.inc, g.seq.Add(1)
		buf = appendMessage(buf[:0], p)
		if e := g.conn.Publish(g.subject, buf); e != nil && err == nil {
			err = e
		}
	}
	for k := range parts {
		parts[k].eps, parts[k].routes = parts[k].eps[:0], parts[k].routes[:0]
	}
	if err == nil && tooLarge != "" {
		err = fmt.Errorf("share: the work at endpoint %.64q does not fit a batch of %d bytes, or %d parts of %d MiB in all: %w", tooLarge, limit, maxParts, maxSenderBytes>>20, nats.ErrMaxPayload)
	}
	return buf, len(parts), err
}

// notConnected records a batch that publish skips because the connection
// is down; wasUp reports whether it was up at the batch before. It warns at
// the first such batch of an outage, whether the connection went down or
// never came up, and then every downReportInterval while the outage lasts,
// so that a wrong or unreachable NATS URL is reported without a line every
// Interval.
func (g *Group) notConnected(now time.Time, wasUp bool) {
	g.downSkipped++
	switch {
	case wasUp:
		g.downSince, g.downLogged = now, now
		g.log.Warn("share: NATS disconnected; routing on local state until it reconnects", "self", g.id)
	case g.downSince.IsZero():
		g.downSince, g.downLogged = now, now
		g.log.Warn("share: NATS not connected; cannot publish, routing on local state until it connects", "self", g.id)
	case now.Sub(g.downLogged) >= downReportInterval:
		g.downLogged = now
		g.log.Warn("share: NATS still not connected; cannot publish, routing on local state until it connects",
			"self", g.id, "for", now.Sub(g.downSince).Round(time.Second), "unpublished", g.downSkipped)
	}
}

// keepDecoded is the size of the largest batch whose decoded memory a Group
// keeps for the next one; a batch of more than MaxEndpoints endpoints is not
// kept either. Nor is the memory of batches that grew it beyond
// maxKeptDecoded in all: the slices of routes and endpoints that one batch
// grew are kept when the next has fewer, so that batches each larger than
// the last in another slice would otherwise keep all of them.
const (
	keepDecoded    = 256 << 10
	maxKeptDecoded = 4 * keepDecoded
)

// receive applies one peer batch.
func (g *Group) receive(data []byte) error {
	if id, inc, ok := decodeSender(data); ok && inc == g.inc && isOwnID(id, g.id) {
		// This Group's own batch, echoed by NATS: the rest is not read,
		// and the buffers kept for the peers' batches are kept.
		return nil
	}
	g.recvMu.Lock()
	defer g.recvMu.Unlock()
	m := &g.recv
	defer func() {
		if len(data) > keepDecoded || len(m.eps) > g.maxEPs || g.recvGrown > maxKeptDecoded {
			// The buffers a rare large batch grew are dropped after it,
			// so that its memory is not kept for the small ones that
			// follow.
			g.recv, g.keys, g.recvGrown = message{}, keyTable{}, 0
			g.peers.dropSpare()
		}
	}()
	err := decodeGrowing(m, &g.keys, data, &g.recvGrown)
	if err != nil {
		g.rejected.Add(1)
		return err
	}
	if baseID(m.id) == g.id {
		// Another replica's, since this one's incarnation was checked.
		g.rejected.Add(1)
		if now := g.clock.Now(); m.inc != g.impostor && (g.impostorLogged.IsZero() || now.Sub(g.impostorLogged) >= downReportInterval) {
			// Peers see the two replicas' batches replace each
			// other's: say so once per other replica, and at most
			// once a minute, whatever claims new incarnations.
			g.impostor, g.impostorLogged = m.inc, now
			g.log.Warn("share: another replica publishes under this ID; peers miss the work of one of the two", "self", g.id)
		}
		return fmt.Errorf("%w: another replica publishes as %q", ErrRefused, g.id)
	}
	t := g.clock.Now()
	now := g.line.UnixNano(t)
	joined, ok := g.peers.apply(m, len(data), now)
	if !ok {
		g.rejected.Add(1)
		return fmt.Errorf("%w: batch %d of peer %q came late, the peer is beyond MaxPeers, or its batch in parts is too large", ErrRefused, m.seq, m.id)
	}
	g.received.Add(1)
	g.local.newBatch()
	if joined {
		g.log.Info("share: peer joined", "peer", baseID(m.id), "self", g.id)
	}
	if g.index == nil {
		return nil
	}
	for _, r := range m.routes {
		key := m.eps[r.ep].key
		if g.isKnown(key) {
			_ = g.index.Record(key, r.blocks, t)
		}
	}
	return nil
}
