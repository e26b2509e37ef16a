package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/llmlb/llmlb/internal/sim"
)

// maxTraceBytes bounds the trace the command reads. The command holds
// only the requests it keeps (all of them without -requests), not the
// trace's bytes.
const maxTraceBytes = 1 << 30

// readTrace reads the trace at path, or stdin if path is "-", as scanFile
// does with limit maxTraceBytes, and returns ctx's cause if ctx ends
// first: opening a named pipe or reading a pipe or terminal can wait for a
// writer indefinitely, and an interrupt must still stop the command. The
// abandoned read ends with its input, or with the process.
func readTrace(ctx context.Context, path, format string, requests int) (*sim.Trace, string, error) {
	type result struct {
		trace  *sim.Trace
		format string
		err    error
	}
	done := make(chan result, 1)
	in := stdin
	go func() {
		tr, format, err := scanFile(path, in, maxTraceBytes, format, requests)
		done <- result{tr, format, err}
	}()
	select {
	case r := <-done:
		return r.trace, r.format, r.err
	case <-ctx.Done():
		return nil, "", context.Cause(ctx)
	}
}

// scanFile reads the trace file at path, or in if path is "-", of at most
// limit bytes, in format (detected from its first bytes if empty), keeping
// its first requests arrivals (0 keeps all), and returns it and its
// format. It reads the trace once, as it streams in, holding only the
// arrivals it keeps, but it reports the errors that reading the whole
// trace before parsing it would, in that order. A path that cannot be
// opened or is a directory, or a trace longer than limit, is a usage
// error; a read error is reported as such, not as a malformed trace; and
// only a trace read whole can be malformed.
func scanFile(path string, in io.Reader, limit int64, format string, requests int) (*sim.Trace, string, error) {
	name := path
	r := in
	if path == "-" {
		name = "standard input"
	} else {
		fi, err := os.Stat(path)
		if err != nil {
			return nil, "", usageError{fmt.Errorf("-trace: %w", err)}
		}
		if fi.IsDir() {
			return nil, "", usageError{fmt.Errorf("-trace %s is a directory", path)}
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, "", usageError{fmt.Errorf("-trace: %w", err)}
		}
		defer f.Close()
		if fi.Mode().IsRegular() && fi.Size() > limit {
			return nil, "", tooLong(name, limit) // without reading what would be refused
		}
		r = f
	}
	cr := &countingReader{r: io.LimitReader(r, limit+1)}
	br := bufio.NewReader(cr)
	if format == "" {
		head, _ := br.Peek(64)
		format = sim.DetectFormat(head)
	}
	tr, err := sim.ScanTrace(br, format, requests)
	if cr.err == nil {
		// A malformed line stops the scan; what follows it may still
		// make the trace too long or fail to read.
		_, _ = io.Copy(io.Discard, cr)
	}
	switch {
	case cr.err != nil && path == "-":
		return nil, "", fmt.Errorf("-trace: standard input: %w", cr.err)
	case cr.err != nil:
		return nil, "", fmt.Errorf("-trace: %w", cr.err)
	case cr.n > limit:
		return nil, "", tooLong(name, limit)
	case err != nil:
		return nil, "", traceError(path, err)
	}
	return tr, format, nil
}

// tooLong is the error for a trace, named name, longer than limit bytes.
func tooLong(name string, limit int64) error {
	return usageError{fmt.Errorf("-trace: %s is longer than the simulator's limit of %d bytes: replay a part of it", name, limit)}
}

// traceError names the trace at path ("-" for standard input) in err, an
// error of package sim reading or replaying it.
func traceError(path string, err error) error {
	if path == "-" {
		path = "-trace: standard input"
	}
	return fmt.Errorf("%s: %w", path, err)
}

// countingReader counts the bytes read from r and keeps the first error
// other than io.EOF, which a reader of it may not pass on.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}
