package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stream is a completion stream read in the background: its events (the
// data lines) and how it ended.
type stream struct {
	events []string
	err    error // nil for a stream read to its end
}

// startStream sends a streamed completion of maxTokens tokens to the engine
// at base, waits for its first event and returns a channel that receives
// the rest of the stream once it has ended.
func startStream(t *testing.T, base string, maxTokens string) <-chan stream {
	t.Helper()
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"x","stream":true,"max_tokens":`+maxTokens+`}`))
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n')
	require.NoError(t, err, "the stream's first event")
	rest := make(chan stream, 1)
	go func() {
		var s stream
		for {
			line, err := br.ReadString('\n')
			if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
				s.events = append(s.events, d)
			}
			if err != nil {
				if err != io.EOF {
					s.err = err
				}
				rest <- s
				return
			}
		}
	}()
	return rest
}

// statusOf returns the status of a GET of url on a connection of its own,
// or 0 if it failed.
func statusOf(url string) int {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// assertDrained checks the stream of an engine that drained: it finished,
// all 300 tokens then [DONE].
func assertDrained(t *testing.T, s stream) {
	t.Helper()
	require.NoError(t, s.err, "the stream broke")
	require.NotEmpty(t, s.events)
	assert.Equal(t, "[DONE]", s.events[len(s.events)-1])
	assert.Len(t, s.events, 300, "299 tokens after the first, then [DONE]")
}

// -shutdown-timeout: once run's context ends (the signal), each engine
// answers new requests 503 and lets its stream in progress finish, then run
// returns; by default, vLLM's 0, run breaks the stream at once. A stream of
// 300 tokens at -speedup 1 lasts about two seconds.
func TestShutdownTimeoutFlag(t *testing.T) {
	var usage strings.Builder
	require.ErrorIs(t, run(context.Background(), []string{"-h"}, io.Discard, &usage), flag.ErrHelp)
	assert.Regexp(t, `-shutdown-timeout duration\n\s+on SIGTERM or SIGINT, how long each engine lets its requests in progress finish.*\(0: break them at once, vLLM's default\)\n`, usage.String())

	for _, c := range []struct {
		name   string
		args   []string
		drains bool
	}{
		{"default", nil, false},
		{"drain", []string{"-shutdown-timeout", "1m"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, signal := context.WithCancel(context.Background())
			defer signal()
			r, w := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, append([]string{"-n", "2", "-speedup", "1"}, c.args...), w, io.Discard)
				w.Close()
			}()
			out := bufio.NewReader(r)
			var bases []string
			for range 2 {
				line, err := out.ReadString('\n')
				require.NoError(t, err)
				bases = append(bases, strings.TrimSpace(line))
			}
			go func() { _, _ = io.Copy(io.Discard, r) }()
			rest := startStream(t, bases[0], "300")
			signalled := time.Now()
			signal()
			if c.drains {
				// Both engines drain: the idle one too, until run returns.
				require.Eventually(t, func() bool { return statusOf(bases[0]+"/health") == http.StatusServiceUnavailable },
					10*time.Second, time.Millisecond, "the engine does not answer 503 after the signal")
				resp, err := http.Post(bases[0]+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
				require.NoError(t, err, "a new request while draining")
				resp.Body.Close()
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a new request while draining")
			}
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("run still running 20s after the signal")
			}
			s := <-rest
			if c.drains {
				assertDrained(t, s)
				t.Logf("run returned %v after the signal", time.Since(signalled))
			} else {
				assert.Error(t, s.err, "the stream must break at once by default")
				assert.Less(t, len(s.events), 299)
			}
		})
	}
}

// SIGTERM starts the shutdown of llmlb-engine run as a process: with
// -shutdown-timeout the stream in progress finishes and the command exits
// 0; a second SIGTERM ends it at once, killed by the signal, its stream
// broken.
func TestSIGTERM(t *testing.T) {
	for _, c := range []struct {
		name  string
		twice bool
	}{
		{"drain", false},
		{"second signal", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-n", "1", "-speedup", "1", "-shutdown-timeout", "1m")
			cmd.Env = append(os.Environ(), runMainEnv+"=1")
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			line, err := bufio.NewReader(stdout).ReadString('\n')
			require.NoError(t, err)
			base := strings.TrimSpace(line)
			rest := startStream(t, base, "300")
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			require.Eventually(t, func() bool { return statusOf(base+"/health") == http.StatusServiceUnavailable },
				10*time.Second, time.Millisecond, "the engine does not answer 503 after SIGTERM")
			if c.twice {
				require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			}
			var exit *exec.ExitError
			select {
			case err = <-exited:
				exited <- err // for the cleanup
			case <-time.After(20 * time.Second):
				t.Fatal("llmlb-engine still running 20s after SIGTERM")
			}
			s := <-rest
			if c.twice {
				require.True(t, errors.As(err, &exit), "exit: %v", err)
				ws := exit.Sys().(syscall.WaitStatus)
				assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGTERM, "exit %v, want killed by SIGTERM", exit)
				assert.Error(t, s.err, "the stream must break when the process is killed")
				return
			}
			require.NoError(t, err, "exit status")
			assertDrained(t, s)
		})
	}
}
