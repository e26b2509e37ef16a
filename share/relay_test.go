package share

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// zmq4 v0.17.0 never stops the sending goroutine of a PUB socket: Close
// does not close its writer. The relay test's engine leaves one behind.
const zmq4PubWriter = "github.com/go-zeromq/zmq4.(*pubMWriter).run"

// relayBlock is the block size of the relay tests, in tokens.
const relayBlock = 4

// relayPrompt returns n blocks of tokens starting at token base.
func relayPrompt(base uint32, n int) []uint32 {
	t := make([]uint32, n*relayBlock)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

// storedEvent returns the BlockStored event of blocks [from, to) of tokens
// whose router hashes are hashes; the engine's hash of a block is its
// router hash plus one.
func storedEvent(hashes []uint64, tokens []uint32, from, to int) kvevents.Event {
	e := kvevents.Event{Kind: kvevents.Stored, BlockSize: relayBlock, Medium: "GPU", TokenIDs: tokens[from*relayBlock : to*relayBlock]}
	for _, h := range hashes[from:to] {
		e.BlockHashes = append(e.BlockHashes, h+1)
	}
	if from > 0 {
		e.Parent, e.HasParent = hashes[from-1]+1, true
	}
	return e
}

// relayIndex returns an events index and a token-mode hasher of
// relayBlock tokens.
func relayIndex(t *testing.T) (*prefix.Index, *prefix.Hasher) {
	t.Helper()
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: relayBlock})
	require.NoError(t, err)
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: relayBlock, EventsOnly: true})
	require.NoError(t, err)
	return idx, h
}

// freeAddr returns a loopback TCP address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return fmt.Sprintf("tcp://%s", l.Addr())
}

// TestRelayServesFollowers runs an engine's publisher over ZMQ, a
// forwarding Subscriber and a Relay onto a real NATS server, and two
// Followers, one per router, each with its own Applier: both indexes follow
// the engine, an engine restart clears them, and so does the Subscriber
// stopping, then a Follower stopping.
func TestRelayServesFollowers(t *testing.T) {
	ns := startServer(t, -1)
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	salt := prefix.Salt{Model: "m"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	startPublisher := func() (*kvevents.Publisher, context.CancelFunc) {
		p, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: pubAddr, ReplayEndpoint: replayAddr, Topic: "kv-events"})
		require.NoError(t, err)
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		wg.Go(func() { defer close(done); _ = p.Run(pctx) })
		return p, func() { pcancel(); <-done }
	}
	p, stopPub := startPublisher()

	type router struct {
		idx  *prefix.Index
		ap   *kvevents.Applier
		stop context.CancelFunc
		done chan struct{}
	}
	var routers []*router
	var h *prefix.Hasher
	for range 2 {
		idx, hasher := relayIndex(t)
		h = hasher
		ap, err := kvevents.NewApplier(kvevents.Config{Index: idx, Hasher: hasher})
		require.NoError(t, err)
		require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
		f, err := NewFollower(FollowerConfig{Conn: connect(t, ns.ClientURL()), Sink: ap})
		require.NoError(t, err)
		r := &router{idx: idx, ap: ap, done: make(chan struct{})}
		fctx, stop := context.WithCancel(ctx)
		r.stop = stop
		wg.Go(func() { defer close(r.done); _ = f.Run(fctx) })
		routers = append(routers, r)
	}
	relay, err := NewRelay(RelayConfig{Conn: connect(t, ns.ClientURL())})
	require.NoError(t, err)
	sub, err := kvevents.NewSubscriber(kvevents.Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Forward: relay.Forward})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]kvevents.Endpoint{"e1": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events"}}))
	subCtx, stopSub := context.WithCancel(ctx)
	subDone := make(chan struct{})
	wg.Go(func() { defer close(subDone); _ = sub.Run(subCtx) })

	const waitFor, tick = 10 * time.Second, 5 * time.Millisecond
	// Publish empty batches until both followers apply one.
	require.Eventually(t, func() bool {
		p.Publish(&kvevents.Batch{})
		for _, r := range routers {
			if st, _ := r.ap.Stats("e1"); st.Batches == 0 {
				return false
			}
		}
		return true
	}, waitFor, 20*time.Millisecond)
	matches := func(hashes []uint64, n int) func() bool {
		return func() bool {
			for _, r := range routers {
				if r.idx.MatchLen("e1", hashes, time.Now()) != n {
					return false
				}
			}
			return true
		}
	}

	a := relayPrompt(1, 3)
	ha := h.HashTokens(salt, a)
	p.Publish(&kvevents.Batch{TS: 1, Events: []kvevents.Event{storedEvent(ha, a, 0, 2)}})
	p.Publish(&kvevents.Batch{TS: 2, Events: []kvevents.Event{storedEvent(ha, a, 2, 3)}})
	p.Publish(&kvevents.Batch{TS: 3, Events: []kvevents.Event{{Kind: kvevents.Removed, Medium: "GPU", BlockHashes: []uint64{ha[2] + 1}}}})
	// The first batch alone already matches two blocks: wait for the
	// third batch, then check what the three left.
	require.Eventually(t, func() bool {
		for _, r := range routers {
			if st, _ := r.ap.Stats("e1"); st.Removed == 0 {
				return false
			}
		}
		return true
	}, waitFor, tick)
	assert.True(t, matches(ha, 2)())
	for _, r := range routers {
		st, ok := r.ap.Stats("e1")
		require.True(t, ok)
		assert.Zero(t, st.Gaps)
		assert.Zero(t, st.Resets)
		assert.Equal(t, int64(3), st.Stored)
		assert.Equal(t, int64(1), st.Removed)
	}

	// The engine restarts: the followers drop what they knew.
	stopPub()
	p, stopPub = startPublisher()
	defer stopPub()
	c := relayPrompt(200, 1)
	hc := h.HashTokens(salt, c)
	require.Eventually(t, func() bool {
		p.Publish(&kvevents.Batch{TS: 5, Events: []kvevents.Event{storedEvent(hc, c, 0, 1)}})
		return matches(hc, 1)()
	}, waitFor, 20*time.Millisecond)
	assert.True(t, matches(ha, 0)())

	// The subscriber stops: its last forward is a clear, which reaches
	// every follower.
	stopSub()
	<-subDone
	require.Eventually(t, func() bool {
		for _, r := range routers {
			if r.idx.Len("e1") != 0 {
				return false
			}
		}
		return true
	}, waitFor, tick)
	ok, failed := relay.Published()
	assert.Positive(t, ok)
	assert.Zero(t, failed)

	// A follower that stops clears its sink: nothing keeps it current.
	r := routers[0]
	r.ap.Apply("e1", 0, kvevents.AppendBatch(nil, &kvevents.Batch{Events: []kvevents.Event{storedEvent(ha, a, 0, 2)}}))
	require.Equal(t, 2, r.idx.Len("e1"))
	r.stop()
	<-r.done
	assert.Equal(t, 0, r.idx.Len("e1"))
}

// sinkCall is one call of a recordingSink.
type sinkCall struct {
	key     string
	seq     int64
	payload string
	clear   bool
}

// recordingSink records what a Follower hands it.
type recordingSink struct{ calls []sinkCall }

func (s *recordingSink) Apply(key string, seq int64, payload []byte) {
	s.calls = append(s.calls, sinkCall{key: key, seq: seq, payload: string(payload)})
}
func (s *recordingSink) Clear() { s.calls = append(s.calls, sinkCall{clear: true}) }

// relayed returns the message a Relay publishes for key's batch seq (a
// clear for a nil payload).
func relayed(key string, seq int64, payload []byte) *nats.Msg {
	return relayMessage(DefaultRelaySubject, "", key, seq, payload, 1<<20)
}

// A Follower hands the Sink each relayed batch with its endpoint and
// sequence number, and a clear for a clear or a message that is not a
// relayed batch.
func TestFollowerMessages(t *testing.T) {
	sink := &recordingSink{}
	var errs []error
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, OnError: func(_ string, err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	f.receive(relayed("e1", 7, []byte("batch")))
	f.receive(relayed("e2", 0, nil))
	bad := relayed("e1", 8, []byte("batch"))
	bad.Header.Set(headerSeq, "x")
	f.receive(bad)
	neg := relayed("e1", 8, []byte("batch"))
	neg.Header.Set(headerSeq, strconv.Itoa(-2))
	f.receive(neg)
	f.receive(relayMessage(DefaultRelaySubject, "", "e3", 9, make([]byte, 100), 100))
	assert.Equal(t, []sinkCall{
		{key: "e1", seq: 7, payload: "batch"},
		{key: "e2", seq: -1},
		{key: "e1", seq: -1},
		{key: "e1", seq: -1},
		{key: "e3", seq: -1}, // too large for the connection: a clear
	}, sink.calls)
	require.Len(t, errs, 2)
	assert.ErrorIs(t, errs[0], ErrMalformed)
}

func TestRelayConfigErrors(t *testing.T) {
	for _, cfg := range []RelayConfig{
		{},
		{Conn: new(nats.Conn), Interval: -1},
		{Conn: new(nats.Conn), Interval: 2 * time.Minute},
		{Conn: new(nats.Conn), ID: strings.Repeat("x", 129)},
	} {
		_, err := NewRelay(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
	for _, cfg := range []FollowerConfig{
		{Sink: &recordingSink{}},
		{Conn: new(nats.Conn)},
		{Conn: new(nats.Conn), Sink: &recordingSink{}, Buffer: -1},
		{Conn: new(nats.Conn), Sink: &recordingSink{}, BufferBytes: -1},
	} {
		_, err := NewFollower(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
}

// A Follower that heard a Relay's heartbeat drops the endpoints it relayed
// once it has heard nothing from it for three Intervals; a Relay that never
// sent a heartbeat is not expired.
func TestFollowerDropsSilentRelay(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sink := &recordingSink{}
	var errs []string
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: clock,
		OnError: func(key string, err error) { errs = append(errs, key+": "+err.Error()) }})
	require.NoError(t, err)
	r1 := &Relay{subject: DefaultRelaySubject, id: "r1", interval: 100 * time.Millisecond}
	from := func(id string, m *nats.Msg) *nats.Msg { m.Header.Set(headerRelay, id); return m }
	f.receive(r1.heartbeat())
	f.receive(from("r1", relayed("e1", 1, []byte("b1"))))
	f.receive(from("r1", relayed("e2", 1, []byte("b2"))))
	f.receive(from("old", relayed("e3", 1, []byte("b3")))) // no heartbeat: never expires
	clock.Set(at(300))
	f.expire()
	require.Len(t, sink.calls, 3, "within three Intervals")
	clock.Set(at(301))
	f.expire()
	require.ElementsMatch(t, []sinkCall{{key: "e1", seq: -1}, {key: "e2", seq: -1}}, sink.calls[3:])
	require.Len(t, errs, 2)
	assert.Contains(t, errs[0], `relay "r1" silent for 301ms`)
	clock.Set(at(5000))
	f.expire()
	require.Len(t, sink.calls, 5, "dropped once; the other Relay never sent a heartbeat")

	// Heard again, it is followed again.
	f.receive(r1.heartbeat())
	f.receive(from("r1", relayed("e1", 2, []byte("b4"))))
	clock.Set(at(5200))
	f.expire()
	require.Len(t, sink.calls, 6)
}

// Relays that never send a heartbeat (not run, or restarted under new IDs)
// do not stop a Follower from following the Relays that do: once silent for
// three minutes they are forgotten, their endpoints kept.
func TestFollowerForgetsRelaysWithoutHeartbeats(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sink := &recordingSink{}
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: clock})
	require.NoError(t, err)
	from := func(id string, m *nats.Msg) *nats.Msg { m.Header.Set(headerRelay, id); return m }
	for i := range maxRelays {
		f.receive(from(fmt.Sprint("gone", i), relayed("e0", 1, []byte("b"))))
	}
	clock.Set(at(int(3*maxRelayInterval/time.Millisecond) + 1))
	f.expire()
	require.Len(t, sink.calls, 1, "the batch handed on once, its repeats dropped; the Relays forgotten, their endpoints kept")
	r1 := &Relay{subject: DefaultRelaySubject, id: "r1", interval: 100 * time.Millisecond}
	f.receive(r1.heartbeat())
	f.receive(from("r1", relayed("e1", 1, []byte("b1"))))
	calls := len(sink.calls)
	clock.Advance(time.Second)
	f.expire()
	assert.Equal(t, []sinkCall{{key: "e1", seq: -1}}, sink.calls[calls:], "r1 fell silent")
}

// A Relay whose process dies (its connection closed without its clears)
// leaves no blocks at the Followers once its heartbeats stop.
func TestRelayDeathDropsBlocks(t *testing.T) {
	ns := startServer(t, -1)
	idx, h := relayIndex(t)
	salt := prefix.Salt{Model: "m"}
	ap, err := kvevents.NewApplier(kvevents.Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
	var dropped sync.Map
	f, err := NewFollower(FollowerConfig{Conn: connect(t, ns.ClientURL()), Sink: ap,
		OnError: func(key string, err error) { dropped.Store(key, err.Error()) }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	relayConn, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	relay, err := NewRelay(RelayConfig{Conn: relayConn, Interval: 50 * time.Millisecond})
	require.NoError(t, err)
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	a := relayPrompt(1, 2)
	ha := h.HashTokens(salt, a)
	payload := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{storedEvent(ha, a, 0, 2)}})
	require.Eventually(t, func() bool {
		relay.Forward("e1", 0, payload)
		_ = relayConn.Flush()
		return idx.MatchLen("e1", ha, time.Now()) == 2
	}, 10*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // heartbeats go on: the blocks stay
	require.Equal(t, 2, idx.MatchLen("e1", ha, time.Now()))

	rcancel() // the relay's process dies: no more heartbeats, no clears
	require.ErrorIs(t, <-rdone, context.Canceled)
	relayConn.Close()
	require.Eventually(t, func() bool { return idx.MatchLen("e1", ha, time.Now()) == 0 }, 10*time.Second, 10*time.Millisecond)
	// The Follower clears the endpoint's blocks, then reports why: wait
	// for the report too.
	var msg any
	require.Eventually(t, func() bool {
		var ok bool
		msg, ok = dropped.Load("e1")
		return ok
	}, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, msg, "silent")
}

func TestRelayRunOnce(t *testing.T) {
	ns := startServer(t, -1)
	relay, err := NewRelay(RelayConfig{Conn: connect(t, ns.ClientURL()), Interval: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	require.Eventually(t, func() bool { ok, _ := relay.Published(); return ok > 0 }, 10*time.Second, time.Millisecond)
	assert.ErrorIs(t, relay.Run(ctx), ErrRunning)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

// A batch that does not fit the connection's maximum payload with the
// Relay's headers, its ID's included, is published as a clear, never
// refused: whatever its size, the Followers hear of it.
func TestRelayForwardsBatchesNearMaxPayload(t *testing.T) {
	const maxPayload = 4096
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: maxPayload})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second))
	nc := connect(t, ns.ClientURL())
	relay, err := NewRelay(RelayConfig{Conn: nc, ID: strings.Repeat("r", 128)})
	require.NoError(t, err)
	sub, err := nc.SubscribeSync(DefaultRelaySubject)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	key := strings.Repeat("k", 100)
	sent := 0
	for n := maxPayload - 400; n <= maxPayload; n++ {
		relay.Forward(key, int64(n), make([]byte, n))
		sent++
	}
	ok, failed := relay.Published()
	assert.Zero(t, failed, "batches refused by the connection")
	assert.Equal(t, int64(sent), ok)
	batches, clears := 0, 0
	for range ok {
		m, err := sub.NextMsg(10 * time.Second)
		require.NoError(t, err)
		if m.Header.Get(headerSeq) == clearSeq {
			clears++
		} else {
			batches++
		}
	}
	assert.NotZero(t, batches, "the batches that fit")
	assert.NotZero(t, clears, "the batches that do not")
}

// A message naming a Relay ID or an endpoint key longer than a Relay
// sends is dropped and reported, and the Follower keeps nothing of it:
// else one publisher could make it hold gigabytes of names.
func TestFollowerDropsOversizedNames(t *testing.T) {
	sink := &recordingSink{}
	var errs []error
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, OnError: func(_ string, err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	longID := relayed("e1", 1, []byte("b"))
	longID.Header.Set(headerRelay, strings.Repeat("r", 129))
	f.receive(longID)
	longKey := relayMessage(DefaultRelaySubject, "r1", strings.Repeat("k", 1025), 1, []byte("b"), 1<<20)
	f.receive(longKey)
	longSeq := relayed("e1", 1, []byte("b"))
	longSeq.Header.Set(headerSeq, strings.Repeat("9", 1<<16))
	f.receive(longSeq)
	assert.Zero(t, len(f.relays), "no relay followed")
	assert.Equal(t, []sinkCall{{key: "e1", seq: -1}}, sink.calls, "only the message with a bad sequence reaches the Sink, as a clear")
	require.Equal(t, 3, len(errs))
	for _, err := range errs {
		assert.True(t, errors.Is(err, ErrMalformed))
		assert.Less(t, len(err.Error()), 200, "the error does not carry the message's names")
	}
}

// A Relay does not publish a key its Followers would refuse (over 1024
// bytes): it counts it as failed, and a Follower sees nothing. A key with
// a line break is relayed encoded, and cannot start another header.
func TestRelayRefusesKeysFollowersCannotTake(t *testing.T) {
	ns := startServer(t, -1)
	sub := connect(t, ns.ClientURL())
	msgs := make(chan *nats.Msg, 8)
	s, err := sub.ChanSubscribe(DefaultRelaySubject, msgs)
	require.NoError(t, err)
	defer func() { _ = s.Unsubscribe() }()
	require.NoError(t, sub.Flush())
	r, err := NewRelay(RelayConfig{Conn: connect(t, ns.ClientURL()), ID: "r1"})
	require.NoError(t, err)
	r.Forward(strings.Repeat("k", maxKeyBytes+1), 1, []byte("batch"))
	r.Forward("e1\r\nNats-Relay: forged", 1, []byte("batch"))
	r.Forward("e1", 1, []byte("batch"))
	for _, want := range []string{"e1\r\nNats-Relay: forged", "e1"} {
		select {
		case m := <-msgs:
			key, ok := endpointKey(m.Header)
			assert.True(t, ok)
			assert.Equal(t, want, key)
			assert.Equal(t, "r1", m.Header.Get(headerRelay))
			assert.Empty(t, m.Header.Get("Nats-Relay"))
		case <-time.After(5 * time.Second):
			t.Fatalf("the batch of %q was not relayed", want)
		}
	}
	select {
	case m := <-msgs:
		t.Fatalf("a refused key was relayed: %q", m.Header.Get(headerEndpoint))
	case <-time.After(50 * time.Millisecond):
	}
	ok, failed := r.Published()
	assert.Equal(t, int64(2), ok)
	assert.Equal(t, int64(1), failed)
}
