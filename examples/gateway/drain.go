package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// shutdown is how the gateway stops: it reports not ready for delay, still
// taking requests, then stops taking them and lets those in flight finish
// for up to grace. It follows the connections of the server it makes
// (server), so that it stops the moment the last request has finished.
type shutdown struct {
	grace, delay time.Duration
	draining     atomic.Bool // the readiness probe fails
	conns        conns       // the connections of the server that server made
}

// serveReady answers the readiness probe: 200 until the shutdown begins,
// then 503.
func (sd *shutdown) serveReady(w http.ResponseWriter, _ *http.Request) {
	if sd.draining.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// serve serves h on l, following its connections, until stop; call it
// once. It returns the server and the channel on which the server's Serve
// sends its result.
func (sd *shutdown) serve(h http.Handler, l net.Listener) (*http.Server, <-chan error) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout, ConnState: sd.conns.track}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(listener{l, &sd.conns}) }()
	return srv, served
}

// stop stops srv, which serve made and whose Serve sends its result on
// served: srv takes no more connections, its requests in flight and its
// upgraded connections have up to sd.grace to finish, and then those left
// are cut. stop returns once srv has stopped and Serve has returned.
//
// http.Server.Shutdown alone notices that the last request has finished
// only at its next look at the connections, and it looks at intervals that
// grow to 500ms: the gateway would exit up to half a second after its last
// stream ended. stop learns it from srv's connection states instead, and
// then ends the Shutdown and closes the connections left, all idle.
//
// Nor does Shutdown wait for, or Close close, a connection that a handler
// has taken over (hijacked): the gateway's ReverseProxy takes over the
// client's connection when an upstream switches protocols (101 Switching
// Protocols, as a WebSocket such as vLLM's /v1/realtime does, on a path the
// gateway forwards), and copies bytes both ways until either side closes.
// stop waits for such a connection as for a request in flight, and closes
// it once the grace period is over.
func (sd *shutdown) stop(srv *http.Server, served <-chan error, log *slog.Logger) error {
	stopping, done := context.WithTimeout(context.Background(), sd.grace)
	defer done()
	drained, quiet := context.WithCancel(stopping)
	defer quiet()
	idle := make(chan bool, 1)
	go func() {
		// Serve returns once Shutdown has closed the listener, and each
		// connection it accepted has reported its first state before:
		// from then on, none that is busy can be missed.
		<-served
		ok := sd.conns.waitIdle(stopping)
		quiet()
		idle <- ok
	}()
	// Shutdown returns nil once every connection it follows is closed,
	// which may be before an upgraded one is: idle has the last word.
	err := srv.Shutdown(drained)
	if !<-idle {
		log.Warn("gateway: shutdown grace period over, cutting the requests still in flight",
			"grace", sd.grace, "upgraded", sd.conns.closeUpgraded())
		return srv.Close()
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// Nothing in flight: close the idle connections, as Shutdown would
	// have at its next look.
	return srv.Close()
}

// conns follows the states of a server's connections, as its ConnState
// hook. A connection is busy from its start, through each request it
// serves, to its end; it is idle between two requests. A new connection
// counts as busy for as long as it sends nothing, where
// http.Server.Shutdown gives up on one after 5 seconds and closes it, which
// ends it here too. A connection taken over by a handler
// (http.StateHijacked, an upgraded connection) is busy until it is closed,
// which the server does not report: the listener that serve gives the
// server reports it instead (see conn). A zero conns follows no connection
// and is ready to use; it is safe for simultaneous use by multiple
// goroutines.
type conns struct {
	mu   sync.Mutex        // protects busy and idle
	busy map[net.Conn]bool // true for an upgraded connection; lazily initialized
	idle chan struct{}     // takes a value when busy empties; buffered 1, lazily initialized
}

// track records that c is in state st now.
func (cs *conns) track(c net.Conn, st http.ConnState) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.init()
	switch st {
	case http.StateNew, http.StateActive:
		cs.busy[c] = false
		return
	case http.StateHijacked:
		cs.busy[c] = true
		return
	}
	// Idle or closed: Shutdown waits for neither.
	delete(cs.busy, c)
	if len(cs.busy) == 0 {
		select {
		case cs.idle <- struct{}{}:
		default: // a value is waiting already
		}
	}
}

// waitIdle waits until no connection is busy, and reports true, or until
// ctx is done, and reports false.
func (cs *conns) waitIdle(ctx context.Context) bool {
	for {
		cs.mu.Lock()
		cs.init()
		n, idle := len(cs.busy), cs.idle
		cs.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-idle: // look again: another may have become busy since
		case <-ctx.Done():
			return false
		}
	}
}

// closeUpgraded closes the upgraded connections and returns how many it
// closed.
func (cs *conns) closeUpgraded() int {
	cs.mu.Lock()
	var up []net.Conn
	for c, upgraded := range cs.busy {
		if upgraded {
			up = append(up, c)
		}
	}
	cs.mu.Unlock()
	// Outside the lock: a conn's Close tracks its end.
	for _, c := range up {
		_ = c.Close()
	}
	return len(up)
}

// init makes busy and idle; the caller holds mu.
func (cs *conns) init() {
	if cs.busy == nil {
		cs.busy, cs.idle = make(map[net.Conn]bool), make(chan struct{}, 1)
	}
}

// listener is a server's listener whose connections report their Close to
// cs (see conn).
type listener struct {
	net.Listener
	cs *conns
}

// Accept waits for and returns the next connection, which reports its
// Close to l.cs.
func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, cs: l.cs}, nil
}

// conn is a connection that reports its Close to cs as its end
// (http.StateClosed). The server reports the end of the connections it
// keeps itself, and a handler that takes one over gets this conn from
// Hijack, so that its Close, the end of an upgraded connection, is
// reported too. The server closes a connection a second time after its
// end, which changes nothing.
type conn struct {
	net.Conn
	cs *conns
}

// Close closes the connection and reports its end.
func (c *conn) Close() error {
	c.cs.track(c, http.StateClosed)
	return c.Conn.Close()
}

// CloseWrite shuts down the writing side of the connection if it can (a
// TCP connection can), as the server and the ReverseProxy do when the
// connection has one: after a response that closes it, and when the
// upstream of an upgraded one has finished sending.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
