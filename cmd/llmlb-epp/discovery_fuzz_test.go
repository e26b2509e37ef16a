package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzEndpointsFile: whatever an endpoints file holds, reading it returns an
// error or a sorted list of distinct replicas that each pass checkReplica,
// at most maxEndpoints of them, each written in the file.
func FuzzEndpointsFile(f *testing.F) {
	for _, s := range []string{
		"10.0.0.7:8000\n10.0.0.8:8000\n",
		byteOrderMark + "10.0.0.7:8000 # first\r\n\n# comment\n[fd00::7]:8000\n",
		"10.0.0.7:8000\n10.0.0.7:8000\n",
		"vllm:8000\n",
		"[10.0.0.1]:8000\n",
		"[fe80::1%eth0]:8000\n",
		"10.0.0.7:08000\n",
		"[::ffff:10.0.0.7]:8000\n",
		"10.0.0.7:0\n",
		"\x00\xff\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "endpoints")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		addrs, err := source{file: path}.load(context.Background())
		if err != nil {
			if addrs != nil {
				t.Fatalf("an error (%v) and replicas %q", err, addrs)
			}
			return
		}
		if len(addrs) > maxEndpoints || !slices.IsSorted(addrs) || len(slices.Compact(slices.Clone(addrs))) != len(addrs) {
			t.Fatalf("replicas %q: want at most %d, sorted and distinct", addrs, maxEndpoints)
		}
		for _, a := range addrs {
			if err := checkReplica(a); err != nil {
				t.Fatalf("replica %q returned: %v", a, err)
			}
			if !bytes.Contains(data, []byte(a)) {
				t.Fatalf("replica %q is not in the file", a)
			}
		}
	})
}
