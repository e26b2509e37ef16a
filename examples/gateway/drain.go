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

// server returns the server of h, whose connections sd follows; call it
// once.
func (sd *shutdown) server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout, ConnState: sd.conns.track}
}

// stop stops srv, which server made and whose Serve sends its result on
// served: srv takes no more connections, its requests in flight have up to
// sd.grace to finish, and then those left are cut. stop returns once srv
// has stopped and Serve has returned.
//
// http.Server.Shutdown alone notices that the last request has finished
// only at its next look at the connections, and it looks at intervals that
// grow to 500ms: the gateway would exit up to half a second after its last
// stream ended. stop learns it from srv's connection states instead, and
// then ends the Shutdown and closes the connections left, all idle.
func (sd *shutdown) stop(srv *http.Server, served <-chan error, log *slog.Logger) error {
	stopping, done := context.WithTimeout(context.Background(), sd.grace)
	defer done()
	drained, quiet := context.WithCancel(stopping)
	defer quiet()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		// Serve returns once Shutdown has closed the listener, and each
		// connection it accepted has reported its first state before:
		// from then on, none that is busy can be missed.
		<-served
		if sd.conns.waitIdle(drained) {
			quiet()
		}
	}()
	err := srv.Shutdown(drained)
	quiet()
	<-watched
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		log.Warn("gateway: shutdown grace period over, cutting the requests still in flight", "grace", sd.grace)
		return srv.Close()
	case errors.Is(err, context.Canceled):
		// No request in flight: close the idle connections, as Shutdown
		// would have at its next look.
		return srv.Close()
	}
	return err
}

// conns follows the states of a server's connections, as its ConnState
// hook. A connection is busy from its start, through each request it
// serves, to its end; it is idle between two requests. A new connection
// counts as busy for as long as it sends nothing, where
// http.Server.Shutdown gives up on one after 5 seconds: stop then waits for
// Shutdown's own verdict. A zero conns follows no connection and is ready
// to use; it is safe for simultaneous use by multiple goroutines.
type conns struct {
	mu   sync.Mutex            // protects busy and idle
	busy map[net.Conn]struct{} // lazily initialized
	idle chan struct{}         // takes a value when busy empties; buffered 1, lazily initialized
}

// track records that c is in state st now.
func (cs *conns) track(c net.Conn, st http.ConnState) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.init()
	switch st {
	case http.StateNew, http.StateActive:
		cs.busy[c] = struct{}{}
		return
	}
	// Idle, hijacked or closed: Shutdown waits for none of these.
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

// init makes busy and idle; the caller holds mu.
func (cs *conns) init() {
	if cs.busy == nil {
		cs.busy, cs.idle = make(map[net.Conn]struct{}), make(chan struct{}, 1)
	}
}
