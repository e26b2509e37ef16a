package main

import (
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmlb/llmlb/grpclb"
)

func TestMain(m *testing.M) {
	if _, err := grpclb.Register(grpclb.Options{Name: grpclb.DefaultName}); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

// TestRun runs the example's calls for a load-blind and a KV-aware policy
// and checks the split.
func TestRun(t *testing.T) {
	replicas, stop, err := startReplicas([]float64{0.2, 0.95, 0.2})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const calls = 90
	for _, tc := range []struct {
		cfg     string
		maxFull int64
	}{
		{`{"policy": "round-robin"}`, calls},
		{`{"policy": "least-kv"}`, calls / 6},
	} {
		for _, r := range replicas {
			r.calls.Store(0)
		}
		if err := run(tc.cfg, replicas, calls, 4); err != nil {
			t.Fatalf("%s: %v", tc.cfg, err)
		}
		var total int64
		for _, r := range replicas {
			total += r.calls.Load()
		}
		if total != calls {
			t.Errorf("%s: replicas saw %d calls, want %d", tc.cfg, total, calls)
		}
		if full := replicas[1].calls.Load(); full > tc.maxFull {
			t.Errorf("%s: the full replica got %d calls, want at most %d", tc.cfg, full, tc.maxFull)
		}
	}
}

// TestParsePolicies checks that -policies tolerates spaces after commas and
// rejects an unknown name before any policy runs.
func TestParsePolicies(t *testing.T) {
	cases := []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "round-robin,p2c-kv,least-kv,default", want: []string{"round-robin", "p2c-kv", "least-kv", "default"}},
		{list: "default, least-kv", want: []string{"default", "least-kv"}},
		{list: "default,", want: []string{"default"}},
		{list: "default,foo", wantErr: true},
		{list: " ", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.list, func(t *testing.T) {
			got, err := parsePolicies(c.list)
			if (err != nil) != c.wantErr {
				t.Fatalf("parsePolicies(%q) error = %v, want error %v", c.list, err, c.wantErr)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("parsePolicies(%q) = %q, want %q", c.list, got, c.want)
			}
		})
	}
}
