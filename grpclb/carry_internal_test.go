package grpclb

import (
	"testing"

	"github.com/llmlb/llmlb"
)

// TestCarrier follows the RPCs of one endpoint across two replacements of
// a channel's balancer: each balancer in turn counts them from the time
// the endpoint is its member, an RPC picked with the old picker after a
// replacement included, and none is counted at another endpoint; the
// replaced balancer's placeholders end; each RPC's end takes one away;
// closing the channel ends the placeholders left.
func TestCarrier(t *testing.T) {
	newLB := func() *llmlb.Balancer {
		t.Helper()
		lb, err := llmlb.New(llmlb.LeastOutstanding())
		if err != nil {
			t.Fatal(err)
		}
		return lb
	}
	eps := []llmlb.Endpoint{keyEndpoint("a"), keyEndpoint("b"), keyEndpoint("c")}
	outstanding := func(lb *llmlb.Balancer) map[string]int64 {
		m := map[string]int64{}
		for _, s := range lb.Stats() {
			m[s.Key] = s.Outstanding
		}
		return m
	}
	check := func(what string, lb *llmlb.Balancer, a int64) {
		t.Helper()
		got := outstanding(lb)
		if got["a"] != a || got["b"] != 0 || got["c"] != 0 {
			t.Errorf("%s: outstanding %v, want a: %d and none elsewhere", what, got, a)
		}
	}

	var c carrier
	lb1, lb2, lb3 := newLB(), newLB(), newLB()
	c.replace(lb1, nil)
	r1 := &rpcCount{key: "a", carry: &c}
	r1.picked()
	r1.picked()
	r1.picked()
	r1.done(nil) // ends on lb1: nothing carried

	c.replace(lb2, map[string]*rpcCount{"a": r1})
	if err := lb2.Update(eps); err != nil {
		t.Fatal(err)
	}
	check("before the membership reaches the carrier", lb2, 0)
	c.adopt(lb2, eps)
	check("carried to the new balancer", lb2, 2)
	r1.picked() // with the replaced balancer's picker, after the replacement
	check("picked with the old picker", lb2, 3)
	r1.done(nil)
	check("one ended", lb2, 2)

	// The endpoint is unhealthy in the next balancer: its carried RPCs
	// count there all the same.
	r2 := &rpcCount{key: "a", carry: &c}
	r2.picked()
	c.replace(lb3, map[string]*rpcCount{"a": r2})
	check("the replaced balancer's placeholders ended", lb2, 0)
	if err := lb3.Update(eps); err != nil {
		t.Fatal(err)
	}
	if err := lb3.SetHealthy("a", false); err != nil {
		t.Fatal(err)
	}
	c.adopt(lb3, eps)
	check("carried from both replaced balancers", lb3, 3)
	r2.done(nil)
	r1.done(nil)
	check("two ended", lb3, 1)

	c.close()
	check("closed", lb3, 0)
	r1.done(nil) // after the channel closed: nothing left to end
	if len(c.keys) != 0 {
		t.Errorf("the closed carrier holds %v", c.keys)
	}
	if n := r1.n.Load() &^ replacedBit; n != 0 {
		t.Errorf("the first balancer counts %d RPCs after all ended, want 0", n)
	}
}
