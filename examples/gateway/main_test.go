package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestRunListenError checks that a gateway following engine KV events
// reports an address already in use and exits, rather than waiting forever
// for its event runners.
func TestRunListenError(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// A ZMQ address nothing publishes on: the subscriber keeps retrying
	// until the gateway ends it.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pub := "tcp://" + free.Addr().String()
	free.Close()
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"-backends", "http://127.0.0.1:1", "-kv-events", pub,
			"-listen", busy.Addr().String(), "-admin", ""}, io.Discard)
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("run returned no error on an address in use")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10 s of failing to listen")
	}
}

// commandLine is a command line and how the gateway must answer it.
type commandLine struct {
	name string
	args []string
	code int
	says string // the error line, without the "gateway: " prefix
}

// Bad command lines: each error is printed once, names the flag, and exits
// with status 2; -h prints the usage and exits with 0.
func TestCommandLine(t *testing.T) {
	testCommandLines(t, []commandLine{
		{"help", []string{"-h"}, 0, ""},
		{"help long", []string{"-help"}, 0, ""},
		{"unknown flag", []string{"-nope"}, 2, "flag provided but not defined: -nope (gateway -h lists the flags)"},
		{"no backends", nil, 2, "-backends is required"},
		// Spaces around the items are trimmed: the backends pass, and the
		// next check fails.
		{"space after comma", []string{"-backends", "http://127.0.0.1:1, http://127.0.0.1:2", "-class-header", "X-Class"}, 2, "-class-header needs -fair"},
		{"no scheme", []string{"-backends", "127.0.0.1:20001"}, 2,
			`-backends: httplb: invalid config: endpoint "127.0.0.1:20001": want an absolute http or https URL, such as "http://127.0.0.1:20001"`},
		{"no scheme, host name", []string{"-backends", "http://127.0.0.1:1,localhost:8000"}, 2,
			`-backends: httplb: invalid config: endpoint "localhost:8000": want an absolute http or https URL, such as "http://localhost:8000"`},
		{"OpenAI base URL", []string{"-backends", "http://127.0.0.1:20001/v1"}, 2, "give the server's base URL, http://127.0.0.1:20001, without /v1"},
		{"duplicate", []string{"-backends", "http://127.0.0.1:1,http://127.0.0.1:1/"}, 2, "-backends: http://127.0.0.1:1 is listed twice"},
		{"spill-to", []string{"-backends", "http://127.0.0.1:1", "-spill-to", "127.0.0.1:2"}, 2, `-spill-to: httplb: invalid config: endpoint "127.0.0.1:2"`},
		{"unknown policy", []string{"-backends", "http://127.0.0.1:1", "-policy", "leastload"}, 2,
			`-policy: unknown policy "leastload" (want one of default, least-outstanding, round-robin, peak-ewma)`},
		{"kv-events count", []string{"-backends", "http://127.0.0.1:1, http://127.0.0.1:2", "-kv-events", "tcp://127.0.0.1:5557"}, 2,
			"-kv-events has 1 addresses for 2 backends"},
		// Without the check, the gateway would run, without KV events; the
		// address it cannot listen on ends it.
		{"kv-replay alone", []string{"-backends", "http://127.0.0.1:1", "-kv-replay", "tcp://127.0.0.1:6557", "-listen", "127.0.0.1:-1"}, 2,
			"-kv-replay needs -kv-events"},
		{"argument", []string{"-backends", "http://127.0.0.1:1", "http://127.0.0.1:2"}, 2, `unexpected argument "http://127.0.0.1:2"`},
		{"attempts negative", []string{"-backends", "http://127.0.0.1:1", "-attempts", "-1"}, 2, "-attempts must not be negative"},
		{"max-in-flight negative", []string{"-backends", "http://127.0.0.1:1", "-max-in-flight", "-3"}, 2, "-max-in-flight must not be negative"},
		{"max-per-session negative", []string{"-backends", "http://127.0.0.1:1", "-max-per-session", "-2"}, 2, "-max-per-session must not be negative"},
		{"slots negative", []string{"-backends", "http://127.0.0.1:1", "-slots", "-4"}, 2, "-slots must not be negative"},
		{"grace negative", []string{"-backends", "http://127.0.0.1:1", "-shutdown-grace", "-1s"}, 2, "-shutdown-grace must not be negative"},
		{"drain delay negative", []string{"-backends", "http://127.0.0.1:1", "-drain-delay", "-5s"}, 2, "-drain-delay must not be negative"},
		{"scrape too short", []string{"-backends", "http://127.0.0.1:1", "-scrape", "1ns"}, 2, "-scrape 1ns is below 1ms"},
		{"fair negative", []string{"-backends", "http://127.0.0.1:1", "-fair", "-2"}, 2, "-fair must not be negative"},
		{"first-event-timeout negative", []string{"-backends", "http://127.0.0.1:1", "-first-event-timeout", "-1s"}, 2, "-first-event-timeout must not be negative"},
	})
}

// testCommandLines runs the gateway with each command line of cases, and
// checks its exit status and what it printed.
func testCommandLines(t *testing.T, cases []commandLine) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := cli(c.args, &stderr)
			out := stderr.String()
			if code != c.code {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, c.code, out)
			}
			if c.code == 0 {
				if !strings.Contains(out, "Usage of gateway") || strings.Contains(out, "help requested") {
					t.Errorf("stderr %q: want the usage and no error", out)
				}
				return
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "gateway: ") || !strings.Contains(lines[0], c.says) {
				t.Errorf("stderr %q: want one line, gateway: ...%s...", out, c.says)
			}
		})
	}
}

// Items of a list flag may have spaces around them.
func TestList(t *testing.T) {
	for in, want := range map[string][]string{
		"":                                    nil,
		"  ":                                  nil,
		"http://a:1":                          {"http://a:1"},
		"http://a:1, http://b:2 ,http://c:3 ": {"http://a:1", "http://b:2", "http://c:3"},
	} {
		if got := list(in); !slices.Equal(got, want) {
			t.Errorf("list(%q) = %q, want %q", in, got, want)
		}
	}
}

// An error of package gateway (here a duplicate backend, which run refuses
// before, given to newGateway directly) is printed with one "gateway: "
// prefix, not the command's name and then the package's.
func TestGatewayErrorPrefix(t *testing.T) {
	o := options{policy: "default", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	_, _, err := newGateway([]string{"http://127.0.0.1:1", "http://127.0.0.1:1"}, o, nil)
	if err == nil {
		t.Fatal("newGateway accepted a duplicate backend")
	}
	if got := errorLine(err); strings.HasPrefix(got, "gateway: gateway:") || !strings.HasPrefix(got, "gateway: invalid config") {
		t.Errorf("printed %q", got)
	}
}

// runMainEnv set to 1 makes this test binary run main, as the gateway.
const runMainEnv = "LLMLB_GATEWAY_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// process is the gateway run as a process of its own, its log read line by
// line.
type process struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  *bufio.Scanner
	stdout *bytes.Buffer // complete once the process has been waited for
}

// startProcess runs the gateway with args in a process of its own; it is
// killed when the test ends.
func startProcess(t *testing.T, args ...string) *process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stdout := new(bytes.Buffer)
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &process{t: t, cmd: cmd, lines: bufio.NewScanner(stderr), stdout: stdout}
}

// waitFor reads the log up to a line containing substr and returns the
// value of its field key ("" for none).
func (p *process) waitFor(substr, key string) string {
	p.t.Helper()
	for p.lines.Scan() {
		line := p.lines.Text()
		if !strings.Contains(line, substr) {
			continue
		}
		if i := strings.Index(line, key+"="); key != "" && i >= 0 {
			return strings.Fields(line[i+len(key)+1:])[0]
		}
		return ""
	}
	p.t.Fatalf("the gateway ended before logging %q", substr)
	return ""
}

// signal sends sig to the gateway.
func (p *process) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits up to 20 s for the gateway to exit, and returns how.
func (p *process) wait() syscall.WaitStatus {
	p.t.Helper()
	go func() {
		for p.lines.Scan() {
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-exited
		p.t.Fatal("the gateway still running 20s after it was told to stop")
	}
	return p.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// holdingEngine is an engine whose streams last until the test ends; held
// is closed when the first reaches it.
func holdingEngine(t *testing.T) (url string, held <-chan struct{}) {
	first := make(chan struct{})
	var once sync.Once
	release := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		once.Do(func() { close(first) })
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(engine.Close)
	t.Cleanup(func() { close(release) })
	return engine.URL, first
}

// stream sends a streamed chat request to the gateway at addr and reads
// its answer to the end.
func stream(addr string) {
	body := strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hold"}]}`)
	resp, err := http.Post(addr+"/v1/chat/completions", "application/json", body)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// get returns the status of a GET of url, or 0 if it failed.
func get(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSecondSignal: a second SIGTERM while a stream holds the shutdown ends
// the gateway at once instead of waiting out -shutdown-grace.
func TestSecondSignal(t *testing.T) {
	engine, held := holdingEngine(t)
	p := startProcess(t, "-backends", engine, "-listen", "127.0.0.1:0", "-admin", "", "-scrape", "-1s", "-shutdown-grace", "1m")
	go stream(p.waitFor("gateway serving", "addr"))
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the request did not reach the engine")
	}
	p.signal(syscall.SIGTERM)
	p.waitFor("gateway shutting down", "")
	p.signal(syscall.SIGTERM)
	if ws := p.wait(); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("exit %v, want killed by SIGTERM", p.cmd.ProcessState)
	}
}

// TestProbes: /healthz and /readyz answer 200; from the first SIGTERM on,
// /readyz answers 503 while, for -drain-delay, the gateway still takes
// requests; then it stops and exits 0.
func TestProbes(t *testing.T) {
	engine, held := holdingEngine(t)
	p := startProcess(t, "-backends", engine, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-scrape", "-1s",
		"-drain-delay", "2s", "-shutdown-grace", "100ms")
	ready := p.waitFor("admin endpoints", "readiness")
	live := strings.TrimSuffix(ready, "/readyz") + "/healthz"
	addr := p.waitFor("gateway serving", "addr")
	if code := get(live); code != http.StatusOK {
		t.Errorf("/healthz: %d, want 200", code)
	}
	if code := get(ready); code != http.StatusOK {
		t.Errorf("/readyz: %d, want 200", code)
	}
	p.signal(syscall.SIGTERM)
	p.waitFor("gateway shutting down", "")
	if code := get(ready); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while shutting down: %d, want 503", code)
	}
	if code := get(live); code != http.StatusOK {
		t.Errorf("/healthz while shutting down: %d, want 200", code)
	}
	go stream(addr)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("a request during the drain delay did not reach the engine")
	}
	if ws := p.wait(); ws.Signaled() || ws.ExitStatus() != 0 {
		t.Errorf("exit %v, want 0", p.cmd.ProcessState)
	}
}

// TestNATSCredentialsNotLogged: the gateway logs the NATS server it shares
// over, but neither the token (which NATS takes from a URL's user name) nor
// the password of its URL.
func TestNATSCredentialsNotLogged(t *testing.T) {
	const token, password = "tok3n-in-url", "passw0rd-in-url"
	t.Run("invalid URL", func(t *testing.T) {
		var stderr bytes.Buffer
		code := cli([]string{"-backends", "http://127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "",
			"-nats", "nats://gw:" + password + "@127.0.0.1:port"}, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "-nats: ") || strings.Contains(stderr.String(), password) {
			t.Errorf("exit status %d, stderr %q; want 1 and the error without the password", code, stderr.String())
		}
	})
	for _, c := range []struct {
		name string
		opts server.Options
		url  func(port int) string
	}{
		{"token", server.Options{Authorization: token}, func(port int) string {
			return fmt.Sprintf("nats://%s@127.0.0.1:%d", token, port)
		}},
		{"password", server.Options{Username: "gw", Password: password}, func(port int) string {
			return fmt.Sprintf("nats://gw:%s@127.0.0.1:%d", password, port)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
			ns, err := server.NewServer(&opts)
			if err != nil {
				t.Fatal(err)
			}
			ns.Start()
			t.Cleanup(ns.Shutdown)
			if !ns.ReadyForConnections(10 * time.Second) {
				t.Fatal("NATS server not ready")
			}
			engine, _ := holdingEngine(t)
			p := startProcess(t, "-backends", engine, "-listen", "127.0.0.1:0", "-admin", "", "-scrape", "-1s",
				"-nats", c.url(ns.Addr().(*net.TCPAddr).Port))
			var logged []string
			connected, serving := false, false
			for (!connected || !serving) && p.lines.Scan() {
				line := p.lines.Text()
				logged = append(logged, line)
				connected = connected || strings.Contains(line, "NATS connected")
				serving = serving || strings.Contains(line, "gateway serving")
			}
			p.signal(syscall.SIGTERM)
			for p.lines.Scan() {
				logged = append(logged, p.lines.Text())
			}
			p.wait()
			if !connected || !serving {
				t.Fatalf("the gateway did not log both its NATS connection and that it serves:\n%s", strings.Join(logged, "\n"))
			}
			for _, line := range logged {
				if strings.Contains(line, token) || strings.Contains(line, password) {
					t.Errorf("logged a credential of the NATS URL: %s", line)
				}
			}
		})
	}
}

// The user information of a URL, a password or a NATS token, is redacted
// for the logs; each URL of a list is.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":           "nats://127.0.0.1:4222",
		"nats://tok@127.0.0.1:4222":       "nats://redacted@127.0.0.1:4222",
		"nats://user:p@ss@127.0.0.1:4222": "nats://redacted@127.0.0.1:4222",
		"user:pass@127.0.0.1:4222":        "redacted@127.0.0.1:4222",
		"":                                "",
		"nats://a:1@h1:4222, tls://b@h2:4222,nats://h3:1": "nats://redacted@h1:4222,tls://redacted@h2:4222,nats://h3:1",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("redactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// ctxRunner is a runner that hands its context over and runs until it ends.
type ctxRunner chan context.Context

func (r ctxRunner) Run(ctx context.Context) error {
	r <- ctx
	<-ctx.Done()
	return ctx.Err()
}

// TestDrainKeepsBackgroundWork: through the drain delay after the signal,
// while the gateway still takes requests, it keeps scraping the replicas and
// its runners (KV events, a spill tier) keep going, so that it routes on
// current state; they stop once it has stopped serving.
func TestDrainKeepsBackgroundWork(t *testing.T) {
	scrapes := make(chan struct{}, 1024)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			select {
			case scrapes <- struct{}{}:
			default:
			}
		}
	}))
	defer engine.Close()
	o := options{policy: "default", scrape: 10 * time.Millisecond, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	g, _, err := newGateway([]string{engine.URL}, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sd := &shutdown{delay: time.Second}
	events := make(ctxRunner, 1)
	ctx, signal := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, g, []runner{events}, l, sd, o.log) }()
	<-scrapes
	runCtx := <-events
	signal()
	for !sd.draining.Load() {
		time.Sleep(time.Millisecond)
	}
	for len(scrapes) > 0 { // scrapes from before the drain
		<-scrapes
	}
	for n := 0; n < 3; n++ {
		select {
		case <-scrapes:
		case err := <-served:
			t.Fatalf("the gateway scraped %d times in its drain delay and stopped (%v); want it scraping until it stops serving", n, err)
		}
	}
	if runCtx.Err() != nil {
		t.Error("a runner was stopped at the signal, before the gateway stopped serving")
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
	if runCtx.Err() == nil {
		t.Error("a runner still runs after the gateway stopped serving")
	}
}

// With -first-event-timeout, a request sent to a replica that takes the
// connection and never answers is retried on another replica in time; every
// request completes. The silent replica answers nothing before the test
// ends, so a request it was sent completes only if the timeout fired. The
// timeout must also spare the good replica's answer, which takes
// milliseconds but is measured from the send as well: the limit is far
// longer, so that a loaded machine does not time that out too, and far
// shorter than the client waits.
func TestFirstEventTimeout(t *testing.T) {
	const limit = time.Second
	release := make(chan struct{})
	var sent atomic.Int64
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(silent.Close)
	t.Cleanup(func() { close(release) })
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(good.Close)
	p := startProcess(t, "-backends", silent.URL+","+good.URL, "-policy", "round-robin", "-attempts", "2",
		"-first-event-timeout", limit.String(), "-listen", "127.0.0.1:0", "-admin", "", "-scrape", "-1s")
	addr := p.waitFor("gateway serving", "addr")
	client := &http.Client{Timeout: 20 * limit}
	for i := range 4 {
		body := strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		resp, err := client.Post(addr+"/v1/chat/completions", "application/json", body)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "[DONE]") {
			t.Fatalf("request %d: %s, %q, %v; want 200 and the good replica's stream", i, resp.Status, got, err)
		}
	}
	// Round robin sends every other request to the silent replica first
	// (a retry has one candidate left and takes no turn): two got past it
	// only by the timeout.
	if n := sent.Load(); n != 2 {
		t.Errorf("the silent replica was sent %d requests, want 2", n)
	}
	p.signal(syscall.SIGTERM)
	p.wait()
}
