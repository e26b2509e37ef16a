package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An interrupt stops the command while it waits for a trace on standard
// input that never comes, and the command reports what stopped it and
// removes the output file it created.
func TestRunInterruptWhileReadingTrace(t *testing.T) {
	r, w := io.Pipe()
	t.Cleanup(func() { w.Close() }) // ends a read the command abandoned
	old := stdin
	t.Cleanup(func() { stdin = old })
	stdin = r

	interrupt := errors.New("interrupt signal received")
	ctx, cancel := context.WithCancelCause(context.Background())
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	var out, errb bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"-trace", "-", "-policies", "p2c", "-json", jsonPath}, &out, &errb)
	}()
	cancel(interrupt)
	var got int
	select {
	case got = <-code:
	case <-time.After(10 * time.Second):
		t.Error("no exit 10s after the interrupt: the command still waits for the trace")
		w.Close()
		got = <-code
	}
	if want := "llmlb-sim: interrupt signal received\n"; got != 1 || errb.String() != want {
		t.Errorf("exit %d, stderr %q; want 1 and %q", got, errb.String(), want)
	}
	if _, err := os.Stat(jsonPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("-json file %s left after the interrupt: %v", jsonPath, err)
	}
}

// An interrupt during the simulation is reported as what stopped the
// run, not as a context error.
func TestRunInterruptDuringSimulation(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("interrupt signal received"))
	var out, errb bytes.Buffer
	code := run(ctx, []string{"-requests", "50", "-policies", "p2c"}, &out, &errb)
	if want := "llmlb-sim: interrupt signal received\n"; code != 1 || errb.String() != want {
		t.Errorf("exit %d, stderr %q; want 1 and %q", code, errb.String(), want)
	}
}

// A trace longer than the limit is refused, naming the limit, before it
// is held in memory whole; one at the limit is read.
func TestReadFileLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, err := readFile(path, nil, 10); err != nil || string(data) != "0123456789" {
		t.Errorf("at the limit: %q, %v; want the file", data, err)
	}
	_, err := readFile(path, nil, 9)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-trace: "+path+" is longer than the simulator's limit of 9 bytes") {
		t.Errorf("above the limit: %v; want a usage error naming the limit", err)
	}

	if _, err := readFile("-", strings.NewReader("0123456789"), 9); err == nil || !strings.Contains(err.Error(), "-trace: standard input is longer than the simulator's limit of 9 bytes") {
		t.Errorf("standard input above the limit: %v; want an error naming the limit", err)
	}
}

// A malformed trace on standard input is named as such in the error,
// with the line at fault.
func TestRunTraceStdinMalformed(t *testing.T) {
	old := stdin
	t.Cleanup(func() { stdin = old })
	stdin = strings.NewReader(`{"timestamp": 0, "input_length": 600, "output_length": 20}` + "\nnot json\n")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-trace", "-", "-policies", "p2c"}, &out, &errb)
	if want := "llmlb-sim: -trace: standard input: sim: malformed trace: line 2: "; code != 2 || !strings.HasPrefix(errb.String(), want) {
		t.Errorf("exit %d, stderr %q; want 2 and %q", code, errb.String(), want)
	}
}
