package httplb

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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
}

func TestFairRequest(t *testing.T) {
	tr := &Transport{classHdr: "X-Priority"}
	req, _ := http.NewRequest(http.MethodPost, "http://gw.invalid/", nil)
	req.Header.Set("X-Priority", "interactive")
	cases := []struct {
		name      string
		t         *Transport
		lreq      llmlb.Request
		principal string
		class     fair.Class
	}{
		{"tenant", tr, llmlb.Request{Tenant: "acme", AffinityKey: "4:acmes1", PromptTokens: 7}, "acme", fair.Interactive},
		{"session without tenant", tr, llmlb.Request{AffinityKey: "s1"}, "session:s1", fair.Interactive},
		{"neither", tr, llmlb.Request{}, "", fair.Interactive},
		{"untrusted header", &Transport{}, llmlb.Request{Tenant: "acme"}, "acme", fair.Standard},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := &attempt{t: tc.t, req: req, lreq: tc.lreq}
			r := a.fairRequest()
			assert.Equal(t, tc.principal, r.Principal)
			assert.Equal(t, tc.class, r.Class)
			assert.Equal(t, tc.lreq.PromptTokens, r.PromptTokens)
		})
	}
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
