package grpclb_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
)

// TestEndpointsSharingAnAddress: resolved endpoints that share a first
// address, or list the same addresses, are one member under one key,
// whatever the order in which endpointsharding reports their children.
// Without that, two such children took turns at one key from one
// UpdateState to the next: its health and picker flapped between theirs,
// or its key changed between resolver updates. Endpoints that share only a
// later address stay two members.
func TestEndpointsSharingAnAddress(t *testing.T) {
	// dead is an address nothing listens on.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	ep := func(addrs ...string) resolver.Endpoint {
		var e resolver.Endpoint
		for _, a := range addrs {
			e.Addresses = append(e.Addresses, resolver.Address{Addr: a})
		}
		return e
	}

	for _, test := range []struct {
		name string
		// eps returns the resolved endpoints for the addresses of
		// servers a and b.
		eps func(a, b string) []resolver.Endpoint
		// deadA makes a an address nothing listens on.
		deadA bool
		// want returns the members' keys.
		want func(a, b string) []string
	}{
		{"first address shared, nothing listening on it", func(a, b string) []resolver.Endpoint {
			return []resolver.Endpoint{ep(a), ep(a, b)}
		}, true, func(a, _ string) []string { return []string{a} }},
		{"first address shared", func(a, b string) []resolver.Endpoint {
			return []resolver.Endpoint{ep(a, b), ep(a)}
		}, false, func(a, _ string) []string { return []string{a} }},
		{"same addresses in another order", func(a, b string) []resolver.Endpoint {
			return []resolver.Endpoint{ep(b, a), ep(a, b)}
		}, false, func(_, b string) []string { return []string{b} }},
		{"same addresses, one listed twice", func(a, b string) []resolver.Endpoint {
			return []resolver.Endpoint{ep(a, b), ep(b, a, a)}
		}, false, func(a, _ string) []string { return []string{a} }},
		{"a later address shared", func(a, b string) []resolver.Endpoint {
			return []resolver.Endpoint{ep(a), ep(b, a)}
		}, false, func(a, b string) []string { return []string{a, b} }},
	} {
		t.Run(test.name, func(t *testing.T) {
			b := startServer(t, -1, false)
			a := &testServer{addr: dead}
			if !test.deadA {
				a = startServer(t, -1, false)
			}
			client, r, lb := dial(t, testName, `{"policy": "round-robin"}`, b)
			state := resolver.State{Endpoints: test.eps(a.addr, b.addr)}
			want := test.want(a.addr, b.addr)
			slices.Sort(want)
			// Each resolver update makes endpointsharding report its
			// children once more, in a new random order.
			eventually(t, "every member healthy", func() bool {
				r.UpdateState(state)
				if lb() == nil {
					return false
				}
				n := 0
				for _, s := range lb().Stats() {
					if s.Healthy {
						n++
					}
				}
				return n == len(want)
			})
			for i := range 30 {
				r.UpdateState(state)
				got := members(lb())
				slices.Sort(got)
				if !slices.Equal(got, want) {
					t.Fatalf("update %d: members %v, want %v", i, got, want)
				}
				for _, s := range lb().Stats() {
					if !s.Healthy {
						t.Fatalf("update %d: member %s is unhealthy", i, s.Key)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
				cancel()
				if err != nil {
					t.Fatalf("update %d: call: %v", i, err)
				}
			}
			if n := a.calls.Load() + b.calls.Load(); n != 30 {
				t.Errorf("the servers got %d calls, want 30", n)
			}
		})
	}
}
