package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/internal/e2e"
	"github.com/llmlb/llmlb/retry"
)

// A gateway replica that did not relay a stored response finds it by
// trying the engines in turn, and logs each engine that does not hold it
// at debug level: after a restart every stored response is unknown, and a
// warning per probe would bury the failures the warnings are for.
func TestGatewayProbeLoggedQuietly(t *testing.T) {
	c, err := e2e.StartCluster(2, engine.Config{Speedup: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	serve := func(g *Gateway, method, path, body string) (int, []byte) {
		req := httptest.NewRequest(method, path, bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		g.ServeHTTP(w, req)
		b, _ := io.ReadAll(w.Result().Body)
		return w.Code, b
	}
	// The program's own observer hears the probes as probes too.
	var userProbes, userRetries atomic.Int32
	obs := &retry.Observer{
		Probe: func(int, error) { userProbes.Add(1) },
		Retry: func(int, error) { userRetries.Add(1) },
	}
	newGateway := func() (*Gateway, *logBuffer) {
		l, logs := newLogger()
		cfg := Config{Logger: l, ScrapeInterval: -1, Policy: llmlb.RoundRobin()}
		cfg.Retry.Observer = obs
		g, err := New(c.URLs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.transport.CloseIdleConnections)
		return g, logs
	}
	// One response on each engine, in turn.
	first, _ := newGateway()
	var ids []string
	for i := range 2 {
		code, body := serve(first, http.MethodPost, "/v1/responses", `{"model":"`+engine.DefaultModel+`","input":"hello","max_output_tokens":2}`)
		if code != http.StatusOK {
			t.Fatalf("create %d: %d %s", i, code, body)
		}
		var created struct{ ID string }
		if err := json.Unmarshal(body, &created); err != nil || created.ID == "" {
			t.Fatalf("create %d: %s", i, body)
		}
		ids = append(ids, created.ID)
	}
	// Through a new replica each, whose first pick is the first engine:
	// the second response is found at the second try.
	var probes, warnings int
	for i, id := range ids {
		g, logs := newGateway()
		if code, body := serve(g, http.MethodGet, "/v1/responses/"+id, ""); code != http.StatusOK {
			t.Fatalf("retrieve %d: %d %s", i, code, body)
		}
		probes += len(logs.records(t, "gateway: stored response not on this endpoint, trying the next"))
		warnings += len(logs.records(t, "gateway: attempt failed before its first token, retrying"))
	}
	if probes != 1 || warnings != 0 {
		t.Errorf("logged %d probes and %d retry warnings, want 1 and 0", probes, warnings)
	}
	if p, r := userProbes.Load(), userRetries.Load(); p != 1 || r != 0 {
		t.Errorf("the program's observer heard %d probes and %d retries, want 1 and 0", p, r)
	}
}
