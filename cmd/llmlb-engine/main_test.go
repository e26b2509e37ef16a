package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmlb/llmlb/engine"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// zmq4 v0.17.0 never stops the sending goroutine of a PUB socket, one per
// kvevents.Publisher run.
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main() // for TestExitStatus: this test binary is llmlb-engine
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// kvPort returns a loopback port p such that p and p+1000 were free a
// moment ago.
func kvPort(t *testing.T) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1000)))
		l.Close()
		if err == nil {
			l2.Close()
			return p
		}
	}
	t.Fatal("no free pair of ports")
	return 0
}

// startRun runs the command with args until the test ends and returns the
// first line it prints, the first engine's address.
func startRun(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, w, io.Discard)
		w.Close()
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, r) }()
	return line
}

// startEngine runs one engine publishing KV events on port p and returns
// its base URL.
func startEngine(t *testing.T, p int) string {
	t.Helper()
	line := startRun(t, "-n", "1", "-speedup", "1000", "-block-size", "4", "-kv-events-port", strconv.Itoa(p))
	want := fmt.Sprintf(" kv-events tcp://127.0.0.1:%d replay tcp://127.0.0.1:%d\n", p, p+1000)
	require.True(t, strings.HasSuffix(line, want), "%q", line)
	return strings.Fields(line)[0]
}

func complete(t *testing.T, url, text string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, text)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestKVEventsPort follows -kv-events-port with a kvevents.Subscriber: a
// prompt the engine cached matches in the index under the router's hashes.
func TestKVEventsPort(t *testing.T) {
	p := kvPort(t)
	url := startEngine(t, p)
	h, err := prefix.NewHasher(prefix.HasherConfig{BlockTokens: 4})
	require.NoError(t, err)
	idx, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 4, EventsOnly: true})
	require.NoError(t, err)
	sub, err := kvevents.NewSubscriber(kvevents.Config{Index: idx, Hasher: h})
	require.NoError(t, err)
	salt := prefix.Salt{Model: engine.DefaultModel}
	require.NoError(t, sub.SetEndpoints(map[string]kvevents.Endpoint{url: {
		PubAddr: fmt.Sprintf("tcp://127.0.0.1:%d", p), ReplayAddr: fmt.Sprintf("tcp://127.0.0.1:%d", p+1000), Topic: "kv-events", Salt: salt,
	}}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = sub.Run(ctx) })
	defer wg.Wait()
	defer cancel()

	i := 0
	require.Eventually(t, func() bool {
		i++
		text := strings.Repeat(fmt.Sprintf("request %d. ", i), 8)
		complete(t, url, text)
		blocks := h.HashTokens(salt, engine.Tokens(text))
		return len(blocks) > 0 && idx.MatchLen(url, blocks, time.Now()) == len(blocks)
	}, 10*time.Second, 20*time.Millisecond)
}

// TestKVEventsPython decodes -kv-events-port's stream with the pyzmq and
// msgpack consumer of package kvevents' tests, which checks vLLM's
// positional schema.
func TestKVEventsPython(t *testing.T) {
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(c); err == nil && exec.Command(path, "-c", "import zmq, msgpack").Run() == nil {
			py = path
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with pyzmq and msgpack (apt-get install python3-zmq python3-msgpack)")
	}
	p := kvPort(t)
	url := startEngine(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "../../kvevents/testdata/vllm_subscriber.py",
		fmt.Sprintf("tcp://127.0.0.1:%d", p), fmt.Sprintf("tcp://127.0.0.1:%d", p+1000), "kv-events")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	defer func() {
		stdin.Close()
		for range lines {
		}
		_ = cmd.Wait()
	}()

	sent := map[string]string{} // tokens of the first block, as JSON, to prompt
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "subscriber exited: %s", stderr.String())
			var ev struct {
				Type      string   `json:"type"`
				TokenIDs  []uint32 `json:"token_ids"`
				BlockSize int      `json:"block_size"`
				Hashes    []uint64 `json:"block_hashes"`
			}
			require.NoError(t, json.Unmarshal([]byte(l), &ev), l)
			if ev.Type != "BlockStored" {
				continue
			}
			assert.Equal(t, 4, ev.BlockSize)
			assert.Len(t, ev.TokenIDs, 4*len(ev.Hashes))
			key, _ := json.Marshal(ev.TokenIDs[:4])
			text, ok := sent[string(key)]
			require.True(t, ok, "tokens %v of no prompt sent", ev.TokenIDs)
			assert.Equal(t, engine.Tokens(text)[:len(ev.TokenIDs)], ev.TokenIDs)
			_, _ = io.WriteString(stdin, "quit\n")
			return
		case <-tick.C:
			n++
			text := strings.Repeat(fmt.Sprintf("prompt %d; ", n), 8)
			key, _ := json.Marshal(engine.Tokens(text)[:4])
			sent[string(key)] = text
			complete(t, url, text)
		case <-ctx.Done():
			t.Fatalf("no BlockStored; stderr: %s", stderr.String())
		}
	}
}

// TestRunErrors checks that bad flags fail before any engine starts, with
// an error naming the flag.
func TestParsePorts(t *testing.T) {
	got, err := parsePorts(" 8001,0, 0,65535", "::1")
	require.NoError(t, err)
	assert.Equal(t, []string{"[::1]:8001", "[::1]:0", "[::1]:0", "[::1]:65535"}, got)
	// A port is named as a number, whatever its leading zeros.
	got, err = parsePorts("08001,00,000", "h")
	require.NoError(t, err)
	assert.Equal(t, []string{"h:8001", "h:0", "h:0"}, got)
	_, err = parsePorts(strings.Repeat("0,", maxEngines)+"0", "h")
	assert.ErrorContains(t, err, "lists more than 1024 ports")
}

// FuzzParsePorts: -ports never panics, and what it accepts is one address
// per listed port, in the list's order, on the host, none twice but port 0.
func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"8001,8002", "8001,x", ",", "0,0", "8001, 8001", "65536", "-1", " 1 ", "00,00", "08001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		addrs, err := parsePorts(list, "127.0.0.1")
		if err != nil {
			return
		}
		if n := strings.Count(list, ",") + 1; len(addrs) != n || n > maxEngines {
			t.Fatalf("parsePorts(%q) = %d addresses", list, len(addrs))
		}
		seen := map[string]bool{}
		parts := strings.Split(list, ",")
		for i, a := range addrs {
			host, port, err := net.SplitHostPort(a)
			if err != nil {
				t.Fatalf("parsePorts(%q): address %q: %v", list, a, err)
			}
			if want, err := strconv.ParseUint(strings.TrimSpace(parts[i]), 10, 16); err != nil || host != "127.0.0.1" || port != strconv.FormatUint(want, 10) {
				t.Fatalf("parsePorts(%q): address %d is %q for %q", list, i, a, parts[i])
			}
			if port != "0" && seen[port] {
				t.Fatalf("parsePorts(%q) lists port %s twice", list, port)
			}
			seen[port] = true
		}
	})
}

func TestRunErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-rpm", "-1"}, "-rpm -1 must not be negative"},
		{[]string{"-kv-blocks", "-1"}, "-kv-blocks -1 must be positive"},
		{[]string{"-max-waiting", "-2"}, "-max-waiting -2 must not be negative"},
		{[]string{"-n", "0"}, "-n 0 out of range [1, 1024]"},
		{[]string{"-n", "1025"}, "-n 1025 out of range [1, 1024]"},
		{[]string{"-n", "2", "extra"}, `unexpected argument "extra"`},
		{[]string{"-ports", "8001,x"}, `-ports "8001,x": "x" is not a port from 0 to 65535`},
		{[]string{"-speedup", "-1"}, "-speedup -1 must be finite and at least 0.001"},
		// 0 is engine.Config's default, not what was asked.
		{[]string{"-speedup", "0"}, "-speedup 0 must be finite and at least 0.001"},
		{[]string{"-max-tokens", "0"}, "-max-tokens 0 must be positive"},
		{[]string{"-kv-blocks", "0"}, "-kv-blocks 0 must be positive"},
		{[]string{"-block-size", "0"}, "-block-size 0 must be positive"},
		{[]string{"-token-budget", "0"}, "-token-budget 0 must be positive"},
		{[]string{"-max-running", "0"}, "-max-running 0 must be positive"},
		// Iteration times beyond time.Duration: no delay at all.
		{[]string{"-speedup", "1e-300"}, "-speedup 1e-300 must be finite and at least 0.001"},
		{[]string{"-speedup", "NaN"}, "-speedup NaN must be finite and at least 0.001"},
		{[]string{"-speedup", "Inf"}, "-speedup +Inf must be finite and at least 0.001"},
		{[]string{"-max-tokens", "99999999"}, "-max-tokens 99999999 exceeds the output cap of 4096 tokens"},
		{[]string{"-ports", ","}, `-ports ",": "" is not a port from 0 to 65535`},
		{[]string{"-ports", "8001, 8001"}, `-ports "8001, 8001" lists 8001 twice`},
		{[]string{"-ports", "70000"}, `"70000" is not a port`},
		{[]string{"-read-timeout", "0"}, "-read-timeout 0s must be positive"},
		{[]string{"-read-timeout", "-1s"}, "-read-timeout -1s must be positive"},
		{[]string{"-idle-timeout", "0"}, "-idle-timeout 0s must be positive"},
		{[]string{"-idle-timeout", "-1s"}, "-idle-timeout -1s must be positive"},
		{[]string{"-shutdown-timeout", "-1s"}, "-shutdown-timeout -1s must not be negative"},
		{[]string{"-model", ""}, "-model must not be empty"},
		// Engine 1000's PUB port would be engine 0's replay port.
		{[]string{"-n", "1001", "-kv-events-port", "5000"}, "-kv-events-port: 1001 engines publish KV events, at most 1000 can"},
	} {
		var out strings.Builder
		err := run(context.Background(), tc.args, &out, io.Discard)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
		require.Empty(t, out.String(), "%v printed an address", tc.args)
	}
}

// -read-timeout bounds the time a client has to send its body.
func TestReadTimeoutFlag(t *testing.T) {
	line := startRun(t, "-n", "1", "-read-timeout", "100ms")
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSpace(line), "http://"))
	require.NoError(t, err)
	defer conn.Close()
	// A header announcing a body that never comes.
	_, err = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: engine\r\nContent-Length: 100\r\n\r\n{")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
}

// runMainEnv set to 1 makes this test binary run main, as llmlb-engine.
const runMainEnv = "LLMLB_ENGINE_RUN_MAIN"

// runMain runs llmlb-engine with args in a process of its own and returns
// its stdout, its stderr and its exit status.
func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("llmlb-engine %v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// -h and -help print the usage and exit 0; a bad flag exits 1.
func TestExitStatus(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		stdout, stderr, code := runMain(t, arg)
		assert.Equal(t, 0, code, "%s: %s", arg, stderr)
		assert.Empty(t, stdout, arg)
		assert.Contains(t, stderr, "Usage of llmlb-engine", arg)
		assert.Contains(t, stderr, "-kv-events-port", arg)
		assert.NotContains(t, stderr, "help requested", arg)
	}
	stdout, stderr, code := runMain(t, "-n", "0")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Equal(t, "llmlb-engine: -n 0 out of range [1, 1024]\n", stderr)
}

// holdPorts binds loopback ports p, p+1, p+1000 and p+1001 for a free p
// and returns p and their listeners, in that order.
func holdPorts(t *testing.T) (int, []net.Listener) {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		for _, q := range []int{p + 1, p + 1000, p + 1001} {
			if q > 65535 {
				break
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(q)))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		if len(ls) == 4 {
			t.Cleanup(func() {
				for _, l := range ls {
					l.Close()
				}
			})
			return p, ls
		}
		for _, l := range ls {
			l.Close()
		}
	}
	t.Fatal("no free ports")
	return 0, nil
}

// A port in use, HTTP or KV events, fails the command before it prints any
// address, and the ports it bound are free again.
func TestPortInUse(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy int // index in holdPorts' listeners of the port in use
		args func(p int) []string
		want string
	}{
		{"http", 1, func(p int) []string { return []string{"-ports", fmt.Sprintf("%d,%d", p, p+1)} }, ""},
		{"kv-events", 1, func(p int) []string {
			return []string{"-n", "2", "-kv-events-port", strconv.Itoa(p)}
		}, "-kv-events-port: "},
		{"kv-events replay", 3, func(p int) []string {
			return []string{"-n", "2", "-kv-events-port", strconv.Itoa(p)}
		}, "-kv-events-port: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ls := holdPorts(t)
			for i, l := range ls {
				if i != tc.busy {
					l.Close()
				}
			}
			var out strings.Builder
			err := run(context.Background(), tc.args(p), &out, io.Discard)
			require.Error(t, err)
			assert.Empty(t, out.String(), "an address printed")
			busy := ls[tc.busy].Addr().String()
			assert.ErrorContains(t, err, tc.want+"listen tcp "+busy+": bind: address already in use")
			for i, l := range ls {
				if i == tc.busy {
					continue
				}
				l, err := net.Listen("tcp", l.Addr().String())
				require.NoError(t, err, "a port bound by the failed run is still in use")
				l.Close()
			}
		})
	}
}

// -idle-timeout closes a keep-alive connection with no request on it; by
// default after vLLM's 5 seconds.
func TestIdleTimeoutFlag(t *testing.T) {
	var usage strings.Builder
	require.ErrorIs(t, run(context.Background(), []string{"-h"}, io.Discard, &usage), flag.ErrHelp)
	assert.Regexp(t, `-idle-timeout duration\n\s+close a keep-alive connection idle this long.*\(default 5s\)`, usage.String())

	line := startRun(t, "-n", "1", "-idle-timeout", "50ms")
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSpace(line), "http://"))
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	_, err = io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: engine\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the idle connection is closed")
}
