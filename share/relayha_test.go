package share

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// relayedBy returns the message Relay id publishes for key's batch seq (a
// clear for a nil payload), numbered n of instance "i1" (unnumbered for 0).
func relayedBy(id string, n uint64, key string, seq int64, payload []byte) *nats.Msg {
	m := relayMessage(DefaultRelaySubject, id, key, seq, payload, 1<<20)
	if n > 0 {
		m.Header.Set(headerRelayMsg, "i1-"+strconv.FormatUint(n, 10))
	}
	return m
}

// engineBatch is the payload of batch seq of an engine process: batches
// of two processes differ, as their timestamps do.
func engineBatch(process string, seq int64) []byte {
	return []byte(fmt.Sprintf("%s/%d", process, seq))
}

// Two Relays that relay the same engine, each ahead of the other by turns,
// make the Sink see each batch once, in order, without a clear; an engine
// restart (each Relay clears, then relays the new process's batches from
// 0) still clears the endpoint once, and the old process's batches are
// not handed on after the new one's.
func TestFollowerHandsOnBatchesOfTwoRelaysOnce(t *testing.T) {
	for seed := range uint64(50) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 2))
			sink := &recordingSink{}
			f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: &fakeClock{t: at(0)}})
			require.NoError(t, err)
			// Each Relay's messages in order; the two streams interleave
			// at random, as they arrive from two connections.
			var queues [2][]*nats.Msg
			for i, id := range []string{"r1", "r2"} {
				for seq := range int64(20) {
					queues[i] = append(queues[i], relayedBy(id, 0, "e1", seq, engineBatch("p1", seq)))
				}
				queues[i] = append(queues[i], relayedBy(id, 0, "e1", -1, nil)) // the engine restarted
				for seq := range int64(5) {
					queues[i] = append(queues[i], relayedBy(id, 0, "e1", seq, engineBatch("p2", seq)))
				}
			}
			for len(queues[0])+len(queues[1]) > 0 {
				i := rnd.IntN(2)
				if len(queues[i]) == 0 {
					i = 1 - i
				}
				f.receive(queues[i][0])
				queues[i] = queues[i][1:]
			}
			var p1, p2 []int64
			clears := 0
			for _, c := range sink.calls {
				switch {
				case c.seq < 0:
					require.Empty(t, p2, "a clear after the new process's batches: %v", sink.calls)
					clears++
				case c.payload == string(engineBatch("p1", c.seq)):
					require.Zero(t, clears, "the old process's batch %d after the restart: %v", c.seq, sink.calls)
					p1 = append(p1, c.seq)
				default:
					require.Equal(t, string(engineBatch("p2", c.seq)), c.payload)
					p2 = append(p2, c.seq)
				}
			}
			want := make([]int64, 20)
			for i := range want {
				want[i] = int64(i)
			}
			assert.Equal(t, want, p1, "the old process's batches, each once, in order")
			assert.Equal(t, 1, clears, "the restart")
			require.NotEmpty(t, p2)
			assert.IsIncreasing(t, p2)
			assert.Equal(t, int64(4), p2[len(p2)-1])
		})
	}
}

// Through a real NATS server, two Relays relaying the same engine's
// batches to a Follower leave its Applier's index as one Relay would: a
// repeat read as an engine restart would clear the endpoint, and the
// blocks stored after it would miss their parent.
func TestTwoRelaysKeepTheIndex(t *testing.T) {
	ns := startServer(t, -1)
	idx, h := relayIndex(t)
	salt := prefix.Salt{Model: "m"}
	ap, err := kvevents.NewApplier(kvevents.Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	require.NoError(t, ap.SetEndpoints(map[string]prefix.Salt{"e1": salt}))
	f, err := NewFollower(FollowerConfig{Conn: connect(t, ns.ClientURL()), Sink: ap})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var relays []*Relay
	var conns []*nats.Conn
	for range 2 {
		nc := connect(t, ns.ClientURL())
		r, err := NewRelay(RelayConfig{Conn: nc})
		require.NoError(t, err)
		relays, conns = append(relays, r), append(conns, nc)
	}
	a := relayPrompt(1, 4)
	ha := h.HashTokens(salt, a)
	batches := make([][]byte, 4)
	for i := range batches {
		batches[i] = kvevents.AppendBatch(nil, &kvevents.Batch{TS: float64(i + 1), Events: []kvevents.Event{storedEvent(ha, a, i, i+1)}})
	}
	// The Follower subscribes in Run: relay batch 0 until it is indexed.
	require.Eventually(t, func() bool {
		relays[0].Forward("e1", 0, batches[0])
		_ = conns[0].Flush()
		return idx.MatchLen("e1", ha, time.Now()) == 1
	}, 10*time.Second, 10*time.Millisecond)
	relays[1].Forward("e1", 0, batches[0])
	for seq := 1; seq < len(batches); seq++ {
		for _, r := range relays {
			r.Forward("e1", int64(seq), batches[seq])
		}
	}
	for _, nc := range conns {
		require.NoError(t, nc.Flush())
	}
	require.Eventually(t, func() bool {
		st, _ := ap.Stats("e1")
		return st.Seq == 3
	}, 10*time.Second, time.Millisecond)
	// Let the repeats of the last batch arrive too.
	probe := relayPrompt(100, 1)
	hp := h.HashTokens(salt, probe)
	require.Eventually(t, func() bool {
		for _, r := range relays {
			r.Forward("e1", 4, kvevents.AppendBatch(nil, &kvevents.Batch{TS: 5, Events: []kvevents.Event{storedEvent(hp, probe, 0, 1)}}))
		}
		for _, nc := range conns {
			_ = nc.Flush()
		}
		return idx.MatchLen("e1", hp, time.Now()) == 1
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 4, idx.MatchLen("e1", ha, time.Now()), "every block, each stored after its parent")
	st, _ := ap.Stats("e1")
	assert.Zero(t, st.Gaps)
}

// Messages of a Relay lost on the way (its message numbers skip) are a
// gap at every endpoint it relays, known at its next message: their
// blocks are dropped at once, not at each endpoint's next batch, which may
// be long in coming. An endpoint another Relay carries keeps its blocks.
func TestFollowerDropsEndpointsOfARelayThatLostMessages(t *testing.T) {
	sink := &recordingSink{}
	var errs []error
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: &fakeClock{t: at(0)},
		OnError: func(_ string, err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	f.receive(relayedBy("r1", 1, "e1", 1, []byte("a1")))
	f.receive(relayedBy("r1", 2, "e2", 1, []byte("b1")))
	f.receive(relayedBy("r1", 3, "e3", 1, []byte("c1")))
	f.receive(relayedBy("r2", 1, "e3", 1, []byte("c1"))) // r2 carries e3 too
	require.Len(t, sink.calls, 3)
	// Message 4 of r1 is lost; its heartbeat, number 5, tells.
	hb := (&Relay{subject: DefaultRelaySubject, id: "r1", interval: time.Second}).heartbeat()
	hb.Header.Set(headerRelayMsg, "i1-5")
	f.receive(hb)
	assert.ElementsMatch(t, []sinkCall{{key: "e1", seq: -1}, {key: "e2", seq: -1}}, sink.calls[3:], "e3 is carried by r2")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Error(), `1 messages of relay "r1" lost`)
	// The blocks stored from then on are indexed.
	f.receive(relayedBy("r1", 6, "e1", 3, []byte("a3")))
	f.receive(relayedBy("r1", 7, "e3", 2, []byte("c2")))
	assert.Equal(t, []sinkCall{{key: "e1", seq: 3, payload: "a3"}, {key: "e3", seq: 2, payload: "c2"}}, sink.calls[5:])
	// Another process under the same ID numbers its messages afresh.
	m := relayedBy("r1", 0, "e2", 7, []byte("b7"))
	m.Header.Set(headerRelayMsg, "i2-1")
	f.receive(m)
	assert.Len(t, sink.calls, 8)
	assert.Len(t, errs, 1)
}

// A Relay numbers the messages its connection takes, heartbeats
// included, from 1, under an instance of its own.
func TestRelayNumbersItsMessages(t *testing.T) {
	ns := startServer(t, -1)
	sub := connect(t, ns.ClientURL())
	msgs := make(chan *nats.Msg, 8)
	s, err := sub.ChanSubscribe(DefaultRelaySubject, msgs)
	require.NoError(t, err)
	defer func() { _ = s.Unsubscribe() }()
	require.NoError(t, sub.Flush())
	var instances sync.Map
	for range 2 {
		r, err := NewRelay(RelayConfig{Conn: connect(t, ns.ClientURL()), ID: "r1"})
		require.NoError(t, err)
		r.publish(r.heartbeat())
		r.Forward("e1", 1, []byte("batch"))
		r.Forward("e1", -1, nil)
		for want := uint64(1); want <= 3; want++ {
			select {
			case m := <-msgs:
				instance, n, ok := relayMsg(m.Header.Get(headerRelayMsg))
				require.True(t, ok, "%q", m.Header.Get(headerRelayMsg))
				assert.Equal(t, want, n)
				instances.Store(instance, true)
			case <-time.After(5 * time.Second):
				t.Fatal("no message")
			}
		}
	}
	n := 0
	instances.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 2, n, "two Relays, two instances")
}

// A Relay ahead of the one that carries an endpoint (which lost the
// engine, say) is not believed at once, but takes the endpoint over once
// the other has relayed nothing of it for takeoverAfter; a Relay behind
// the others never does.
func TestFollowerTakeover(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	sink := &recordingSink{}
	f, err := NewFollower(FollowerConfig{Conn: new(nats.Conn), Sink: sink, Clock: clock})
	require.NoError(t, err)
	f.receive(relayedBy("r1", 0, "e1", 10, engineBatch("p1", 10)))
	f.receive(relayedBy("r2", 0, "e1", 3, engineBatch("p1", 3))) // behind, not known
	f.receive(relayedBy("r2", 0, "e1", 12, engineBatch("p1", 12)))
	require.Len(t, sink.calls, 1, "r2 is not known to carry e1")
	clock.Advance(takeoverAfter)
	f.receive(relayedBy("r2", 0, "e1", 4, engineBatch("p1", 4)))
	require.Len(t, sink.calls, 1, "behind: a repeat, whoever is silent")
	f.receive(relayedBy("r2", 0, "e1", 13, engineBatch("p1", 13)))
	assert.Equal(t, sinkCall{key: "e1", seq: 13, payload: string(engineBatch("p1", 13))}, sink.calls[1], "r2 took over")
	f.receive(relayedBy("r1", 0, "e1", 11, engineBatch("p1", 11)))
	f.receive(relayedBy("r1", 0, "e1", 13, engineBatch("p1", 13)))
	f.receive(relayedBy("r2", 0, "e1", 14, engineBatch("p1", 14)))
	f.receive(relayedBy("r1", 0, "e1", 15, engineBatch("p1", 15)))
	assert.Equal(t, []int64{10, 13, 14, 15}, seqs(sink.calls), "r1 carries e1 again once it relays a batch handed on")
}

func seqs(calls []sinkCall) []int64 {
	var s []int64
	for _, c := range calls {
		s = append(s, c.seq)
	}
	return s
}
