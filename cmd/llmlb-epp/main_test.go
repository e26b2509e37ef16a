package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmlb/llmlb"
	"github.com/llmlb/llmlb/extproc"
)

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runMainEnv set to 1 makes this test binary run main, as llmlb-epp.
const runMainEnv = "LLMLB_EPP_RUN_MAIN"

// TestSecondSignal: a second SIGTERM during the drain ends the process at
// once instead of waiting out -drain-delay and -drain-timeout.
func TestSecondSignal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-endpoints", "127.0.0.1:1", "-grpc-addr", "127.0.0.1:0",
		"-grpc-health-addr", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-scrape", "-1s", "-drain-delay", "1m")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stderr)
	waitFor := func(substr string) {
		t.Helper()
		for lines.Scan() {
			if strings.Contains(lines.Text(), substr) {
				return
			}
		}
		t.Fatalf("llmlb-epp ended before logging %q", substr)
	}
	waitFor("llmlb-epp serving")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	waitFor("llmlb-epp draining")
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatal("llmlb-epp still draining 20s after a second SIGTERM")
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGTERM, "exit %v after %v", cmd.ProcessState, time.Since(start))
}

// TestHelp: -h writes the usage and exits with status 0, like any command
// asked for help; a usage error (an unknown flag, a value that does not
// parse, one the command refuses) exits with status 2, as the flag
// package's ExitOnError does, and writes its error once, without the usage.
func TestHelp(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string // the error, for a usage error
	}{
		{[]string{"-h"}, 0, ""},
		{[]string{"-help"}, 0, ""},
		{[]string{"-no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-refresh", "soon"}, 2, `invalid value "soon" for flag -refresh`},
		{[]string{"-endpoints", "10.0.0.1:8000", "-policy", "fastest"}, 2, `unknown -policy "fastest"`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], c.args...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1")
			out, err := cmd.CombinedOutput()
			require.Equal(t, c.code, cmd.ProcessState.ExitCode(), "%v\n%s", err, out)
			if c.code == 0 {
				require.Contains(t, string(out), "Usage of llmlb-epp")
				require.NotContains(t, string(out), "help requested")
				return
			}
			require.Equal(t, 1, strings.Count(string(out), c.want), "the error once:\n%s", out)
			require.True(t, strings.HasPrefix(string(out), "llmlb-epp: "+c.want), "%s", out)
			require.NotContains(t, string(out), "Usage of llmlb-epp", "a usage error names the error, not every flag")
			require.Equal(t, 2, strings.Count(string(out), "\n"), "one line for the error, one pointing to -h:\n%s", out)
		})
	}
}

// TestCommandExitStatus: a picker that fails to start (here, its listener
// cannot be opened) exits with status 1, not the 2 of a usage error.
func TestCommandExitStatus(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	var out strings.Builder
	code := command(context.Background(), []string{"-endpoints", "127.0.0.1:1", "-grpc-addr", l.Addr().String(),
		"-grpc-health-addr", "", "-admin", "", "-scrape", "-1s"}, &out)
	require.Equal(t, 1, code, "%s", out.String())
	require.Contains(t, out.String(), "llmlb-epp: ")
	require.Equal(t, 1, strings.Count(out.String(), "\n"), "%s", out.String())
}

func TestParseFlags(t *testing.T) {
	cases := []struct {
		args []string
		err  string
	}{
		{nil, "exactly one of"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-dns", "svc:8000"}, "exactly one of"},
		{[]string{"-dns", "svc"}, "-dns"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-policy", "fastest"}, "unknown -policy"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-engine", "tgi"}, "-engine"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-kv-events-port", "5557"}, "-tokenizer"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-log-level", "loud"}, "-log-level"},
		{[]string{"-endpoints", "10.0.0.1:8000", "extra"}, "unexpected"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-refresh", "0s"}, "-refresh"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-refresh", "1ns"}, "-refresh 1ns is below 10ms"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-kv-replay-port", "5558"}, "-kv-replay-port does nothing without -kv-events-port"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-model", "m"}, "-model does nothing without -kv-events-port"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-kv-topic", "kv"}, "-kv-topic does nothing without -kv-events-port"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-share-id", "a"}, "-share-id does nothing without -nats"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-retry-after", "-1s"}, "-retry-after -1s must not be negative"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-buffered-bytes", "-1"}, "-max-buffered-bytes -1 must be at least -max-body-bytes"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-buffered-bytes", "1048576"}, "-max-buffered-bytes 1048576 must be at least"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-buffered-bytes", "1048576", "-max-body-bytes", "1048577"}, "must be at least"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-buffered-bytes", "1048576", "-max-body-bytes", "1048576"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-buffered-bytes", "0", "-max-concurrent-streams", "0"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-buffered-bytes", "1073741824", "-max-body-bytes", "9223372036854775807"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-concurrent-streams", "-1"}, "-max-concurrent-streams -1 is outside"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-max-concurrent-streams", "4294967296"}, "-max-concurrent-streams 4294967296 is outside"},
		{[]string{"-endpoints-file", "eps", "-metrics-path", "metrics"}, "-metrics-path \"metrics\" must begin with /"},
		{[]string{"-dns", "vllm.default.svc:8000", "-metrics-path", "/%zz"}, "-metrics-path"},
		{[]string{"-dns", "vllm.default.svc:8000", "-metrics-path", "/v1/metrics?format=text"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000,10.0.0.2:8000", "-policy", "p2c", "-score", "kv"}, ""},
		// A flag read only by another policy or setting is refused, not ignored.
		{[]string{"-endpoints", "10.0.0.1:8000", "-score", "kv"}, "-score does nothing without -policy p2c"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-policy", "least-kv", "-score", "kv"}, "-score does nothing without -policy p2c"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-policy", "p2c", "-slots", "64"}, "-slots does nothing without -policy default"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-policy", "gie-default", "-cache-weight", "2"}, "-cache-weight does nothing without -policy default"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-policy", "random", "-sampled", "4"}, "-sampled does nothing without -policy default"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-slots", "64", "-cache-weight", "2", "-sampled", "4"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000", "-secure-serving=false", "-cert-path", "/etc/tls"}, "-cert-path does nothing without -secure-serving"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-feature-header", "x-route"}, "-feature-header does nothing without -predict-outputs"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-feature-header", "x-route", "-predict-outputs"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000", "-retry-after", "5s"}, "-retry-after does nothing without -max-in-flight or -max-per-session"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-retry-after", "5s", "-max-per-session", "2"}, ""},
		{[]string{"-endpoints", "10.0.0.1:8000", "-scrape", "-1s", "-metrics-path", "/m"}, "-metrics-path does nothing without scraping"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-scrape", "-1s", "-metrics-https"}, "-metrics-https does nothing without scraping"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-scrape", "-1s", "-engine", "vllm"}, "-engine does nothing without scraping"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-scrape", "2s", "-engine", "vllm", "-metrics-https", "-metrics-path", "/m"}, ""},
		// A header name no request can carry is refused.
		{[]string{"-endpoints", "10.0.0.1:8000", "-tenant-header", "x tenant"}, "-tenant-header \"x tenant\" is not an HTTP header name"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-session-header", "x-session:"}, "-session-header \"x-session:\" is not an HTTP header name"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-session-header", ":authority"}, "is not an HTTP header name"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-predict-outputs", "-feature-header", "x-route\n"}, "-feature-header"},
		{[]string{"-endpoints", "10.0.0.1:8000", "-session-header", "", "-tenant-header", "x-llm-d-inference-fairness-id"}, ""},
		{[]string{"-dns", "vllm.default.svc:8000", "-kv-events-port", "5557", "-tokenizer", "engine"}, ""},
	}
	for _, c := range cases {
		o, err := parseFlags(c.args, io.Discard)
		if c.err == "" {
			require.NoError(t, err, "%v", c.args)
			continue
		}
		require.ErrorContains(t, err, c.err, "%v", c.args)
		_ = o
	}
}

// TestBodyTimeoutFlag: -body-timeout sets the picker's body deadline,
// extproc's default unless given; a negative value (no deadline) builds.
func TestBodyTimeoutFlag(t *testing.T) {
	o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, extproc.DefaultBodyTimeout, o.bodyTimeout)
	o, err = parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-body-timeout", "5s"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, o.bodyTimeout)
	o, err = parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-body-timeout", "-1s"}, io.Discard)
	require.NoError(t, err)
	_, err = newServer(o)
	require.NoError(t, err)
}

// TestBodyModeFlags: -request-body-mode and -response-body-mode name the
// body modes assumed for a data plane that announces none, full duplex
// unless given; every value builds.
func TestBodyModeFlags(t *testing.T) {
	o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, o.reqMode)
	require.Equal(t, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, o.respMode)
	for name, mode := range bodyModes {
		o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-request-body-mode", name, "-response-body-mode", name}, io.Discard)
		require.NoError(t, err)
		require.Equal(t, mode, o.reqMode)
		require.Equal(t, mode, o.respMode)
		_, err = newServer(o)
		require.NoError(t, err)
	}
	_, err = parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-request-body-mode", "BUFFERED"}, io.Discard)
	require.ErrorContains(t, err, "unknown -request-body-mode")
	_, err = parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-response-body-mode", "chunked"}, io.Discard)
	require.ErrorContains(t, err, "unknown -response-body-mode")
}

// TestPolicies: every name -policy accepts builds.
func TestPolicies(t *testing.T) {
	for _, p := range policies {
		o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-policy", p}, io.Discard)
		require.NoError(t, err)
		_, err = newServer(o)
		require.NoError(t, err, p)
	}
	o, _ := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-policy", "p2c", "-score", "speed"}, io.Discard)
	_, err := newServer(o)
	require.ErrorContains(t, err, "-score")
}

type fakeResolver struct {
	ips []string
	err error
}

func (f *fakeResolver) LookupHost(context.Context, string) ([]string, error) { return f.ips, f.err }

func newMembership(t *testing.T, src source) *membership {
	b, err := llmlb.New(llmlb.LeastOutstanding())
	require.NoError(t, err)
	return &membership{src: src, b: b, scheme: "http", path: "/metrics", log: slog.New(slog.DiscardHandler)}
}

func keys(m *membership) []string {
	var out []string
	for _, s := range m.b.Stats() {
		out = append(out, s.Key)
	}
	return out
}

// TestFileSource: the endpoints file is re-read when it changes; a broken
// file keeps the last replicas.
func TestFileSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints")
	require.NoError(t, os.WriteFile(path, []byte("# replicas\n10.0.0.2:8000\n10.0.0.1:8000 # first\n\n10.0.0.2:8000\n"), 0o644))
	m := newMembership(t, source{file: path})
	require.NoError(t, m.refresh(context.Background()))
	require.ElementsMatch(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, keys(m))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.watch(ctx, 5*time.Millisecond, 0)
	}()
	defer func() {
		cancel()
		<-done
	}()
	replace := func(content string) { // as a ConfigMap volume does: write aside, rename
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
		require.NoError(t, os.Rename(tmp, path))
	}
	replace("10.0.0.3:8000\n[fd00::1]:8000\n")
	require.Eventually(t, func() bool {
		k := keys(m)
		return len(k) == 2 && strings.Join(k, ",") != "10.0.0.1:8000,10.0.0.2:8000"
	}, 5*time.Second, 5*time.Millisecond)
	require.ElementsMatch(t, []string{"10.0.0.3:8000", "[fd00::1]:8000"}, keys(m))

	replace("not an address\n")
	require.Eventually(t, func() bool { return m.status().err != nil }, 5*time.Second, 5*time.Millisecond)
	require.ErrorContains(t, m.status().err, ":1:")
	require.ElementsMatch(t, []string{"10.0.0.3:8000", "[fd00::1]:8000"}, keys(m), "kept")
}

// TestFileSourceStartupFailureWarnedOnce: an endpoints file that cannot be
// read when the picker starts is warned about once, not again by the first
// re-read that fails too; its recovery is logged with the failures counted
// from the start.
func TestFileSourceStartupFailureWarnedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints")
	o, err := parseFlags([]string{"-endpoints-file", path, "-refresh", "10ms", "-scrape", "-1s", "-grpc-addr", "127.0.0.1:0",
		"-grpc-health-addr", "", "-admin", "", "-drain-delay", "0", "-secure-serving=false"}, io.Discard)
	require.NoError(t, err)
	logs := &lockedBuffer{}
	o.logOut = logs
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, nil) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool { return logs.count("llmlb-epp serving") == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(100 * time.Millisecond) // re-reads that fail, every 10ms
	require.NoError(t, os.WriteFile(path, []byte("10.0.0.1:8000\n"), 0o644))
	require.Eventually(t, func() bool { return logs.count("reading the replicas recovered") == 1 }, 5*time.Second, time.Millisecond)

	logs.mu.Lock()
	out := logs.b.String()
	logs.mu.Unlock()
	m := regexp.MustCompile(`reading the replicas recovered" failures=(\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 2, "the startup read and at least one re-read failed:\n%s", out)
	require.Equal(t, 1, strings.Count(out, "reading the replicas failed"), "warned once:\n%s", out)
}

// TestFileSourceTooLarge: a file past the bound, or a device, is refused,
// not read whole; the replicas listed before are kept.
func TestFileSourceTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints")
	require.NoError(t, os.WriteFile(path, []byte("10.0.0.1:8000\n"), 0o644))
	m := newMembership(t, source{file: path})
	require.NoError(t, m.refresh(context.Background()))
	big := strings.Repeat("# "+strings.Repeat("x", 1021)+"\n", maxFileBytes/1024) + "10.0.0.2:8000\n"
	require.NoError(t, os.WriteFile(path, []byte(big), 0o644))
	require.ErrorContains(t, m.refresh(context.Background()), "larger than")
	require.Equal(t, []string{"10.0.0.1:8000"}, keys(m), "kept")
	if _, err := readFile("/dev/zero", 1<<20); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("reading /dev/zero: %v, want it refused unread", err)
	}
}

// TestDNSSource: the addresses a name resolves to, with the port; no
// records twice in a row is an empty pool (once is a blip, which keeps the
// last replicas), a failed lookup keeps the last replicas.
func TestDNSSource(t *testing.T) {
	// A dual-stack Service: an A and an AAAA record per pod, each pod one
	// replica.
	res := &fakeResolver{ips: []string{"10.1.0.5", "fd00::5", "10.1.0.4", "fd00::4"}}
	m := newMembership(t, source{dns: "vllm.ns.svc:8000", res: res})
	require.NoError(t, m.refresh(context.Background()))
	require.ElementsMatch(t, []string{"10.1.0.4:8000", "10.1.0.5:8000"}, keys(m))
	// An IPv6 single-stack Service.
	res.ips = []string{"fd00::7", "fd00::8"}
	require.NoError(t, m.refresh(context.Background()))
	require.ElementsMatch(t, []string{"[fd00::7]:8000", "[fd00::8]:8000"}, keys(m))
	res.ips = []string{"10.1.0.5", "10.1.0.4", "fd00::7"}
	require.NoError(t, m.refresh(context.Background()))
	require.ElementsMatch(t, []string{"10.1.0.4:8000", "10.1.0.5:8000"}, keys(m))

	res.ips, res.err = nil, errors.New("server misbehaving")
	require.Error(t, m.refresh(context.Background()))
	require.Len(t, keys(m), 2)

	res.ips, res.err = []string{"fd00::4", "fe80::1%eth0"}, nil // from /etc/hosts, say
	require.ErrorContains(t, m.refresh(context.Background()), "zone")
	require.Len(t, keys(m), 2, "kept")

	res.err = &net.DNSError{Err: "no such host", Name: "vllm.ns.svc", IsNotFound: true}
	require.NoError(t, m.refresh(context.Background()))
	require.Len(t, keys(m), 2, "one lookup without records")
	res.ips, res.err = []string{"10.1.0.4"}, nil
	require.NoError(t, m.refresh(context.Background()))
	require.Equal(t, []string{"10.1.0.4:8000"}, keys(m), "a change with records applies at once")
	res.ips, res.err = nil, &net.DNSError{Err: "no such host", Name: "vllm.ns.svc", IsNotFound: true}
	require.NoError(t, m.refresh(context.Background()))
	require.Len(t, keys(m), 1, "a second blip, after records, is one lookup without records again")
	require.NoError(t, m.refresh(context.Background()))
	require.Empty(t, keys(m), "two lookups in a row without records")
}

// TestDNSNoRecords: a -dns name without records is logged, at the first
// lookup and at each lookup that finds none after one that found some, and
// its return once; the picker otherwise starts ready with no replicas, and
// would answer 503 with nothing in the log to say why.
func TestDNSNoRecords(t *testing.T) {
	var logs lockedBuffer
	res := &fakeResolver{err: &net.DNSError{Err: "no such host", Name: "vlm.ns.svc", IsNotFound: true}}
	m := newMembership(t, source{dns: "vlm.ns.svc:8000", res: res})
	m.log = slog.New(slog.NewTextHandler(&logs, nil))
	const none, back = "the -dns name has no records", "the -dns name has records again"
	require.NoError(t, m.refresh(context.Background()))
	require.NoError(t, m.refresh(context.Background()))
	require.Equal(t, 1, logs.count(none), "logged once, not at every lookup")
	require.Equal(t, 1, logs.count("name=vlm.ns.svc:8000"))
	res.ips, res.err = []string{"10.1.0.4"}, nil
	require.NoError(t, m.refresh(context.Background()))
	require.NoError(t, m.refresh(context.Background()))
	require.Equal(t, 1, logs.count(back))
	res.ips, res.err = nil, &net.DNSError{Err: "no such host", Name: "vlm.ns.svc", IsNotFound: true}
	require.NoError(t, m.refresh(context.Background()))
	require.Equal(t, 2, logs.count(none))
	res.err = errors.New("server misbehaving") // a failed lookup says nothing of the records
	require.Error(t, m.refresh(context.Background()))
	require.Equal(t, 2, logs.count(none))
	require.Equal(t, 1, logs.count(back))
}

// TestCertPathError: a -cert-path whose key pair cannot be loaded fails the
// start with an error that names the flag.
func TestCertPathError(t *testing.T) {
	dir := t.TempDir()
	o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-cert-path", dir}, io.Discard)
	require.NoError(t, err)
	_, err = newServer(o)
	require.ErrorContains(t, err, "-cert-path: ")
	require.ErrorContains(t, err, "tls.crt")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), []byte("not PEM"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not PEM"), 0o600))
	_, err = newServer(o)
	require.ErrorContains(t, err, "-cert-path: ")
}

// TestCertReload: a key pair in -cert-path is served, and replaced when its
// files change.
func TestCertReload(t *testing.T) {
	dir := t.TempDir()
	write := func(cn string) {
		cert, err := selfSigned(time.Now())
		require.NoError(t, err)
		key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600))
		future := time.Now().Add(time.Duration(len(cn)) * time.Second)
		require.NoError(t, os.Chtimes(filepath.Join(dir, "tls.crt"), future, future))
	}
	write("a")
	cfg, err := tlsConfig(dir)
	require.NoError(t, err)
	first, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	again, _ := cfg.GetCertificate(&tls.ClientHelloInfo{})
	require.Same(t, first, again)
	write("bb")
	second, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	require.NotEqual(t, first.Certificate[0], second.Certificate[0])

	_, err = tlsConfig(t.TempDir())
	require.Error(t, err, "no key pair")
}

// TestFileSourceAddresses: the file's addresses are the destinations the
// data plane receives, so a leading byte-order mark is no part of the first
// one, and a host that is not an IP address is refused (the replicas listed
// before are kept): the data plane dials it as given.
func TestFileSourceAddresses(t *testing.T) {
	cases := []struct {
		name, content string
		want          []string // nil: refused
	}{
		{"byte-order-mark", "\xef\xbb\xbf10.0.0.1:8000\r\n10.0.0.2:8000\r\n", []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"ipv6", "[fd00::1]:8000\n10.0.0.1:8000\n", []string{"10.0.0.1:8000", "[fd00::1]:8000"}},
		{"name", "vllm-0.vllm.ns.svc.cluster.local.:8000\n", nil},
		{"localhost", "localhost:8001\n", nil},
		{"zone", "[fe80::1%eth0]:8000\n", nil},
		{"bracketed-ipv4", "[10.0.0.1]:8000\n", nil},
		{"plus-port", "10.0.0.1:+8000\n", nil},
		{"zero-port", "10.0.0.1:0\n", nil},
		{"leading-zero-port", "10.0.0.1:08000\n", nil},
		{"mapped", "[::ffff:10.0.0.1]:8000\n", nil},
		{"long-ipv6", "[FD00:0::7]:8000\n", nil},
		{"mark-mid-file", "10.0.0.1:8000\n\xef\xbb\xbf10.0.0.2:8000\n", nil},
		{"space", "10.0.0.1 :8000\n", nil},
		{"tab", "10.0.0.1\t:8000\n", nil},
		{"control", "10.0.0.\x011:8000\n", nil},
		{"non-ascii", "10.0.0.1\u00a0:8000\n", nil},
		{"empty-label", "vllm..svc:8000\n", nil},
		{"long-label", strings.Repeat("x", 64) + ".svc:8000\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "endpoints")
			require.NoError(t, os.WriteFile(path, []byte("10.0.0.9:8000\n"), 0o644))
			m := newMembership(t, source{file: path})
			require.NoError(t, m.refresh(context.Background()))
			require.NoError(t, os.WriteFile(path, []byte(c.content), 0o644))
			if c.want == nil {
				require.Error(t, m.refresh(context.Background()))
				require.Equal(t, []string{"10.0.0.9:8000"}, keys(m), "kept")
				return
			}
			for range 2 { // applied once two reads agree
				require.NoError(t, m.refresh(context.Background()))
			}
			require.Equal(t, c.want, keys(m))
		})
	}
	// -endpoints, likewise.
	m := newMembership(t, source{static: []string{"10.0.0.1:8000", "vllm-0:8000"}})
	require.ErrorContains(t, m.refresh(context.Background()), "use -dns NAME:PORT")
	// -dns names its host with the same rule.
	_, err := parseFlags([]string{"-dns", "vllm headless:8000"}, io.Discard)
	require.ErrorContains(t, err, "-dns")
}

// TestScrapeCentury: a scrape interval whose three-fold default signal age
// overflows builds, with an age that never runs out, as the gateway's.
func TestScrapeCentury(t *testing.T) {
	o, err := parseFlags([]string{"-endpoints", "10.0.0.1:8000", "-scrape", "1000000h"}, io.Discard)
	require.NoError(t, err)
	s, err := newServer(o)
	require.NoError(t, err)
	require.Equal(t, time.Duration(math.MaxInt64), s.maxAge)
}

// TestRecvLimit: gRPC's receive limit is a little over the body cap, and
// no more than a little over the 1 GiB extproc holds at most, so that a
// BUFFERED body over that is refused before it is read into memory.
func TestRecvLimit(t *testing.T) {
	for _, c := range []struct {
		maxBody int64
		want    int
	}{
		{8 << 20, 9 << 20},
		{1 << 30, 1<<30 + 1<<20},
		{2 << 30, 1<<30 + 1<<20},
		{math.MaxInt64, 1<<30 + 1<<20},
	} {
		if got := recvLimit(c.maxBody); got != c.want {
			t.Errorf("recvLimit(%d) = %d, want %d", c.maxBody, got, c.want)
		}
	}
}
