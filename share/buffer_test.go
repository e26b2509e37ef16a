package share

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// connectSlow connects to url for a subscriber the test makes slow, without
// the connection's report of each slow-consumer episode on stderr. The
// connection does not receive its own messages, so that its InMsgs count
// only the other connections' (a Group publishes every Interval on the
// subject it subscribes to).
func connectSlow(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.NoEcho(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// bigBatches returns n batches of peer id, in order, each carrying blocks
// prefix blocks: about 8 bytes each on the wire.
func bigBatches(t *testing.T, id string, n, blocks int) [][]byte {
	t.Helper()
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "src", Clock: clock})
	a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	var m message
	a.local.snapshot(&m, clock.Now().UnixNano())
	bl := make([]uint64, blocks)
	for i := range bl {
		bl[i] = uint64(i + 1)
	}
	m.routes = []route{{ep: 0, blocks: bl}}
	out := make([][]byte, n)
	for i := range out {
		m.id, m.inc, m.seq = id, 1, uint64(i+1)
		out[i] = appendMessage(nil, &m)
	}
	return out
}

// Run holds at most its byte budget of the peers' batches while it cannot
// apply them: the excess is dropped and counted as rejected, not queued.
func TestRunDropsBatchesBeyondItsReceiveBuffer(t *testing.T) {
	srv := startServer(t, -1)
	conn := connectSlow(t, srv.ClientURL())
	g, err := New(Config{Conn: conn, ID: "g", Interval: 10 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	g.recvBuffer = 1 << 20
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	// A probe reaching g shows that its subscription is in place.
	pub := connect(t, srv.ClientURL())
	probe := bigBatches(t, "probe", 1, 1)[0]
	require.Eventually(t, func() bool {
		_ = pub.Publish(DefaultSubject, probe)
		return g.Stats().Received > 0
	}, 5*time.Second, 5*time.Millisecond)
	// Once a later batch is applied, every probe was applied or refused.
	require.NoError(t, pub.Publish(DefaultSubject, bigBatches(t, "marker", 1, 1)[0]))
	require.Eventually(t, func() bool { return g.Stats().Received == 2 }, 5*time.Second, time.Millisecond)
	base := g.Stats()

	// While g cannot apply anything, a burst of 16 batches of 256 KiB
	// arrives: 4 MiB, four times the budget. g is released only once all
	// 16 reached its connection (which, without echo, counts no batch of
	// g's own): a batch arriving after it would find room again.
	const n = 16
	batches := bigBatches(t, "p", n, 32<<10)
	g.recvMu.Lock()
	in := conn.Stats().InMsgs
	for _, b := range batches {
		require.NoError(t, pub.Publish(DefaultSubject, b))
	}
	require.NoError(t, pub.Flush())
	require.Eventually(t, func() bool { return conn.Stats().InMsgs >= in+n }, 5*time.Second, time.Millisecond)
	g.recvMu.Unlock()

	require.Eventually(t, func() bool {
		st := g.Stats()
		return st.Received+st.Rejected-base.Received-base.Rejected >= n
	}, 5*time.Second, 5*time.Millisecond)
	st := g.Stats()
	applied := st.Received - base.Received
	assert.LessOrEqual(t, applied, uint64(6), "at most the budget, 4 batches, and the one being applied, were held")
	assert.Positive(t, applied)
	assert.Equal(t, uint64(n), applied+st.Rejected-base.Rejected)
}

// blockingSink blocks its first call of Apply with a payload until
// released, and records the calls.
type blockingSink struct {
	started, release chan struct{}
	mu               sync.Mutex
	calls            []sinkCall
}

func (s *blockingSink) Apply(key string, seq int64, payload []byte) {
	s.mu.Lock()
	first := len(s.calls) == 0
	s.calls = append(s.calls, sinkCall{key: key, seq: seq})
	s.mu.Unlock()
	if first {
		close(s.started)
		<-s.release
	}
}

func (s *blockingSink) Clear() {}

func (s *blockingSink) applied(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		if c.key == key && c.seq >= 0 {
			n++
		}
	}
	return n
}

// A Follower holds at most BufferBytes of relayed messages while its Sink
// is busy: the excess is dropped, not queued, and reported to OnError.
func TestFollowerDropsMessagesBeyondBufferBytes(t *testing.T) {
	srv := startServer(t, -1)
	conn := connectSlow(t, srv.ClientURL())
	sink := &blockingSink{started: make(chan struct{}), release: make(chan struct{})}
	errs := make(chan error, 100)
	f, err := NewFollower(FollowerConfig{Conn: conn, Sink: sink, BufferBytes: 1 << 20,
		OnError: func(key string, err error) {
			if key == "" {
				errs <- err
			}
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	pub := connect(t, srv.ClientURL())
	relay, err := NewRelay(RelayConfig{Conn: pub})
	require.NoError(t, err)
	// The first message reaching the Sink blocks it.
	require.Eventually(t, func() bool {
		relay.Forward("probe", 1, []byte("x"))
		select {
		case <-sink.started:
			return true
		default:
			return false
		}
	}, 5*time.Second, 5*time.Millisecond)

	// While the Sink is busy, a burst of 16 batches of 256 KiB arrives:
	// 4 MiB, four times the budget.
	const n = 16
	in := conn.Stats().InMsgs
	payload := make([]byte, 256<<10)
	for i := range n {
		relay.Forward("e1", int64(i), payload)
	}
	require.NoError(t, pub.Flush())
	require.Eventually(t, func() bool { return conn.Stats().InMsgs >= in+n }, 5*time.Second, time.Millisecond)
	close(sink.release)

	select {
	case err := <-errs:
		assert.Contains(t, err.Error(), "dropped")
	case <-time.After(5 * time.Second):
		t.Fatal("no drop reported")
	}
	// Once a later message arrives, those held before it were applied.
	require.Eventually(t, func() bool {
		relay.Forward("end", 1, []byte("x"))
		return sink.applied("end") > 0
	}, 5*time.Second, 5*time.Millisecond)
	applied := sink.applied("e1")
	assert.Positive(t, applied)
	assert.LessOrEqual(t, applied, 5, "at most the budget, 4 batches, was held")
	// The Relay's messages are numbered: the Follower knew at once that it
	// lost some, and dropped the blocks of every endpoint the Relay
	// relays, even one with no batch since.
	assert.True(t, sink.cleared("probe"), "the endpoint relayed before the loss is cleared")
}

// cleared reports whether key was cleared.
func (s *blockingSink) cleared(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.calls {
		if c.key == key && c.seq < 0 {
			return true
		}
	}
	return false
}
