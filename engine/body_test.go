package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
		n := 40 // a chunk a token, and a chat stream's role chunk
		if path == "/v1/chat/completions" {
			n++
		}
		require.Len(t, ev, n+1, "%s: every token, then [DONE]", path)
		assert.Equal(t, "[DONE]", ev[n])
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

// TestReadTimeoutOverHTTP2: over HTTP/2 a body past ReadTimeout gets 408
// and only its stream ends: the connection, which other requests share,
// serves on. (Connection: close would make the server send GOAWAY.)
func TestReadTimeoutOverHTTP2(t *testing.T) {
	e := newEngine(t, Config{ReadTimeout: 100 * time.Millisecond, Speedup: 1})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = e.Run(ctx)
	}()
	ts := httptest.NewUnstartedServer(e)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	c := ts.Client()
	t.Cleanup(func() {
		c.CloseIdleConnections()
		ts.Close()
		cancel()
		<-ran
	})
	// do posts body and reports the answer and whether it came over the
	// connection of an earlier request.
	do := func(body io.Reader) (int, string, bool) {
		t.Helper()
		reused := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", body)
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 2, resp.ProtoMajor)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), reused
	}
	code, _, _ := do(strings.NewReader(`{"prompt":"x","max_tokens":1}`))
	require.Equal(t, http.StatusOK, code)

	// A body that stops after its first bytes.
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		if _, err := pw.Write([]byte(`{"prompt"`)); err != nil {
			return
		}
		<-stop
		pw.Close()
	}()
	code, b, reused := do(pr)
	close(stop)
	<-wrote
	assert.Equal(t, http.StatusRequestTimeout, code)
	assert.Contains(t, b, "reading body: not received within 100ms")
	assert.True(t, reused, "the 408 came over the first request's connection")

	// The deadline is lifted from a stream's body as it is from a
	// connection's: a stream outlasting ReadTimeout runs to its end.
	start := time.Now()
	code, b, reused = do(strings.NewReader(`{"prompt":"x","max_tokens":40,"stream":true}`))
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, reused, "the connection serves on after a stream's 408")
	ev := events(t, strings.NewReader(b))
	require.Len(t, ev, 41, "every token, then [DONE]")
	assert.Equal(t, "[DONE]", ev[40])
	assert.Greater(t, time.Since(start), 100*time.Millisecond, "the stream outlasted the read timeout")
}

// TestReadTimeoutBoundsUnreadBodies: ReadTimeout bounds every body, not
// only those the completions endpoints read. net/http discards a body the
// handler left unread before it sends the answer; one that does not come
// held the connection, unanswered, for ever. Past ReadTimeout the answer
// goes out and the connection closes; a body that comes in time leaves the
// connection open.
func TestReadTimeoutBoundsUnreadBodies(t *testing.T) {
	e := newEngine(t, Config{ReadTimeout: 100 * time.Millisecond})
	url, _ := serve(t, e)
	addr := strings.TrimPrefix(url, "http://")
	cases := []struct {
		name, request string
		code          int
	}{
		{"health", "POST /health", http.StatusMethodNotAllowed},
		{"models", "POST /v1/models", http.StatusMethodNotAllowed},
		{"metrics", "POST /metrics", http.StatusOK},
		{"wrong method", "PUT /v1/completions", http.StatusMethodNotAllowed},
		{"unknown path", "POST /v2/completions", http.StatusNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			br := bufio.NewReader(conn)
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))

			// A body that comes keeps the connection.
			_, err = io.WriteString(conn, c.request+" HTTP/1.1\r\nHost: engine\r\nContent-Length: 2\r\n\r\n{}")
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, c.code, resp.StatusCode)
			assert.False(t, resp.Close, "a body that came keeps the connection")

			// A body that does not come.
			start := time.Now()
			_, err = io.WriteString(conn, c.request+" HTTP/1.1\r\nHost: engine\r\nContent-Length: 100\r\n\r\n{")
			require.NoError(t, err)
			resp, err = http.ReadResponse(br, nil)
			require.NoError(t, err, "no answer: the connection waits for the body")
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, c.code, resp.StatusCode)
			assert.True(t, resp.Close, "the connection closes")
			assert.Less(t, time.Since(start), 3*time.Second)
		})
	}
}
