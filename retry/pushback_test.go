package retry

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

var refNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	cases := []struct {
		in   string
		want Pushback
	}{
		{"", Pushback{}},
		{"   ", Pushback{}},
		{"0", Pushback{RetryLater, 0}},
		{"120", Pushback{RetryLater, 120 * time.Second}},
		{" 7 ", Pushback{RetryLater, 7 * time.Second}},
		{"1.5", Pushback{RetryLater, 1500 * time.Millisecond}},
		{"300", Pushback{RetryLater, 300 * time.Second}},
		{"301", Pushback{}}, // above the cap: ignored
		{"99999999999999999999999", Pushback{}},
		// Negative or malformed: ignored, as Envoy does; the field can
		// only ask for a wait.
		{"-1", Pushback{}},
		{"soon", Pushback{}},
		{"1e3", Pushback{}},
		{"+5", Pushback{}},
		{"NaN", Pushback{}},
		{"2026-11-30T12:01:00Z", Pushback{}},
		{"Mon, 30 Nov 2026 12:01:00 GMT", Pushback{RetryLater, time.Minute}},
		{"Monday, 30-Nov-26 12:00:30 GMT", Pushback{RetryLater, 30 * time.Second}},
		{"Mon Nov 30 12:00:10 2026", Pushback{RetryLater, 10 * time.Second}},
		{"Mon, 30 Nov 2026 11:00:00 GMT", Pushback{RetryLater, 0}}, // past: now
		{"Mon, 30 Nov 2026 13:00:00 GMT", Pushback{}},              // an hour: ignored
	}
	for _, tc := range cases {
		if got := ParseRetryAfter(tc.in, refNow, 0); got != tc.want {
			t.Errorf("ParseRetryAfter(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if got := ParseRetryAfter("600", refNow, time.Hour); got != (Pushback{RetryLater, 10 * time.Minute}) {
		t.Errorf("custom cap: %+v", got)
	}
}

func TestParseGRPCPushback(t *testing.T) {
	cases := []struct {
		in   string
		want Pushback
	}{
		{"", Pushback{}},
		{"0", Pushback{RetryLater, 0}},
		{"250", Pushback{RetryLater, 250 * time.Millisecond}},
		{"300000", Pushback{RetryLater, 300 * time.Second}},
		{"300001", Pushback{}},
		{"99999999999999999999999", Pushback{}},
		{"-1", Pushback{Kind: DoNotRetry}},
		{"1.5", Pushback{Kind: DoNotRetry}},
		{"abc", Pushback{Kind: DoNotRetry}},
		{"10ms", Pushback{Kind: DoNotRetry}},
	}
	for _, tc := range cases {
		if got := ParseGRPCPushback(tc.in, 0); got != tc.want {
			t.Errorf("ParseGRPCPushback(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestParseRateLimitReset(t *testing.T) {
	cases := []struct {
		in   string
		want Pushback
	}{
		{"", Pushback{}},
		{"30", Pushback{RetryLater, 30 * time.Second}},
		{"0.25", Pushback{RetryLater, 250 * time.Millisecond}},
		{"1s", Pushback{RetryLater, time.Second}},
		{"20ms", Pushback{RetryLater, 20 * time.Millisecond}},
		{"1m30.5s", Pushback{RetryLater, 90500 * time.Millisecond}},
		{"6m0s", Pushback{}}, // 360 s: above the cap
		{"301", Pushback{}},
		{"-1s", Pushback{}}, // negative or malformed: ignored
		{"-5", Pushback{}},
		{"later", Pushback{}},
		// Unix timestamps (GitHub): relative to now.
		{"1796040060", Pushback{RetryLater, time.Minute}},
		{"1796039000", Pushback{RetryLater, 0}},
		{"1796050000", Pushback{}},
		{"2026-11-30T12:00:45Z", Pushback{RetryLater, 45 * time.Second}},
	}
	if refNow.Unix() != 1796040000 {
		t.Fatalf("refNow is %d", refNow.Unix())
	}
	for _, tc := range cases {
		if got := ParseRateLimitReset(tc.in, refNow, 0); got != tc.want {
			t.Errorf("ParseRateLimitReset(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestFromHeader(t *testing.T) {
	h := func(kv ...string) http.Header {
		hd := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			hd.Set(kv[i], kv[i+1])
		}
		return hd
	}
	cases := []struct {
		name string
		h    http.Header
		want Pushback
	}{
		{"nil", nil, Pushback{}},
		{"empty", h(), Pushback{}},
		{"grpc first", h("grpc-retry-pushback-ms", "100", "Retry-After", "5"), Pushback{RetryLater, 100 * time.Millisecond}},
		{"grpc garbage stops", h("grpc-retry-pushback-ms", "x", "Retry-After", "5"), Pushback{Kind: DoNotRetry}},
		{"retry-after", h("Retry-After", "5", "X-RateLimit-Reset", "9"), Pushback{RetryLater, 5 * time.Second}},
		{"over cap skipped", h("Retry-After", "3600", "RateLimit-Reset", "9"), Pushback{RetryLater, 9 * time.Second}},
		{"x-ratelimit-reset", h("X-RateLimit-Reset", "12"), Pushback{RetryLater, 12 * time.Second}},
		{"openai requests exhausted", h("x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "20s",
			"x-ratelimit-remaining-requests", "0", "x-ratelimit-remaining-tokens", "100"), Pushback{RetryLater, time.Second}},
		{"openai tokens exhausted", h("x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "20s",
			"x-ratelimit-remaining-requests", "5", "x-ratelimit-remaining-tokens", "0"), Pushback{RetryLater, 20 * time.Second}},
		{"openai longer", h("x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "2s"), Pushback{RetryLater, 2 * time.Second}},
		{"openai one", h("x-ratelimit-reset-tokens", "250ms"), Pushback{RetryLater, 250 * time.Millisecond}},
		{"openai garbage", h("x-ratelimit-reset-tokens", "??"), Pushback{}},
		{"retry-after garbage skipped", h("Retry-After", "soon", "RateLimit-Reset", "9"), Pushback{RetryLater, 9 * time.Second}},
		{"retry-after garbage alone", h("Retry-After", "soon"), Pushback{}},
		{"retry-after negative skipped", h("Retry-After", "-1", "X-RateLimit-Reset", "4"), Pushback{RetryLater, 4 * time.Second}},
		{"openai garbage beside a spent window", h("x-ratelimit-reset-requests", "??", "x-ratelimit-reset-tokens", "3s",
			"x-ratelimit-remaining-tokens", "0"), Pushback{RetryLater, 3 * time.Second}},
		{"openai garbage beside a reset", h("x-ratelimit-reset-requests", "2s", "x-ratelimit-reset-tokens", "-1s"), Pushback{RetryLater, 2 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromHeader(tc.h, refNow, 0); got != tc.want {
				t.Errorf("FromHeader = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// checkPushback asserts the invariants every parser keeps.
func checkPushback(t *testing.T, in string, p Pushback, limit time.Duration) {
	t.Helper()
	switch p.Kind {
	case NoPushback, DoNotRetry:
		if p.Delay != 0 {
			t.Fatalf("%q: %v with delay %v", in, p.Kind, p.Delay)
		}
	case RetryLater:
		if p.Delay < 0 || p.Delay > limit {
			t.Fatalf("%q: delay %v outside [0, %v]", in, p.Delay, limit)
		}
	default:
		t.Fatalf("%q: kind %v", in, p.Kind)
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "120", "1.5", "-1", "Mon, 30 Nov 2026 12:01:00 GMT", "Mon Nov 30 12:00:10 2026", "9999999999999999999999", "1e9", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := ParseRetryAfter(s, refNow, 0)
		checkPushback(t, s, p, DefaultMaxPushback)
		if p.Kind == DoNotRetry {
			t.Fatalf("%q: DoNotRetry; a Retry-After can only ask for a wait", s)
		}
		// Whole seconds within the limit are that wait, exactly.
		if n, ok := digits(strings.TrimSpace(s)); ok && n <= uint64(DefaultMaxPushback/time.Second) {
			if want := (Pushback{Kind: RetryLater, Delay: time.Duration(n) * time.Second}); p != want {
				t.Fatalf("%q: %+v, want %+v", s, p, want)
			}
		}
	})
}

// digits returns the value of s if it is a non-empty run of ASCII digits
// whose value fits in a uint64.
func digits(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' || n > (math.MaxUint64-9)/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

func FuzzParseGRPCPushback(f *testing.F) {
	for _, s := range []string{"", "0", "250", "-1", "abc", "300001", "00000000000000000000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := ParseGRPCPushback(s, 0)
		checkPushback(t, s, p, DefaultMaxPushback)
		if len(s) > 0 && s[0] == '-' && p.Kind != DoNotRetry {
			t.Fatalf("%q: negative value gave %v", s, p.Kind)
		}
		// Whole milliseconds within the limit are that wait, exactly.
		if n, ok := digits(strings.TrimSpace(s)); ok && n <= uint64(DefaultMaxPushback/time.Millisecond) {
			if want := (Pushback{Kind: RetryLater, Delay: time.Duration(n) * time.Millisecond}); p != want {
				t.Fatalf("%q: %+v, want %+v", s, p, want)
			}
		}
	})
}

func FuzzParseRateLimitReset(f *testing.F) {
	for _, s := range []string{"", "30", "0.25", "1s", "6m0s", "1m30.5s", "-5", "1796040060", "2026-11-30T12:00:45Z", "1e400", "9223372036.854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := ParseRateLimitReset(s, refNow, 0)
		checkPushback(t, s, p, DefaultMaxPushback)
		if p.Kind == DoNotRetry {
			t.Fatalf("%q: DoNotRetry; a rate-limit reset can only ask for a wait", s)
		}
		v := strings.TrimSpace(s)
		var want Pushback
		if n, ok := digits(v); ok {
			switch {
			case n <= uint64(DefaultMaxPushback/time.Second):
				// Whole seconds within the limit are that wait, exactly.
				want = Pushback{Kind: RetryLater, Delay: time.Duration(n) * time.Second}
			case n < unixThreshold:
				want = Pushback{} // seconds above the limit: ignored
			case n <= uint64(refNow.Unix()):
				// A Unix time already past: retry now.
				want = Pushback{Kind: RetryLater}
			case n <= uint64(refNow.Add(DefaultMaxPushback).Unix()):
				want = Pushback{Kind: RetryLater, Delay: time.Unix(int64(n), 0).Sub(refNow)}
			}
			if p != want {
				t.Fatalf("%q: %+v, want %+v", s, p, want)
			}
			return
		}
		if d, err := time.ParseDuration(v); err == nil && !isDecimal(v) {
			// A Go duration: negative or above the limit is ignored,
			// else that wait, exactly.
			switch {
			case d >= 0 && d <= DefaultMaxPushback:
				want = Pushback{Kind: RetryLater, Delay: d}
			}
			if p != want {
				t.Fatalf("%q: %+v, want %+v", s, p, want)
			}
		}
	})
}

func FuzzFromHeader(f *testing.F) {
	f.Add("100", "5", "9", "1s", "0")
	f.Add("", "Mon, 30 Nov 2026 12:01:00 GMT", "", "6m0s", "")
	f.Add("x", "", "-1", "", "0")
	f.Fuzz(func(t *testing.T, grpc, retryAfter, reset, resetTokens, remaining string) {
		h := http.Header{}
		h.Set(HeaderGRPCPushback, grpc)
		h.Set(HeaderRetryAfter, retryAfter)
		h.Set(HeaderXRateLimitReset, reset)
		h.Set(HeaderResetTokens, resetTokens)
		h.Set("X-Ratelimit-Remaining-Tokens", remaining)
		p := FromHeader(h, refNow, time.Minute)
		checkPushback(t, "header", p, time.Minute)
		// The headers are read in order, and the first that says anything
		// decides, whatever the later ones hold.
		if g := ParseGRPCPushback(grpc, time.Minute); g.Kind != NoPushback {
			if p != g {
				t.Fatalf("grpc-retry-pushback-ms %q says %+v; FromHeader = %+v", grpc, g, p)
			}
			return
		}
		if r := ParseRetryAfter(retryAfter, refNow, time.Minute); r.Kind != NoPushback {
			if p != r {
				t.Fatalf("Retry-After %q says %+v; FromHeader = %+v", retryAfter, r, p)
			}
			return
		}
		if x := ParseRateLimitReset(reset, refNow, time.Minute); x.Kind != NoPushback {
			if p != x {
				t.Fatalf("X-RateLimit-Reset %q says %+v; FromHeader = %+v", reset, x, p)
			}
			return
		}
		// Only the token window is left: its reset decides when it says
		// anything, and nothing is asked when it says nothing.
		if tk := ParseRateLimitReset(resetTokens, refNow, time.Minute); p != tk {
			t.Fatalf("x-ratelimit-reset-tokens %q says %+v; FromHeader = %+v", resetTokens, tk, p)
		}
	})
}

func BenchmarkParseRetryAfter(b *testing.B) {
	for _, in := range []string{"120", "Mon, 30 Nov 2026 12:01:00 GMT"} {
		name := "form=seconds"
		if len(in) > 5 {
			name = "form=date"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ParseRetryAfter(in, refNow, 0).Kind != RetryLater {
					b.Fatal("not parsed")
				}
			}
		})
	}
}

// TestParseRateLimitResetTooLarge: a reset too large for a Duration is a
// delay above any limit, like one that fits: ignored under a limit, and the
// largest delay without one (an Ejector then cools down for MaxCooldown).
// It is not a "do not retry".
func TestParseRateLimitResetTooLarge(t *testing.T) {
	for _, in := range []string{
		"1" + strings.Repeat("0", 400), // beyond float64
		"9999999999h",                  // beyond a Duration
		"99999999999999999999s",
		"9999999999h1m",
		"1.5h9999999999h",
		"+9999999999h",
		"4102444800" + strings.Repeat("0", 10), // a Unix time past 2116
	} {
		if got := ParseRateLimitReset(in, refNow, 0); got != (Pushback{}) {
			t.Errorf("ParseRateLimitReset(%.24q, limit 0) = %+v, want NoPushback", in, got)
		}
		if got := ParseRateLimitReset(in, refNow, noPushbackLimit); got.Kind != RetryLater {
			t.Errorf("ParseRateLimitReset(%.24q, no limit) = %+v, want RetryLater", in, got)
		}
	}
	for _, in := range []string{"9999999999hh", "9999999999h-1s", "h", ".h", "1.2.3s", "+-1s", "9999999999x", "+"} {
		if got := ParseRateLimitReset(in, refNow, 0); got != (Pushback{}) {
			t.Errorf("ParseRateLimitReset(%q) = %+v, want NoPushback (malformed: ignored)", in, got)
		}
	}
	// A spent window with such a reset cools its endpoint down for
	// MaxCooldown, as any reset above it does.
	clk := newFakeClock()
	e, err := NewEjector(newBalancer(t, "a"), EjectorConfig{Clock: clk, MaxCooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.ReportQuota("a", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"9999999999h"}})
	if n, next := e.Out(); n != 1 || next != time.Minute {
		t.Errorf("Out() = %d, %v after a reset of 9999999999h; want 1, the 1m cap", n, next)
	}
}
