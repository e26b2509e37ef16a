package fair

import (
	"strings"
	"testing"
)

// The key kept for a long principal name is longer than any name kept as
// it is, so that no name can be given to take over another's counter.
func TestPrincipalKeysNeverCollide(t *testing.T) {
	short := strings.Repeat("s", maxKeyBytes)
	long := short + "+"
	if principalKey(short) != short {
		t.Errorf("a name of %d bytes is kept as %q", len(short), principalKey(short))
	}
	k := principalKey(long)
	if len(k) != maxKeyBytes+1 || principalKey(k) == k || principalKey(long+"+") == k {
		t.Errorf("a name of %d bytes is kept as %q, which names another principal", len(long), k)
	}
}
