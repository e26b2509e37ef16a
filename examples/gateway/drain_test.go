package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
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
				l := newPipeListener()
				srv, served := sd.serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: first\n\n")
					w.(http.Flusher).Flush()
					close(held)
					select {
					case <-release:
						fmt.Fprint(w, "data: [DONE]\n\n")
					case <-r.Context().Done():
					}
				}), l)
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
// is idle between two requests; a hijacked (upgraded) connection, whose end
// its server does not report, stays busy until its Close.
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
		{"hijacked", []http.ConnState{http.StateNew, http.StateActive, http.StateHijacked}, false},
		{"hijacked, then closed", []http.ConnState{http.StateNew, http.StateActive, http.StateHijacked, http.StateClosed}, true},
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

// connList is a listener that hands out its connections in order, then
// fails.
type connList []net.Conn

func (l *connList) Accept() (net.Conn, error) {
	if len(*l) == 0 {
		return nil, net.ErrClosed
	}
	c := (*l)[0]
	*l = (*l)[1:]
	return c, nil
}

func (l *connList) Close() error   { return nil }
func (l *connList) Addr() net.Addr { return pipeAddr{} }

// closeUpgraded closes the upgraded connections and leaves the others; the
// Close of a connection that the listener handed out reports its end.
func TestCloseUpgraded(t *testing.T) {
	var cs conns
	l := listener{&connList{pipeConn(t), pipeConn(t)}, &cs}
	upgraded, active := accept(t, l), accept(t, l)
	for _, c := range []net.Conn{upgraded, active} {
		cs.track(c, http.StateNew)
		cs.track(c, http.StateActive)
	}
	cs.track(upgraded, http.StateHijacked)
	if n := cs.closeUpgraded(); n != 1 {
		t.Errorf("closeUpgraded closed %d connections, want 1", n)
	}
	// A pipe's SetDeadline fails once the pipe is closed.
	if err := upgraded.SetDeadline(time.Time{}); err == nil {
		t.Error("the upgraded connection is still open")
	}
	if err := active.SetDeadline(time.Time{}); err != nil {
		t.Errorf("the active connection was closed: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if cs.waitIdle(ctx) {
		t.Error("idle with a connection active")
	}
	if err := active.Close(); err != nil {
		t.Fatal(err)
	}
	if !cs.waitIdle(ctx) {
		t.Error("a connection closed through the listener's conn is still busy")
	}
	if n := cs.closeUpgraded(); n != 0 {
		t.Errorf("closeUpgraded closed %d connections, want 0", n)
	}
}

// accept returns l's next connection.
func accept(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echoUpstream is an upstream that switches every request to the protocol
// it asks for (101 Switching Protocols, as a WebSocket upgrade is
// answered) and then echoes what it receives until either side closes.
func echoUpstream(t *testing.T) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + r.Header.Get("Upgrade") + "\r\n\r\n")
		_ = buf.Flush()
		_, _ = io.Copy(conn, buf)
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// upgrade opens a connection to the gateway at base, upgrades it to the
// echo protocol on /v1/realtime and returns it with its reader.
func upgrade(t *testing.T, base string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: gateway\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s, want 101", resp.Status)
	}
	return conn, br
}

// echo sends msg on an upgraded connection and reports whether the
// upstream's echo came back within 10 s.
func echo(conn net.Conn, br *bufio.Reader, msg string) error {
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	defer conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil {
		return err
	}
	if string(got) != msg {
		return fmt.Errorf("echoed %q, want %q", got, msg)
	}
	return nil
}

// TestShutdownWaitsForUpgraded: the gateway proxies an upgraded connection
// (a WebSocket, say: the ReverseProxy takes the client's connection over
// from the server), and on SIGTERM waits for it as for a stream in flight.
// It keeps proxying until the client closes the connection and then exits
// at once, or until -shutdown-grace is over and then closes it and exits,
// and never before.
func TestShutdownWaitsForUpgraded(t *testing.T) {
	for _, c := range []struct {
		name         string
		grace        time.Duration
		clientCloses bool
	}{
		{"client closes", time.Minute, true},
		{"grace period over", time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startProcess(t, "-backends", echoUpstream(t), "-allow-paths", "/v1/realtime", "-listen", "127.0.0.1:0",
				"-admin", "", "-scrape", "-1s", "-shutdown-grace", c.grace.String())
			conn, br := upgrade(t, p.waitFor("gateway serving", "addr"))
			if err := echo(conn, br, "before"); err != nil {
				t.Fatalf("before the signal: %v", err)
			}
			signalled := time.Now()
			p.signal(syscall.SIGTERM)
			p.waitFor("gateway shutting down", "")
			lines := make(chan string, 64)
			go func() {
				defer close(lines)
				for p.lines.Scan() {
					lines <- p.lines.Text()
				}
			}()
			exited := make(chan error, 1)
			go func() { exited <- p.cmd.Wait() }()
			// A gateway that did not wait for the connection would have
			// exited by now (within milliseconds); this one still proxies
			// it.
			time.Sleep(300 * time.Millisecond)
			select {
			case err := <-exited:
				t.Fatalf("the gateway exited (%v) %v after the signal, with an upgraded connection open", err, time.Since(signalled))
			default:
			}
			if err := echo(conn, br, "during the shutdown"); err != nil {
				t.Fatalf("after the signal: %v", err)
			}
			if c.clientCloses {
				closed := time.Now()
				conn.Close()
				select {
				case <-exited:
				case <-time.After(20 * time.Second):
					_ = p.cmd.Process.Kill()
					<-exited
					t.Fatal("the gateway still running 20s after the client closed its connection")
				}
				t.Logf("the gateway exited %v after the client closed its connection", time.Since(closed))
				for range lines {
				}
			} else {
				// The gateway closes the connection once its grace is over.
				if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
					t.Fatal(err)
				}
				if _, err := br.ReadByte(); err == nil {
					t.Fatal("read a byte the client never sent")
				} else if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal("the connection still open 20s after the grace period")
				}
				if d := time.Since(signalled); d < c.grace {
					t.Errorf("the connection closed %v after the signal, before the %v grace was over", d, c.grace)
				}
				select {
				case <-exited:
				case <-time.After(20 * time.Second):
					_ = p.cmd.Process.Kill()
					<-exited
					t.Fatal("the gateway still running 20s after its grace period")
				}
				var cut string
				for l := range lines {
					if strings.Contains(l, "grace period over") {
						cut = l
					}
				}
				if !strings.Contains(cut, "upgraded=1") {
					t.Errorf("log line %q, want the grace period over with upgraded=1", cut)
				}
			}
			if ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || ws.ExitStatus() != 0 {
				t.Errorf("exit %v, want 0", p.cmd.ProcessState)
			}
		})
	}
}
