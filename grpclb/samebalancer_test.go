package grpclb

import (
	"testing"

	"github.com/llmlb/llmlb/prefix"
)

// TestSameBalancer: configs that build the same balancer (parameters set
// to their defaults or left out, a slow-start ramp without a window,
// out-of-band reporting) keep the channel's balancer; any parameter that
// changes what it builds replaces it.
func TestSameBalancer(t *testing.T) {
	ix, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	events, err := prefix.NewIndex(prefix.IndexConfig{BlockSize: 64, EventsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		a, b          string
		index, events *prefix.Index
		same          bool
	}{
		{name: "identical", a: `{"policy": "p2c", "score": "kv"}`, b: `{"score": "kv", "policy": "p2c"}`, same: true},
		{name: "default policy named", a: `{}`, b: `{"policy": "default"}`, same: true},
		{name: "oob interval", a: `{"policy": "round-robin"}`, b: `{"policy": "round-robin", "oobReportInterval": "1s"}`, same: true},
		{name: "default score", a: `{"policy": "p2c"}`, b: `{"policy": "p2c", "score": "requests"}`, same: true},
		{name: "default allowance and age", a: `{"policy": "least-outstanding"}`,
			b: `{"policy": "least-outstanding", "decodeAllowance": 256, "maxSignalAge": "10s"}`, same: true},
		{name: "default bias", a: `{"policy": "weighted-least-request"}`, b: `{"policy": "weighted-least-request", "bias": 1.0}`, same: true},
		{name: "default ring", a: `{"policy": "consistent-hash"}`,
			b: `{"policy": "consistent-hash", "hashBalance": 1.25, "ringReplicas": 160}`, same: true},
		{name: "default prefix hash", a: `{"policy": "prefix-hash"}`,
			b: `{"policy": "prefix-hash", "prefixTokens": 256, "loadFactor": 1.25, "blockTokens": 16}`, same: true},
		{name: "default thresholds", a: `{"policy": "prefix-aware"}`,
			b: `{"policy": "prefix-aware", "absThreshold": 64, "relThreshold": 1.5, "matchThreshold": 0.3, "blockTokens": 16}`, same: true},
		{name: "block size of the builder's index", a: `{"policy": "prefix-aware"}`, b: `{"policy": "prefix-aware", "blockTokens": 32}`,
			index: ix, same: true},
		{name: "dynamo-kv reads the events index", a: `{"policy": "dynamo-kv"}`, b: `{"policy": "dynamo-kv", "blockTokens": 64}`,
			events: events, same: true},
		{name: "default peak decay", a: `{"policy": "peak-ewma"}`, b: `{"policy": "peak-ewma", "peakDecay": "10s"}`, same: true},
		{name: "ramp without a window", a: `{"policy": "round-robin"}`, b: `{"policy": "round-robin", "slowStartAggression": 2}`, same: true},

		{name: "policy", a: `{"policy": "least-outstanding"}`, b: `{"policy": "round-robin"}`},
		{name: "score", a: `{"policy": "p2c"}`, b: `{"policy": "p2c", "score": "kv"}`},
		{name: "allowance", a: `{"policy": "p2c"}`, b: `{"policy": "p2c", "decodeAllowance": 128}`},
		{name: "signal age", a: `{"policy": "p2c"}`, b: `{"policy": "p2c", "maxSignalAge": "5s"}`},
		{name: "slow start", a: `{"policy": "p2c"}`, b: `{"policy": "p2c", "slowStartWindow": "30s"}`},
		{name: "ramp", a: `{"policy": "p2c", "slowStartWindow": "30s"}`, b: `{"policy": "p2c", "slowStartWindow": "30s", "slowStartAggression": 2}`},
		{name: "block size", a: `{"policy": "prefix-aware"}`, b: `{"policy": "prefix-aware", "blockTokens": 32}`},
		{name: "default weights", a: `{}`, b: `{"cacheWeight": 2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := parseConfig([]byte(tc.a), tc.index, tc.events)
			if err != nil {
				t.Fatal(err)
			}
			b, err := parseConfig([]byte(tc.b), tc.index, tc.events)
			if err != nil {
				t.Fatal(err)
			}
			if got := a.sameBalancer(b); got != tc.same {
				t.Errorf("sameBalancer(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.same)
			}
			if got := b.sameBalancer(a); got != tc.same {
				t.Errorf("sameBalancer(%s, %s) = %v, want %v", tc.b, tc.a, got, tc.same)
			}
		})
	}
}

// TestSameBalancerIgnoresUnreadFields: a Config built in Go may carry
// parameters its policy does not read; they build nothing.
func TestSameBalancerIgnoresUnreadFields(t *testing.T) {
	a := &Config{Policy: "round-robin"}
	b := &Config{Policy: "round-robin", Score: "kv", HashBalance: 2, CacheWeight: 3}
	if !a.sameBalancer(b) || !b.sameBalancer(a) {
		t.Error("parameters round-robin does not read replaced its balancer")
	}
	if c := (&Config{Policy: "p2c", Score: "kv"}); a.sameBalancer(c) {
		t.Error("a change of policy kept the balancer")
	}
}
