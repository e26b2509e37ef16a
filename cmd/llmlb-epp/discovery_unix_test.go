//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFileSourceNamedPipe: an endpoints file that is a named pipe (a shell's
// process substitution, -endpoints-file <(...)) is refused at once, not
// waited on for a writer: a read that blocks for ever would freeze the
// replicas without a word and keep the picker from stopping.
func TestFileSourceNamedPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	m := newMembership(t, source{file: path})
	done := make(chan error, 1)
	go func() { done <- m.refresh(context.Background()) }()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "not a regular file")
	case <-time.After(5 * time.Second):
		// Release the reader blocked in open, so that the test ends.
		if w, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			_ = w.Close()
		}
		<-done
		t.Fatal("reading a named pipe blocked")
	}
}
