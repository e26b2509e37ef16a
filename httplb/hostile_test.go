package httplb

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/fair"
	"github.com/llmlb/llmlb/retry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tallyBudget grants every withdrawal and counts the calls of each kind.
type tallyBudget struct {
	starts, withdrawals, firstDone, retryDone atomic.Int64
}

func (b *tallyBudget) Start() { b.starts.Add(1) }

func (b *tallyBudget) Withdraw() bool {
	b.withdrawals.Add(1)
	return true
}

func (b *tallyBudget) Finish(retry bool, _ retry.Outcome) {
	if retry {
		b.retryDone.Add(1)
	} else {
		b.firstDone.Add(1)
	}
}

// tallyReporter counts the attempts reported.
type tallyReporter struct{ n atomic.Int64 }

func (r *tallyReporter) Report(string, error) { r.n.Add(1) }

// waitDone blocks until the upstream request's context ends (the proxy gave
// up on it).
func waitDone(r *http.Request) { <-r.Context().Done() }

// Whatever an upstream does (hangs up, stalls, breaks its framing, floods,
// speaks HTTP/2, sends 1xx answers or odd Retry-After headers) and whenever
// the client leaves, every attempt of a request behind NewProxy is finished
// exactly once: the balancer's counts return to zero, each Pick has one
// Done and the request at most one FirstToken, the budget is told of the
// end of the request and of each attempt it granted, the reporter of each
// attempt, and the client is told no upstream address.
func TestProxyAccountingEndsOnceWithHostileUpstreams(t *testing.T) {
	sse := func(w http.ResponseWriter) { w.Header().Set("Content-Type", "text/event-stream") }
	cases := []struct {
		name       string
		h          http.HandlerFunc
		tls, h2c   bool
		clientWait time.Duration // the client leaves after this; 0 never
		read       int           // bytes the client reads before it leaves; 0 all
	}{
		{name: "hang up mid-stream", h: hangUp("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nf\r\ndata: a\n\ndata: \r\n")},
		{name: "hang up before the headers", h: hangUp("")},
		{name: "headers, then nothing", h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			waitDone(r)
		}, clientWait: 50 * time.Millisecond},
		{name: "first event, then nothing", h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			fmt.Fprint(w, "data: x\n\n")
			w.(http.Flusher).Flush()
			waitDone(r)
		}, clientWait: 50 * time.Millisecond},
		{name: "flood, client leaves", h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			for i := 0; i < 100000 && r.Context().Err() == nil; i++ {
				fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			}
		}, read: 10000},
		{name: "comments past the peek limit", h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			fmt.Fprint(w, strings.Repeat(": keep-alive\n", DefaultMaxPeekBytes/12+10))
		}},
		{name: "bad chunk framing", h: hangUp("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata: a\r\n")},
		{name: "bad chunk framing after the first event", h: hangUp("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\na\r\ndata: a\n\n\r\nzz\r\n")},
		{name: "gzip stream", h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			w.Header().Set("Content-Encoding", "gzip")
			z := gzip.NewWriter(w)
			for i := range 10 {
				fmt.Fprintf(z, "data: %d\n\n", i)
				_ = z.Flush()
			}
			_ = z.Close()
		}},
		{name: "trailers", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Usage")
			sse(w)
			fmt.Fprint(w, "data: a\n\n")
			w.Header().Set("X-Usage", "5")
		}},
		{name: "103, then 503", h: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusEarlyHints)
			status(http.StatusServiceUnavailable)(w, r)
		}},
		{name: "100 Continue unasked", h: hangUp("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 9\r\n\r\ndata: a\n\n")},
		{name: "Retry-After a past date", h: status(http.StatusServiceUnavailable, "Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT")},
		{name: "Retry-After a future date", h: status(http.StatusTooManyRequests, "Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))},
		{name: "Retry-After garbage", h: status(http.StatusServiceUnavailable, "Retry-After", "soon")},
		{name: "Retry-After twice", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Retry-After", "1")
			w.Header().Add("Retry-After", "999999")
			status(http.StatusServiceUnavailable)(w, r)
		}},
		{name: "HTTP/2", tls: true, h: streamTokens(3)},
		{name: "HTTP/2, client leaves", tls: true, h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			fmt.Fprint(w, "data: x\n\n")
			w.(http.Flusher).Flush()
			waitDone(r)
		}, clientWait: 50 * time.Millisecond},
		{name: "HTTP/2 stream reset mid-stream", tls: true, h: func(w http.ResponseWriter, r *http.Request) {
			sse(w)
			fmt.Fprint(w, "data: x\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}},
		{name: "h2c", h2c: true, h: streamTokens(3)},
	}
	for _, c := range cases {
		for _, mode := range []struct {
			name              string
			hedge, firstEvent time.Duration
		}{{name: "plain"}, {name: "hedged", hedge: 5 * time.Millisecond}, {name: "first-event timeout", firstEvent: 20 * time.Millisecond}} {
			t.Run(c.name+"/"+mode.name, func(t *testing.T) {
				start := func() *httptest.Server {
					s := httptest.NewUnstartedServer(c.h)
					if c.h2c {
						s.Config.Protocols = new(http.Protocols)
						s.Config.Protocols.SetUnencryptedHTTP2(true)
					}
					if c.tls {
						s.EnableHTTP2 = true
						s.StartTLS()
					} else {
						s.Start()
					}
					t.Cleanup(s.Close)
					return s
				}
				a, b := start(), start()
				var picks, firstTokens, dones atomic.Int64
				bal, err := llmlb.New(llmlb.LeastOutstanding(), llmlb.WithObserver(&llmlb.Observer{
					Pick: func(pi llmlb.PickInfo) {
						if pi.Err == nil {
							picks.Add(1)
						}
					},
					FirstToken: func(llmlb.FirstTokenInfo) { firstTokens.Add(1) },
					Done:       func(llmlb.DoneInfo) { dones.Add(1) },
				}))
				require.NoError(t, err)
				eps, err := NewEndpoints(a.URL, b.URL)
				require.NoError(t, err)
				require.NoError(t, bal.Update(eps))
				base := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
				if c.h2c {
					base.Protocols = new(http.Protocols)
					base.Protocols.SetUnencryptedHTTP2(true)
				}
				t.Cleanup(base.CloseIdleConnections)
				budget, reporter := &tallyBudget{}, &tallyReporter{}
				q := newFairQueue(t, fair.Config{MaxInFlight: 4})
				adm, err := retry.NewAdmission(retry.AdmissionConfig{MaxInFlight: 4, MaxPerSession: 2})
				require.NoError(t, err)
				cfg := Config{Balancer: bal, Base: base, Queue: q, Admission: adm, FirstEventTimeout: mode.firstEvent, Retry: retry.LoopConfig{
					MaxAttempts: 3, Budget: budget, Reporter: reporter,
					After: func(time.Duration) <-chan time.Time { return closedTime }, // no back-off
				}}
				if mode.hedge > 0 {
					cfg.Retry.Hedge.Delay = mode.hedge
					cfg.Retry.After = nil // real hedge timers
				}
				tr, err := NewTransport(cfg)
				require.NoError(t, err)
				h := &harness{b: bal, tr: tr, cfg: cfg}
				gw := h.proxy(t)

				client := &http.Client{Transport: &http.Transport{}}
				defer client.CloseIdleConnections()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if c.clientWait > 0 {
					time.AfterFunc(c.clientWait, cancel)
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
				require.NoError(t, err)
				if resp, err := client.Do(req); err == nil {
					var got []byte
					if c.read > 0 {
						got = make([]byte, c.read)
						n, _ := io.ReadFull(resp.Body, got)
						got = got[:n]
					} else {
						got, _ = io.ReadAll(resp.Body)
					}
					_ = resp.Body.Close()
					for _, up := range []string{a.URL, b.URL} {
						host := strings.TrimPrefix(strings.TrimPrefix(up, "https://"), "http://")
						assert.NotContains(t, string(got), host)
						assert.NotContains(t, fmt.Sprint(resp.Header), host)
					}
				}

				h.requireIdle(t)
				require.Eventually(t, func() bool {
					return picks.Load() == dones.Load() &&
						budget.starts.Load() == budget.firstDone.Load() &&
						budget.withdrawals.Load() == budget.retryDone.Load()
				}, 5*time.Second, time.Millisecond, "picks %d, dones %d; budget starts %d, ends %d, withdrawals %d, ends %d",
					picks.Load(), dones.Load(), budget.starts.Load(), budget.firstDone.Load(), budget.withdrawals.Load(), budget.retryDone.Load())
				assert.EqualValues(t, 1, budget.starts.Load())
				assert.LessOrEqual(t, firstTokens.Load(), int64(1))
				require.Eventually(t, func() bool {
					s := q.Stats()
					return s.InFlight == 0 && s.TokensInFlight == 0 && s.Waiting == 0 && adm.InFlight() == 0
				}, 5*time.Second, time.Millisecond, "fair queue or admission not released: %+v, %d", q.Stats(), adm.InFlight())
				// A hedge picked as another attempt commits is not sent,
				// withdraws nothing and is not reported.
				assert.Equal(t, budget.starts.Load()+budget.withdrawals.Load(), reporter.n.Load(), "attempts reported")
			})
		}
	}
}

// An upstream's error event too long to hold (a line, or a value over
// thousands of lines, of a MiB) is no trouble: as the first event, held
// back only to the peek's limit, it is still retried, its start being an
// error's; after the first, it passes as sent, and its pick still ends as
// a failure. The attempts end once, and the other events are as sent.
func TestHugeErrorEvents(t *testing.T) {
	line := `data: {"error": {"message": "` + strings.Repeat("x", 1<<20) + `", "code": 500}}` + "\n\n"
	lines := "data: {\"error\": {\n" + strings.Repeat("data: \"x\": 1,\n", 1<<16) + "data: \"code\": 500}}\n\n"
	for _, huge := range []struct{ name, event string }{{"one line", line}, {"lines", lines}} {
		for _, first := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/first=%v", huge.name, first), func(t *testing.T) {
				stream := huge.event + "data: [DONE]\n\n"
				if !first {
					stream = tokenEvents + stream
				}
				a := newUpstream(t, writeIn(stream, 4096))
				b := newUpstream(t, streamTokens(1))
				done := &doneLog{}
				h := newObservedHarness(t, Config{}, done, nil, a, b)
				resp, body, _ := postLogged(t, h)
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				errs := done.get(a.URL)
				require.Len(t, errs, 1)
				assert.ErrorIs(t, errs[0], ErrErrorEvent)
				if first {
					assert.Equal(t, "data: {\"i\":0}\n\ndata: [DONE]\n\n", body)
					return
				}
				assert.Equal(t, stream, body)
				assert.EqualValues(t, 0, b.hits.Load())
			})
		}
	}
}
