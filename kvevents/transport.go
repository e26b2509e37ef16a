package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The subscriber's sockets dial tcp and ipc addresses through a zmq4
// transport of this package's own, which wraps each connection in a
// guardConn. zmq4 alone runs the ZMTP handshake of a connection it dials
// with no deadline, whatever its context; allocates each frame whole at the
// size its header claims, before reading it; and leaves the goroutine that
// reads a connection blocked for ever when the socket closes while its
// queue of received messages is full. The guard bounds the handshake,
// fails a connection whose peer announces a message larger than any batch
// this package accepts, and lets a subscription close its connections
// itself, then read what zmq4 queued until the reading goroutine stops.

// Schemes of the guarded transports, registered with zmq4 under names no
// one else uses.
const (
	guardTCP = "llmlb-kvevents-tcp"
	guardIPC = "llmlb-kvevents-ipc"
)

// ZMTP 3 framing, as the guard reads it.
const (
	// greetingBytes is the length of the greeting that opens a connection.
	greetingBytes = 64
	// Bits of the flags byte that starts each frame: more frames follow in
	// the message; the size is 8 bytes (big-endian) rather than 1.
	flagMore = 0x01
	flagLong = 0x02
	// maxMessageBytes is the largest message a peer may announce: a
	// payload of MaxPayloadBytes with room for its topic, sequence number
	// and delimiter frames.
	maxMessageBytes = MaxPayloadBytes + 64<<10
	// maxFrames is the most frames one message may have, well above the
	// three of the stream's and the replay's messages.
	maxFrames = 16
)

// drainTimeout bounds the wait, when a subscription closes a socket, for
// zmq4's reading goroutine to report its connection closed.
const drainTimeout = 2 * time.Second

// queueBytes bounds the bytes of the messages a socket's connection has
// read and its subscription has not yet done with: those zmq4 queued, the
// one it is reading, and the one the subscription holds. zmq4 queues ten
// messages whatever their size; with this bound a publisher of the largest
// messages accepted gets one at a time, the connection then waiting (and
// the publisher's socket queueing or dropping) until the subscription
// asks for the next.
const queueBytes = maxMessageBytes

// registerOnce runs registerGuards' registration, whose error is
// registerErr.
var (
	registerOnce sync.Once
	registerErr  error
)

// registerGuards registers the guarded transports and the Publisher's
// stall-bounded ones with zmq4, once.
func registerGuards() error {
	registerOnce.Do(func() {
		registerErr = errors.Join(
			zmq4.RegisterTransport(guardTCP, guardTransport{network: "tcp"}),
			zmq4.RegisterTransport(guardIPC, guardTransport{network: "unix"}),
			zmq4.RegisterTransport(stallTCP, stallTransport{network: "tcp"}),
			zmq4.RegisterTransport(stallIPC, stallTransport{network: "unix"}),
		)
		if registerErr != nil {
			registerErr = fmt.Errorf("kvevents: %w", registerErr)
		}
	})
	return registerErr
}

// dialed, if set, is called with every connection a guardTransport dials,
// before it is used. Tests set it to shrink the kernel's receive buffer, so
// that what a subscription holds is measured without the buffer the kernel
// sizes at will.
var dialed func(net.Conn)

// guardTransport is the zmq4 transport of network ("tcp" or "unix") that
// dials guarded connections for the connGroup on the socket's context.
// It only dials.
type guardTransport struct{ network string }

// Dial dials addr with dialer, under ctx and the connGroup's context, and
// returns the connection guarded and added to the group.
func (t guardTransport) Dial(ctx context.Context, dialer transport.Dialer, addr string) (net.Conn, error) {
	g, _ := ctx.Value(connGroupKey{}).(*connGroup)
	if g == nil {
		return nil, errors.New("kvevents: guarded transport dialed outside a subscription")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	c, err := dialer.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	if dialed != nil {
		dialed(c)
	}
	gc := newGuardConn(c, g.handshake)
	gc.budget = g
	if !g.add(gc) {
		c.Close()
		return nil, net.ErrClosed
	}
	return gc, nil
}

// Listen refuses: the guarded transports only dial.
func (t guardTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kvevents: the guarded transport does not listen")
}

// Addr returns the address dialed for ep, ep itself.
func (t guardTransport) Addr(ep string) (string, error) { return ep, nil }

// connGroupKey is the context key of a socket's connGroup.
type connGroupKey struct{}

// connGroup holds the guarded connections of one socket, and closes them
// when its context ends or close is called. It also holds the socket's
// budget of queueBytes: a connection acquires the size of each frame as its
// header arrives, before zmq4 allocates the frame, and waits while the
// budget is spent; the socket releases each message once its user is done
// with it.
type connGroup struct {
	ctx       context.Context // the life of the connections
	handshake time.Duration   // the time each has for its ZMTP handshake

	mu     sync.Mutex // protects the fields below
	freed  sync.Cond  // signalled, with mu, when bytes are released or the group closes
	conns  []net.Conn
	closed bool
	held   uint64 // bytes acquired and not released
	limit  uint64 // the budget: queueBytes
}

// newConnGroup returns an empty group living for ctx.
func newConnGroup(ctx context.Context, handshake time.Duration) *connGroup {
	g := &connGroup{ctx: ctx, handshake: handshake, limit: queueBytes}
	g.freed.L = &g.mu
	return g
}

// acquire takes n bytes of the budget, waiting while they would exceed it
// and some are held; it fails once the group is closed.
func (g *connGroup) acquire(n uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.closed && g.held > 0 && n > g.limit-min(g.held, g.limit) {
		g.freed.Wait()
	}
	if g.closed {
		return net.ErrClosed
	}
	g.held += n
	return nil
}

// release gives back n bytes acquired.
func (g *connGroup) release(n uint64) {
	if n == 0 {
		return
	}
	g.mu.Lock()
	g.held -= min(n, g.held)
	g.mu.Unlock()
	g.freed.Broadcast()
}

// add adds c to the group, or reports false if the group is closed.
func (g *connGroup) add(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.ctx.Err() != nil {
		return false
	}
	g.conns = append(g.conns, c)
	return true
}

// close closes the group's connections, and any added later.
func (g *connGroup) close() {
	g.mu.Lock()
	conns := g.conns
	g.conns, g.closed = nil, true
	g.mu.Unlock()
	g.freed.Broadcast()
	for _, c := range conns {
		c.Close()
	}
}

// guardConn is a connection dialed by a guarded transport. It reads the
// ZMTP framing of the bytes zmq4 reads through it: the handshake (the
// greeting and the first frame after it, the peer's READY command) must
// complete within the handshake time, and a Read that would complete the
// header of a frame taking its message beyond limit bytes, or maxFrames
// frames, fails instead, as does every Read after it, so that zmq4
// never allocates the frame. After the handshake, a Read that completes a
// frame's header first acquires the frame's size from the budget of its
// socket's group, if any. zmq4 reads a connection from one goroutine at
// a time (the dialing one during the handshake, then its reader), so the
// parsing state needs no lock.
type guardConn struct {
	net.Conn
	limit  uint64     // the most bytes a message may hold: maxMessageBytes
	budget *connGroup // the socket's budget of bytes read; nil for none

	handshaking bool    // the deadline of the handshake is set
	greeting    int     // bytes of the greeting still to come
	header      [9]byte // the current frame's header, its first n bytes read
	n           int
	body        uint64 // bytes of the current frame's body still to come
	more        bool   // the current frame is not its message's last
	frames      int    // frames of the current message so far
	size        uint64 // bytes of the current message so far
	err         error  // why the connection failed
}

// newGuardConn guards c, whose handshake must complete within handshake.
func newGuardConn(c net.Conn, handshake time.Duration) *guardConn {
	g := &guardConn{Conn: c, limit: maxMessageBytes, greeting: greetingBytes, handshaking: true}
	_ = c.SetDeadline(time.Now().Add(handshake))
	return g
}

// Read reads from the connection and checks the framing of what it read.
func (c *guardConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if ferr := c.scan(p[:n]); ferr != nil {
		c.err = ferr
		return 0, ferr
	}
	return n, err
}

// scan follows the framing over b, the next bytes read.
func (c *guardConn) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
		case c.body > 0:
			k := min(c.body, uint64(len(b)))
			c.body -= k
			b = b[k:]
			if c.body == 0 {
				c.endFrame()
			}
		default:
			c.header[c.n] = b[0]
			c.n++
			b = b[1:]
			long := c.header[0]&flagLong != 0
			if c.n < 2 || long && c.n < 9 {
				continue
			}
			size := uint64(c.header[1])
			if long {
				size = binary.BigEndian.Uint64(c.header[1:])
			}
			c.more = c.header[0]&flagMore != 0
			c.n = 0
			c.frames++
			if c.frames > maxFrames {
				return fmt.Errorf("kvevents: peer sent a message of more than %d frames", maxFrames)
			}
			if size > c.limit-c.size {
				return fmt.Errorf("kvevents: peer announced a frame of %d bytes, taking its message beyond %d bytes", size, c.limit)
			}
			if c.budget != nil && !c.handshaking {
				if err := c.budget.acquire(size); err != nil {
					return err
				}
			}
			c.size += size
			c.body = size
			if size == 0 {
				c.endFrame()
			}
		}
	}
	return nil
}

// endFrame ends the current frame: the message too unless more follow, and
// the handshake if it is the first frame.
func (c *guardConn) endFrame() {
	if !c.more {
		c.frames, c.size = 0, 0
	}
	if c.handshaking {
		c.handshaking = false
		_ = c.Conn.SetDeadline(time.Time{})
	}
}

// zsocket is a zmq4 socket of a subscription, dialing one address. A tcp
// or ipc address is dialed through the guarded transport, and the socket
// lives until Close, whatever ctx does: when ctx ends, the connection is
// closed, which ends a Dial or Recv in progress, and Close then reads what
// zmq4 had queued until its reader stops. An inproc address, whose peer is
// in the same process, is dialed as it is, and the socket ends with ctx.
type zsocket struct {
	zmq4.Socket
	addr    string             // the address dialed
	group   *connGroup         // the guarded connections; nil for inproc
	stop    func() bool        // stops closing the group when ctx ends
	cancel  context.CancelFunc // ends the socket's context
	reading bool               // zmq4's reader of the connection may still run
	held    uint64             // bytes of the message Recv returned last, released at the next
}

// newZSocket returns a socket made by newSocket for dialing addr, whose
// handshake must complete within handshake, and whose connection ends with
// ctx.
func newZSocket(ctx context.Context, newSocket func(context.Context, ...zmq4.Option) zmq4.Socket, addr string, handshake time.Duration) (*zsocket, error) {
	if err := registerGuards(); err != nil {
		return nil, err
	}
	s := &zsocket{addr: addr}
	sctx := ctx
	if scheme, rest, _ := strings.Cut(addr, "://"); scheme == "tcp" || scheme == "ipc" {
		s.addr = guardTCP + "://" + rest
		if scheme == "ipc" {
			s.addr = guardIPC + "://" + rest
		}
		s.group = newConnGroup(ctx, handshake)
		s.stop = context.AfterFunc(ctx, s.group.close)
		sctx = context.WithValue(context.WithoutCancel(ctx), connGroupKey{}, s.group)
	}
	sctx, s.cancel = context.WithCancel(sctx)
	s.Socket = newSocket(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(dialTimeout), zmq4.WithLogger(quiet))
	return s, nil
}

// Dial connects the socket to its address.
func (s *zsocket) Dial() error {
	if err := s.Socket.Dial(s.addr); err != nil {
		return err
	}
	s.reading = true
	return nil
}

// Recv receives a message, valid until the next call of Recv or Close,
// which give its bytes back to the group's budget. After an error, zmq4's
// reader has stopped.
func (s *zsocket) Recv() (zmq4.Msg, error) {
	if s.group != nil {
		s.group.release(s.held)
		s.held = 0
	}
	msg, err := s.Socket.Recv()
	if err != nil {
		s.reading = false
		return msg, err
	}
	if s.group != nil {
		for _, f := range msg.Frames {
			s.held += uint64(len(f))
		}
	}
	return msg, nil
}

// Close closes the connection, receives what zmq4 queued until its reader
// reports the connection closed (for drainTimeout at most), and closes the
// socket.
func (s *zsocket) Close() {
	if s.group != nil {
		s.stop()
		s.group.close()
		if s.reading {
			t := time.AfterFunc(drainTimeout, s.cancel)
			for s.reading {
				_, _ = s.Recv()
			}
			t.Stop()
		}
	}
	s.cancel()
	_ = s.Socket.Close()
}

// The Publisher's sockets listen through transports of this package's own,
// which bound each write to a connection by maxStall. zmq4 writes a message
// to a socket's peers one after another, with no deadline, holding the
// socket's lock: one subscriber that stops reading (its window full) would
// stop the live stream of every other, and one replay client that stops
// reading every later replay. A connection whose write has not completed
// within maxStall is closed, cut mid-message: the peer is dropped, as
// libzmq drops a subscriber's messages past its high-water mark, and once
// it reconnects it asks the replay socket for what it missed.
const (
	stallTCP = "llmlb-kvevents-pub-tcp"
	stallIPC = "llmlb-kvevents-pub-ipc"
)

// maxStall is how long one write to a Publisher's peer may take; a variable
// for tests.
var maxStall = 5 * time.Second

// stallTransport is the zmq4 transport of network ("tcp" or "unix") whose
// listeners accept stall-bounded connections. It only listens.
type stallTransport struct{ network string }

// Dial refuses: the stall-bounded transports only listen.
func (t stallTransport) Dial(context.Context, transport.Dialer, string) (net.Conn, error) {
	return nil, errors.New("kvevents: the publisher's transport does not dial")
}

// Listen listens on addr and returns a listener of stall-bounded
// connections.
func (t stallTransport) Listen(_ context.Context, addr string) (net.Listener, error) {
	l, err := net.Listen(t.network, addr)
	if err != nil {
		return nil, err
	}
	return stallListener{l}, nil
}

// Addr returns the address listened on for ep, as zmq4's own transports
// read it ("*" for every interface or any port).
func (t stallTransport) Addr(ep string) (string, error) { return transport.New(t.network).Addr(ep) }

// stallListener accepts stall-bounded connections.
type stallListener struct{ net.Listener }

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return stallConn{c}, nil
}

// stallConn is a connection whose writes fail, and close it, once one has
// taken maxStall.
type stallConn struct{ net.Conn }

func (c stallConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(maxStall))
	n, err := c.Conn.Write(p)
	if err != nil {
		// A message cut short leaves the peer's stream out of frame.
		_ = c.Conn.Close()
	}
	return n, err
}
