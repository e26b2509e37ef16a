package prefix

import (
	"errors"
	"testing"
)

// TestRecordsCountsOnlyRecorded: Records counts the Record calls that
// recorded blocks, not those refused for too many endpoints or an empty key,
// those without blocks, or those of an events-only index.
func TestRecordsCountsOnlyRecorded(t *testing.T) {
	x := mustIndex(t, IndexConfig{MaxEndpoints: 1})
	must(t, x.Record("a", chainOf(1, 2), t0))
	if err := x.Record("b", chainOf(1, 2), t0); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("Record on a second endpoint: %v, want ErrTooManyEndpoints", err)
	}
	if err := x.Record("", chainOf(1, 2), t0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Record with an empty key: %v, want ErrInvalidArgument", err)
	}
	must(t, x.Record("a", nil, t0))
	must(t, x.Stored("a", x.BlockSize(), chainOf(9, 2)...))
	must(t, x.Record("a", chainOf(5, 1), t0))
	if got := x.Records(); got != 2 {
		t.Fatalf("Records() = %d, want 2", got)
	}

	ev := mustIndex(t, IndexConfig{EventsOnly: true})
	must(t, ev.Record("a", chainOf(1, 2), t0))
	if got := ev.Records(); got != 0 {
		t.Fatalf("events-only index: Records() = %d, want 0", got)
	}
}
