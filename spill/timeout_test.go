package spill

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// A tier whose own transport times out (a dial to an address that does not
// answer, or an upstream that sends no headers within the transport's
// ResponseHeaderTimeout) is unreachable, and the request spills: net/http's
// timeout errors satisfy errors.Is(err, context.DeadlineExceeded), yet the
// request's own context has not ended. A request whose own deadline passes
// goes to no other tier.
func TestSpillPastTimedOutTier(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept() // and never answer
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	defer func() { ln.Close(); <-accepted }()
	upstream := func(tr *http.Transport) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.URL.Scheme, r.URL.Host, r.Host = "http", ln.Addr().String(), ""
			return tr.RoundTrip(r)
		})
	}
	for _, tc := range []struct {
		name string
		tier http.RoundTripper
	}{
		{"dial timeout", upstream(&http.Transport{DialContext: (&net.Dialer{Timeout: time.Nanosecond}).DialContext})},
		{"response header timeout", upstream(&http.Transport{ResponseHeaderTimeout: 20 * time.Millisecond})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events []Event
			second := &tier{answer: status(200, "ok")}
			tr, err := New(Config{
				Tiers:    []Tier{{Name: "near", Transport: tc.tier}, {Name: "far", Transport: second}},
				Observer: func(e Event) { events = append(events, e) },
			})
			if err != nil {
				t.Fatal(err)
			}
			r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", strings.NewReader("{}"))
			resp, err := tr.RoundTrip(r)
			if err != nil {
				t.Fatalf("RoundTrip: %v; want the next tier's answer", err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get(DefaultHeader) != "near" || second.sent() != 1 {
				t.Fatalf("got %d from %q, %d sent to the next tier; want a spill", resp.StatusCode, resp.Header.Get(DefaultHeader), second.sent())
			}
			if want := []Event{{From: "near", To: "far", Reason: Unreachable}}; !slices.Equal(events, want) {
				t.Fatalf("events %v, want %v", events, want)
			}
		})
	}

	t.Run("the request's own deadline", func(t *testing.T) {
		second := &tier{answer: status(200, "ok")}
		tr, err := New(Config{Tiers: []Tier{
			{Name: "near", Transport: upstream(&http.Transport{})},
			{Name: "far", Transport: second},
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		r, _ := http.NewRequestWithContext(ctx, "POST", "http://gateway/v1/chat/completions", strings.NewReader("{}"))
		resp, err := tr.RoundTrip(r)
		if resp != nil {
			resp.Body.Close()
		}
		if !errors.Is(err, context.DeadlineExceeded) || second.sent() != 0 {
			t.Fatalf("RoundTrip: %v, %d sent to the next tier; want the deadline's error and none", err, second.sent())
		}
	})
}
