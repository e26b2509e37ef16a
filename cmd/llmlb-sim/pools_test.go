package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/sim"
)

func TestPoolScenarios(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-scenario", "spill", "-seed", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"scenario spill:", "seed 2", "spill to provider", "\nCompare first"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"-scenario", "providers", "-requests", "5"}, &out, &errb); code != 2 {
		t.Errorf("-requests with a pool scenario: exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), "takes only -seed and -seeds") {
		t.Errorf("-requests with a pool scenario: %q", errb.String())
	}

	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"-h"}, &out, &errb); code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
	for _, s := range sim.PoolScenarios() {
		if !strings.Contains(errb.String(), s.Name) {
			t.Errorf("help lacks scenario %q", s.Name)
		}
	}
}
