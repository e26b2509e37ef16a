package httplb

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newFairQueue(t *testing.T, cfg fair.Config) *fair.Queue {
	t.Helper()
	q, err := fair.New(cfg)
	require.NoError(t, err)
	return q
}

func TestTrustClassHeaderRequiresQueue(t *testing.T) {
	b, err := llmlb.New(llmlb.LeastOutstanding())
	require.NoError(t, err)
	_, err = NewTransport(Config{Balancer: b, TrustClassHeader: "X-Priority"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewTransport(Config{Balancer: b, Queue: newFairQueue(t, fair.Config{MaxInFlight: 4}), TrustClassHeader: "X Priority"})
	assert.ErrorIs(t, err, ErrInvalidConfig, "not a header name")
}

func TestFairRequest(t *testing.T) {
	tr := &Transport{classHdr: "X-Priority"}
	req, _ := http.NewRequest(http.MethodPost, "http://gw.invalid/", nil)
	req.Header.Set("X-Priority", "interactive")
	cases := []struct {
		name      string
		t         *Transport
		remote    string
		lreq      llmlb.Request
		principal string
		class     fair.Class
	}{
		{"tenant", tr, "192.0.2.1:1234", llmlb.Request{Tenant: "acme", AffinityKey: "4:acmes1", PromptTokens: 7}, "acme", fair.Interactive},
		{"session without tenant", tr, "192.0.2.1:1234", llmlb.Request{AffinityKey: "s1"}, "addr:192.0.2.1", fair.Interactive},
		{"session without address", tr, "", llmlb.Request{AffinityKey: "s1"}, "session:s1", fair.Interactive},
		{"neither", tr, "", llmlb.Request{}, "", fair.Interactive},
		{"untrusted header", &Transport{}, "", llmlb.Request{Tenant: "acme"}, "acme", fair.Standard},
		// A tenant named as an address, a session or an escaped tenant is
		// counted as none of them.
		{"tenant named as an address", tr, "192.0.2.1:1234", llmlb.Request{Tenant: "addr:192.0.2.1"}, "tenant:addr:192.0.2.1", fair.Interactive},
		{"tenant named as a session", tr, "", llmlb.Request{Tenant: "session:s1"}, "tenant:session:s1", fair.Interactive},
		{"tenant named as an escaped tenant", tr, "", llmlb.Request{Tenant: "tenant:addr:192.0.2.1"}, "tenant:tenant:addr:192.0.2.1", fair.Interactive},
		{"tenant with a colon", tr, "", llmlb.Request{Tenant: "org:acme"}, "org:acme", fair.Interactive},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := req.Clone(context.Background())
			req.RemoteAddr = tc.remote
			a := &attempt{t: tc.t, req: req, lreq: tc.lreq}
			r := a.fairRequest()
			assert.Equal(t, tc.principal, r.Principal)
			assert.Equal(t, tc.class, r.Class)
			assert.Equal(t, tc.lreq.PromptTokens, r.PromptTokens)
		})
	}
}

// No two tenants, and no tenant and anonymous client, share a principal:
// the mapping from tenants, addresses and sessions to principals is one to
// one.
func TestPrincipalsDistinct(t *testing.T) {
	seen := map[string]string{}
	add := func(what, principal string) {
		t.Helper()
		if prev, ok := seen[principal]; ok {
			t.Fatalf("%s and %s share the principal %q", prev, what, principal)
		}
		seen[principal] = what
	}
	for _, name := range []string{"acme", "addr:192.0.2.1", "session:s1", "tenant:acme", "tenant:addr:192.0.2.1", "tenant:tenant:acme", "addr:", "tenant:", ":"} {
		add("tenant "+name, tenantPrincipal(name))
	}
	add("address 192.0.2.1", addrPrincipal("192.0.2.1:80"))
	add("session s1", sessionPrincipalPrefix+"s1")
	add("session acme", sessionPrincipalPrefix+"acme")
}

// The principal of a request without a tenant is its client's IPv4 address
// or IPv6 /48, whatever its port; "" without an address.
func TestAddrPrincipal(t *testing.T) {
	cases := []struct{ remote, want string }{
		{"192.0.2.1:1234", "addr:192.0.2.1"},
		{"192.0.2.1:9999", "addr:192.0.2.1"},
		{"192.0.2.1", "addr:192.0.2.1"},
		{"[::ffff:192.0.2.1]:80", "addr:192.0.2.1"},
		{"[2001:db8:1:2:3:4:5:6]:443", "addr:2001:db8:1::/48"},
		{"[2001:db8:1:ffff::1%eth0]:443", "addr:2001:db8:1::/48"},
		{"2001:db8:1:2::7", "addr:2001:db8:1::/48"},
		{"[2001:db8:2::1]:443", "addr:2001:db8:2::/48"},
		{"", ""},
		{"@", ""},
		{"not an address:80", ""},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, addrPrincipal(tc.remote), "%q", tc.remote)
	}
}

// A client without a tenant that sends every request under a new session
// key, from a new port, gets its share of the fair queue, no more: its
// requests are one principal, its address's. Two steady clients keep one
// request each waiting and the rotating one twenty; one request is in
// flight at a time.
func TestFairQueueRotatingSessionsGetFairShare(t *testing.T) {
	for _, rotating := range []string{"192.0.2.3", "2001:db8:3::"} { // IPv6: 2001:db8:3:<n>::<n>
		t.Run(rotating, func(t *testing.T) {
			p, err := NewParser(ParserConfig{})
			require.NoError(t, err)
			q := newFairQueue(t, fair.Config{MaxInFlight: 1, MaxWaiting: 100})
			tr := &Transport{}
			type client struct {
				host    string
				depth   int
				waiting int
				served  int
			}
			clients := []*client{{host: "192.0.2.1", depth: 1}, {host: "192.0.2.2", depth: 1}, {host: rotating, depth: 20}}
			var (
				n        int
				inflight *fair.Ticket
				admitted []*client
			)
			send := func(c *client) {
				n++
				host, session := c.host, "steady-"+c.host
				if c.depth > 1 { // the rotating client: a new session, a new port, a new IPv6 /64 in its /48
					session = fmt.Sprintf("rot-%d", n)
					if strings.HasSuffix(host, "::") {
						host = fmt.Sprintf("%s%x::%x", strings.TrimSuffix(host, ":"), n, n)
					}
				}
				req, _ := http.NewRequest(http.MethodPost, "http://gw.invalid/v1/chat/completions", strings.NewReader(chatBody))
				req.Header.Set(DefaultSessionHeader, session)
				req.RemoteAddr = net.JoinHostPort(host, strconv.Itoa(1024+n))
				lreq, err := p.Parse(req)
				require.NoError(t, err)
				a := &attempt{t: tr, req: req, lreq: lreq}
				fr := a.fairRequest()
				require.NotEmpty(t, fr.Principal, "principal of %s", req.RemoteAddr) // each client is told apart
				var tk *fair.Ticket
				tk, ok, err := q.Enter(fr, func(err error) {
					require.NoError(t, err)
					c.waiting--
					admitted = append(admitted, c)
					inflight = tk
				})
				require.NoError(t, err)
				if ok {
					admitted = append(admitted, c)
					inflight = tk
				} else {
					c.waiting++
				}
			}
			for len(admitted) < 300 {
				for _, c := range clients {
					for c.waiting < c.depth {
						send(c)
					}
				}
				require.NotNil(t, inflight)
				tk := inflight
				inflight = nil
				tk.Charge(50)
				tk.Done()
			}
			for _, c := range admitted[:300] {
				c.served++
			}
			for _, c := range clients {
				t.Logf("%s: %d of 300", c.host, c.served)
				assert.InDelta(t, 100, c.served, 10, "%s served %d of 300 admissions", c.host, c.served)
			}
		})
	}
}

// Behind NewProxy, a request without a tenant is queued under its client's
// address, whatever session key it sends.
func TestFairQueuePrincipalIsClientAddress(t *testing.T) {
	var (
		mu    sync.Mutex
		names []string
	)
	q := newFairQueue(t, fair.Config{Weight: func(p string) float64 {
		mu.Lock()
		defer mu.Unlock()
		names = append(names, p)
		return 1
	}})
	up := newUpstream(t, streamTokens(1))
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Queue: q}, up)
	gw := h.proxy(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, session := range []string{"a", "b", ""} {
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
		require.NoError(t, err)
		if session != "" {
			req.Header.Set(DefaultSessionHeader, session)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, err = readAll(t, resp)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"addr:127.0.0.1", "addr:127.0.0.1", "addr:127.0.0.1"}, names)
}

// gatedSSE streams first events, then waits for gate before the rest.
func gatedSSE(first, rest int, gate <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range first {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
		}
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		for i := range rest {
			fmt.Fprintf(w, "data: {\"j\":%d}\n\n", i)
		}
	}
}

// readEvents reads from r until it has seen n "data:" lines.
func readEvents(t *testing.T, r *bufio.Reader, n int) {
	t.Helper()
	for n > 0 {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "data:") {
			n--
		}
	}
}

// The prompt is charged at admission and each streamed event as the caller
// reads it; the ticket is released at the end of the body.
func TestFairQueueChargesStreamedOutput(t *testing.T) {
	gate := make(chan struct{})
	up := newUpstream(t, gatedSSE(3, 4, gate))
	q := newFairQueue(t, fair.Config{})
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Queue: q}, up)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	prompt := q.Stats().TokensInFlight
	require.Positive(t, prompt)
	assert.Equal(t, 1, q.Stats().InFlight)

	br := bufio.NewReader(resp.Body)
	readEvents(t, br, 3)
	assert.Equal(t, prompt+3, q.Stats().TokensInFlight)
	close(gate)
	_, err = io.Copy(io.Discard, br)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, fair.Stats{Principals: 1}, q.Stats())
}

// A body that is not an event stream is charged when it ends: its usage
// count, or one token per BytesPerToken bytes without one.
func TestFairQueueChargesPlainBody(t *testing.T) {
	payload := strings.Repeat("x", 4000)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, payload)
	})
	q := newFairQueue(t, fair.Config{})
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Queue: q}, up)
	resp, err := do(t, h, chatBody)
	require.NoError(t, err)
	prompt := q.Stats().TokensInFlight
	buf := make([]byte, 2000)
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	assert.Equal(t, prompt, q.Stats().TokensInFlight, "charged before the end")
	_, err = readAll(t, resp)
	require.NoError(t, err)
	assert.Equal(t, 0, q.Stats().InFlight)

	cases := []struct {
		name string
		body string
		want int64
	}{
		{"bytes", payload, 4000 / BytesPerToken},
		{"usage", `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":12}}`, 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tk, err := q.Admit(context.Background(), fair.Request{Principal: "p", PromptTokens: 10})
			require.NoError(t, err)
			defer tk.Done()
			m := outputMeter{c: NewOutputCounter(http.Header{"Content-Type": {"application/json"}}), tk: tk}
			m.observe([]byte(tc.body))
			assert.Equal(t, int64(10), q.Stats().TokensInFlight)
			m.end()
			assert.Equal(t, 10+tc.want, q.Stats().TokensInFlight)
		})
	}
}

// With the capacity used, requests wait, and the most urgent class goes
// first when it frees, whatever the arrival order; the class comes from the
// trusted header.
func TestFairQueueOrdersWaitersByClass(t *testing.T) {
	gate := make(chan struct{})
	var (
		mu    sync.Mutex
		order []string
	)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		order = append(order, r.Header.Get("X-Priority"))
		mu.Unlock()
		if r.Header.Get("X-Priority") == "" {
			gatedSSE(1, 1, gate)(w, r)
			return
		}
		streamTokens(1)(w, r)
	})
	q := newFairQueue(t, fair.Config{MaxInFlight: 1})
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Queue: q, TrustClassHeader: "X-Priority"}, up)
	first, err := do(t, h, chatBody)
	require.NoError(t, err)

	var wg sync.WaitGroup
	send := func(class string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, "http://gateway.invalid/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("X-Priority", class)
			resp, err := h.tr.RoundTrip(req)
			if assert.NoError(t, err) {
				_, err := readAll(t, resp)
				assert.NoError(t, err)
			}
		}()
	}
	send("batch")
	require.Eventually(t, func() bool { return q.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	send("interactive")
	require.Eventually(t, func() bool { return q.Stats().Waiting == 2 }, 5*time.Second, time.Millisecond)
	close(gate)
	_, err = readAll(t, first)
	require.NoError(t, err)
	wg.Wait()
	assert.Equal(t, []string{"", "interactive", "batch"}, order)
	assert.Equal(t, 0, q.Stats().InFlight)
}

// Past the queue's bound the proxy answers 429 with a Retry-After at once,
// and a waiter whose context ends leaves the queue holding nothing.
func TestFairQueueOverloadAnswers429(t *testing.T) {
	gate := make(chan struct{})
	up := newUpstream(t, gatedSSE(1, 1, gate))
	q := newFairQueue(t, fair.Config{MaxInFlight: 1, MaxWaiting: 1, RetryAfter: 2 * time.Second})
	h := newHarness(t, llmlb.LeastOutstanding(), Config{Queue: q}, up)
	gw := h.proxy(t)

	first, err := do(t, h, chatBody)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://gateway.invalid/v1/chat/completions", strings.NewReader(chatBody))
		_, err := h.tr.RoundTrip(req)
		waited <- err
	}()
	require.Eventually(t, func() bool { return q.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)

	resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("Retry-After"))

	cancel()
	err = <-waited
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
	assert.Equal(t, 0, q.Stats().Waiting)

	close(gate)
	_, err = readAll(t, first)
	require.NoError(t, err)
	assert.Equal(t, 0, q.Stats().InFlight)
	http.DefaultClient.CloseIdleConnections()
}

// FuzzAddrPrincipal checks that addrPrincipal never panics, names an
// address or nothing, and does not depend on the port.
func FuzzAddrPrincipal(f *testing.F) {
	for _, s := range []string{"192.0.2.1:1234", "[2001:db8::1]:80", "[fe80::1%eth0]:1", "[::ffff:1.2.3.4]:5", "1.2.3.4", "::1", "", "@", "x:y", "[::1]", "1.2.3.4:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, remote string) {
		got := addrPrincipal(remote)
		if got == "" {
			return
		}
		addr, ok := strings.CutPrefix(got, addrPrincipalPrefix)
		if !ok {
			t.Fatalf("addrPrincipal(%q) = %q", remote, got)
		}
		if p, err := netip.ParsePrefix(addr); err == nil {
			if p.Bits() != ipv6PrincipalBits || !p.Addr().Is6() || p.Masked() != p {
				t.Fatalf("addrPrincipal(%q) = %q", remote, got)
			}
		} else if ip, err := netip.ParseAddr(addr); err != nil || !ip.Is4() {
			t.Fatalf("addrPrincipal(%q) = %q", remote, got)
		}
		if ap, err := netip.ParseAddrPort(remote); err == nil {
			other := netip.AddrPortFrom(ap.Addr(), ap.Port()+1).String()
			if again := addrPrincipal(other); again != got {
				t.Fatalf("addrPrincipal(%q) = %q, addrPrincipal(%q) = %q", remote, got, other, again)
			}
		}
	})
}
