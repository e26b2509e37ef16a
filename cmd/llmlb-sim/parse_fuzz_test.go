package main

import (
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/sim"
)

// The parsers of the list flags never panic, and what they accept is in
// range and is what the list says, in its order.

func FuzzParseSpeeds(f *testing.F) {
	for _, s := range []string{"1,1,0.5,0.5", "2x1,6x0.5", " 2 x 1 , 0.25 ", "0x1", "1e-300", "4096x1", "x", "1,,1", "NaN"} {
		f.Add(s, 4)
	}
	f.Fuzz(func(t *testing.T, list string, replicas int) {
		got, err := parseSpeeds(list, replicas)
		if err != nil {
			return
		}
		if len(got) != replicas {
			t.Fatalf("parseSpeeds(%q, %d) = %d speeds", list, replicas, len(got))
		}
		for _, v := range got {
			if !(v >= sim.MinSpeed && v <= sim.MaxSpeed) {
				t.Fatalf("parseSpeeds(%q, %d) accepted speed %v", list, replicas, v)
			}
		}
	})
}

func FuzzParseSweep(f *testing.F) {
	for _, s := range []string{"0.5,0.75,1,1.25,1.5", "1,1", "1,0.5", "", "1,,2", "Inf", "1e-300,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		got, err := parseSweep(list)
		if err != nil {
			return
		}
		if len(got) == 0 || len(got) > maxSweepPoints {
			t.Fatalf("parseSweep(%q) = %d rate scales", list, len(got))
		}
		parts := strings.Split(list, ",")
		if len(got) != len(parts) {
			t.Fatalf("parseSweep(%q) = %d rate scales for %d listed", list, len(got), len(parts))
		}
		for i, x := range got {
			if !(x > 0) || math.IsInf(x, 0) || i > 0 && x <= got[i-1] {
				t.Fatalf("parseSweep(%q) = %v", list, got)
			}
			// Each scale is the number listed in its place.
			if want, err := strconv.ParseFloat(strings.TrimSpace(parts[i]), 64); err != nil || x != want {
				t.Fatalf("parseSweep(%q) = %v: scale %d is not %q", list, got, i, parts[i])
			}
		}
	})
}

func FuzzParsePrefill(f *testing.F) {
	for _, s := range []string{"2,3", "0", "2,2", "", "two", "-1"} {
		f.Add(s, 8)
	}
	f.Fuzz(func(t *testing.T, list string, replicas int) {
		got, err := parsePrefill(list, replicas)
		if err != nil {
			return
		}
		parts := strings.Split(list, ",")
		if len(got) != len(parts) {
			t.Fatalf("parsePrefill(%q, %d) = %d counts for %d listed", list, replicas, len(got), len(parts))
		}
		for i, n := range got {
			if n < 1 || n >= replicas || slices.Contains(got[:i], n) {
				t.Fatalf("parsePrefill(%q, %d) = %v", list, replicas, got)
			}
			// Each count is the number listed in its place.
			if want, err := strconv.Atoi(strings.TrimSpace(parts[i])); err != nil || n != want {
				t.Fatalf("parsePrefill(%q, %d) = %v: count %d is not %q", list, replicas, got, i, parts[i])
			}
		}
	})
}

func FuzzParseOutputs(f *testing.F) {
	for _, s := range []string{"allowance,predict,true", "true,true", "predict,", "", "oracle"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		got, err := parseOutputs(list)
		if err != nil {
			return
		}
		parts := strings.Split(list, ",")
		if len(got) != len(parts) {
			t.Fatalf("parseOutputs(%q) = %d kinds for %d listed", list, len(got), len(parts))
		}
		for i, k := range got {
			if slices.Contains(got[:i], k) {
				t.Fatalf("parseOutputs(%q) = %v", list, got)
			}
			// Each kind is the one named in its place.
			if k.String() != strings.TrimSpace(parts[i]) {
				t.Fatalf("parseOutputs(%q) = %v: kind %d is not %q", list, got, i, parts[i])
			}
		}
	})
}

// A duration flag reports a duration beyond time.Duration's range as out
// of range, and nothing else: checked against an exact evaluation of the
// duration's text.
func FuzzDurationFlag(f *testing.F) {
	for _, s := range []string{"2s", "500ms", "2", "soon", "9999999h", "-1s", "", "-9223372036854775809ns",
		"2562047h47m16.854775807s", "2562047h47m16.854775808s", "1.5h30m", ".5µs", "99999999999999999999us", "1e10s", "9h9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var d time.Duration
		var bad error
		err := (durationFlag{name: "x", d: &d, min: time.Millisecond, max: time.Minute, bad: &bad}).Set(s)
		if err == nil {
			if want, err := time.ParseDuration(s); err != nil || d != want {
				t.Fatalf("Set(%q) set %v", s, d)
			}
			return
		}
		if bad == nil {
			t.Fatalf("Set(%q) failed without recording the error", s)
		}
		ns, ok := durationNanos(s)
		// Within a microsecond of the limit, the rounding of fractions
		// decides; elsewhere the exact value does.
		limit := new(big.Rat).SetInt64(math.MaxInt64)
		over := ok && ns.Cmp(new(big.Rat).Add(limit, big.NewRat(1000, 1))) > 0
		under := !ok || ns.Cmp(new(big.Rat).Sub(limit, big.NewRat(1000, 1))) < 0
		switch outOfRange := strings.Contains(bad.Error(), "out of range: want a duration from 1ms to 1m"); {
		case outOfRange && !ok:
			t.Fatalf("Set(%q): %v, but it is no duration", s, bad)
		case outOfRange && under:
			t.Fatalf("Set(%q): %v, but it is in range (%v ns)", s, bad, ns.FloatString(0))
		case !outOfRange && over:
			t.Fatalf("Set(%q): %v, but it is out of range (%v ns)", s, bad, ns.FloatString(0))
		}
	})
}

// durationPart is one number and unit of a duration as
// time.ParseDuration reads it; durationSyntax the whole of one.
var (
	durationPart   = regexp.MustCompile(`([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)`)
	durationSyntax = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)
)

// durationNanos returns the exact magnitude in nanoseconds of s, a
// duration in time.ParseDuration's syntax, or false if s is not one.
func durationNanos(s string) (*big.Rat, bool) {
	if !durationSyntax.MatchString(s) {
		return nil, false
	}
	unit := map[string]int64{"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
	sum := new(big.Rat)
	for _, m := range durationPart.FindAllStringSubmatch(s, -1) {
		v, ok := new(big.Rat).SetString("0" + m[1] + "." + m[2] + "0")
		if !ok {
			return nil, false
		}
		sum.Add(sum, v.Mul(v, new(big.Rat).SetInt64(unit[m[3]])))
	}
	return sum, true
}
