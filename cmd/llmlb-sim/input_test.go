package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/llmlb/llmlb/internal/sim"
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

// A trace longer than the limit is refused, naming the limit, whatever
// its first limit bytes hold, as when the command read a trace whole
// before parsing it; one at the limit is read.
func TestScanFileLimit(t *testing.T) {
	const line = `{"timestamp": 0, "input_length": 5, "output_length": 1}` + "\n"
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(line+line), 0o600); err != nil {
		t.Fatal(err)
	}
	limit := int64(2 * len(line))
	if tr, format, err := scanFile(path, nil, limit, "", 0); err != nil || format != "mooncake" {
		t.Errorf("at the limit: format %q, %v; want the trace", format, err)
	} else if reqs, err := tr.Requests(1); err != nil || len(reqs) != 2 {
		t.Errorf("at the limit: %d requests, %v; want 2", len(reqs), err)
	}
	for _, requests := range []int{0, 1} {
		_, _, err := scanFile(path, nil, limit-1, "", requests)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), fmt.Sprintf("-trace: %s is longer than the simulator's limit of %d bytes", path, limit-1)) {
			t.Errorf("-requests %d, above the limit: %v; want a usage error naming the limit", requests, err)
		}
	}

	// Too long wins over a malformed line within the limit, and over one
	// cut by it.
	for _, in := range []string{"not json\n" + line + line, line + line + "x"} {
		_, _, err := scanFile("-", strings.NewReader(in), limit, "mooncake", 1)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("-trace: standard input is longer than the simulator's limit of %d bytes", limit)) {
			t.Errorf("%q on standard input above the limit: %v; want an error naming the limit", in, err)
		}
	}
}

// A read error is reported as such, even after a malformed line, and not
// as a malformed trace.
func TestScanFileReadError(t *testing.T) {
	broken := errors.New("device gone")
	in := io.MultiReader(strings.NewReader("not json\n"), iotest.ErrReader(broken))
	_, _, err := scanFile("-", in, 1<<20, "", 1)
	if !errors.Is(err, broken) || errors.Is(err, sim.ErrMalformedTrace) || err.Error() != "-trace: standard input: device gone" {
		t.Errorf("error %v; want the read error", err)
	}
}

// manyLines is a Mooncake trace of n lines, the later ones earlier, made
// as it is read; it calls sample every n/10 lines.
type manyLines struct {
	n, i   int
	buf    []byte
	sample func()
}

func (m *manyLines) Read(p []byte) (int, error) {
	for len(m.buf) == 0 {
		if m.i == m.n {
			return 0, io.EOF
		}
		if m.i%(m.n/10) == 0 {
			m.sample()
		}
		m.buf = fmt.Appendf(m.buf, `{"timestamp": %d, "input_length": 600, "output_length": 20, "hash_ids": [%d, 7]}`+"\n", m.n-m.i, m.i)
		m.i++
	}
	n := copy(p, m.buf)
	m.buf = m.buf[n:]
	return n, nil
}

// The command reads a trace as it streams in, holding only the requests
// it keeps: 100,000 lines (8 MB) on standard input with -requests 10 keep
// the live heap within 1 MiB of where it started, and it keeps the last 10
// lines, the earliest. Reading the trace whole first held all of it, and
// then every request.
func TestScanFileBoundsMemory(t *testing.T) {
	const lines, limit = 100_000, 10
	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := live()
	var peak uint64
	in := &manyLines{n: lines, sample: func() { peak = max(peak, live()) }}
	tr, _, err := scanFile("-", in, maxTraceBytes, "", limit)
	if err != nil {
		t.Fatal(err)
	}
	peak = max(peak, live())
	if grew := int64(peak) - int64(base); grew > 1<<20 {
		t.Errorf("live heap grew by %d bytes reading %d lines with -requests %d, want at most 1 MiB", grew, lines, limit)
	}
	reqs, err := tr.Requests(1)
	if err != nil || len(reqs) != limit || reqs[limit-1].Arrival != (limit-1)*time.Millisecond {
		t.Errorf("%d requests, %v; want the %d earliest, 1ms apart", len(reqs), err, limit)
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
