package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// runMainEnv set to 1 makes this test binary run main, as the quick start.
const runMainEnv = "LLMLB_QUICKSTART_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runQuickstart runs the quick start in a process of its own with args,
// and returns its exit status, stdout and stderr.
func runQuickstart(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("the quick start still ran after a minute; stderr:\n%s", errOut.String())
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// TestRun runs the quick start as its doc comment says, with no arguments:
// against two emulated engines, its three completions all stream, and the
// second and third go where the first left the shared system prompt cached.
func TestRun(t *testing.T) {
	code, out, errOut := runQuickstart(t)
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, errOut)
	}
	lines := regexp.MustCompile(`(?m)^(http://127\.0\.0\.1:\d+): first token after \S+$`).FindAllStringSubmatch(out, -1)
	if len(lines) != 3 {
		t.Fatalf("stdout:\n%s\nwant 3 lines naming the replica and the time to first token", out)
	}
	for _, l := range lines[1:] {
		if l[1] != lines[0][1] {
			t.Errorf("stdout:\n%s\nwant every completion on the replica the first one went to", out)
			break
		}
	}
}

// TestReplicaDown: given a replica that refuses connections, the quick
// start exits with status 1 and says why.
func TestReplicaDown(t *testing.T) {
	code, _, errOut := runQuickstart(t, "http://127.0.0.1:1")
	if code != 1 || !regexp.MustCompile(`connection refused`).MatchString(errOut) {
		t.Errorf("exit status %d, stderr %q; want 1 and the connection refused", code, errOut)
	}
}
