package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestDefaultClassify(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&StatusError{Code: 408}, true},
		{&StatusError{Code: 429}, true},
		{&StatusError{Code: 500}, true},
		{&StatusError{Code: 501}, false},
		{&StatusError{Code: 502}, true},
		{&StatusError{Code: 503}, true},
		{&StatusError{Code: 504}, true},
		{&StatusError{Code: 400}, false},
		{&StatusError{Code: 404}, false},
		{&StatusError{Code: GRPCUnavailable, GRPC: true}, true},
		{&StatusError{Code: GRPCResourceExhausted, GRPC: true}, true},
		{&StatusError{Code: 3, GRPC: true}, false},                  // INVALID_ARGUMENT
		{&StatusError{Code: 14}, false},                             // HTTP 14 is not gRPC 14
		{fmt.Errorf("upstream: %w", &StatusError{Code: 503}), true}, // wrapped
		{errors.New("read: connection reset by peer"), true},
		{&OverloadError{Scope: "global"}, true},
		{context.Canceled, false},
		{fmt.Errorf("dial: %w", context.DeadlineExceeded), false},
		{&GiveUpError{Err: &StatusError{Code: 503}}, false},
	}
	for _, tc := range cases {
		if got := DefaultClassify(tc.err); got != tc.want {
			t.Errorf("DefaultClassify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestOnCodes(t *testing.T) {
	codes := []int{503}
	c := OnCodes(codes, []int{GRPCUnavailable})
	codes[0] = 500 // copied: no effect
	if !c(&StatusError{Code: 503}) || c(&StatusError{Code: 500}) || c(&StatusError{Code: 429}) {
		t.Fatal("HTTP codes not as configured")
	}
	if !c(&StatusError{Code: GRPCUnavailable, GRPC: true}) || c(&StatusError{Code: GRPCResourceExhausted, GRPC: true}) {
		t.Fatal("gRPC codes not as configured")
	}
}

func TestErrors(t *testing.T) {
	ge := &GiveUpError{Attempts: 3, Reason: "budget", Err: &StatusError{Code: 503}}
	var se *StatusError
	if !errors.Is(ge, ErrExhausted) || !errors.As(ge, &se) || se.Code != 503 {
		t.Fatalf("GiveUpError does not unwrap: %v", ge)
	}
	if ge.Error() != "retry: gave up after 3 attempts (budget): retry: upstream HTTP status 503" {
		t.Fatalf("message %q", ge.Error())
	}
	oe := &OverloadError{Scope: "session"}
	if !errors.Is(oe, ErrOverloaded) || errors.Is(oe, ErrExhausted) {
		t.Fatal("OverloadError does not match ErrOverloaded only")
	}
	if s := (&StatusError{Code: 14, GRPC: true}).Error(); s != "retry: upstream gRPC status 14" {
		t.Fatalf("message %q", s)
	}
	for o, want := range map[Outcome]string{Succeeded: "succeeded", Failed: "failed", Abandoned: "abandoned", 9: "Outcome(9)"} {
		if o.String() != want {
			t.Errorf("%d.String() = %q", o, o.String())
		}
	}
	if PushbackKind(7).String() != "PushbackKind(7)" {
		t.Error(PushbackKind(7).String())
	}
}

// TestOverloadErrorMessage: the message names a cap only for Admission's
// scopes; a fair queue's refusals (queue full, shed, deadline passed) and
// spill's cooling tiers read as an overload of their scope, not as a cap
// reached.
func TestOverloadErrorMessage(t *testing.T) {
	cases := []struct {
		scope string
		want  string
	}{
		{"global", "retry: overloaded (global cap reached), retry after 1s"},
		{"session", "retry: overloaded (session cap reached), retry after 1s"},
		{"queue", "retry: overloaded (queue), retry after 1s"},
		{"principal", "retry: overloaded (principal), retry after 1s"},
		{"spill", "retry: overloaded (spill), retry after 1s"},
		{"", "retry: overloaded, retry after 1s"},
	}
	for _, tc := range cases {
		err := error(&OverloadError{Scope: tc.scope, RetryAfter: time.Second})
		if got := err.Error(); got != tc.want {
			t.Errorf("scope %q: %q, want %q", tc.scope, got, tc.want)
		}
	}
}
