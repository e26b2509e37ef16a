package spill

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/httplb"
)

// Behind httplb's proxy, a 400 whose body stalls past maxPeekTime, and so
// is taken as no context-length error while its read ahead still reads it,
// then ends with trailers, reaches the client whole, with the trailers
// that name nothing: the read ahead's goroutine, which adds the trailers
// to its answer as the body ends, and the proxy, which reads the answer's
// trailers before the body, never touch the same Trailer unsynchronised
// (go test -race tells), over HTTP/1.1 or HTTP/2.
func TestProxyStalledReadAheadTrailers(t *testing.T) {
	const head, rest = `{"error":{"message":"bad `, `temperature"}}`
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", h2), func(t *testing.T) {
			release := make(chan struct{}) // the tier may end its body
			ended := make(chan struct{})   // the tier has written the end of its body and its trailers
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Trailer", "Server, X-Checksum")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, head)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				fmt.Fprint(w, rest)
				w.Header().Set("Server", "uvicorn")
				w.Header().Set("X-Checksum", "crc32=1234")
				w.(http.Flusher).Flush()
				close(ended)
			}))
			if h2 {
				up.EnableHTTP2 = true
				up.StartTLS()
			} else {
				up.Start()
			}
			defer up.Close()
			next := &tier{answer: func(*http.Request) (*http.Response, error) {
				t.Error("a 400 that is no context-length error spilled")
				return nil, io.EOF
			}}
			tierTr := oneEndpointTier(t, up.URL, up.Client().Transport)
			log := slog.New(slog.DiscardHandler)
			tr, err := New(Config{Tiers: []Tier{{Name: "a", Transport: tierTr}, {Name: "b", Transport: next}}, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			handle := httplb.NewUpstreamErrorHandler(log)
			proxy := httplb.NewProxy(nil)
			proxy.Transport = tr
			proxy.ModifyResponse = func(resp *http.Response) error {
				// The read ahead gave up waiting: the tier ends its body
				// now, while the proxy holds its answer, and the read
				// ahead reads the end and the trailers.
				close(release)
				<-ended
				time.Sleep(50 * time.Millisecond)
				return handle(resp)
			}
			gw := httptest.NewServer(proxy)
			defer gw.Close()
			resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusBadRequest || string(body) != head+rest {
				t.Fatalf("got %d %q, %v", resp.StatusCode, body, err)
			}
			if _, ok := resp.Trailer["Server"]; ok || resp.Trailer.Get("X-Checksum") != "crc32=1234" {
				t.Errorf("trailers %v, want X-Checksum alone", resp.Trailer)
			}
			if strings.Contains(strings.Join(resp.Header.Values("Trailer"), ","), "Server") {
				t.Errorf("Server announced as a trailer: %q", resp.Header.Values("Trailer"))
			}
		})
	}
}
