package engine

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A keep-alive connection with no request on it for IdleTimeout is closed,
// as vLLM's server closes one after its keep-alive timeout.
func TestIdleConnectionClosed(t *testing.T) {
	e := newEngine(t, Config{IdleTimeout: 50 * time.Millisecond})
	url, _ := serve(t, e)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	_, err = io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: engine\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.False(t, resp.Close, "the connection is kept alive")
	// Long past the idle timeout, short of forever: the read ends with
	// the server's close, not with this deadline.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
}

// Without IdleTimeout, Serve keeps an idle connection for
// DefaultIdleTimeout, longer than net/http's DefaultTransport keeps one, so
// that a Go client with default settings always closes it first.
func TestDefaultIdleTimeout(t *testing.T) {
	assert.Equal(t, DefaultIdleTimeout, newEngine(t, Config{}).idleTime)
	assert.Greater(t, DefaultIdleTimeout, http.DefaultTransport.(*http.Transport).IdleConnTimeout)
}
