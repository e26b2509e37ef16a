package prefix

import (
	"errors"
	"testing"
	"time"
)

// TestUnrecord: Unrecord takes back the blocks a Record at a time placed,
// but not those that a later Record touched too (a request with the same
// prefix sent to the same endpoint), within the TTL/64 that keeps their
// expiry or beyond it, nor those an engine event reported, nor another
// endpoint's.
func TestUnrecord(t *testing.T) {
	ttl := 64 * time.Second // TTL/64 = 1s
	p := chainOf(1, 8)
	for _, tc := range []struct {
		name  string
		after func(x *Index) // between the Record at t0 and its Unrecord
		want  int            // blocks of p matched at "a" after the Unrecord
	}{
		{"alone", func(*Index) {}, 0},
		{"same prompt again, at once", func(x *Index) { must(t, x.Record("a", p, t0)) }, 8},
		{"same prompt twice again, the second skipped", func(x *Index) {
			must(t, x.Record("a", p, t0))
			must(t, x.Record("a", p, t0))
		}, 8},
		{"same prompt twice again, with another between", func(x *Index) {
			must(t, x.Record("a", p, t0))
			must(t, x.Record("a", chainOf(9, 3), t0))
			must(t, x.Record("a", p, t0))
		}, 8},
		{"a shorter prompt of the prefix", func(x *Index) { must(t, x.Record("a", p[:5], t0.Add(time.Millisecond))) }, 5},
		{"a longer prompt of the prefix", func(x *Index) {
			must(t, x.Record("a", append(p[:8:8], chainOf(7, 2)...), t0.Add(time.Millisecond)))
		}, 8},
		{"same prompt again, later, new expiry", func(x *Index) { must(t, x.Record("a", p, t0.Add(2*time.Second))) }, 8},
		{"reported by the engine", func(x *Index) { must(t, x.Stored("a", x.BlockSize(), p[:3]...)) }, 3},
		{"another endpoint", func(x *Index) { must(t, x.Record("b", p, t0)) }, 0},
		{"the blocks removed and recorded again", func(x *Index) {
			must(t, x.Removed("a", x.BlockSize(), p...))
			must(t, x.Record("a", p, t0))
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := mustIndex(t, IndexConfig{TTL: ttl})
			must(t, x.Record("a", p, t0))
			tc.after(x)
			must(t, x.Unrecord("a", p, t0))
			if got := x.MatchLen("a", p, t0.Add(time.Millisecond)); got != tc.want {
				t.Fatalf("after Unrecord, a matches %d blocks, want %d", got, tc.want)
			}
			if tc.want == 0 && x.Len("a") != 0 {
				t.Fatalf("after Unrecord, a holds %d blocks, want none", x.Len("a"))
			}
			checkInvariants(t, x)
		})
	}
}

// TestUnrecordOnlyItsTime: an Unrecord at another time than the Record's,
// of an unknown endpoint or at a time the index cannot place removes
// nothing; the last is an error, as for Record.
func TestUnrecordOnlyItsTime(t *testing.T) {
	x := mustIndex(t, IndexConfig{})
	p := chainOf(1, 4)
	must(t, x.Record("a", p, t0))
	must(t, x.Unrecord("a", p, t0.Add(time.Nanosecond)))
	must(t, x.Unrecord("b", p, t0))
	if err := x.Unrecord("a", p, time.Time{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Unrecord at the zero time = %v, want ErrInvalidArgument", err)
	}
	if got := x.MatchLen("a", p, t0); got != 4 {
		t.Fatalf("a matches %d blocks, want 4", got)
	}
}
