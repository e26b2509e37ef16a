package llmlb

import "testing"

// TestActiveBlocksLongPrefixBounded: a request whose Prefix is longer than
// maxActiveHashes has its hashes beyond that counted as
// private blocks, so that the work and memory it costs under the lock every
// pick shares are bounded, and its blocks are counted all the same.
func TestActiveBlocksLongPrefixBounded(t *testing.T) {
	a, err := NewActiveBlocks(16)
	if err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	long := make([]uint64, n)
	for i := range long {
		long[i] = uint64(i + 1)
	}
	r := &Request{PromptTokens: 16 * n, Prefix: long}
	most := maxActiveHashes
	h := a.hold("ep0", r)
	if got := len(h.hashed); got != most {
		t.Fatalf("the hold keeps %d hashes, want %d", got, most)
	}
	if got := len(a.eps["ep0"].refs); got != most {
		t.Fatalf("the endpoint's set holds %d hashes, want %d", got, most)
	}
	if got := a.Blocks("ep0"); got != n {
		t.Fatalf("Blocks = %d, want the request's %d", got, n)
	}
	if active, added := a.Potential("ep1", r); active != 0 || added != n {
		t.Fatalf("Potential at an idle endpoint = %d, %d; want 0, %d", active, added, n)
	}
	h.drop()
	if got := a.Blocks("ep0"); got != 0 {
		t.Fatalf("Blocks = %d after the request ended, want 0", got)
	}
}
