package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSlowBody: a client that sends its header and then trickles its body
// gets 408 once ReadTimeout has passed, and its connection is closed,
// instead of holding a handler for ever.
func TestSlowBody(t *testing.T) {
	e := newEngine(t, Config{ReadTimeout: 100 * time.Millisecond})
	url, _ := serve(t, e)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	const body = `{"prompt":"x","max_tokens":1}`
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:5])
	require.NoError(t, err)
	start := time.Now()
	// Trickle a byte every 30 ms: each arrives well within any per-read
	// timeout, the whole body never does.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 5; i < len(body)-1; i++ {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no answer: the handler still waits for the body")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assert.Contains(t, string(b), "reading body: not received within 100ms")
	assert.True(t, resp.Close, "the connection closes")
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Zero(t, e.Stats().Waiting+e.Stats().Running, "nothing was queued")
}

// TestReadTimeoutSparesStreams: ReadTimeout bounds the body only: a stream
// that lasts many times longer runs to its end, and the connection then
// serves the next request.
func TestReadTimeoutSparesStreams(t *testing.T) {
	e := newEngine(t, Config{ReadTimeout: 20 * time.Millisecond, Speedup: 1})
	url, _ := serve(t, e)
	start := time.Now()
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		resp := post(t, url+path, `{"prompt":"x","messages":[{"role":"user","content":"x"}],"max_tokens":40,"stream":true}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ev := events(t, resp.Body)
		require.Len(t, ev, 41, "%s: every token, then [DONE]", path)
		assert.Equal(t, "[DONE]", ev[40])
	}
	require.Greater(t, time.Since(start), 10*20*time.Millisecond, "the streams outlasted the read timeout")
	reused := false
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":1}`))
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, reused, "the streams' connection serves the next request")
	st := e.Stats()
	assert.EqualValues(t, 3, st.Finished)
	assert.Zero(t, st.Cancelled)
}
