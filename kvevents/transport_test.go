package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmlb/llmlb/prefix"
)

// peer is a TCP listener standing for an engine that misbehaves: serve
// runs on each connection it accepts, which it closes when the test ends.
type peer struct {
	addr     string
	accepted atomic.Int64
}

func newPeer(t *testing.T, serve func(net.Conn)) *peer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &peer{addr: "tcp://" + l.Addr().String()}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			p.accepted.Add(1)
			wg.Go(func() { serve(c) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// silent serves a connection by never writing a byte: a process that is
// not (or no longer) a ZMQ socket, or a hung engine whose kernel still
// accepts connections.
func silent(c net.Conn) { _, _ = c.Read(make([]byte, 1<<16)) }

// runSubscriber runs sub until the test ends, and returns a function that
// ends Run and reports whether it returned within waitFor.
func runSubscriber(t *testing.T, sub *Subscriber) (stop func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx) }()
	stop = func() bool {
		cancel()
		select {
		case <-done:
			return true
		case <-time.After(waitFor):
			return false
		}
	}
	t.Cleanup(func() { stop() })
	return stop
}

// TestRunReturnsDespiteSilentPeer checks that Run returns when its context
// ends while a subscription waits for the ZMTP greeting of a peer that
// accepted the connection and sends nothing.
func TestRunReturnsDespiteSilentPeer(t *testing.T) {
	idx, h := newTestIndex(t)
	p := newPeer(t, silent)
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: p.addr}}))
	stop := runSubscriber(t, sub)
	require.Eventually(t, func() bool { return p.accepted.Load() > 0 }, waitFor, tick)
	assert.True(t, stop(), "Run did not return while a peer never greeted")
}

// TestRemovingSilentEndpoint checks that removing an endpoint whose peer
// never greets stops its subscription at once, so that the endpoints set
// with it are followed.
func TestRemovingSilentEndpoint(t *testing.T) {
	idx, h := newTestIndex(t)
	p := newPeer(t, silent)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	pub, stopPub := publisherStarter(ctx, t, &wg, freeAddr(t), "")()
	defer stopPub()
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"silent": {PubAddr: p.addr}}))
	runSubscriber(t, sub)
	require.Eventually(t, func() bool { return p.accepted.Load() > 0 }, waitFor, tick)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"good": {PubAddr: pub.cfg.Endpoint, Topic: "kv-events"}}))
	require.Eventually(t, func() bool {
		pub.Publish(&Batch{})
		st, _ := sub.Stats("good")
		return st.Batches > 0
	}, waitFor, 20*time.Millisecond, "the endpoint set in place of a silent one is not followed")
	_, ok := sub.Stats("silent")
	assert.False(t, ok)
}

// TestReplayTimeoutBoundsHandshake checks that a replay socket that
// accepts the connection and never greets holds the stream up for
// ReplayTimeout only: the replay fails, is reported, and the batch that
// asked for it is applied.
func TestReplayTimeoutBoundsHandshake(t *testing.T) {
	idx, h := newTestIndex(t)
	replay := newPeer(t, silent)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	pub, stopPub := publisherStarter(ctx, t, &wg, freeAddr(t), "")()
	defer stopPub()
	// Batch 0 is not sent live: the first batch received asks for a replay.
	pub.publish(&Batch{}, false)
	var errs atomic.Int64
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, ReplayTimeout: 100 * time.Millisecond,
		OnError: func(string, error) { errs.Add(1) }})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pub.cfg.Endpoint, ReplayAddr: replay.addr, Topic: "kv-events"}}))
	runSubscriber(t, sub)
	require.Eventually(t, func() bool {
		pub.Publish(&Batch{})
		st, _ := sub.Stats("e1")
		return st.Batches > 0
	}, waitFor, 50*time.Millisecond, "no batch applied: the replay waits for a greeting past ReplayTimeout")
	assert.Positive(t, replay.accepted.Load())
	assert.Positive(t, errs.Load(), "the failed replay was not reported")
}

// TestHandshakeTimeout checks that a subscription gives up on a peer that
// never greets after the dial timeout, reports it, and tries again.
func TestHandshakeTimeout(t *testing.T) {
	idx, h := newTestIndex(t)
	p := newPeer(t, silent)
	errs := make(chan error, 16)
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, OnError: func(_ string, err error) {
		select {
		case errs <- err:
		default:
		}
	}})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: p.addr}}))
	runSubscriber(t, sub)
	select {
	case err := <-errs:
		// The peer accepted the connection: what ends the attempt is the
		// deadline on its greeting.
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("reported %v, want the greeting's deadline exceeded", err)
		}
	case <-time.After(dialTimeout + waitFor):
		t.Fatalf("no error reported %v after connecting to a peer that never greets", dialTimeout+waitFor)
	}
	require.Eventually(t, func() bool { return p.accepted.Load() >= 2 }, waitFor, tick, "no second attempt")
}

// hostile returns a peer that completes the ZMTP handshake as a PUB socket
// and then sends raw, the bytes frames.
func hostile(t *testing.T, frames []byte) *peer {
	return newPeer(t, func(c net.Conn) {
		zc, err := zmq4.Open(c, null.Security(), zmq4.Pub, zmq4.SocketIdentity(""), true, nil)
		if err != nil {
			return
		}
		_, _ = zc.Write(frames)
		silent(c)
	})
}

// longHeader returns the header of a long frame of size bytes.
func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

// TestOversizedMessage checks that a peer announcing a message larger than
// any batch accepted, or of more frames than any message has, fails the
// connection as soon as the frame header arrives, before anything is
// allocated for it: the failure is reported, and the subscription
// reconnects.
func TestOversizedMessage(t *testing.T) {
	cases := map[string][]byte{
		"one frame beyond the limit": longHeader(0, maxMessageBytes+1),
		"2^40 bytes":                 longHeader(0, 1<<40),
		"2^63-1 bytes":               longHeader(0, 1<<63-1),
		"2^64-1 bytes":               longHeader(0, 1<<64-1),
		"too many frames":            bytes.Repeat([]byte{flagMore, 0}, maxFrames+1),
	}
	for name, frames := range cases {
		t.Run(name, func(t *testing.T) {
			idx, h := newTestIndex(t)
			p := hostile(t, frames)
			errs := make(chan error, 16)
			sub, err := NewSubscriber(Config{Index: idx, Hasher: h, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
				OnError: func(_ string, err error) {
					select {
					case errs <- err:
					default:
					}
				}})
			require.NoError(t, err)
			require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: p.addr}}))
			stop := runSubscriber(t, sub)
			select {
			case err := <-errs:
				assert.True(t, strings.Contains(err.Error(), "beyond") || strings.Contains(err.Error(), "frames"), "%v", err)
			case <-time.After(waitFor):
				t.Fatal("no error reported")
			}
			require.Eventually(t, func() bool { return p.accepted.Load() >= 2 }, waitFor, tick, "no reconnection")
			assert.True(t, stop(), "Run did not return")
		})
	}
}

// chunkConn is a connection whose reads return at most chunk bytes of
// data, and that records its deadlines.
type chunkConn struct {
	net.Conn
	data      []byte
	chunk     int
	deadlines []time.Time
}

func (c *chunkConn) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), c.chunk)], c.data)
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkConn) SetDeadline(t time.Time) error {
	c.deadlines = append(c.deadlines, t)
	return nil
}

// TestGuardConnFraming checks that the guard passes through every byte of
// a well-formed ZMTP stream read in pieces of any size, clears the
// handshake deadline after the peer's first frame only, and fails the read
// that completes the header of a message too large.
func TestGuardConnFraming(t *testing.T) {
	var stream []byte
	stream = append(stream, make([]byte, greetingBytes)...)
	stream = append(stream, 0x04, 5, 5, 'R', 'E', 'A', 'D') // READY, a short command
	stream = append(stream, flagMore, 2, 'k', 'v')
	stream = append(stream, flagMore, 8, 0, 0, 0, 0, 0, 0, 0, 7)
	stream = append(stream, longHeader(0, 300)...)
	stream = append(stream, make([]byte, 300)...)
	stream = append(stream, 0x04|flagLong, 0, 0, 0, 0, 0, 0, 1, 0) // a long command
	stream = append(stream, make([]byte, 256)...)
	for _, chunk := range []int{1, 2, 3, 7, 9, 64, 1 << 10} {
		fake := &chunkConn{data: bytes.Clone(stream), chunk: chunk}
		c := newGuardConn(fake, time.Minute)
		var got []byte
		buf := make([]byte, 100)
		for len(got) < len(stream) {
			n, err := c.Read(buf)
			require.NoError(t, err, "chunks of %d", chunk)
			got = append(got, buf[:n]...)
			if len(got) < greetingBytes+7 {
				assert.Len(t, fake.deadlines, 1, "deadline cleared before the first frame, chunks of %d", chunk)
			}
		}
		assert.Equal(t, stream, got, "chunks of %d", chunk)
		require.Len(t, fake.deadlines, 2, "chunks of %d", chunk)
		assert.False(t, fake.deadlines[0].IsZero())
		assert.True(t, fake.deadlines[1].IsZero())

		// The header of a frame too large fails the read of its last
		// byte, and every read after it.
		fake.data = longHeader(0, maxMessageBytes+1)
		read := 0
		for ; read < 9; read++ {
			if n, err := c.Read(buf[:1]); err != nil {
				assert.Zero(t, n)
				break
			}
		}
		assert.Equal(t, 8, read, "chunks of %d", chunk)
		fake.data = []byte{0}
		_, err := c.Read(buf)
		assert.Error(t, err, "a read after the failure")
	}
	// A message whose frames add up beyond the limit, or has too many
	// frames, fails at the header of the frame too many; the message after
	// a message at the limit does not.
	atLimit := append([]byte{flagMore, 60}, make([]byte, 60)...)
	atLimit = append(atLimit, 0, 40)
	atLimit = append(atLimit, make([]byte, 40)...)
	for name, frames := range map[string][]byte{
		"sizes": append(append([]byte{flagMore, 60}, make([]byte, 60)...), 0, 41),
		"count": bytes.Repeat([]byte{flagMore, 0}, maxFrames+1),
		"next":  append(bytes.Clone(atLimit), atLimit...),
	} {
		stream := append(make([]byte, greetingBytes), 0x04, 0)
		stream = append(stream, frames...)
		c := newGuardConn(&chunkConn{data: stream, chunk: 1}, time.Minute)
		c.limit = 100
		read := 0
		for ; read < len(stream); read++ {
			if _, err := c.Read(make([]byte, 1)); err != nil {
				break
			}
		}
		if name == "next" {
			assert.Equal(t, len(stream), read, name)
		} else {
			assert.Equal(t, len(stream)-1, read, name)
		}
	}
}

// TestSubscriptionEndsCleanly ends, again and again, a subscription whose
// Forward is slow while the engine keeps publishing, so that zmq4's queue
// of received messages is full: once Run has returned, none of the
// subscriber's goroutines remains, zmq4's reader of each connection
// included.
func TestSubscriptionEndsCleanly(t *testing.T) {
	current := goleak.IgnoreCurrent()
	pubAddr := freeAddr(t)
	pub, err := NewPublisher(PublisherConfig{Endpoint: pubAddr, QueueSize: 1 << 16})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = pub.Run(ctx) })
	var forwarded atomic.Int64
	var gate atomic.Pointer[chan struct{}]
	sub, err := NewSubscriber(Config{MinBackoff: 10 * time.Millisecond, Forward: func(key string, seq int64, payload []byte) {
		forwarded.Add(1)
		if g := gate.Load(); payload != nil && g != nil {
			<-*g
		}
	}})
	require.NoError(t, err)
	stop := runSubscriber(t, sub)
	for range 10 {
		g := make(chan struct{})
		gate.Store(&g)
		require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr}}))
		n := forwarded.Load()
		require.Eventually(t, func() bool {
			pub.Publish(&Batch{})
			return forwarded.Load() > n
		}, waitFor, 5*time.Millisecond)
		// Forward now blocks: zmq4 queues what follows, then its reader
		// waits for room in the queue.
		for range 30 {
			pub.Publish(&Batch{})
		}
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, sub.SetEndpoints(nil))
		time.Sleep(20 * time.Millisecond)
		close(g)
		require.Eventually(t, func() bool { _, ok := sub.Stats("e1"); return !ok }, waitFor, tick)
	}
	require.True(t, stop(), "Run did not return")
	cancel()
	wg.Wait()
	requireNoLeak(t, current)
}

// TestReplayEndsCleanly checks that a replay that has what it asked for
// while the replay socket still sends (the batches published since) leaves
// none of zmq4's goroutines behind, although zmq4's queue of received
// messages is full when it ends.
func TestReplayEndsCleanly(t *testing.T) {
	current := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	pub, stopPub := publisherStarter(ctx, t, &wg, pubAddr, replayAddr)()
	var (
		gated   = int64(-1)
		slow    = int64(-1)
		blocked = make(chan struct{})
		gate    = make(chan struct{})
		mu      sync.Mutex // protects gated and slow
	)
	sub, err := NewSubscriber(Config{Forward: func(key string, seq int64, payload []byte) {
		mu.Lock()
		g, s := gated, slow
		mu.Unlock()
		switch {
		case payload == nil:
		case seq == g:
			close(blocked)
			<-gate // the batches that follow are published meanwhile
		case seq == s:
			time.Sleep(100 * time.Millisecond) // the replay's reply fills zmq4's queue
		}
	}})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events"}}))
	stop := runSubscriber(t, sub)
	stats := func() Stats { s, _ := sub.Stats("e1"); return s }
	require.Eventually(t, func() bool {
		pub.Publish(&Batch{})
		return stats().Batches > 0
	}, waitFor, 20*time.Millisecond)
	pub.mu.Lock()
	k := pub.seq
	pub.mu.Unlock()
	require.Eventually(t, func() bool { return stats().Seq == k-1 }, waitFor, tick)
	// Batch k blocks Forward; meanwhile k+1 is lost and k+2 arrives,
	// which asks the replay for k+1: the replay sends k to k+60.
	mu.Lock()
	gated, slow = k, k+1
	mu.Unlock()
	pub.Publish(&Batch{})
	<-blocked
	for seq := k + 1; seq <= k+60; seq++ {
		pub.publish(&Batch{}, seq == k+2)
	}
	replayed := stats().Replayed
	close(gate)
	require.Eventually(t, func() bool { st := stats(); return st.Seq == k+2 && st.Replayed == replayed+1 }, waitFor, tick)
	require.True(t, stop(), "Run did not return")
	stopPub()
	cancel()
	wg.Wait()
	requireNoLeak(t, current)
}

// TestSubscriberFollowsIPC checks that an ipc:// endpoint, dialed through
// the guarded transport, is followed like a tcp:// one.
func TestSubscriberFollowsIPC(t *testing.T) {
	idx, h := newTestIndex(t)
	dir := t.TempDir()
	pubAddr, replayAddr := "ipc://"+dir+"/pub.sock", "ipc://"+dir+"/replay.sock"
	salt := prefix.Salt{Model: "m"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	p, stopPub := publisherStarter(ctx, t, &wg, pubAddr, replayAddr)()
	defer stopPub()
	p.publish(&Batch{}, false) // batch 0 comes by replay only
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: pubAddr, ReplayAddr: replayAddr, Topic: "kv-events", Salt: salt}}))
	runSubscriber(t, sub)
	a := prompt(1, 2)
	ha := h.HashTokens(salt, a)
	require.Eventually(t, func() bool {
		p.Publish(&Batch{Events: []Event{stored(ha, a, 0, 2)}})
		return idx.MatchLen("e1", ha, time.Now()) == 2
	}, waitFor, 20*time.Millisecond)
	st, _ := sub.Stats("e1")
	assert.Positive(t, st.Replayed)
}

// requireNoLeak fails t unless, within waitFor, no goroutine remains beyond
// those ignored by current and the publishers' zmq4 writers.
func requireNoLeak(t *testing.T, current goleak.Option) {
	t.Helper()
	leak := goleak.Find(current, zmq4PubWriter)
	for deadline := time.Now().Add(waitFor); leak != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		leak = goleak.Find(current, zmq4PubWriter)
	}
	if leak != nil {
		t.Fatal(leak)
	}
}

// bigBatches returns a peer that completes the ZMTP handshake as a PUB
// socket and sends count batches of size bytes (a padding field the
// decoder skips), numbered from 0, then nothing; written counts the bytes
// it wrote.
func bigBatches(t *testing.T, size, count int, written *atomic.Int64) *peer {
	payload := []byte{0x94, 0x00, 0x90, 0xc0, mpBin32} // [ts, events, data_parallel_rank, padding]
	payload = binary.BigEndian.AppendUint32(payload, uint32(size))
	payload = append(payload, make([]byte, size)...)
	return newPeer(t, func(c net.Conn) {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(64 << 10)
		}
		if _, err := zmq4.Open(c, null.Security(), zmq4.Pub, zmq4.SocketIdentity(""), true, nil); err != nil {
			return
		}
		for seq := range uint64(count) {
			msg := append([]byte{flagMore, 0, flagMore, 8}, binary.BigEndian.AppendUint64(nil, seq)...)
			msg = append(msg, longHeader(0, uint64(len(payload)))...)
			for _, b := range [][]byte{msg, payload} {
				for len(b) > 0 {
					n, err := c.Write(b[:min(len(b), 64<<10)])
					written.Add(int64(n))
					if err != nil {
						return
					}
					b = b[n:]
				}
			}
		}
		silent(c)
	})
}

// awaitStall waits until the peer that counts its bytes in written has
// written at least least bytes and then no more for half a second, failing
// t if it writes limit bytes or more, and returns the bytes written.
func awaitStall(t *testing.T, written *atomic.Int64, least, limit int64) int64 {
	t.Helper()
	last, since := int64(-1), time.Now()
	for deadline := time.Now().Add(waitFor); last < least || time.Since(since) < 500*time.Millisecond; {
		require.True(t, time.Now().Before(deadline), "the peer never stalled")
		if n := written.Load(); n != last {
			last, since = n, time.Now()
		}
		require.Less(t, last, limit, "the subscription took %d MiB of batches while busy with one", last>>20)
		time.Sleep(10 * time.Millisecond)
	}
	return last
}

// TestSlowSubscriptionBoundsQueuedBytes checks that a subscription busy
// with one batch holds at most about MaxPayloadBytes of the batches that
// follow, however large they are, rather than the ten messages zmq4 queues
// whatever their size: the connection waits, and once the subscription
// catches up every batch is applied, none lost.
func TestSlowSubscriptionBoundsQueuedBytes(t *testing.T) {
	const (
		size  = 8 << 20 // bytes of padding per batch
		count = 20
	)
	// The kernel grows a connection's receive buffer at will (up to 32 MiB
	// on some hosts, four batches): keep it small, so that what the
	// subscription holds is what is measured.
	dialed = func(c net.Conn) {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10)
		}
	}
	t.Cleanup(func() { dialed = nil })
	var written atomic.Int64
	p := bigBatches(t, size, count, &written)
	gate := make(chan struct{})
	var forwarded, gaps atomic.Int64
	sub, err := NewSubscriber(Config{Forward: func(_ string, seq int64, payload []byte) {
		if payload == nil {
			gaps.Add(1)
			return
		}
		if forwarded.Add(1) == 1 {
			<-gate
		}
	}})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: p.addr}}))
	stop := runSubscriber(t, sub)
	defer close(gate)

	t.Logf("stalled at %d MiB", awaitStall(t, &written, 4*size, 11*size)>>20)
	gate <- struct{}{}
	require.Eventually(t, func() bool { return forwarded.Load() == count }, waitFor, tick, "batches lost")
	assert.Zero(t, gaps.Load())
	st, _ := sub.Stats("e1")
	assert.Equal(t, int64(count-1), st.Seq)
	assert.True(t, stop(), "Run did not return")
}

// TestSubscriptionEndsWhileItsConnectionWaits checks that a subscription
// stopped while its connection waits for it to catch up ends cleanly,
// zmq4's reader of the connection included.
func TestSubscriptionEndsWhileItsConnectionWaits(t *testing.T) {
	var written atomic.Int64
	p := bigBatches(t, 8<<20, 20, &written)
	current := goleak.IgnoreCurrent()
	gate := make(chan struct{})
	var forwarded atomic.Int64
	sub, err := NewSubscriber(Config{Forward: func(_ string, seq int64, payload []byte) {
		if payload != nil && forwarded.Add(1) == 1 {
			<-gate
		}
	}})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: p.addr}}))
	stop := runSubscriber(t, sub)
	awaitStall(t, &written, 32<<20, 1<<62)
	require.NoError(t, sub.SetEndpoints(nil))
	time.Sleep(20 * time.Millisecond)
	close(gate)
	require.Eventually(t, func() bool { _, ok := sub.Stats("e1"); return !ok }, waitFor, tick)
	require.True(t, stop(), "Run did not return")
	requireNoLeak(t, current)
}

// TestCommandsBetweenBatches checks that ZMTP commands after the handshake,
// such as the PING of a publisher with heartbeats on (ZMQ_HEARTBEAT_IVL),
// are not batches: they count as no malformed message and clear nothing.
func TestCommandsBetweenBatches(t *testing.T) {
	idx, h := newTestIndex(t)
	tokens := prompt(1, 4)
	var salt prefix.Salt
	hashes := h.HashTokens(salt, tokens)
	message := func(seq uint64, events ...Event) []byte {
		payload := AppendBatch(nil, &Batch{TS: 1, Events: events, DPRank: -1})
		msg := []byte{flagMore, 2, 'k', 'v', flagMore, 8}
		msg = binary.BigEndian.AppendUint64(msg, seq)
		msg = append(msg, longHeader(0, uint64(len(payload)))...)
		return append(msg, payload...)
	}
	ping := []byte{0x04, 8, 4, 'P', 'I', 'N', 'G', 0, 100, 0} // name, TTL 10 s, no context
	var frames []byte
	frames = append(frames, message(0, stored(hashes, tokens, 0, 2))...)
	frames = append(frames, ping...)
	frames = append(frames, message(1, stored(hashes, tokens, 2, 4))...)
	frames = append(frames, ping...)
	p := hostile(t, frames)
	sub, err := NewSubscriber(Config{Index: idx, Hasher: h, OnError: func(_ string, err error) { t.Errorf("reported: %v", err) }})
	require.NoError(t, err)
	require.NoError(t, sub.SetEndpoints(map[string]Endpoint{"e1": {PubAddr: p.addr}}))
	stop := runSubscriber(t, sub)
	require.Eventually(t, func() bool {
		st, _ := sub.Stats("e1")
		return st.Batches == 2
	}, waitFor, tick, "both batches applied")
	st, _ := sub.Stats("e1")
	assert.Zero(t, st.Malformed, "malformed messages")
	assert.Equal(t, 4, idx.MatchLen("e1", hashes, time.Now()), "blocks indexed") // a malformed message would clear them
	assert.True(t, stop(), "Run did not return")
}
