package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestStopEndsWithLastRequest: stop lets a stream in flight finish and
// returns the moment it has, with no timer left to wait for; the grace
// period still bounds the wait, and then the stream is cut. In a synctest
// bubble, time moves only when every goroutine waits: stop returns at the
// very instant the stream ends, or Shutdown's next look at the connections,
// 500ms apart by then, would show as time passed.
func TestStopEndsWithLastRequest(t *testing.T) {
	const grace, streamEnds = time.Minute, 3 * time.Second
	for _, c := range []struct {
		name     string
		finishes bool // before the grace period is over
		stops    time.Duration
	}{
		{"stream finishes", true, streamEnds},
		{"grace period over", false, grace},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sd := &shutdown{grace: grace}
				held, release := make(chan struct{}), make(chan struct{})
				srv := sd.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: first\n\n")
					w.(http.Flusher).Flush()
					close(held)
					select {
					case <-release:
						fmt.Fprint(w, "data: [DONE]\n\n")
					case <-r.Context().Done():
					}
				}))
				l := newPipeListener()
				served := make(chan error, 1)
				go func() { served <- srv.Serve(l) }()
				type answer struct {
					body string
					err  error
				}
				answered := make(chan answer, 1)
				go func() {
					body, err := l.get("/v1/chat/completions")
					answered <- answer{body, err}
				}()
				<-held
				signal := time.Now()
				stopped := make(chan error, 1)
				go func() { stopped <- sd.stop(srv, served, slog.New(slog.DiscardHandler)) }()
				var err error
				if c.finishes {
					time.Sleep(streamEnds)
					close(release)
					// Time stands still until every goroutine waits: if
					// stop waits for a timer, it has not returned yet.
					synctest.Wait()
					select {
					case err = <-stopped:
					default:
						err = <-stopped
						t.Errorf("stop returned %v after the stream ended, not at once", time.Since(signal)-streamEnds)
					}
				} else {
					err = <-stopped
				}
				if err != nil {
					t.Errorf("stop: %v", err)
				}
				if got := time.Since(signal); got != c.stops {
					t.Errorf("stop returned %v after the signal, want %v", got, c.stops)
				}
				a := <-answered
				if done := a.err == nil && strings.HasSuffix(a.body, "data: [DONE]\n\n"); done != c.finishes {
					t.Errorf("the stream finished: %v (%q, %v), want %v", done, a.body, a.err, c.finishes)
				}
			})
		})
	}
}

// conns counts a connection busy from its start to its end, except while it
// is idle between two requests; a hijacked connection is no longer its
// server's.
func TestConnsBusy(t *testing.T) {
	a, b := pipeConn(t), pipeConn(t)
	for _, c := range []struct {
		name   string
		states []http.ConnState // of a, then of b, in turn
		idle   bool
	}{
		{"none", nil, true},
		{"new", []http.ConnState{http.StateNew}, false},
		{"active", []http.ConnState{http.StateNew, http.StateActive}, false},
		{"idle", []http.ConnState{http.StateNew, http.StateActive, http.StateIdle}, true},
		{"active again", []http.ConnState{http.StateNew, http.StateActive, http.StateIdle, http.StateActive}, false},
		{"closed", []http.ConnState{http.StateNew, http.StateActive, http.StateClosed}, true},
		{"hijacked", []http.ConnState{http.StateNew, http.StateActive, http.StateHijacked}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, second := range []bool{false, true} {
				var cs conns
				for _, st := range c.states {
					cs.track(a, st)
				}
				if second { // another connection that comes and goes changes nothing
					cs.track(b, http.StateNew)
					cs.track(b, http.StateActive)
					cs.track(b, http.StateClosed)
				}
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if got := cs.waitIdle(ctx); got != c.idle {
					t.Errorf("with another connection %v: waitIdle = %v, want %v", second, got, c.idle)
				}
			}
		})
	}
}

// pipeConn returns one end of an in-memory connection, closed when the test
// ends.
func pipeConn(t *testing.T) net.Conn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

// pipeListener is a listener of in-memory connections (net.Pipe), which a
// server in a synctest bubble can take: a goroutine waiting on one waits
// durably.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// get sends a GET of path on a new connection and returns the body of the
// answer, read to its end.
func (l *pipeListener) get(path string) (string, error) {
	c, s := net.Pipe()
	defer c.Close()
	select {
	case l.conns <- s:
	case <-l.closed:
		return "", net.ErrClosed
	}
	req, err := http.NewRequest(http.MethodGet, "http://gateway"+path, nil)
	if err != nil {
		return "", err
	}
	if err := req.Write(c); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}
