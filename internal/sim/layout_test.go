package sim

import (
	"testing"
	"unsafe"
)

// TestReqStateLines checks that in a large slice of reqStates, as the
// runner keeps, every request's Sequence starts a cache line, so that the
// progress an engine reads at every iteration takes one line.
func TestReqStateLines(t *testing.T) {
	if size := unsafe.Sizeof(reqState{}); size%64 != 0 {
		t.Errorf("reqState takes %d bytes, not a whole number of 64-byte lines", size)
	}
	st := make([]reqState, 1000)
	for _, i := range []int{0, 1, 2, 3, 999} {
		if at := uintptr(unsafe.Pointer(&st[i].Sequence)); at%64 != 0 {
			t.Errorf("the Sequence of reqState %d is at %#x, not at the start of a line", i, at)
		}
	}
}
