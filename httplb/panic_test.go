package httplb

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb"
)

// panicWriter is a middleware's ResponseWriter that panics on its first
// Write, as a handler aborting with http.ErrAbortHandler does.
type panicWriter struct{ http.ResponseWriter }

func (panicWriter) Write([]byte) (int, error) { panic(http.ErrAbortHandler) }

// A handler that panics while a response is being relayed, before its body
// is closed (in a ModifyResponse, or a middleware's ResponseWriter), ends
// the request: the server cancels its context, and the pick and the
// admission it holds are released, not held by a body nobody reads.
func TestPanicWhileRelayingReleasesPick(t *testing.T) {
	cases := []struct {
		name  string
		proxy func(*Transport) http.Handler
	}{
		{"ModifyResponse", func(tr *Transport) http.Handler {
			p := NewProxy(tr)
			p.ModifyResponse = func(*http.Response) error { panic(http.ErrAbortHandler) }
			return p
		}},
		{"ResponseWriter", func(tr *Transport) http.Handler {
			p := NewProxy(tr)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p.ServeHTTP(panicWriter{w}, r)
			})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newUpstream(t, streamTokens(3))
			h := newHarness(t, llmlb.LeastOutstanding(), Config{}, up)
			s := httptest.NewUnstartedServer(c.proxy(h.tr))
			s.Config.ErrorLog = log.New(io.Discard, "", 0)
			s.Start()
			t.Cleanup(s.Close)
			resp, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			h.requireIdle(t)
		})
	}
}
