package model

import (
	"testing"
	"unsafe"
)

// TestSequenceProgressLine checks that the progress of a Sequence that every
// iteration reads, and ID, fit in its first cache line.
func TestSequenceProgressLine(t *testing.T) {
	var s Sequence
	for _, f := range []struct {
		name string
		end  uintptr
	}{
		{"state", unsafe.Offsetof(s.state) + unsafe.Sizeof(s.state)},
		{"private", unsafe.Offsetof(s.private) + unsafe.Sizeof(s.private)},
		{"shared", unsafe.Offsetof(s.shared) + unsafe.Sizeof(s.shared)},
		{"target", unsafe.Offsetof(s.target) + unsafe.Sizeof(s.target)},
		{"computed", unsafe.Offsetof(s.computed) + unsafe.Sizeof(s.computed)},
		{"decoded", unsafe.Offsetof(s.decoded) + unsafe.Sizeof(s.decoded)},
		{"generated", unsafe.Offsetof(s.generated) + unsafe.Sizeof(s.generated)},
		{"output", unsafe.Offsetof(s.output) + unsafe.Sizeof(s.output)},
		{"ID", unsafe.Offsetof(s.ID) + unsafe.Sizeof(s.ID)},
	} {
		if f.end > 64 {
			t.Errorf("Sequence.%s ends at byte %d, beyond the first cache line", f.name, f.end)
		}
	}
}
