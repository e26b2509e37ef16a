package extproc

import (
	"context"
	"errors"
	"testing"

	"github.com/llmlb/llmlb"
)

// TestHostOf: a subset hint names a host with or without its port, and an
// IPv6 host with or without brackets; each form matches the member.
func TestHostOf(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.0.0.1:8000", "10.0.0.1"},
		{"10.0.0.1", "10.0.0.1"},
		{"[fd00::7]:8000", "fd00::7"},
		{"[fd00::7]", "fd00::7"},
		{"fd00::7", "fd00::7"},
		{"pod.ns.svc:8000", "pod.ns.svc"},
		{"", ""},
	} {
		if got := hostOf(c.in); got != c.want {
			t.Errorf("hostOf(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// key is an endpoint named by its address.
type key string

func (k key) Key() string { return string(k) }

// TestPickAllowed: a pick whose endpoint the subset hint does not allow
// (one that joined the pool after the hint was matched) is finished and
// the request picked again, until an allowed endpoint or none is left;
// nothing stays charged to the endpoints passed over.
func TestPickAllowed(t *testing.T) {
	b, err := llmlb.New(llmlb.RoundRobin())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Update([]llmlb.Endpoint{key("10.0.0.1:8000"), key("10.0.0.2:8000"), key("10.0.0.3:8000")}); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Config{Balancer: b})
	if err != nil {
		t.Fatal(err)
	}
	outstanding := func() map[string]int {
		m := map[string]int{}
		for _, e := range b.Stats() {
			m[e.Key] = int(e.Outstanding)
		}
		return m
	}
	for i := range 3 { // the round robin starts at each endpoint in turn
		var lr llmlb.Request // no exclusions: every member joined "later"
		p, err := s.pickAllowed(context.Background(), &lr, map[string]bool{"10.0.0.3": true})
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if got := p.Endpoint().Key(); got != "10.0.0.3:8000" {
			t.Fatalf("round %d: picked %s, outside the subset", i, got)
		}
		if got := outstanding(); got["10.0.0.1:8000"] != 0 || got["10.0.0.2:8000"] != 0 || got["10.0.0.3:8000"] != 1 {
			t.Fatalf("round %d: outstanding %v", i, got)
		}
		p.Done(nil)
	}
	var lr llmlb.Request
	if _, err := s.pickAllowed(context.Background(), &lr, map[string]bool{"10.0.0.9": true}); !errors.Is(err, llmlb.ErrNoCandidates) {
		t.Fatalf("no member allowed: err %v, want ErrNoCandidates", err)
	}
	for k, n := range outstanding() {
		if n != 0 {
			t.Errorf("%s: %d outstanding", k, n)
		}
	}
}
