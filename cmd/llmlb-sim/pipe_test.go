//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A trace read from a named pipe is read once, for every rate scale of a
// sweep, and to tell a rate scale that spreads it too far from a malformed
// trace: the pipe's contents are gone, and opening it again waits for a
// writer that may never come. The command hung there; the test gives it
// 10s, then opens the pipe for writing to release it.
func TestRunTracePipeReadOnce(t *testing.T) {
	cases := []struct {
		name, trace string
		args        []string
		code        int
		want        string // in stderr
	}{
		// Spread beyond the limit at 1e-300, which the trace read at its
		// own rate tells from a malformed trace.
		{"spread", `{"timestamp": 0, "input_length": 5, "output_length": 1}` + "\n" + `{"timestamp": 1000, "input_length": 5, "output_length": 1}` + "\n",
			[]string{"-rate-scale", "1e-300"}, 2, "-rate-scale 1e-300 spreads the trace's arrivals beyond the simulator's limit: "},
		// Every point of a sweep runs the trace.
		{"sweep", `{"timestamp": 0, "input_length": 5, "output_length": 1}` + "\n" + `{"timestamp": 1000, "input_length": 5, "output_length": 1}` + "\n",
			[]string{"-sweep", "1,2"}, 0, ""},
		// Malformed at a rate scale above 1, which brings arrivals
		// closer: the trace fails at its own rate too. (Its last line
		// has no newline, so that the command reads to the end, after
		// the writer has gone.)
		{"malformed", `{"timestamp": 0, "input_length": 5, "output_length": 1}` + "\nnot json",
			[]string{"-rate-scale", "2"}, 2, "sim: malformed trace: line 2"},
		{"malformed in a sweep", `{"timestamp": 0, "input_length": 5, "output_length": 1}` + "\nnot json",
			[]string{"-sweep", "2,3"}, 2, "sim: malformed trace: line 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "trace.jsonl")
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Skipf("no named pipes: %v", err)
			}
			args := append([]string{"-trace", path, "-policies", "p2c"}, c.args...)
			var out, errb bytes.Buffer
			code := make(chan int, 1)
			go func() { code <- run(context.Background(), args, &out, &errb) }()
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteString(c.trace)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			var got int
			select {
			case got = <-code:
			case <-time.After(10 * time.Second):
				t.Errorf("%v: no exit after 10s: the command is opening the pipe again", args)
				for got == 0 {
					if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
						f.Close()
					}
					select {
					case got = <-code:
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			if got != c.code || !strings.Contains(errb.String(), c.want) {
				t.Errorf("%v: exit %d, stderr %q; want %d and %q", args, got, errb.String(), c.code, c.want)
			}
			if c.code == 0 && !strings.Contains(out.String(), "x2") {
				t.Errorf("%v: no table at rate scale 2 in\n%s", args, out.String())
			}
		})
	}
}

// An interrupt or SIGTERM cancels the run's context, naming the signal, so
// that the command stops and removes the outputs it created; a second one,
// for a run slow to stop, ends the process as the signal does by default.
// The test runs itself as that process.
func TestSignalCancelsThenExits(t *testing.T) {
	if os.Getenv("LLMLB_SIM_SIGNAL_CHILD") == "1" {
		ctx, stop := interruptContext()
		defer stop()
		os.Stdout.WriteString("ready\n")
		<-ctx.Done()
		os.Stdout.WriteString(context.Cause(ctx).Error() + "\n")
		select {} // a run that does not stop
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestSignalCancelsThenExits$")
			cmd.Env = append(os.Environ(), "LLMLB_SIM_SIGNAL_CHILD=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() {
				lines := bufio.NewScanner(out)
				for _, want := range []string{"ready", sig.String() + " signal received"} {
					if !lines.Scan() || lines.Text() != want {
						t.Errorf("child printed %q, want %q", lines.Text(), want)
						cmd.Process.Kill()
						break
					}
					cmd.Process.Signal(sig)
				}
				io.Copy(io.Discard, out)
				exited <- cmd.Wait()
			}()
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != sig {
					t.Errorf("child ended with %v; want killed by the second %v", err, sig)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("child still running 10s after the second %v", sig)
				cmd.Process.Kill()
				<-exited
			}
		})
	}
}
