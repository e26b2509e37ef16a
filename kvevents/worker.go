package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
)

// dialTimeout bounds one connection attempt: the TCP connection, then the
// ZMTP handshake of a PUB socket.
const dialTimeout = 5 * time.Second

// endSeq is the sequence number of the end-of-replay marker.
const endSeq = -1

// quiet discards the log lines of zmq4 sockets.
var quiet = log.New(io.Discard, "", 0)

// worker runs the subscription to one endpoint.
type worker struct {
	s     *Subscriber
	key   string
	ep    Endpoint
	stats counters
	tr    *translator
	batch Batch

	cancel context.CancelFunc
	done   chan struct{}

	// Sequence state, owned by the worker's goroutine.
	last    int64  // last batch applied, -1 if none
	lastSum uint64 // XXH64 of its payload
	live    int64  // last sequence number received on the current connection, -1 if none
	// The epoch of the engine process that published the last batch
	// applied (see [topicEpoch]), as its XXH64; epoched is false if that
	// batch's topic had none.
	epoch   uint64
	epoched bool
	cleared bool // reset cleared the endpoint's blocks, and no batch was applied since
}

func (s *Subscriber) newWorker(key string, ep Endpoint) *worker {
	w := &worker{s: s, key: key, ep: ep, last: -1, done: make(chan struct{})}
	w.stats.seq.Store(-1)
	if s.cfg.Forward == nil {
		w.tr = newTranslator(key, s.cfg.Index, s.cfg.Hasher, ep.Salt, s.cfg.MaxBlocks, &w.stats)
	}
	return w
}

func (w *worker) start(ctx context.Context) {
	ctx, w.cancel = context.WithCancel(ctx)
	go func() {
		defer close(w.done)
		w.run(ctx)
	}()
}

func (w *worker) stop() {
	w.cancel()
	<-w.done
}

func (w *worker) report(err error) {
	if f := w.s.cfg.OnError; f != nil && err != nil {
		f(w.key, err)
	}
}

// run connects, receives until the connection fails, and reconnects after a
// back-off, until ctx ends.
func (w *worker) run(ctx context.Context) {
	backoff := w.s.cfg.MinBackoff
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		got, err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		w.report(fmt.Errorf("kvevents: %s: %w", w.ep.PubAddr, err))
		if got {
			backoff = w.s.cfg.MinBackoff
		}
		t.Reset(w.s.jitter(backoff))
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, w.s.cfg.MaxBackoff)
	}
}

// session runs one connection to the PUB socket. It reports whether any
// message arrived, and the error that ended it. The ZMTP handshake must
// complete within dialTimeout; when ctx ends, the connection is closed and
// the session returns.
func (w *worker) session(ctx context.Context) (got bool, err error) {
	sub, err := newZSocket(ctx, zmq4.NewSub, w.ep.PubAddr, dialTimeout)
	if err != nil {
		return false, err
	}
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, w.ep.Topic); err != nil {
		return false, err
	}
	if err := sub.Dial(); err != nil {
		return false, err
	}
	w.stats.connects.Add(1)
	w.stats.connected.Store(true)
	defer w.stats.connected.Store(false)
	w.live = -1
	for {
		msg, err := sub.Recv()
		if err != nil {
			return got, err
		}
		if ctx.Err() != nil {
			return got, ctx.Err()
		}
		if msg.Type == zmq4.CmdMsg {
			continue // a ZMTP command, such as a heartbeat's PING: not a batch
		}
		got = true
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			w.malformed(fmt.Errorf("kvevents: message of %d frames, want [topic, seq, payload]", len(msg.Frames)))
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		if seq > math.MaxInt64 {
			w.malformed(fmt.Errorf("kvevents: batch numbered %d, beyond %d", seq, int64(math.MaxInt64)))
			continue
		}
		epoch, epoched := topicEpoch(msg.Frames[0])
		w.receive(ctx, int64(seq), epoch, epoched, msg.Frames[2])
	}
}

// epochMarker and snapshotMarker separate the metadata SGLang appends to
// the topic frame of its live messages when its publisher has a snapshot
// endpoint: topic + "\x00sgl-kv-epoch=" + epoch, where the epoch is a fresh
// UUID for each publisher (each engine process), then, on the empty batch
// that marks where a snapshot was cut, "\x00sgl-kv-snapshot=" + its id
// (_live_topic and _snapshot_barrier_topic in
// python/sglang/srt/disaggregation/kv_events.py, SGLang's 2026 source with
// snapshot_endpoint; without one, the topic is sent as it is). A SUB
// socket's filter matches the topic as a prefix, so the endpoint's Topic
// receives these messages.
var (
	epochMarker    = []byte("\x00sgl-kv-epoch=")
	snapshotMarker = []byte("\x00sgl-kv-snapshot=")
)

// topicEpoch returns the XXH64 of the engine epoch in a topic frame, and
// false if the frame has none.
func topicEpoch(topic []byte) (uint64, bool) {
	_, epoch, ok := bytes.Cut(topic, epochMarker)
	if !ok {
		return 0, false
	}
	epoch, _, _ = bytes.Cut(epoch, snapshotMarker)
	return xxhash.Sum64(epoch), true
}

// receive handles the batch seq received on the PUB socket, whose topic
// carried the engine epoch (epoched) or not.
//
// A batch numbered below one already received on the same connection means
// the engine restarted (vLLM numbers batches from 0 in each process), and so
// does the first batch of a new connection numbered below the last one
// applied, and a batch of another epoch than the last one applied (SGLang
// draws one for each process), whatever its number. Missed batches are
// asked of the replay socket; on a new connection the replay also starts
// with the last batch applied, which must come back unchanged: otherwise
// the engine restarted and reached the old numbers again while the
// subscriber was away. Without a replay socket and without an epoch,
// nothing tells such a restart from a connection that merely broke, so a
// new connection clears the endpoint's blocks. An engine restart clears
// them once, even when the replay after it fails too.
func (w *worker) receive(ctx context.Context, seq int64, epoch uint64, epoched bool, payload []byte) {
	fresh := w.live < 0
	switch {
	case w.last >= 0 && (epoched != w.epoched || epoch != w.epoch):
		w.reset() // another engine process
	case !fresh && seq <= w.live, fresh && w.last >= 0 && seq <= w.last:
		w.reset()
	case seq <= w.last:
		w.live = seq
		return // already applied from a replay
	}
	w.live = seq
	w.epoch, w.epoched = epoch, epoched
	gap := w.last >= 0 && seq > w.last+1
	if gap {
		w.stats.gaps.Add(1)
	}
	// On a new connection, a batch of the epoch of the last one applied
	// comes from the same engine process.
	unsure := fresh && w.last >= 0 && !epoched
	switch {
	case w.ep.ReplayAddr == "":
		if gap || unsure {
			w.reset()
		}
	case gap, unsure, w.last < 0 && seq > 0:
		err := w.replay(ctx, seq)
		if errors.Is(err, errRestarted) {
			w.reset()
			err = w.replay(ctx, seq)
		}
		if err != nil {
			w.report(fmt.Errorf("kvevents: %s: replay before batch %d: %w", w.ep.ReplayAddr, seq, err))
			w.reset()
		}
	}
	w.apply(seq, payload)
}

// reset clears the endpoint's blocks and forgets the sequence. Once they
// are cleared, and until a batch is applied, there is nothing to clear: a
// second reset (a restart detected, then the replay after it failing) does
// nothing.
func (w *worker) reset() {
	if w.cleared {
		return
	}
	w.clear()
	w.last = -1
	w.cleared = true
}

// clear drops the endpoint's blocks, or forwards a clear.
func (w *worker) clear() {
	if w.tr != nil {
		w.tr.clear()
		return
	}
	w.stats.cleared.Add(1)
	w.s.cfg.Forward(w.key, -1, nil)
}

// apply decodes and applies batch seq, or forwards it.
func (w *worker) apply(seq int64, payload []byte) {
	w.last, w.lastSum = seq, xxhash.Sum64(payload)
	w.cleared = false
	w.stats.seq.Store(seq)
	if err := DecodeBatch(&w.batch, payload); err != nil {
		w.malformed(fmt.Errorf("kvevents: batch %d: %w", seq, err))
		return
	}
	if w.tr == nil {
		w.stats.unknown.Add(int64(w.batch.unknown))
		w.stats.batches.Add(1)
		w.s.cfg.Forward(w.key, seq, payload)
		return
	}
	w.tr.apply(&w.batch)
}

// malformed handles a message that cannot be applied: what it held is
// unknown, so the endpoint's blocks are cleared.
func (w *worker) malformed(err error) {
	w.stats.malformed.Add(1)
	w.report(err)
	w.clear()
}

var errRestarted = errors.New("the engine restarted")

// replay asks the replay socket for the batches before batch upto that
// were not applied, and applies them. If a batch was applied before, the
// replay starts with it and fails with errRestarted unless it is
// unchanged. If none was (w.last < 0), the replay may start later than
// batch 0, the engine having dropped its oldest batches: their blocks are
// then not indexed, but whatever the replayed batches report removed is, so
// nothing wrong is indexed. Otherwise every batch must arrive.
func (w *worker) replay(ctx context.Context, upto int64) error {
	ctx, cancel := context.WithTimeout(ctx, w.s.cfg.ReplayTimeout)
	defer cancel()
	d, err := newZSocket(ctx, zmq4.NewDealer, w.ep.ReplayAddr, w.s.cfg.ReplayTimeout)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Dial(); err != nil {
		return err
	}
	verify := w.last >= 0
	from := max(w.last, 0)
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, uint64(from)))); err != nil {
		return err
	}
	for verify || w.last < upto-1 {
		msg, err := d.Recv()
		if ctx.Err() != nil {
			return ctx.Err() // the connection was closed for it
		}
		if err != nil {
			return err
		}
		if msg.Type == zmq4.CmdMsg {
			continue // a ZMTP command, such as a heartbeat's PING
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter the ROUTER echoes
		}
		if len(f) == 3 {
			// vLLM's replay socket sends the topic first, as its PUB
			// socket does, since 2026 ([topic, seq, payload], and ["",
			// -1, ""] at the end: ZmqEventPublisher._service_replay in
			// vllm/distributed/kv_events.py); SGLang's, and vLLM's before,
			// send [seq, payload].
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return fmt.Errorf("replay message of %d frames, want [seq, payload] or [topic, seq, payload]", len(msg.Frames))
		}
		seq := int64(binary.BigEndian.Uint64(f[0]))
		switch {
		case verify:
			if seq != w.last || xxhash.Sum64(f[1]) != w.lastSum {
				return errRestarted
			}
			verify = false
			continue
		case seq == endSeq || len(f[1]) == 0:
			return fmt.Errorf("replay ended after batch %d", w.last)
		case seq <= w.last:
			continue
		case seq != w.last+1 && w.last >= 0:
			return fmt.Errorf("replay skipped from batch %d to %d", w.last, seq)
		case seq >= upto:
			return nil // the oldest batch buffered arrived live
		}
		w.stats.replayed.Add(1)
		w.apply(seq, f[1])
	}
	return nil
}
