package spill

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/httplb"
	"github.com/llmlb/llmlb/retry"
)

// upgradeTier is a tier of one upstream behind an httplb.Transport with
// its own balancer, and the count of requests the upstream received.
type upgradeTier struct {
	b     *llmlb.Balancer
	tr    *httplb.Transport
	calls *atomic.Int64
}

// newUpgradeTier starts an upstream that answers with h and returns the
// tier over it, whose Transport makes up to attempts attempts.
func newUpgradeTier(t *testing.T, attempts int, h http.HandlerFunc) upgradeTier {
	t.Helper()
	calls := new(atomic.Int64)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		h(w, r)
	}))
	t.Cleanup(up.Close)
	b, err := llmlb.New(llmlb.RoundRobin())
	if err != nil {
		t.Fatal(err)
	}
	eps, err := httplb.NewEndpoints(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update(eps); err != nil {
		t.Fatal(err)
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr, err := httplb.NewTransport(httplb.Config{Balancer: b, Base: base, Retry: retry.LoopConfig{MaxAttempts: attempts}})
	if err != nil {
		t.Fatal(err)
	}
	return upgradeTier{b: b, tr: tr, calls: calls}
}

// outstanding returns the requests the tier's balancer counts in flight.
func (u upgradeTier) outstanding() int64 {
	var n int64
	for _, s := range u.b.Stats() {
		n += s.Outstanding
	}
	return n
}

// echoSwitch answers with 101 Switching Protocols to "echo" and then
// echoes what it receives until the connection closes.
func echoSwitch(w http.ResponseWriter, r *http.Request) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	_ = buf.Flush()
	_, _ = io.Copy(conn, buf)
}

// A protocol switch (a WebSocket on vLLM's /v1/realtime, say) passes
// through httplb's proxy over the Transport: from the first tier, and from
// a later one when the first spills the request before switching. Bytes
// go both ways over the switched connection, its pick stays outstanding
// while it is open and ends when the client closes it, and a switched
// request is neither retried within its tier nor spilled to the next
// when the connection closes.
func TestProxyUpgradeThroughTiers(t *testing.T) {
	busy := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}
	for _, c := range []struct {
		name     string
		first    http.HandlerFunc
		attempts int  // of the first tier
		spilled  bool // the second tier switches, the first refused
	}{
		{"first tier", echoSwitch, 3, false},
		// One attempt: the tier's own retries would wait for the
		// Retry-After.
		{"spilled", busy, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newUpgradeTier(t, c.attempts, c.first)
			b := newUpgradeTier(t, 3, echoSwitch)
			spills := new(atomic.Int64)
			tr, err := New(Config{
				Tiers:    []Tier{{Name: "a", Transport: a.tr}, {Name: "b", Transport: b.tr}},
				Logger:   slog.New(slog.DiscardHandler),
				Observer: func(Event) { spills.Add(1) },
			})
			if err != nil {
				t.Fatal(err)
			}
			proxy := httplb.NewProxy(nil)
			proxy.Transport = tr
			gw := httptest.NewServer(proxy)
			t.Cleanup(gw.Close)

			conn, err := net.Dial("tcp", gw.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			if _, err := io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("status %d, want 101", resp.StatusCode)
			}
			if got, want := resp.Header.Get(DefaultHeader), map[bool]string{true: "a"}[c.spilled]; got != want {
				t.Errorf("%s %q, want %q", DefaultHeader, got, want)
			}
			for _, msg := range []string{"ping", "pong and more"} {
				if _, err := io.WriteString(conn, msg); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(br, got); err != nil {
					t.Fatal(err)
				}
				if string(got) != msg {
					t.Fatalf("echoed %q, want %q", got, msg)
				}
			}
			switched := b
			if !c.spilled {
				switched = a
			}
			if n := switched.outstanding(); n != 1 {
				t.Errorf("the switched tier counts %d requests in flight while the connection is open, want 1", n)
			}
			if err := conn.Close(); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for switched.outstanding() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the switched request is still in flight after its connection closed: %+v", switched.b.Stats())
				}
				time.Sleep(5 * time.Millisecond)
			}
			// Give a retry or a spill, if the end of the connection made
			// one, the time to reach an upstream.
			time.Sleep(50 * time.Millisecond)
			wantB, wantSpills := int64(0), int64(0)
			if c.spilled {
				wantB, wantSpills = 1, 1
			}
			if n := a.calls.Load(); n != 1 {
				t.Errorf("the first tier's upstream got %d requests, want 1", n)
			}
			if n := b.calls.Load(); n != wantB {
				t.Errorf("the second tier's upstream got %d requests, want %d", n, wantB)
			}
			if n := spills.Load(); n != wantSpills {
				t.Errorf("%d spills, want %d", n, wantSpills)
			}
			if n := a.outstanding() + b.outstanding(); n != 0 {
				t.Errorf("%d requests in flight after the connection closed, want 0", n)
			}
		})
	}
}
