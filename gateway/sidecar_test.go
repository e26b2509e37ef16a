package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
)

// syncBuffer is a concurrency-safe buffer for a log.Logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A plain httputil.ReverseProxy between the gateway and an engine, as a
// sidecar written in Go is, now and then cuts a stream right after its
// headers: its own HTTP/1 server drains and closes the request body when
// the proxy writes the engine's response headers, while its Transport is
// still to read that body once more after its Content-Length
// (transferWriter.writeBody in net/http/transfer.go, and
// chunkWriter.writeHeader in net/http/server.go, Go 1.26.8); that read
// fails with "http: invalid Read on closed Body", and the Transport closes
// the connection to the engine under the response being copied
// ("ReverseProxy read error during body copy: use of closed network
// connection"; golang/go#40747). A cut before the first token is retried,
// and the request gets its whole answer; one after it (rarer: the
// connection closes within microseconds of the headers) reaches the client
// as a read error, as any failure after the first token does. A proxy
// whose server reads the body in full duplex
// ([http.ResponseController.EnableFullDuplex]) has no such cut.
func TestGatewayThroughSidecarProxy(t *testing.T) {
	c, err := e2e.StartCluster(1, engine.Config{Speedup: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	target, err := url.Parse(c.URLs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, duplex := range []bool{false, true} {
		name := "plain"
		if duplex {
			name = "full duplex"
		}
		t.Run(name, func(t *testing.T) {
			var proxyLog syncBuffer
			out := &http.Transport{}
			defer out.CloseIdleConnections()
			rp := httputil.NewSingleHostReverseProxy(target)
			rp.Transport = out
			rp.ErrorLog = log.New(&proxyLog, "", 0)
			sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if duplex {
					if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
						t.Error(err)
					}
				}
				rp.ServeHTTP(w, r)
			}))
			defer sidecar.Close()
			cut, cutLate := sendThrough(t, sidecar.URL, &proxyLog)
			t.Logf("of 200 requests, %d cut by the proxy before their first token and retried, %d after it", cut, cutLate)
			if duplex && cut+cutLate > 0 {
				t.Errorf("%d requests cut by a full-duplex proxy, want none\nproxy log:\n%s", cut+cutLate, proxyLog.String())
			}
		})
	}
}

// sendThrough sends 200 streamed completions through a gateway in front of
// the sidecar at url, and returns the number of attempts cut before their
// first token (and retried) and of requests cut after it. It fails the
// test on any other failure.
func sendThrough(t *testing.T, url string, proxyLog *syncBuffer) (cut, cutLate int) {
	t.Helper()
	logger, logs := newLogger()
	g, err := New([]string{url}, Config{Logger: logger, ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.transport.CloseIdleConnections()
	front := httptest.NewServer(g)
	defer front.Close()
	client := front.Client()
	body, _ := json.Marshal(map[string]any{"model": engine.DefaultModel, "prompt": "through a sidecar", "max_tokens": 4, "stream": true})
	for i := range 200 {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, front.URL+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case err == nil && res.StatusCode == http.StatusOK && strings.Contains(string(b), "data: [DONE]"):
		case err != nil && res.StatusCode == http.StatusOK && strings.HasPrefix(string(b), "data: {"):
			// The proxy cut the stream after the first token had
			// passed: nothing can be retried any more.
			cutLate++
		default:
			t.Fatalf("request %d: %d %q, %v\nproxy log:\n%s", i, res.StatusCode, b, err, proxyLog.String())
		}
	}
	// No other failure than the cut described above.
	for _, line := range strings.Split(strings.TrimSpace(proxyLog.String()), "\n") {
		if line != "" && !strings.Contains(line, "ReverseProxy read error during body copy") {
			t.Errorf("the proxy logged %q", line)
		}
	}
	cut = len(logs.records(t, "gateway: attempt failed before its first token, retrying"))
	return cut, cutLate
}
