package httplb

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// switchTo answers with 101 Switching Protocols to protocol and then echoes
// what it receives until the connection closes.
func switchTo(protocol string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + protocol + "\r\n\r\n")
		_ = buf.Flush()
		_, _ = io.Copy(conn, buf)
	}
}

// upgrade sends an upgrade request to protocol through the gateway at addr
// and returns the connection and its answer.
func upgrade(t *testing.T, addr, protocol string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = io.WriteString(conn, "GET /v1/realtime HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: "+protocol+"\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	return conn, br, resp
}

// A protocol switch (a WebSocket, say) passes through the proxy, and its
// pick is finished when the connection closes.
func TestProxyUpgrade(t *testing.T) {
	up := newUpstream(t, switchTo("echo"))
	h := newHarness(t, fixed{}, Config{}, up)
	gw := h.proxy(t)
	conn, br, resp := upgrade(t, gw.Listener.Addr().String(), "echo")
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	_, err := io.WriteString(conn, "ping")
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(br, got)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(got))
	// The open session streams: it is outstanding, and no longer queued.
	st := h.b.Stats()
	require.Len(t, st, 1)
	assert.EqualValues(t, 1, st[0].Outstanding)
	assert.EqualValues(t, 0, st[0].Queued)
	require.NoError(t, conn.Close())
	h.requireIdle(t)
}

// An upstream that switches to a protocol the request did not ask for is
// refused, and its pick is finished.
func TestProxyUpgradeMismatch(t *testing.T) {
	up := newUpstream(t, switchTo("other"))
	h := newHarness(t, fixed{}, Config{Retry: retry.LoopConfig{MaxAttempts: 1}}, up)
	gw := h.proxy(t)
	_, _, resp := upgrade(t, gw.Listener.Addr().String(), "echo")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	h.requireIdle(t)
}

// noHijack hides the other interfaces of the server's ResponseWriter, as a
// middleware that wraps it (to log the status, say) does.
type noHijack struct{ http.ResponseWriter }

// Behind a ResponseWriter that cannot be hijacked the proxy cannot switch
// protocols: it answers 502, and the switched upstream connection is closed
// and its pick finished when the request ends.
func TestProxyUpgradeWithoutHijacker(t *testing.T) {
	up := newUpstream(t, switchTo("echo"))
	h := newHarness(t, fixed{}, Config{}, up)
	p := NewProxy(h.tr)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.ServeHTTP(noHijack{w}, r)
	}))
	t.Cleanup(gw.Close)
	_, _, resp := upgrade(t, gw.Listener.Addr().String(), "echo")
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	h.requireIdle(t)
}

// FuzzUpgradeType checks upgradeType and sameProtocol, which read the
// Connection and Upgrade headers of a request and of its 101 answer,
// against a plain reference: a protocol is asked for when a comma-separated
// option of a Connection header is "upgrade" in any case, and the answer's
// protocol matches when it is printable ASCII equal to the request's but
// for the case of its letters.
func FuzzUpgradeType(f *testing.F) {
	f.Add("Upgrade", "websocket", "WebSocket")
	f.Add("keep-alive, UPGRADE ", "h2c", "h2c")
	f.Add("upgradex", "websocket", "websocket")
	f.Add(",,upgrade,", "a\x00", "A\x00")
	f.Add("close", "websocket", "websoc\u212aet")
	f.Fuzz(func(t *testing.T, connection, want, got string) {
		h := http.Header{"Connection": {connection}, "Upgrade": {want}}
		asked := false
		for _, opt := range strings.Split(connection, ",") {
			asked = asked || strings.ToLower(strings.TrimSpace(opt)) == "upgrade"
		}
		if ut := upgradeType(h); asked && ut != want || !asked && ut != "" {
			t.Fatalf("upgradeType(Connection %q, Upgrade %q) = %q", connection, want, ut)
		}
		lower := func(c byte) byte { // ASCII only, as the tokens of RFC 9110 are
			if 'A' <= c && c <= 'Z' {
				return c + 'a' - 'A'
			}
			return c
		}
		same := len(got) == len(want)
		for i := 0; same && i < len(got); i++ {
			same = got[i] >= ' ' && got[i] <= '~' && lower(got[i]) == lower(want[i])
		}
		if sameProtocol(got, want) != same {
			t.Fatalf("sameProtocol(%q, %q) = %v", got, want, !same)
		}
	})
}
