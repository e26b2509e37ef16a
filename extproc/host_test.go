package extproc

import "testing"

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
