package retry

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/llmlb/llmlb"
)

// TestPushbackLowercaseKeys: gRPC metadata keys are lowercase (grpc-go's
// metadata.MD), so trailers passed on as http.Header(md) keep them so, as
// do headers copied as they came from an HTTP/2 frame. Every header the
// pushback functions read is found under its lowercase name too.
func TestPushbackLowercaseKeys(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	later := func(d time.Duration) Pushback { return Pushback{Kind: RetryLater, Delay: d} }
	cases := []struct {
		name string
		h    http.Header
		want Pushback
	}{
		{"grpc do not retry", http.Header{"grpc-retry-pushback-ms": {"-1"}}, Pushback{Kind: DoNotRetry}},
		{"grpc wait", http.Header{"grpc-retry-pushback-ms": {"1500"}}, later(1500 * time.Millisecond)},
		{"grpc before retry-after", http.Header{"grpc-retry-pushback-ms": {"x"}, "Retry-After": {"3"}}, Pushback{Kind: DoNotRetry}},
		{"retry-after", http.Header{"retry-after": {"7"}}, later(7 * time.Second)},
		{"ratelimit-reset", http.Header{"ratelimit-reset": {"9"}}, later(9 * time.Second)},
		{"x-ratelimit-reset", http.Header{"x-ratelimit-reset": {"11"}}, later(11 * time.Second)},
		{"openai pair, tokens spent", http.Header{
			"x-ratelimit-reset-requests":   {"1s"},
			"x-ratelimit-reset-tokens":     {"20ms"},
			"x-ratelimit-remaining-tokens": {"0"},
		}, later(20 * time.Millisecond)},
		{"canonical first", http.Header{"Retry-After": {"2"}, "retry-after": {"5"}}, later(2 * time.Second)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := FromHeader(c.h, now, 0); got != c.want {
				t.Errorf("FromHeader(%v) = %+v, want %+v", c.h, got, c.want)
			}
		})
	}

	quota := http.Header{
		"x-ratelimit-limit-requests":     {"100"},
		"x-ratelimit-remaining-requests": {"0"},
		"x-ratelimit-reset-requests":     {"2m0s"},
		"x-ratelimit-limit-tokens":       {"1000"},
		"x-ratelimit-remaining-tokens":   {"500"},
		"x-ratelimit-reset-tokens":       {"1s"},
	}
	if got := QuotaReset(quota, now, 0); got != later(2*time.Minute) {
		t.Errorf("QuotaReset = %+v, want a wait of 2m", got)
	}
	if f, reset, ok := QuotaHeadroom(quota, now); !ok || f != 0 || reset != 2*time.Minute {
		t.Errorf("QuotaHeadroom = %v, %v, %v; want 0, 2m, true", f, reset, ok)
	}

	// A gRPC UNAVAILABLE that asks for a wait is an overload answer, not a
	// failure of the endpoint.
	se := &StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header{"grpc-retry-pushback-ms": {"100"}}}
	if o := HealthOutcome(se); o != Abandoned {
		t.Errorf("HealthOutcome(UNAVAILABLE with lowercase pushback) = %v, want abandoned", o)
	}
}

// TestPushbackSeveralGRPCValues: grpc-go does not retry when the server sends
// grpc-retry-pushback-ms more than once (stream.go, shouldRetry).
func TestPushbackSeveralGRPCValues(t *testing.T) {
	for _, h := range []http.Header{
		{"Grpc-Retry-Pushback-Ms": {"10", "20"}},
		{"grpc-retry-pushback-ms": {"10", "10"}},
	} {
		if got := FromHeader(h, time.Time{}, 0); got.Kind != DoNotRetry {
			t.Errorf("FromHeader(%v) = %+v, want do-not-retry", h, got)
		}
	}
}

// TestLoopHonoursGRPCTrailers: an attempt that returns a gRPC status with its
// trailers converted from metadata, as http.Header(md), is not retried when
// they say "do not retry".
func TestLoopHonoursGRPCTrailers(t *testing.T) {
	b := newBalancer(t, "a", "b", "c")
	l, err := NewLoop(b, LoopConfig{Budget: unlimited{}, Backoff: noBackoff{}, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	md := map[string][]string{"grpc-retry-pushback-ms": {"-1"}} // a metadata.MD
	n := 0
	err = l.Do(context.Background(), &llmlb.Request{}, func(context.Context, *Attempt) error {
		n++
		return &StatusError{Code: GRPCUnavailable, GRPC: true, Header: http.Header(md)}
	})
	var ge *GiveUpError
	if !errors.As(err, &ge) || ge.Reason != "pushback" || n != 1 {
		t.Fatalf("Do = %v after %d attempts, want a give-up for pushback after 1", err, n)
	}
	assertIdle(t, b)
}
