package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replayFrom asks the replay socket at addr for the batches from start on,
// and returns the sequence numbers of the replies, the end marker's last.
func replayFrom(ctx context.Context, t *testing.T, addr string, start uint64) []uint64 {
	t.Helper()
	return replayRequest(ctx, t, addr, binary.BigEndian.AppendUint64(nil, start))
}

// replayRequest sends each of reqs on one DEALER connection to the replay
// socket at addr, each a message of its own, the first n-1 without the
// empty delimiter frame (to be ignored), the last with it, and returns the
// sequence numbers of the replies, the end marker's last.
func replayRequest(ctx context.Context, t *testing.T, addr string, reqs ...[]byte) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(quiet))
	defer d.Close()
	require.NoError(t, d.Dial(addr))
	for _, r := range reqs[:len(reqs)-1] {
		require.NoError(t, d.Send(zmq4.NewMsg(r)))
	}
	require.NoError(t, d.SendMulti(zmq4.NewMsgFrom(nil, reqs[len(reqs)-1])))
	var seqs []uint64
	for {
		msg, err := d.Recv()
		require.NoError(t, err, "replies so far: %v", seqs)
		f := msg.Frames
		require.Len(t, f, 3, "want [\"\", seq, payload]")
		seq := binary.BigEndian.Uint64(f[1])
		seqs = append(seqs, seq)
		if seq == ^uint64(0) {
			return seqs
		}
	}
}

// TestReplayFromBeyondInt64 checks that the Publisher reads a replay
// request as the unsigned number it is on the wire, as vLLM does: from 2^63
// on, no batch is replayed, only the end marker sent.
func TestReplayFromBeyondInt64(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	replayAddr := freeAddr(t)
	p, stop := publisherStarter(ctx, t, &wg, freeAddr(t), replayAddr)()
	defer stop()
	for range 3 {
		p.Publish(&Batch{})
	}
	end := ^uint64(0)
	cases := []struct {
		start uint64
		want  []uint64
	}{
		{0, []uint64{0, 1, 2, end}},
		{2, []uint64{2, end}},
		{3, []uint64{end}},
		{1 << 63, []uint64{end}},
		{end - 1, []uint64{end}},
		{end, []uint64{end}},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, replayFrom(ctx, t, replayAddr, c.start), "replay from %d", c.start)
	}
}

// TestReplayRequestOfAnyLength checks that the Publisher reads a replay
// request's number of any length as vLLM does (int.from_bytes(..., "big")):
// shorter than 8 bytes, a smaller number; none, 0; longer, the number its
// bytes spell, which beyond 64 bits is past every batch, a megabyte of it
// included; and that a lone empty frame, a delimiter without a request, is
// ignored.
func TestReplayRequestOfAnyLength(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	replayAddr := freeAddr(t)
	p, stop := publisherStarter(ctx, t, &wg, freeAddr(t), replayAddr)()
	defer stop()
	for range 3 {
		p.Publish(&Batch{})
	}
	end := ^uint64(0)
	zerosThen := func(n int, last byte) []byte {
		b := make([]byte, n)
		b[n-1] = last
		return b
	}
	mega := bytes.Repeat([]byte{0xff}, 1<<20)
	cases := []struct {
		name string
		reqs [][]byte
		want []uint64
	}{
		{"empty", [][]byte{{}}, []uint64{0, 1, 2, end}},
		{"1 byte", [][]byte{{2}}, []uint64{2, end}},
		{"3 bytes", [][]byte{{0, 0, 1}}, []uint64{1, 2, end}},
		{"9 bytes, leading zero", [][]byte{zerosThen(9, 2)}, []uint64{2, end}},
		{"9 bytes, above 2^64", [][]byte{append([]byte{1}, make([]byte, 8)...)}, []uint64{end}},
		{"1 MiB of zeros, then 1", [][]byte{zerosThen(1<<20, 1)}, []uint64{1, 2, end}},
		{"1 MiB of 0xff", [][]byte{mega}, []uint64{end}},
		{"lone empty frame ignored", [][]byte{{}, {2}}, []uint64{2, end}},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, replayRequest(ctx, t, replayAddr, c.reqs...), c.name)
	}
}

// TestReplayStartAllocs checks that reading a replay request's number,
// however long, allocates nothing.
func TestReplayStartAllocs(t *testing.T) {
	big := bytes.Repeat([]byte{0xff}, 1<<20)
	assert.Zero(t, testing.AllocsPerRun(10, func() { _ = replayStart(big) }))
	assert.Equal(t, ^uint64(0), replayStart(big))
	assert.Equal(t, uint64(0x0102), replayStart([]byte{0, 0, 1, 2}))
}

// failingSocket is a replay socket whose Recv fails, except the calls
// numbered (from 1) in ok, which return a malformed request (ignored).
type failingSocket struct {
	recvs atomic.Int64
	ok    []int64
}

func (s *failingSocket) Recv() (zmq4.Msg, error) {
	if n := s.recvs.Add(1); slices.Contains(s.ok, n) {
		return zmq4.NewMsg([]byte("short")), nil
	}
	return zmq4.Msg{}, errors.New("broken")
}

func (s *failingSocket) SendMulti(zmq4.Msg) error { return errors.New("broken") }

// TestServeReplayBacksOff checks that the Publisher waits, longer and
// longer up to a limit, between receives on a replay socket that keeps
// failing, instead of retrying at once for ever; that a receive that
// succeeds starts the waits over; and that it returns when its context
// ends during a wait. The waits are taken on a fake clock: the test
// counts them, not the time.
func TestServeReplayBacksOff(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:1"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Receive 11 succeeds; the 14th wait ends the context.
	s := &failingSocket{ok: []int64{11}}
	var waits []time.Duration
	wait := func(ctx context.Context, d time.Duration) bool {
		waits = append(waits, d)
		if len(waits) == 14 {
			cancel()
			return false
		}
		return true
	}
	done := make(chan struct{})
	go func() { defer close(done); p.serveReplay(ctx, s, wait) }()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("serveReplay did not return when its context ended")
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{
		10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second, time.Second,
		10 * ms, 20 * ms, 40 * ms, 80 * ms, // after the receive that succeeded
	}, waits)
	assert.Equal(t, int64(15), s.recvs.Load(), "one receive before each wait, and the one that succeeded")
}

// bigBatch is a batch of about 64 KiB encoded: one event removing 8,192
// blocks.
func bigBatch() *Batch {
	hashes := make([]uint64, 8192)
	for i := range hashes {
		hashes[i] = uint64(i) | 1<<60 // 9 bytes each, encoded
	}
	return &Batch{Events: []Event{{Kind: Removed, BlockHashes: hashes}}}
}

// TestPublisherDropsStalledPeers: a subscriber that stops reading does not
// stop the live stream of the others, nor does a replay client that stops
// reading stop later replays: zmq4 writes to a socket's peers one after
// another without a deadline, and the Publisher's connections close
// themselves once a write has waited maxStall.
func TestPublisherDropsStalledPeers(t *testing.T) {
	defer func(d time.Duration) { maxStall = d }(maxStall)
	maxStall = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	pubAddr, replayAddr := freeAddr(t), freeAddr(t)
	p, stop := publisherStarter(ctx, t, &wg, pubAddr, replayAddr)()
	defer stop()
	sub := func() zmq4.Socket {
		s := zmq4.NewSub(ctx, zmq4.WithLogger(quiet))
		require.NoError(t, s.Dial(pubAddr))
		require.NoError(t, s.SetOption(zmq4.OptionSubscribe, ""))
		return s
	}
	stalled, live := sub(), sub() // stalled is not read until the end
	defer live.Close()
	// The live subscriber's reader: the highest sequence number seen.
	var seen atomic.Int64
	seen.Store(-1)
	wg.Go(func() {
		for {
			msg, err := live.Recv()
			if err != nil {
				return
			}
			if f := msg.Frames; len(f) == 3 {
				seen.Store(int64(binary.BigEndian.Uint64(f[1])))
			}
		}
	})
	// Publish until the live subscriber has seen batches far past what
	// fills the stalled one's buffers (each batch 64 KiB: 2,000 of them
	// 128 MiB).
	deadline := time.Now().Add(waitFor)
	for n := 0; seen.Load() < 2000; n++ {
		if time.Now().After(deadline) {
			t.Fatalf("the live subscriber saw batch %d of %d published", seen.Load(), n)
		}
		p.Publish(bigBatch())
		if n%64 == 63 {
			time.Sleep(time.Millisecond) // let the queue drain
		}
	}

	// A replay client that asks for everything and never reads.
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(quiet))
	require.NoError(t, d.Dial(replayAddr))
	require.NoError(t, d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, 0))))
	time.Sleep(50 * time.Millisecond) // its request first
	last := uint64(seen.Load())
	got := replayFrom(ctx, t, replayAddr, last)
	require.NotEmpty(t, got)
	assert.Equal(t, ^uint64(0), got[len(got)-1], "the replay after the stalled one ends with the end marker")

	// zmq4's reading goroutine of each stalled socket waits to queue a
	// message; it ends once what it queued is read, its connection
	// having been closed by the Publisher.
	for _, s := range []zmq4.Socket{stalled, d} {
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		s.Close()
		<-drained
	}
}
