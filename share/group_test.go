package share

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/prefix"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// offline returns a Group whose network side is never used: the tests move
// its batches by hand with transfer.
func offline(t testing.TB, cfg Config) *Group {
	t.Helper()
	cfg.Conn = new(nats.Conn)
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	g, err := New(cfg)
	require.NoError(t, err)
	return g
}

// transfer delivers from's current batch to each of to, as Run would.
func transfer(from *Group, to ...*Group) {
	var m message
	from.local.snapshot(&m, from.clock.Now().UnixNano())
	from.published.Add(1)
	m.id, m.inc, m.seq = from.id, from.inc, from.published.Load()
	b := appendMessage(nil, &m)
	for _, g := range to {
		g.receive(b)
	}
}

func at(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }

// pickInfo is the PickInfo a balancer gives for a request of prompt and
// output tokens (output 0: charged the default decode allowance).
func pickInfo(ep string, prompt, output int) llmlb.PickInfo {
	decode := output
	if decode == 0 {
		decode = llmlb.DefaultDecodeAllowance
	}
	return llmlb.PickInfo{Endpoint: key(ep), Request: &llmlb.Request{PromptTokens: prompt, OutputTokens: output}, DecodeTokens: decode, SignalAge: -1}
}

// A peer's requests count only if they were picked after the observation:
// the engine's report already includes the earlier ones.
func TestLoadCountsPeersWorkAfterTheObservation(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	obsA := a.Observer(nil)

	// Three requests at 0 ms; the engine sees them at 500 ms.
	for range 3 {
		obsA.Pick(pickInfo("e1", 100, 10))
	}
	sig.Set("e1", llmlb.Load{At: at(500), Waiting: 3, KVUsage: 0.1, KVBlocks: 100, BlockSize: 16})
	// Two more at 1000 ms, and one of the first three streams.
	clock.Set(at(1000))
	obsA.Pick(pickInfo("e1", 100, 10))
	obsA.Pick(pickInfo("e1", 100, 10))
	obsA.FirstToken(llmlb.FirstTokenInfo{Endpoint: key("e1"), Latency: time.Second})
	clock.Set(at(1050))
	transfer(a, b)
	clock.Set(at(1100))

	l, ok := b.Load("e1")
	require.True(t, ok)
	assert.Equal(t, at(500), l.At, "the observation's time is kept")
	assert.Equal(t, 0, l.Running, "the request that streamed was picked before the observation")
	assert.Equal(t, 5, l.Waiting, "3 observed + 2 picked by the peer since")
	assert.InDelta(t, 0.1+220.0/1600, l.KVUsage, 1e-9, "the peer's new tokens over the capacity")
	assert.Equal(t, 4, l.PeerWaiting, "every request of the peer before its first token, whenever picked")
	assert.Equal(t, int64(400), l.PeerPrefillTokens, "and their prompts")

	// A newer observation includes everything the peer published.
	sig.Set("e1", llmlb.Load{At: at(1080), Running: 1, Waiting: 4, KVUsage: math.NaN()})
	l, _ = b.Load("e1")
	assert.Equal(t, 1, l.Running)
	assert.Equal(t, 4, l.Waiting)
	assert.Equal(t, 4, l.PeerWaiting)
	assert.Equal(t, int64(400), l.PeerPrefillTokens)

	// Without an observation: the peer's whole work, as an observation now.
	sig.Set("e1", llmlb.Load{})
	l, ok = b.Load("e1")
	require.True(t, ok)
	assert.Equal(t, at(1100), l.At)
	assert.Equal(t, 1, l.Running)
	assert.Equal(t, 4, l.Waiting)
	assert.True(t, math.IsNaN(l.KVUsage))
	assert.Equal(t, 4, l.PeerWaiting)
	assert.Equal(t, int64(400), l.PeerPrefillTokens)

	// A stale observation is as good as none.
	sig.Set("e1", llmlb.Load{At: at(1100 - int(llmlb.DefaultMaxSignalAge/time.Millisecond) - 1), Waiting: 50})
	l, _ = b.Load("e1")
	assert.Equal(t, 4, l.Waiting)

	// The peer goes silent: after the TTL its work no longer counts.
	sig.Set("e1", llmlb.Load{At: at(900), Waiting: 3})
	clock.Set(at(1050).Add(3*DefaultInterval + time.Millisecond))
	l, _ = b.Load("e1")
	assert.Equal(t, 3, l.Waiting)
	assert.Equal(t, 0, b.Stats().Peers)
}

// The peers' picks since their newest batch are unknown: they are taken to
// be like this replica's own since then, scaled by the ratio of the peers'
// requests in flight to its own. Behind one router nothing is added.
func TestLoadExtrapolatesPeersPicksSinceTheirBatch(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	obsA, obsB := a.Observer(nil), b.Observer(nil)
	sig.Set("e1", llmlb.Load{At: at(0), KVUsage: 0, KVBlocks: 100, BlockSize: 16})
	sig.Set("e2", llmlb.Load{At: at(0), KVUsage: 0, KVBlocks: 100, BlockSize: 16})

	// Alone, b's own picks are not extrapolated: the balancer counts them.
	clock.Set(at(10))
	obsB.Pick(pickInfo("e2", 100, 10))
	l, _ := b.Load("e2")
	assert.Equal(t, 0, l.Waiting, "no peer, nothing added")

	// a has 4 requests in flight (at e1).
	for range 4 {
		obsA.Pick(pickInfo("e1", 100, 10))
	}
	clock.Set(at(50))
	transfer(a, b)
	l, _ = b.Load("e1")
	assert.Equal(t, 4, l.Waiting, "the peer's published picks")
	l, _ = b.Load("e2")
	assert.Equal(t, 0, l.Waiting, "b's pick at e2 came before the batch")

	// b picks e2 once more after the batch: a, with twice b's requests
	// in flight (4 and 2), is taken to have sent it twice as many, with
	// as many tokens each.
	clock.Set(at(60))
	obsB.Pick(pickInfo("e2", 100, 10))
	l, _ = b.Load("e2")
	assert.Equal(t, 2, l.Waiting, "2x b's one pick since the batch")
	assert.InDelta(t, 2*110.0/1600, l.KVUsage, 1e-9)
	assert.Equal(t, 2, l.PeerWaiting)
	assert.Equal(t, int64(200), l.PeerPrefillTokens, "with b's prompt each")
	l, _ = b.Load("e1")
	assert.Equal(t, 4, l.Waiting, "b picked nothing at e1 since the batch")

	// The next batch describes a's real picks: the extrapolation starts
	// again from it.
	clock.Set(at(70))
	transfer(a, b)
	l, _ = b.Load("e2")
	assert.Equal(t, 0, l.Waiting)
}

// The peers' requests the engine counted at the observation and that
// finished since no longer count. This replica's own are left in: the
// balancer takes them off itself (TestOwnFinishedRequestCountsOnce).
func TestLoadDropsRequestsFinishedSinceTheObservation(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	for range 3 {
		a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	}
	for range 2 {
		b.Observer(nil).Pick(pickInfo("e1", 100, 10))
	}
	sig.Set("e1", llmlb.Load{At: at(500), Running: 4, Waiting: 1, KVUsage: math.NaN()})
	clock.Set(at(700))
	b.Observer(nil).Done(llmlb.DoneInfo{Endpoint: key("e1"), Latency: 700 * time.Millisecond})
	clock.Set(at(800))
	for range 2 {
		a.Observer(nil).Done(llmlb.DoneInfo{Endpoint: key("e1"), Latency: 800 * time.Millisecond})
	}
	clock.Set(at(850))
	transfer(a, b)
	clock.Set(at(900))
	l, _ := b.Load("e1")
	assert.Equal(t, 2, l.Running, "4 running - a's 2 finished")
	assert.Equal(t, 1, l.Waiting)

	// The finished requests were picked after an older observation: they
	// are not in it, so nothing is taken from it.
	sig.Set("e1", llmlb.Load{At: at(-100), Running: 0, Waiting: 0, KVUsage: math.NaN()})
	l, _ = b.Load("e1")
	assert.Equal(t, 0, l.Running)
	assert.Equal(t, 1, l.Waiting, "a's request still in flight, picked after the observation")

	// Finished more than taken from running: the rest comes off waiting.
	sig.Set("e1", llmlb.Load{At: at(500), Running: 1, Waiting: 3, KVUsage: math.NaN()})
	l, _ = b.Load("e1")
	assert.Equal(t, 0, l.Running)
	assert.Equal(t, 2, l.Waiting)
}

// A pick made in the middle of a bucket that straddles the observation is
// counted in proportion.
func TestLoadProratesTheStraddlingBucket(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	for range 10 {
		a.Observer(nil).Pick(pickInfo("e1", 0, 1))
	}
	clock.Set(at(99))
	transfer(a, b) // one bucket: picks in [0, 99] ms
	for _, c := range []struct{ obs, want int }{{0, 10}, {-50, 10}, {50, 5}, {99, 0}, {200, 0}} {
		sig.Set("e1", llmlb.Load{At: at(c.obs), KVUsage: math.NaN()})
		l, _ := b.Load("e1")
		assert.Equal(t, c.want, l.Waiting, "observation at %d ms", c.obs)
	}
}

// With the Group as its signal, a balancer steers away from the endpoint
// its peer is loading.
func TestBalancerSeesPeersWork(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock})
	ba, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithClock(clock), llmlb.WithSignal(a, 0), llmlb.WithObserver(a.Observer(nil)))
	require.NoError(t, err)
	bb, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithClock(clock), llmlb.WithSignal(b, 0), llmlb.WithObserver(b.Observer(nil)))
	require.NoError(t, err)
	eps := []llmlb.Endpoint{key("e1"), key("e2"), key("e3")}
	require.NoError(t, ba.Update(eps))
	require.NoError(t, bb.Update(eps))

	// a sends 4 requests, which least-outstanding spreads 2, 1, 1 or so.
	var held []llmlb.Pick
	perEP := map[string]int{}
	for range 4 {
		p, err := ba.Pick(context.Background(), nil)
		require.NoError(t, err)
		held = append(held, p)
		perEP[p.Endpoint().Key()]++
	}
	clock.Advance(10 * time.Millisecond)
	transfer(a, b)
	// b, which has sent nothing, now avoids a's busiest endpoints.
	for range 2 {
		p, err := bb.Pick(context.Background(), nil)
		require.NoError(t, err)
		perEP[p.Endpoint().Key()]++
		held = append(held, p)
	}
	for k, n := range perEP {
		assert.Equal(t, 2, n, "endpoint %s: the six requests must spread evenly", k)
	}
	for _, p := range held {
		p.Done(nil)
	}
	transfer(a, b)
	transfer(b, a)
	for _, k := range []string{"e1", "e2", "e3"} {
		_, ok := b.Load(k)
		assert.False(t, ok, "nothing in flight anywhere: no observation")
	}
}

// The Group's own accounting follows the balancer's exactly through any
// sequence of picks, first tokens and completions, whatever their times.
func TestLocalAccountingMatchesBalancer(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	g := offline(t, Config{ID: "a", Clock: clock, Interval: 10 * time.Millisecond, MaxSignalAge: 100 * time.Millisecond})
	b, err := llmlb.New(llmlb.RoundRobin(), llmlb.WithClock(clock), llmlb.WithObserver(g.Observer(nil)))
	require.NoError(t, err)
	require.NoError(t, b.Update([]llmlb.Endpoint{key("e1"), key("e2"), key("e3")}))
	rng := rand.New(rand.NewPCG(1, 2))
	var live []llmlb.Pick
	for step := range 5000 {
		clock.Advance(time.Duration(rng.IntN(5)) * time.Millisecond)
		switch r := rng.IntN(10); {
		case r < 4:
			p, err := b.Pick(context.Background(), &llmlb.Request{PromptTokens: rng.IntN(500), OutputTokens: rng.IntN(50)})
			require.NoError(t, err)
			live = append(live, p)
		case r < 7 && len(live) > 0:
			live[rng.IntN(len(live))].FirstToken()
		case len(live) > 0:
			i := rng.IntN(len(live))
			live[i].Done(nil)
			live = append(live[:i], live[i+1:]...)
		}
		if step%97 == 0 {
			var m message
			g.local.snapshot(&m, clock.Now().UnixNano()) // ages buckets into older
		}
		for _, s := range b.Stats() {
			streaming, queued, _ := g.local.totals(s.Key)
			require.Equal(t, s.Outstanding-s.Queued, streaming, "step %d %s", step, s.Key)
			require.Equal(t, s.Queued, queued, "step %d %s", step, s.Key)
		}
	}
	for _, p := range live {
		p.Done(nil)
	}
	var m message
	g.local.snapshot(&m, clock.Now().UnixNano())
	for _, e := range m.eps {
		assert.Empty(t, e.buckets, "nothing in flight")
		assert.NotEmpty(t, e.fin, "requests finished within the horizon")
	}
	clock.Advance(200 * time.Millisecond) // past the horizon
	g.local.snapshot(&m, clock.Now().UnixNano())
	assert.Empty(t, m.eps)
	assert.Empty(t, g.local.eps, "idle endpoints are forgotten")
}

// Peers' routed prefixes reach the index, for endpoints this replica knows.
func TestPeersRoutesReachTheIndex(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	require.NoError(t, err)
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Index: ix})
	blocks := []uint64{11, 12, 13, 14}
	info := pickInfo("e1", 64, 1)
	info.Request.Prefix = blocks
	a.Observer(nil).Pick(info)
	other := pickInfo("elsewhere", 64, 1)
	other.Request.Prefix = blocks
	a.Observer(nil).Pick(other)

	transfer(a, b)
	assert.Zero(t, ix.MatchLen("e1", blocks, clock.Now()), "e1 is not known to b yet")

	b.Load("e1") // the balancer scores e1
	a.Observer(nil).Pick(info)
	a.Observer(nil).Pick(info) // the same prefix again: sent once
	a.Observer(nil).Pick(other)
	var m message
	a.local.snapshot(&m, clock.Now().UnixNano())
	assert.Len(t, m.routes, 2)
	a.Observer(nil).Pick(info)
	a.Observer(nil).Pick(other)
	transfer(a, b)
	assert.Equal(t, 4, ix.MatchLen("e1", blocks, clock.Now()))
	assert.Zero(t, ix.Len("elsewhere"), "blocks for endpoints b does not use are ignored")
}

// The endpoints a replica scores change over its life (a rollout replaces
// every engine): once it has scored more than MaxEndpoints in all, peers'
// routes to the endpoints it scores now still reach the index, and so do
// those to an endpoint it scored all along.
func TestPeersRoutesReachTheIndexAfterEndpointChurn(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	require.NoError(t, err)
	a := offline(t, Config{ID: "a", Clock: clock})
	b := offline(t, Config{ID: "b", Clock: clock, Index: ix, MaxEndpoints: 4})
	for i := range 20 { // endpoints replaced since
		b.Load("kept")
		b.Load(fmt.Sprintf("gone%d", i))
	}
	b.Load("new")
	blocks := []uint64{21, 22, 23}
	for _, ep := range []string{"new", "kept"} {
		info := pickInfo(ep, 64, 1)
		info.Request.Prefix = blocks
		a.Observer(nil).Pick(info)
	}
	transfer(a, b)
	assert.Equal(t, 3, ix.MatchLen("new", blocks, clock.Now()), "an endpoint scored after the churn")
	assert.Equal(t, 3, ix.MatchLen("kept", blocks, clock.Now()), "an endpoint scored all along")
}

// Bounded buffers and tables: what does not fit is dropped and counted;
// late, foreign and excess messages are rejected.
func TestBounds(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock, MaxEndpoints: 1, MaxBlocks: 3})
	info := pickInfo("e1", 64, 1)
	info.Request.Prefix = []uint64{1, 2}
	a.Observer(nil).Pick(info)
	info.Request.Prefix = []uint64{1, 2, 3, 4} // cut to the one block left
	a.Observer(nil).Pick(info)
	a.Observer(nil).Pick(info) // no room: dropped
	a.Observer(nil).Pick(pickInfo("e2", 64, 1))
	assert.Equal(t, uint64(2), a.Stats().Dropped)

	b := offline(t, Config{ID: "b", Clock: clock, MaxPeers: 2})
	var m message
	a.local.snapshot(&m, clock.Now().UnixNano())
	m.inc = 1
	for i, id := range []string{"p1", "p2", "p3"} {
		m.id, m.seq = id, uint64(i+1)
		b.receive(appendMessage(nil, &m))
	}
	assert.Equal(t, Stats{Peers: 2, Received: 2, Rejected: 1}, b.Stats())
	m.id, m.seq = "p1", 1 // a repeat
	b.receive(appendMessage(nil, &m))
	m.id, m.seq = "b", 9 // another replica calling itself b
	b.receive(appendMessage(nil, &m))
	b.receive([]byte("garbage"))
	assert.Equal(t, uint64(4), b.Stats().Rejected)
	m.id, m.inc, m.seq = "p1", 2, 1 // p1 restarted
	b.receive(appendMessage(nil, &m))
	assert.Equal(t, uint64(3), b.Stats().Received)
}

func TestNewRejectsBadConfig(t *testing.T) {
	conn := new(nats.Conn)
	cases := []struct {
		name string
		cfg  Config
	}{
		{"interval", Config{Conn: conn, Interval: time.Microsecond}},
		{"ttl below interval", Config{Conn: conn, Interval: time.Second, TTL: time.Millisecond}},
		{"negative signal age", Config{Conn: conn, MaxSignalAge: -1}},
		// Its batches would carry a bucket width that receivers refuse.
		{"signal age", Config{Conn: conn, MaxSignalAge: maxSignalAgeTime + 1}},
		{"signal age overflowing", Config{Conn: conn, MaxSignalAge: math.MaxInt64}},
		{"peers", Config{Conn: conn, MaxPeers: -1}},
		{"endpoints", Config{Conn: conn, MaxEndpoints: maxEPsLimit + 1}},
		{"blocks", Config{Conn: conn, MaxBlocks: maxBlocksLimit + 1}},
		{"id", Config{Conn: conn, ID: string(make([]byte, 129))}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			assert.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

// The observer's functions allocate nothing once an endpoint is known.
func TestObserverAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	sig := &signalMap{}
	sig.Set("e1", llmlb.Load{At: time.Now().Add(time.Hour), KVUsage: math.NaN()})
	g := offline(t, Config{ID: "a", Signal: sig})
	o := g.Observer(&llmlb.Observer{})
	info := pickInfo("e1", 100, 10)
	info.Request.Prefix = []uint64{1, 2, 3}
	o.Pick(info)
	allocs := testing.AllocsPerRun(1000, func() {
		o.Pick(info)
		o.FirstToken(llmlb.FirstTokenInfo{Endpoint: info.Endpoint})
		o.Done(llmlb.DoneInfo{Endpoint: info.Endpoint, Streamed: true})
		g.Load("e1")
	})
	assert.Zero(t, allocs)
}

// Without NATS, the caller carries the batches: AppendBatch builds one on
// the Group's clock and Receive applies it, as Run would over NATS.
func TestAppendBatchAndReceiveWithoutNATS(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a, err := New(Config{ID: "a", Clock: clock, Logger: quiet})
	require.NoError(t, err)
	b, err := New(Config{ID: "b", Clock: clock, Signal: &signalMap{}, Logger: quiet})
	require.NoError(t, err)
	assert.ErrorIs(t, a.Run(context.Background()), ErrInvalidConfig, "Run needs a Conn")

	a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	a.Observer(nil).Pick(pickInfo("e1", 100, 10))
	first := a.AppendBatch(nil)
	clock.Advance(DefaultInterval)
	require.NoError(t, b.Receive(first))
	l, ok := b.Load("e1")
	require.True(t, ok, "no observation: the peer's work as one taken now")
	assert.Equal(t, 2, l.Waiting)

	require.NoError(t, a.Receive(first), "a Group's own batch is ignored")
	assert.ErrorIs(t, b.Receive(first), ErrRefused, "a repeat is refused")
	assert.ErrorIs(t, b.Receive([]byte("garbage")), ErrMalformed)
	second := a.AppendBatch(nil)
	require.NoError(t, b.Receive(second))
	assert.Equal(t, Stats{Peers: 1, Received: 2, Rejected: 2}, b.Stats())
	assert.Equal(t, Stats{Published: 2}, a.Stats())

	// The peer goes silent: its next batch finds it forgotten.
	clock.Advance(3*DefaultInterval + time.Millisecond)
	b.AppendBatch(nil)
	assert.Equal(t, 0, b.Stats().Peers)
	_, ok = b.Load("e1")
	assert.False(t, ok)
}

// The peers' work sums to the same float whatever order their batches
// arrived in, so that a simulation sharing over simulated time is
// deterministic.
func TestLoadIndependentOfArrivalOrder(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	var batches [][]byte
	for i, id := range []string{"p1", "p2", "p3", "p4"} {
		p := offline(t, Config{ID: id, Clock: clock})
		for range i + 1 {
			clock.Advance(7 * time.Millisecond)
			p.Observer(nil).Pick(pickInfo("e1", 100+37*i, 10+i))
		}
		batches = append(batches, p.AppendBatch(nil))
	}
	clock.Advance(10 * time.Millisecond)
	load := func(order ...int) llmlb.Load {
		sig := &signalMap{}
		sig.Set("e1", llmlb.Load{At: at(15), Waiting: 1, KVUsage: 0.3, KVBlocks: 100, BlockSize: 16})
		g := offline(t, Config{ID: "g", Clock: clock, Signal: sig})
		for _, i := range order {
			require.NoError(t, g.Receive(batches[i]))
		}
		l, ok := g.Load("e1")
		require.True(t, ok)
		return l
	}
	want := load(0, 1, 2, 3)
	for _, order := range [][]int{{3, 2, 1, 0}, {2, 0, 3, 1}, {1, 3, 0, 2}} {
		got := load(order...)
		assert.Equal(t, math.Float64bits(want.KVUsage), math.Float64bits(got.KVUsage), "order %v", order)
		assert.Equal(t, want, got, "order %v", order)
	}
}

// A peer that runs the previous version publishes no prefill: its requests
// count as waiting, but not as the peers' whose prefill is known, so the
// balancer prices them at the mean prompt as before.
func TestLoadFromVersion1Peer(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sig := &signalMap{}
	b := offline(t, Config{ID: "b", Clock: clock, Signal: sig})
	sig.Set("e1", llmlb.Load{At: at(0), KVUsage: math.NaN()})
	clock.Set(at(200))
	require.NoError(t, b.receive(version1Message()))
	l, ok := b.Load("e1")
	require.True(t, ok)
	assert.Equal(t, 1, l.Waiting)
	assert.Equal(t, 1, l.Running)
	assert.Equal(t, 0, l.PeerWaiting)
	assert.Equal(t, int64(0), l.PeerPrefillTokens)
}

// A group at the largest MaxSignalAge and Interval builds batches that
// its peers accept.
func TestLongestSignalAgeRoundTrip(t *testing.T) {
	cfg := Config{ID: "a", MaxSignalAge: maxSignalAgeTime, Interval: maxIntervalTime, TTL: 2 * maxIntervalTime}
	a, err := New(cfg)
	require.NoError(t, err)
	cfg.ID = "b"
	b, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Receive(a.AppendBatch(nil)))
	assert.Equal(t, uint64(1), b.Stats().Received)
}

// TestPeerTTLFollowsItsInterval: a peer that publishes every second keeps
// counting between its batches at a receiver that publishes ten times as
// often (whose own TTL is 300 ms), and stops counting three of its periods
// after its last batch.
func TestPeerTTLFollowsItsInterval(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := offline(t, Config{ID: "a", Clock: clock, Interval: time.Second})
	b := offline(t, Config{ID: "b", Clock: clock, Interval: 100 * time.Millisecond})
	obs := a.Observer(nil)
	for range 5 {
		obs.Pick(pickInfo("e1", 100, 10))
	}
	for ms := 0; ms < 3000; ms += 100 {
		clock.Set(at(ms))
		if ms%1000 == 0 {
			require.NoError(t, b.Receive(a.AppendBatch(nil)))
		}
		l, ok := b.Load("e1")
		require.True(t, ok, "t=%d ms", ms)
		require.EqualValues(t, 5, l.Waiting, "t=%d ms: a's requests between its batches", ms)
	}
	// a's last batch came at 2 s, a second after the one before: it
	// counts until 5 s.
	clock.Set(at(4900))
	l, _ := b.Load("e1")
	require.EqualValues(t, 5, l.Waiting)
	clock.Set(at(5100))
	l, _ = b.Load("e1")
	require.EqualValues(t, 0, l.Waiting, "a stopped publishing three of its periods ago")
}
