package prefix

import (
	"errors"
	"maps"
	"math"
	"testing"
	"time"
)

// unplaceable are times before the earliest Unix nanoseconds an int64
// holds, which the index cannot place: the zero time.Time above all, what
// a clock returns before it is set.
var unplaceable = []time.Time{{}, time.Unix(-1<<40, 0), time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, math.MinInt64)}

// TestRecordAtZeroTime checks that a Record at the zero time, or any time
// the index cannot place, is refused and changes nothing: such a Record
// used to add blocks already expired for every real time, evicting live
// blocks to make room for them.
func TestRecordAtZeroTime(t *testing.T) {
	for _, at := range unplaceable {
		x := mustIndex(t, IndexConfig{TTL: time.Minute, Capacity: 4})
		live := chainOf(1, 4)
		must(t, x.Record("a", live, t0))
		if err := x.Record("a", chainOf(2, 4), at); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Record at %v: %v, want ErrInvalidArgument", at, err)
		}
		if got := x.MatchLen("a", live, t0); got != 4 {
			t.Errorf("after a Record at %v: the live blocks match %d, want 4", at, got)
		}
		if err := x.Record("b", chainOf(2, 4), at); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Record of a new endpoint at %v: %v, want ErrInvalidArgument", at, err)
		}
		if x.Capacity("b") != 0 {
			t.Errorf("a Record at %v added its endpoint", at)
		}
		if got := x.Records(); got != 1 {
			t.Errorf("Records() = %d after one Record and two refused, want 1", got)
		}
		ev := mustIndex(t, IndexConfig{EventsOnly: true})
		if err := ev.Record("a", live, at); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("events-only index: Record at %v: %v, want ErrInvalidArgument", at, err)
		}
		checkInvariants(t, x)
	}
}

// TestMatchAtZeroTime checks that a Match or MatchLen at a time the index
// cannot place finds only the blocks engine events reported, which never
// expire: recorded blocks used to match there however long ago they
// expired.
func TestMatchAtZeroTime(t *testing.T) {
	x := mustIndex(t, IndexConfig{TTL: time.Minute})
	p := chainOf(1, 4)
	must(t, x.Record("recorded", p, t0))
	must(t, x.Stored("stored", x.BlockSize(), p[:3]...))
	want := map[string]int{"stored": 3}
	if got := asMap(t, x.Match(p, t0.Add(time.Hour), nil)); !maps.Equal(got, want) {
		t.Fatalf("an hour later: Match = %v, want %v", got, want)
	}
	for _, at := range unplaceable {
		if got := asMap(t, x.Match(p, at, nil)); !maps.Equal(got, want) {
			t.Errorf("Match at %v = %v, want %v", at, got, want)
		}
		if got := x.MatchLen("recorded", p, at); got != 0 {
			t.Errorf("MatchLen(recorded) at %v = %d, want 0", at, got)
		}
		if got := x.MatchLen("stored", p, at); got != 3 {
			t.Errorf("MatchLen(stored) at %v = %d, want 3", at, got)
		}
	}
}
