package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmlb/llmlb/grpclb"
)

// runMainEnv set to 1 makes this test binary run main, as the example.
const runMainEnv = "LLMLB_GRPC_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	if _, err := grpclb.Register(grpclb.Options{Name: grpclb.DefaultName}); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

// TestRun runs the example's calls for a load-blind and a KV-aware policy
// and checks the split.
func TestRun(t *testing.T) {
	replicas, stop, err := startReplicas([]float64{0.2, 0.95, 0.2})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const calls = 90
	for _, tc := range []struct {
		cfg     string
		maxFull int64
	}{
		{`{"policy": "round-robin"}`, calls},
		{`{"policy": "least-kv"}`, calls / 6},
	} {
		for _, r := range replicas {
			r.calls.Store(0)
		}
		if err := run(tc.cfg, replicas, calls, 4); err != nil {
			t.Fatalf("%s: %v", tc.cfg, err)
		}
		var total int64
		for _, r := range replicas {
			total += r.calls.Load()
		}
		if total != calls {
			t.Errorf("%s: replicas saw %d calls, want %d", tc.cfg, total, calls)
		}
		if full := replicas[1].calls.Load(); full > tc.maxFull {
			t.Errorf("%s: the full replica got %d calls, want at most %d", tc.cfg, full, tc.maxFull)
		}
	}
}

// TestParsePolicies checks that -policies tolerates spaces after commas and
// rejects an unknown name before any policy runs.
func TestParsePolicies(t *testing.T) {
	cases := []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "round-robin,p2c-kv,least-kv,default", want: []string{"round-robin", "p2c-kv", "least-kv", "default"}},
		{list: "default, least-kv", want: []string{"default", "least-kv"}},
		{list: "default,", want: []string{"default"}},
		{list: "default,foo", wantErr: true},
		{list: " ", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.list, func(t *testing.T) {
			got, err := parsePolicies(c.list)
			if (err != nil) != c.wantErr {
				t.Fatalf("parsePolicies(%q) error = %v, want error %v", c.list, err, c.wantErr)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("parsePolicies(%q) = %q, want %q", c.list, got, c.want)
			}
		})
	}
}

// runExample runs the example in a process of its own with args, and
// returns its exit status, stdout and stderr.
func runExample(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the example still ran after a minute; stderr:\n%s", errOut.String())
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// TestCommand runs the example as a command: it prints a row of calls per
// replica for each policy asked for, and refuses a bad command line, an
// argument it would otherwise ignore included, before any policy runs.
func TestCommand(t *testing.T) {
	code, out, errOut := runExample(t, "-calls", "30", "-policies", "round-robin, least-kv")
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, errOut)
	}
	for _, policy := range []string{"round-robin", "least-kv"} {
		if !regexp.MustCompile(`(?m)^ *` + policy + `( +\d+){3} *$`).MatchString(out) {
			t.Errorf("stdout:\n%s\nwant a row of %s with the calls of 3 replicas", out, policy)
		}
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"300"}, `unexpected argument "300"`},
		{[]string{"-calls", "0"}, "-calls and -concurrency must be positive"},
		{[]string{"-policies", "default,nope"}, `unknown policy "nope"`},
	} {
		code, out, errOut := runExample(t, c.args...)
		if code == 0 || out != "" || !strings.Contains(errOut, c.says) {
			t.Errorf("%q: exit status %d, stdout %q, stderr %q; want a failure before any policy runs, saying %s", c.args, code, out, errOut, c.says)
		}
	}
}
