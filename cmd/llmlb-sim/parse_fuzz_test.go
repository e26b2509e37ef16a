package main

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/sim"
)

// The parsers of the list flags never panic, and what they accept is in
// range.

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
		for i, x := range got {
			if !(x > 0) || math.IsInf(x, 0) || i > 0 && x <= got[i-1] {
				t.Fatalf("parseSweep(%q) = %v", list, got)
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
		for i, n := range got {
			if n < 1 || n >= replicas || slices.Contains(got[:i], n) {
				t.Fatalf("parsePrefill(%q, %d) = %v", list, replicas, got)
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
		for i, k := range got {
			if slices.Contains(got[:i], k) {
				t.Fatalf("parseOutputs(%q) = %v", list, got)
			}
		}
	})
}

func FuzzDurationFlag(f *testing.F) {
	for _, s := range []string{"2s", "500ms", "2", "soon", "9999999h", "-1s", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var d time.Duration
		var bad error
		if err := (durationFlag{name: "x", d: &d, bad: &bad}).Set(s); err != nil {
			if bad == nil {
				t.Fatalf("Set(%q) failed without recording the error", s)
			}
			return
		}
		if want, err := time.ParseDuration(s); err != nil || d != want {
			t.Fatalf("Set(%q) set %v", s, d)
		}
	})
}
