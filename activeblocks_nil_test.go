package llmlb

import "testing"

// TestActiveBlocksPotentialOfNilRequest checks that Potential treats a nil
// request as one with no prompt, as the rest of the package treats a nil
// *Request, instead of panicking.
func TestActiveBlocksPotentialOfNilRequest(t *testing.T) {
	a, err := NewActiveBlocks(16)
	if err != nil {
		t.Fatal(err)
	}
	if active, added := a.Potential("ep0", nil); active != 0 || added != 0 {
		t.Fatalf("Potential of a nil request on an idle endpoint = %d, %d; want 0, 0", active, added)
	}
	h := a.hold("ep0", &Request{PromptTokens: 48, Prefix: []uint64{1, 2}})
	defer h.drop()
	if active, added := a.Potential("ep0", nil); active != 3 || added != 0 {
		t.Fatalf("Potential of a nil request beside 3 active blocks = %d, %d; want 3, 0", active, added)
	}
}
