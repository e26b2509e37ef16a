package token

import "testing"

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"X-Tenant-ID": true, "x-session_id": true, "!#$%&'*+-.^_`|~09azAZ": true,
		"": false, "bad header": false, "X-Feature:": false, "X-Ténant": false, "X\tTab": false, "X(1)": false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}
