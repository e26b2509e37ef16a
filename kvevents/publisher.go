package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Defaults of [PublisherConfig], those of vLLM's ZMQ publisher.
const (
	// DefaultBufferSteps is the number of recent batches kept for replay.
	DefaultBufferSteps = 10_000
	// DefaultQueueSize is the number of batches waiting to be sent before
	// Publish drops new ones from the live stream.
	DefaultQueueSize = 1024
)

// PublisherConfig configures a [Publisher].
type PublisherConfig struct {
	// Endpoint is the address the PUB socket binds, such as
	// "tcp://*:5557" or "tcp://127.0.0.1:5557". Required.
	Endpoint string
	// ReplayEndpoint, if set, is the address the replay (ROUTER) socket
	// binds, such as "tcp://*:5558".
	ReplayEndpoint string
	// Topic is the first frame of every message; vLLM's default is "".
	Topic string
	// BufferSteps is the number of recent batches kept for replay. Zero
	// means [DefaultBufferSteps].
	BufferSteps int
	// QueueSize is the number of batches waiting to be sent. Zero means
	// [DefaultQueueSize].
	QueueSize int
}

// Publisher publishes KV event batches the way vLLM's ZMQ publisher does, so
// that any consumer of vLLM's stream (this package's [Subscriber], vLLM's
// example subscriber, NVIDIA Dynamo, llm-d) can consume it: each batch is
// sent on a PUB socket as the three frames [topic, sequence number as 8
// bytes big-endian, payload], the payload encoded by [AppendBatch], with
// sequence numbers counting from 0. The last BufferSteps batches are kept
// for replay: a request of one big-endian sequence number on the replay
// socket (after the empty delimiter frame of a REQ or DEALER client) is
// answered with one message [sequence number, payload] per buffered batch
// from that number on, then the end marker [-1, empty payload]; a number of
// 2^63 or more, beyond every batch, with the end marker alone. vLLM's
// subscribers send the number as 8 bytes; as in vLLM, a number of any
// other length is read as the unsigned number its bytes spell, an empty one
// after the delimiter as 0, and one of more than 64 bits as beyond every
// batch.
//
// [Publisher.Publish] numbers, encodes and queues a batch, and never
// blocks; [Publisher.Run] binds the sockets and sends until its context
// ends. A subscriber or replay client that stops reading is disconnected
// once a write to it has waited 5 seconds, so that it does not stop the
// others' messages; it recovers what it missed by replay once it
// reconnects. A batch that finds the queue full is not sent live but is kept for
// replay, so a subscriber sees the gap and recovers it. Publish is safe for
// concurrent use; creating a Publisher starts nothing. The zero Publisher is
// not usable; create one with [NewPublisher].
type Publisher struct {
	cfg     PublisherConfig
	topic   []byte
	queue   chan frame
	running atomic.Bool

	mu   sync.Mutex // protects the fields below
	seq  int64      // next sequence number
	ring []frame    // the last BufferSteps batches, oldest at ring[head] once full
	head int
	buf  []byte // encoding scratch
}

// frame is one numbered, encoded batch.
type frame struct {
	seq     int64
	payload []byte
}

// NewPublisher returns a Publisher for cfg, or an error wrapping
// [ErrInvalidConfig].
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	switch {
	case cfg.Endpoint == "":
		return nil, fmt.Errorf("%w: Endpoint is required", ErrInvalidConfig)
	case cfg.BufferSteps < 0 || cfg.QueueSize < 0:
		return nil, fmt.Errorf("%w: negative BufferSteps or QueueSize", ErrInvalidConfig)
	}
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	return &Publisher{
		cfg:   cfg,
		topic: []byte(cfg.Topic),
		queue: make(chan frame, cfg.QueueSize),
	}, nil
}

// Publish numbers b with the next sequence number, encodes it, keeps it for
// replay and queues it for sending. It does not retain b.
func (p *Publisher) Publish(b *Batch) { p.publish(b, true) }

// publish is Publish; a batch not sent live is only kept for replay.
func (p *Publisher) publish(b *Batch, live bool) {
	p.mu.Lock()
	p.buf = AppendBatch(p.buf[:0], b)
	f := frame{seq: p.seq, payload: append([]byte(nil), p.buf...)}
	p.seq++
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, f)
	} else {
		p.ring[p.head] = f
		p.head = (p.head + 1) % len(p.ring)
	}
	if live {
		select {
		case p.queue <- f:
		default: // dropped live; replay has it
		}
	}
	p.mu.Unlock()
}

// replayStart reads the sequence number of a replay request as vLLM does,
// int.from_bytes(start_seq_bytes, "big") in
// ZmqEventPublisher._service_replay (vllm/distributed/kv_events.py, vLLM
// 0.9 to 2026): the unsigned big-endian number of any length, 0 for none.
// A number that does not fit in 64 bits (more than 8 bytes after its
// leading zeros) is beyond every sequence number, read as the largest. It
// allocates nothing and reads each byte at most once.
func replayStart(b []byte) uint64 {
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	if len(b) > 8 {
		return ^uint64(0)
	}
	var n uint64
	for _, c := range b {
		n = n<<8 | uint64(c)
	}
	return n
}

// since returns the buffered batches numbered from start on, oldest first.
// Numbers compare as the unsigned 8-byte integers they are on the wire, as
// vLLM's replay reads them (int.from_bytes(start_seq_bytes, "big") in
// ZmqEventPublisher._service_replay, vllm/distributed/kv_events.py, from
// vLLM 0.9 to the 2026 source that replays [topic, seq, payload]): a
// request of 2^63 or more asks for batches after every one published, and
// gets none.
func (p *Publisher) since(start uint64) []frame {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []frame
	for i := range p.ring {
		f := p.ring[(p.head+i)%len(p.ring)]
		if uint64(f.seq) >= start {
			out = append(out, f)
		}
	}
	return out
}

// sendTimeout bounds one send on the replay socket.
const sendTimeout = 5 * time.Second

// The wait after a failed receive on the replay socket starts at
// minReplayRetry and doubles after each failure in a row, up to
// maxReplayRetry, so that an error that persists does not spin.
const (
	minReplayRetry = 10 * time.Millisecond
	maxReplayRetry = time.Second
)

// Run binds the PUB socket (and the replay socket, if configured), sends
// the queued batches and answers replay requests until ctx ends, then
// closes the sockets and returns ctx's error, or the error binding a
// socket. A Publisher runs once at a time.
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Publisher.Run", ErrRunning)
	}
	defer p.running.Store(false)
	if err := registerGuards(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quiet))
	defer pub.Close()
	if err := pub.SetOption(zmq4.OptionHWM, p.cfg.QueueSize); err != nil {
		return fmt.Errorf("kvevents: %w", err)
	}
	if err := pub.Listen(bindAddr(p.cfg.Endpoint)); err != nil {
		return fmt.Errorf("kvevents: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if p.cfg.ReplayEndpoint != "" {
		router := zmq4.NewRouter(ctx, zmq4.WithLogger(quiet), zmq4.WithTimeout(sendTimeout))
		defer router.Close()
		if err := router.Listen(bindAddr(p.cfg.ReplayEndpoint)); err != nil {
			return fmt.Errorf("kvevents: %w", err)
		}
		wg.Go(func() { p.serveReplay(ctx, router, sleep) })
	}
	for {
		select {
		case f := <-p.queue:
			// The PUB socket queues the message: its frames must not be
			// reused.
			seq := binary.BigEndian.AppendUint64(nil, uint64(f.seq))
			_ = pub.SendMulti(zmq4.NewMsgFrom(p.topic, seq, f.payload))
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		}
	}
}

// bindAddr turns vLLM's "tcp://*:port" into an address zmq4 binds, through
// the stall-bounded transports for tcp and ipc.
func bindAddr(ep string) string {
	ep = strings.Replace(ep, "://*:", "://0.0.0.0:", 1)
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return stallTCP + "://" + rest
	}
	if rest, ok := strings.CutPrefix(ep, "ipc://"); ok {
		return stallIPC + "://" + rest
	}
	return ep
}

// replaySocket is what serveReplay uses of the replay (ROUTER) socket.
type replaySocket interface {
	Recv() (zmq4.Msg, error)
	SendMulti(zmq4.Msg) error
}

// sleep waits for d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// serveReplay answers replay requests until ctx ends, waiting with wait
// ([sleep], or a fake clock's in tests) after a failed receive.
func (p *Publisher) serveReplay(ctx context.Context, router replaySocket, wait func(context.Context, time.Duration) bool) {
	var end [8]byte
	binary.BigEndian.PutUint64(end[:], ^uint64(0))
	retry := minReplayRetry
	for {
		msg, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil || !wait(ctx, retry) {
				return
			}
			retry = min(2*retry, maxReplayRetry)
			continue
		}
		retry = minReplayRetry
		// [identity, "", seq] from REQ and DEALER clients; [identity, seq]
		// from a DEALER that sends no delimiter.
		f := msg.Frames
		if len(f) < 2 {
			continue
		}
		id, rest := f[0], f[1:]
		var delim [][]byte
		if len(rest) == 2 && len(rest[0]) == 0 {
			delim, rest = [][]byte{{}}, rest[1:]
		}
		// A lone empty frame is a delimiter without a request.
		if len(rest) != 1 || (delim == nil && len(rest[0]) == 0) {
			continue
		}
		start := replayStart(rest[0])
		reply := func(seq []byte, payload []byte) error {
			frames := append(append([][]byte{id}, delim...), seq, payload)
			return router.SendMulti(zmq4.NewMsgFrom(frames...))
		}
		for _, b := range p.since(start) {
			if reply(binary.BigEndian.AppendUint64(nil, uint64(b.seq)), b.payload) != nil {
				break
			}
		}
		_ = reply(end[:], nil)
	}
}
