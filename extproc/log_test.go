package extproc_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmlb/llmlb/extproc"
)

// recordHandler is a slog.Handler that keeps the string attributes of
// every record.
type recordHandler struct {
	mu    sync.Mutex
	attrs []slog.Attr
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		h.attrs = append(h.attrs, a)
		return true
	})
	return nil
}

func (h *recordHandler) get(key string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, a := range h.attrs {
		if a.Key == key {
			out = append(out, a.Value.String())
		}
	}
	return out
}

// TestLoggedRequestIDIsBounded: the request id a client sends is logged cut
// to 128 bytes and with every byte that is not printable ASCII replaced, so
// that a huge or forged x-request-id neither floods the log nor forges its
// lines; a plain one is logged as it is.
func TestLoggedRequestIDIsBounded(t *testing.T) {
	cases := []struct{ name, id, want string }{
		{"plain", "req-7", "req-7"},
		{"huge", strings.Repeat("a", 1<<20), strings.Repeat("a", 128) + "..."},
		{"forged-line", "x\n{\"level\":\"ERROR\"}\x1b[2J\u00e9", "x?{\"level\":\"ERROR\"}?[2J??"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := &recordHandler{}
			b := newBalancer(t, 0, nil) // no endpoint: every request is refused, and logged
			h := start(t, extproc.Config{Balancer: b, Logger: slog.New(rec)})
			e := h.open(t, fullDuplex, fullDuplex)
			m := requestHeaders("/v1/completions", false)
			for _, hv := range m.GetRequestHeaders().GetHeaders().GetHeaders() {
				if hv.GetKey() == "x-request-id" {
					hv.RawValue = []byte(c.id)
				}
			}
			e.send(m)
			e.send(requestBody([]byte(`{"prompt":"x"}`), true))
			require.NotNil(t, e.recv().GetImmediateResponse())
			require.NoError(t, e.closeAndWait())
			require.Equal(t, []string{c.want}, rec.get("request_id"))
		})
	}
}
