package share

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replica is one router of a test: a Group over its own connection, a
// balancer using it, and its Run goroutine.
type replica struct {
	g      *Group
	b      *llmlb.Balancer
	sig    *signalMap
	cancel context.CancelFunc
	done   chan error
}

var testEndpoints = []llmlb.Endpoint{key("e1"), key("e2")}

func startReplica(t *testing.T, url, id string) *replica {
	t.Helper()
	sig := &signalMap{}
	g, err := New(Config{Conn: connect(t, url), ID: id, Signal: sig, Interval: 20 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	b, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithSignal(g, 0), llmlb.WithObserver(g.Observer(nil)))
	require.NoError(t, err)
	require.NoError(t, b.Update(testEndpoints))
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{g: g, b: b, sig: sig, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- g.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
		r.cancel = nil
	}
}

// waiting returns the requests waiting at key in r's view (its own
// balancer's dispatches excluded: r has sent none in these tests).
func (r *replica) waiting(key string) int {
	l, ok := r.g.Load(key)
	if !ok {
		return 0
	}
	return l.Waiting
}

func pickN(t *testing.T, b *llmlb.Balancer, n int) []llmlb.Pick {
	t.Helper()
	var ps []llmlb.Pick
	for range n {
		p, err := b.Pick(context.Background(), nil)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	return ps
}

func TestShareOverNATS(t *testing.T) {
	srv := startServer(t, -1)
	a := startReplica(t, srv.ClientURL(), "a")
	b := startReplica(t, srv.ClientURL(), "b")

	ps := pickN(t, a.b, 4) // two on each endpoint
	require.Eventually(t, func() bool { return b.waiting("e1") == 2 && b.waiting("e2") == 2 }, 5*time.Second, 5*time.Millisecond)
	st := b.g.Stats()
	assert.True(t, st.Connected)
	assert.Equal(t, 1, st.Peers)
	assert.Positive(t, st.Received)
	assert.Zero(t, st.Rejected)

	for _, p := range ps {
		p.FirstToken()
	}
	require.Eventually(t, func() bool {
		l, _ := b.g.Load("e1")
		return l.Running == 2 && l.Waiting == 0
	}, 5*time.Second, 5*time.Millisecond)
	for _, p := range ps {
		p.Done(nil)
	}
	require.Eventually(t, func() bool { _, ok := b.g.Load("e1"); return !ok }, 5*time.Second, 5*time.Millisecond)

	// a stops publishing: after the TTL, b forgets it.
	pickN(t, a.b, 2)
	require.Eventually(t, func() bool { return b.waiting("e1") == 1 }, 5*time.Second, 5*time.Millisecond)
	a.stop()
	require.Eventually(t, func() bool { return b.g.Stats().Peers == 0 && b.waiting("e1") == 0 }, 5*time.Second, 5*time.Millisecond)

	// Run refuses to run twice at once, and may run again after it returns.
	err := b.g.Run(context.Background())
	assert.ErrorIs(t, err, ErrRunning)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.g.Run(ctx) }()
	require.Eventually(t, func() bool { return b.waiting("e1") == 1 }, 5*time.Second, 5*time.Millisecond, "a resumes")
	cancel()
	assert.True(t, errors.Is(<-done, context.Canceled))
}

// The NATS server dies and comes back: during the outage picks go on, on
// local state, and sharing resumes after it.
func TestServerRestart(t *testing.T) {
	srv := startServer(t, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	a := startReplica(t, srv.ClientURL(), "a")
	b := startReplica(t, srv.ClientURL(), "b")
	held := pickN(t, a.b, 2)
	require.Eventually(t, func() bool { return b.waiting("e1") == 1 }, 5*time.Second, 5*time.Millisecond)

	srv.Shutdown()
	srv.WaitForShutdown()
	require.Eventually(t, func() bool {
		st := b.g.Stats()
		return !st.Connected && st.Peers == 0
	}, 5*time.Second, 5*time.Millisecond, "b notices the outage and a's batches expire")
	// b routes on local state: its signal's observation alone.
	b.sig.Set("e1", llmlb.Load{At: time.Now(), Waiting: 7, KVUsage: math.NaN()})
	l, ok := b.g.Load("e1")
	require.True(t, ok)
	assert.Equal(t, 7, l.Waiting)
	b.sig.Set("e1", llmlb.Load{})
	// Picks go on during the outage, on both replicas, and nothing waits
	// for the network.
	for range 1000 {
		for _, r := range []*replica{a, b} {
			p, err := r.b.Pick(context.Background(), nil)
			require.NoError(t, err)
			p.FirstToken()
			p.Done(nil)
		}
	}
	require.Eventually(t, func() bool { return a.g.Stats().Unpublished > 0 }, 5*time.Second, 5*time.Millisecond)

	// The server comes back on the same address; the connections
	// reconnect, the subscriptions resume, and so does sharing.
	startServer(t, port)
	require.Eventually(t, func() bool {
		st := b.g.Stats()
		return st.Connected && st.Peers == 1 && b.waiting("e1") == 1 && b.waiting("e2") == 1
	}, 10*time.Second, 5*time.Millisecond, "sharing resumes: %+v", b.g.Stats())
	more := pickN(t, a.b, 2)
	require.Eventually(t, func() bool { return b.waiting("e1") == 2 && b.waiting("e2") == 2 }, 5*time.Second, 5*time.Millisecond)
	for _, p := range append(held, more...) {
		p.Done(nil)
	}
	require.Eventually(t, func() bool { return b.waiting("e1") == 0 }, 5*time.Second, 5*time.Millisecond)
}

// lockedBuffer collects log output written from Run's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// The work at an endpoint that alone exceeds the server's max_payload
// cannot be published (a larger batch is published in parts, but one
// endpoint is not cut): the Group says so once, counts every failure, and
// says when it publishes again.
func TestPublishFailureIsLogged(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: 1024})
	require.NoError(t, err)
	srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(srv.Shutdown)

	var logs lockedBuffer
	// A short signal age: batches describe finished requests until it
	// passes, and the test waits for them to shrink.
	const age = 50 * time.Millisecond
	g, err := New(Config{Conn: connect(t, srv.ClientURL()), ID: "a", Interval: 5 * time.Millisecond, MaxSignalAge: age,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	b, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithSignal(g, age), llmlb.WithObserver(g.Observer(nil)))
	require.NoError(t, err)
	var eps []llmlb.Endpoint
	for i := range 4 { // keys of 1000 bytes with work in flight: over 1 KB each
		eps = append(eps, key(fmt.Sprintf("%01000d", i)))
	}
	require.NoError(t, b.Update(eps))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	ps := pickN(t, b, len(eps))
	require.Eventually(t, func() bool { return g.Stats().Unpublished >= 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.count("cannot publish"), "one warning for consecutive failures")
	assert.Equal(t, 1, logs.count("maximum payload"), "the warning gives the cause")

	for _, p := range ps {
		p.Done(nil)
	}
	require.Eventually(t, func() bool { return logs.count("publishing again") == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.count("cannot publish"))
}

// A Group whose connection never came up (a wrong URL, given with
// nats.RetryOnFailedConnect) warns at its first batch, then once a minute
// while the connection stays down, and says when it connects; an outage
// after that is reported the same way.
func TestNotConnectedIsLogged(t *testing.T) {
	srv := startServer(t, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.False(t, nc.IsConnected())

	var logs lockedBuffer
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	g, err := New(Config{Conn: nc, ID: "a", Interval: 5 * time.Millisecond, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// unpublished waits until n more batches have gone unpublished.
	unpublished := func(n uint64) {
		t.Helper()
		want := g.Stats().Unpublished + n
		require.Eventually(t, func() bool { return g.Stats().Unpublished >= want }, 5*time.Second, time.Millisecond)
	}
	unpublished(5)
	assert.Equal(t, 1, logs.count("level=WARN msg=\"share: NATS not connected; cannot publish"), "a warning at the first batch")
	assert.False(t, g.Stats().Connected)
	clock.Advance(time.Minute - time.Second)
	unpublished(5)
	assert.Equal(t, 1, logs.count("not connected"), "no repeat within a minute")
	clock.Advance(time.Second)
	unpublished(5)
	assert.Equal(t, 1, logs.count("still not connected"), "a repeat after a minute")
	assert.Equal(t, 1, logs.count("for=1m0s"), "the repeat says for how long")
	unpublished(5)
	assert.Equal(t, 2, logs.count("not connected"), "one repeat a minute")

	srv = startServer(t, port)
	require.Eventually(t, func() bool { return g.Stats().Connected && g.Stats().Published > 0 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, 1, logs.count("NATS connected; sharing with peers"))

	srv.Shutdown()
	srv.WaitForShutdown()
	require.Eventually(t, func() bool { return logs.count("NATS disconnected") == 1 }, 5*time.Second, time.Millisecond)
	unpublished(5)
	assert.Equal(t, 2, logs.count("not connected"), "the disconnection is the outage's first warning")
	clock.Advance(time.Minute)
	unpublished(5)
	assert.Equal(t, 3, logs.count("not connected"), "a repeat after a minute")
}
