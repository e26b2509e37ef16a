package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
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
	ctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(quiet))
	defer d.Close()
	require.NoError(t, d.Dial(addr))
	require.NoError(t, d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, start))))
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

// failingSocket is a replay socket whose every Recv fails.
type failingSocket struct{ recvs atomic.Int64 }

func (s *failingSocket) Recv() (zmq4.Msg, error) {
	s.recvs.Add(1)
	return zmq4.Msg{}, errors.New("broken")
}

func (s *failingSocket) SendMulti(zmq4.Msg) error { return errors.New("broken") }

// TestServeReplayBacksOff checks that the Publisher waits, longer and
// longer, between receives on a replay socket that keeps failing, instead
// of retrying at once for ever.
func TestServeReplayBacksOff(t *testing.T) {
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:1"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := new(failingSocket)
	done := make(chan struct{})
	go func() { defer close(done); p.serveReplay(ctx, s) }()
	// Waits of 10, 20, 40, 80, 160 ms... leave room for 6 or 7 receives in
	// 400ms; without them there would be millions.
	time.Sleep(400 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("serveReplay did not return when its context ended")
	}
	assert.Less(t, s.recvs.Load(), int64(20))
	assert.Greater(t, s.recvs.Load(), int64(1))
}
