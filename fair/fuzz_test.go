package fair

import (
	"strings"
	"testing"
)

// FuzzParseClass checks that ParseClass accepts exactly the three names, in
// any case and with surrounding spaces, and that a class's String parses
// back to it.
func FuzzParseClass(f *testing.F) {
	for _, s := range []string{"interactive", " Batch\t", "STANDARD", "", "batch2", "inter active", "\u00a0batch", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, ok := ParseClass(s)
		if !ok {
			if c != Standard {
				t.Fatalf("ParseClass(%q) = %v, false; want standard", s, c)
			}
			return
		}
		if !strings.EqualFold(c.String(), strings.TrimSpace(s)) {
			t.Fatalf("ParseClass(%q) = %v", s, c)
		}
		if back, ok := ParseClass(c.String()); !ok || back != c {
			t.Fatalf("ParseClass(%q) = %v, %v; want %v", c.String(), back, ok, c)
		}
	})
}

// FuzzPrincipalKey checks that the key a queue keeps for a principal's name
// is at most maxKeyBytes+1 bytes, is the name itself for a short name, and
// differs for different names.
func FuzzPrincipalKey(f *testing.F) {
	short := strings.Repeat("s", maxKeyBytes)
	f.Add("", "a")
	f.Add(short, short+"+")
	f.Add(short+"+", principalKey(short+"+"))
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := principalKey(a), principalKey(b)
		if len(ka) > maxKeyBytes+1 || len(a) <= maxKeyBytes && ka != a {
			t.Fatalf("principalKey(%q) = %q", a, ka)
		}
		if a != b && ka == kb {
			t.Fatalf("principalKey(%q) = principalKey(%q) = %q", a, b, ka)
		}
	})
}
